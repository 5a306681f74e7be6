//! What `cargo metadata` says about the workspace: its root, its target directory, and the
//! kernel crates.
//!
//! A kernel crate is a workspace member whose library is built to PTX. `oxccl-device` always
//! is one. Any other member is one when its library depends on `oxccl-device` and its
//! manifest opts in:
//!
//! ```toml
//! [package.metadata.oxccl]
//! kernels = true
//! ```
//!
//! Depending on `oxccl-device` alone is not enough: host crates (`oxccl`, `oxccl-proxy`,
//! the examples) depend on it for its shared layouts and never run on a GPU.

use crate::bounded::output_bounded;
use crate::util::Tool;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The device crate every kernel crate builds on.
pub const DEVICE_CRATE: &str = "oxccl-device";

/// Longest `cargo metadata --no-deps` may take; it reads the manifests only.
pub const METADATA_TIME_LIMIT: Duration = Duration::from_secs(2 * 60);

/// The facts about the workspace the tasks need.
#[derive(Debug)]
pub struct Workspace {
    /// Directory of the workspace's `Cargo.toml`.
    pub root: PathBuf,
    /// Cargo's target directory (`CARGO_TARGET_DIR` or `<root>/target`).
    pub target_dir: PathBuf,
    /// Every workspace member.
    pub packages: Vec<Package>,
}

/// One workspace member.
#[derive(Debug, Clone)]
pub struct Package {
    /// Package name, as `-p` takes it (`oxccl-device`).
    pub name: String,
    /// Directory of its `Cargo.toml`.
    pub dir: PathBuf,
    /// Its library target: crate name (`oxccl_device`) and the root source file.
    pub lib: Option<(String, PathBuf)>,
    /// Whether its library depends on `oxccl-device` (normal dependency).
    pub depends_on_device: bool,
    /// Whether it sets `package.metadata.oxccl.kernels = true`.
    pub declares_kernels: bool,
}

impl Package {
    /// Whether `cargo xtask build-ptx` builds this crate by default.
    pub fn is_kernel_crate(&self) -> bool {
        self.lib.is_some()
            && (self.name == DEVICE_CRATE || (self.depends_on_device && self.declares_kernels))
    }

    /// The library's crate name (underscored), which names its `.ptx`.
    pub fn lib_name(&self) -> Option<&str> {
        self.lib.as_ref().map(|(n, _)| n.as_str())
    }

    /// The directory holding the library's sources (that of its root file).
    pub fn src_dir(&self) -> Option<PathBuf> {
        self.lib
            .as_ref()
            .and_then(|(_, p)| p.parent().map(PathBuf::from))
    }
}

impl Workspace {
    /// Reads the workspace from `cargo metadata` run in the current directory.
    pub fn load() -> Result<Workspace> {
        let out = output_bounded(
            Tool::cargo()
                .cmd()
                .args(["metadata", "--format-version", "1", "--no-deps"]),
            METADATA_TIME_LIMIT,
        )
        .context("running `cargo metadata`")?;
        if !out.status.success() {
            bail!(
                "`cargo metadata` failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self::from_json(&out.stdout)
    }

    /// Parses `cargo metadata --format-version 1` output.
    pub fn from_json(json: &[u8]) -> Result<Workspace> {
        let v: Value = serde_json::from_slice(json).context("parsing `cargo metadata` output")?;
        let path = |key: &str| {
            v[key]
                .as_str()
                .map(PathBuf::from)
                .with_context(|| format!("`cargo metadata` output has no `{key}`"))
        };
        let members: Vec<&str> = v["workspace_members"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let packages = v["packages"]
            .as_array()
            .context("`cargo metadata` output has no `packages`")?
            .iter()
            .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
            .map(package)
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace {
            root: path("workspace_root")?,
            target_dir: path("target_directory")?,
            packages,
        })
    }

    /// The member named `name`.
    pub fn package(&self, name: &str) -> Result<&Package> {
        self.packages
            .iter()
            .find(|p| p.name == name || p.lib_name() == Some(&name.replace('-', "_")))
            .with_context(|| {
                let names: Vec<&str> = self.packages.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "no workspace member named `{name}` (members: {})",
                    names.join(", ")
                )
            })
    }

    /// The crates built to PTX by default (see the module docs).
    pub fn kernel_crates(&self) -> Vec<&Package> {
        self.packages
            .iter()
            .filter(|p| p.is_kernel_crate())
            .collect()
    }
}

fn package(p: &Value) -> Result<Package> {
    let name = p["name"]
        .as_str()
        .context("a package without a name in `cargo metadata` output")?
        .to_string();
    let manifest = p["manifest_path"]
        .as_str()
        .map(PathBuf::from)
        .with_context(|| format!("package `{name}` has no manifest_path"))?;
    let dir = manifest.parent().map(PathBuf::from).unwrap_or_default();
    const LIB_KINDS: &[&str] = &["lib", "rlib", "cdylib", "dylib", "staticlib"];
    let lib = p["targets"].as_array().and_then(|targets| {
        targets.iter().find_map(|t| {
            let kinds = t["kind"].as_array()?;
            let is_lib = kinds
                .iter()
                .filter_map(Value::as_str)
                .any(|k| LIB_KINDS.contains(&k));
            if !is_lib {
                return None;
            }
            Some((
                t["name"].as_str()?.replace('-', "_"),
                PathBuf::from(t["src_path"].as_str()?),
            ))
        })
    });
    let depends_on_device = p["dependencies"].as_array().is_some_and(|deps| {
        deps.iter()
            .any(|d| d["name"] == DEVICE_CRATE && (d["kind"].is_null() || d["kind"] == "normal"))
    });
    let declares_kernels = p["metadata"]["oxccl"]["kernels"] == true;
    Ok(Package {
        name,
        dir,
        lib,
        depends_on_device,
        declares_kernels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from `cargo metadata --format-version 1 --no-deps` on this workspace, plus a
    /// kernel crate that opts in and a host crate that does not.
    const METADATA: &str = r#"{
      "packages": [
        {"name": "oxccl-device", "id": "path+file:///w/device-kernels#oxccl-device@0.1.0",
         "manifest_path": "/w/device-kernels/Cargo.toml",
         "targets": [{"kind": ["rlib"], "name": "oxccl_device", "src_path": "/w/device-kernels/src/lib.rs"}],
         "dependencies": [{"name": "bytemuck", "kind": null}], "metadata": null},
        {"name": "oxccl-proxy", "id": "path+file:///w/proxy#oxccl-proxy@0.1.0",
         "manifest_path": "/w/proxy/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "oxccl_proxy", "src_path": "/w/proxy/src/lib.rs"}],
         "dependencies": [{"name": "oxccl-device", "kind": null}], "metadata": null},
        {"name": "tutorial-kernels", "id": "path+file:///w/examples/kernels#tutorial-kernels@0.1.0",
         "manifest_path": "/w/examples/kernels/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "tutorial_kernels", "src_path": "/w/examples/kernels/src/lib.rs"},
                     {"kind": ["test"], "name": "t", "src_path": "/w/examples/kernels/tests/t.rs"}],
         "dependencies": [{"name": "oxccl-device", "kind": null}],
         "metadata": {"oxccl": {"kernels": true}}},
        {"name": "dev-only", "id": "path+file:///w/dev-only#dev-only@0.1.0",
         "manifest_path": "/w/dev-only/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "dev_only", "src_path": "/w/dev-only/src/lib.rs"}],
         "dependencies": [{"name": "oxccl-device", "kind": "dev"}],
         "metadata": {"oxccl": {"kernels": true}}},
        {"name": "xtask", "id": "path+file:///w/xtask#xtask@0.1.0",
         "manifest_path": "/w/xtask/Cargo.toml",
         "targets": [{"kind": ["bin"], "name": "xtask", "src_path": "/w/xtask/src/main.rs"}],
         "dependencies": [], "metadata": null}
      ],
      "workspace_members": [
        "path+file:///w/device-kernels#oxccl-device@0.1.0",
        "path+file:///w/proxy#oxccl-proxy@0.1.0",
        "path+file:///w/examples/kernels#tutorial-kernels@0.1.0",
        "path+file:///w/dev-only#dev-only@0.1.0",
        "path+file:///w/xtask#xtask@0.1.0"
      ],
      "target_directory": "/w/target",
      "workspace_root": "/w"
    }"#;

    #[test]
    fn kernel_crates_are_the_device_crate_and_those_that_opt_in() {
        let ws = Workspace::from_json(METADATA.as_bytes()).unwrap();
        assert_eq!(ws.root, PathBuf::from("/w"));
        assert_eq!(ws.target_dir, PathBuf::from("/w/target"));
        let names: Vec<_> = ws.kernel_crates().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["oxccl-device", "tutorial-kernels"]);
        let k = ws.package("tutorial_kernels").unwrap();
        assert_eq!(k.lib_name(), Some("tutorial_kernels"));
        assert_eq!(k.src_dir(), Some(PathBuf::from("/w/examples/kernels/src")));
        assert!(ws.package("xtask").unwrap().lib.is_none());
    }

    #[test]
    fn unknown_package_names_the_members() {
        let ws = Workspace::from_json(METADATA.as_bytes()).unwrap();
        let err = ws.package("nope").unwrap_err().to_string();
        assert!(
            err.contains("oxccl-device") && err.contains("nope"),
            "{err}"
        );
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(Workspace::from_json(b"{").is_err());
        assert!(Workspace::from_json(b"{}").is_err());
    }
}
