//! What `cargo metadata` says about a workspace: its root, its target directory, and the
//! kernel crates.
//!
//! A kernel crate is a workspace member whose library is built to PTX: its library depends on
//! `oxccl-device` (a library of device code with no kernel of its own) and its manifest opts
//! in, as `oxccl-kernels` does:
//!
//! ```toml
//! [package.metadata.oxccl]
//! kernels = true
//! ```
//!
//! Depending on `oxccl-device` alone is not enough: host crates (`oxccl`, `oxccl-proxy`,
//! the examples) depend on it for its shared layouts and never run on a GPU.

use crate::bounded::output_bounded;
use crate::error::{Error, Result};
use cargo_metadata::{DependencyKind, Metadata, MetadataCommand, TargetKind};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The device crate every kernel crate builds on.
pub const DEVICE_CRATE: &str = "oxccl-device";

/// Longest `cargo metadata --no-deps` may take; it reads the manifests only.
pub const METADATA_TIME_LIMIT: Duration = Duration::from_secs(2 * 60);

/// The facts about a workspace that building its kernel crates needs.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// Directory of the workspace's `Cargo.toml`.
    pub root: PathBuf,
    /// Cargo's target directory (`CARGO_TARGET_DIR`, `build.target-dir`, or
    /// `<root>/target`).
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
    /// Whether this is a kernel crate (see the module docs), which is what is built to PTX.
    pub fn is_kernel_crate(&self) -> bool {
        self.lib.is_some() && self.depends_on_device && self.declares_kernels
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

    /// The manifest, `<dir>/Cargo.toml`.
    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join("Cargo.toml")
    }
}

impl Workspace {
    /// Reads the workspace of the current directory from `cargo metadata`, with the cargo
    /// that runs this program (`$CARGO`), as `cargo build` would find it.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] if cargo cannot be run or runs past [`METADATA_TIME_LIMIT`],
    /// [`Error::Metadata`] if it fails (no `Cargo.toml` here or above, a broken manifest).
    pub fn load() -> Result<Workspace> {
        Self::load_from(None)
    }

    /// Reads the workspace that the manifest `manifest_path` belongs to: a package's
    /// `Cargo.toml` or a workspace root's. Cargo runs in the manifest's directory, so the
    /// `.cargo/config.toml` files that apply there apply (a `build.target-dir`, say).
    ///
    /// # Errors
    ///
    /// As [`Workspace::load`].
    pub fn load_manifest(manifest_path: &Path) -> Result<Workspace> {
        Self::load_from(Some(manifest_path))
    }

    /// Parses `cargo metadata --format-version 1` output.
    ///
    /// # Errors
    ///
    /// [`Error::Metadata`] if it is not.
    pub fn from_json(json: &[u8]) -> Result<Workspace> {
        let text = std::str::from_utf8(json)
            .map_err(|_| Error::Metadata("the output is not UTF-8".into()))?;
        let metadata =
            MetadataCommand::parse(text).map_err(|e| Error::Metadata(format!("parsing: {e}")))?;
        Ok(Self::from_metadata(&metadata))
    }

    /// The facts needed from parsed `cargo metadata`.
    pub fn from_metadata(metadata: &Metadata) -> Workspace {
        Workspace {
            root: metadata.workspace_root.clone().into_std_path_buf(),
            target_dir: metadata.target_directory.clone().into_std_path_buf(),
            packages: metadata
                .workspace_packages()
                .into_iter()
                .map(package)
                .collect(),
        }
    }

    /// The member named `name` (its package name, or its library's crate name).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUsage`], naming the members, if there is none.
    pub fn package(&self, name: &str) -> Result<&Package> {
        self.packages
            .iter()
            .find(|p| p.name == name || p.lib_name() == Some(&name.replace('-', "_")))
            .ok_or_else(|| {
                let names: Vec<&str> = self.packages.iter().map(|p| p.name.as_str()).collect();
                Error::InvalidUsage(format!(
                    "no workspace member named `{name}` (members: {})",
                    names.join(", ")
                ))
            })
    }

    /// The member named `name`, which must be a kernel crate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUsage`] if there is no such member, or it has no library, or it is
    /// not a kernel crate (saying what it lacks).
    pub fn kernel_crate(&self, name: &str) -> Result<&Package> {
        let p = self.package(name)?;
        if p.lib.is_none() {
            return Err(Error::InvalidUsage(format!(
                "`{name}` has no library to build to PTX"
            )));
        }
        if !p.is_kernel_crate() {
            let mut lacks = Vec::new();
            if !p.depends_on_device {
                lacks.push(format!("its library must depend on `{DEVICE_CRATE}`"));
            }
            if !p.declares_kernels {
                lacks.push(format!(
                    "its Cargo.toml ({}) must declare `[package.metadata.oxccl] kernels = true`",
                    p.manifest_path().display()
                ));
            }
            return Err(Error::InvalidUsage(format!(
                "`{name}` is not a kernel crate: {}",
                lacks.join(", and ")
            )));
        }
        Ok(p)
    }

    /// The kernel crates of the workspace (see the module docs).
    pub fn kernel_crates(&self) -> Vec<&Package> {
        self.packages
            .iter()
            .filter(|p| p.is_kernel_crate())
            .collect()
    }

    /// The kernel crates named `names` (see [`Workspace::kernel_crate`]), or every kernel
    /// crate of the workspace if `names` is empty, as `-p` options select them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUsage`] if a name is not a kernel crate of the workspace, or if none
    /// is named and the workspace has none.
    pub fn select_kernel_crates(&self, names: &[String]) -> Result<Vec<&Package>> {
        if !names.is_empty() {
            return names.iter().map(|n| self.kernel_crate(n)).collect();
        }
        let crates = self.kernel_crates();
        if crates.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "no kernel crates in the workspace at {}: a kernel crate's library depends on \
                 `{DEVICE_CRATE}` and its Cargo.toml declares \
                 `[package.metadata.oxccl] kernels = true`",
                self.root.display()
            )));
        }
        Ok(crates)
    }

    fn load_from(manifest_path: Option<&Path>) -> Result<Workspace> {
        let mut cmd = MetadataCommand::new();
        cmd.no_deps();
        if let Some(m) = manifest_path {
            // Absolute, since cargo runs in the manifest's directory.
            let m = std::path::absolute(m)
                .map_err(|e| Error::io(format!("resolving {}", m.display()), e))?;
            // A directory that does not exist is left to cargo to report.
            if let Some(dir) = m.parent().filter(|d| d.is_dir()) {
                cmd.current_dir(dir);
            }
            cmd.manifest_path(m);
        }
        let mut cmd = cmd.cargo_command();
        let out = output_bounded(&mut cmd, METADATA_TIME_LIMIT)
            .map_err(|e| Error::command("running `cargo metadata`", e))?;
        if !out.status.success() {
            return Err(Error::Metadata(format!(
                "`cargo metadata` failed:\n{}",
                String::from_utf8_lossy(&out.stderr).trim_end()
            )));
        }
        Self::from_json(&out.stdout)
    }
}

/// Target kinds that are a library `cargo rustc --crate-type cdylib` can build (not a
/// proc-macro).
const LIB_KINDS: &[TargetKind] = &[
    TargetKind::Lib,
    TargetKind::RLib,
    TargetKind::CDyLib,
    TargetKind::DyLib,
    TargetKind::StaticLib,
];

fn package(p: &cargo_metadata::Package) -> Package {
    let lib = p
        .targets
        .iter()
        .find(|t| t.kind.iter().any(|k| LIB_KINDS.contains(k)))
        .map(|t| {
            (
                t.name.replace('-', "_"),
                t.src_path.clone().into_std_path_buf(),
            )
        });
    let depends_on_device = p
        .dependencies
        .iter()
        .any(|d| d.name == DEVICE_CRATE && d.kind == DependencyKind::Normal);
    Package {
        name: p.name.to_string(),
        dir: p
            .manifest_path
            .parent()
            .map(|d| d.as_std_path().to_path_buf())
            .unwrap_or_default(),
        lib,
        depends_on_device,
        declares_kernels: p.metadata["oxccl"]["kernels"] == true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from `cargo metadata --format-version 1 --no-deps` on this workspace (each
    /// field `cargo_metadata` requires, and the ones the tasks read), plus a kernel crate
    /// that opts in, a crate that depends on the device crate for its tests only, and a
    /// host crate that does not opt in.
    const METADATA: &str = r#"{
      "packages": [
        {"name": "oxccl-device", "version": "0.1.0", "features": {},
         "id": "path+file:///w/device-kernels#oxccl-device@0.1.0",
         "manifest_path": "/w/device-kernels/Cargo.toml",
         "targets": [{"kind": ["rlib"], "name": "oxccl_device", "src_path": "/w/device-kernels/src/lib.rs"}],
         "dependencies": [{"name": "bytemuck", "req": "^1.16", "kind": null, "optional": false,
                           "uses_default_features": false, "features": ["derive"]}],
         "metadata": null},
        {"name": "oxccl-proxy", "version": "0.1.0", "features": {},
         "id": "path+file:///w/proxy#oxccl-proxy@0.1.0",
         "manifest_path": "/w/proxy/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "oxccl_proxy", "src_path": "/w/proxy/src/lib.rs"}],
         "dependencies": [{"name": "oxccl-device", "req": "^0.1.0", "kind": null, "optional": false,
                           "uses_default_features": true, "features": [], "path": "/w/device-kernels"}],
         "metadata": null},
        {"name": "tutorial-kernels", "version": "0.1.0", "features": {},
         "id": "path+file:///w/examples/kernels#tutorial-kernels@0.1.0",
         "manifest_path": "/w/examples/kernels/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "tutorial_kernels", "src_path": "/w/examples/kernels/src/lib.rs"},
                     {"kind": ["test"], "name": "t", "src_path": "/w/examples/kernels/tests/t.rs"}],
         "dependencies": [{"name": "oxccl-device", "req": "^0.1.0", "kind": null, "optional": false,
                           "uses_default_features": true, "features": []}],
         "metadata": {"oxccl": {"kernels": true}}},
        {"name": "dev-only", "version": "0.1.0", "features": {},
         "id": "path+file:///w/dev-only#dev-only@0.1.0",
         "manifest_path": "/w/dev-only/Cargo.toml",
         "targets": [{"kind": ["lib"], "name": "dev_only", "src_path": "/w/dev-only/src/lib.rs"}],
         "dependencies": [{"name": "oxccl-device", "req": "^0.1.0", "kind": "dev", "optional": false,
                           "uses_default_features": true, "features": []}],
         "metadata": {"oxccl": {"kernels": true}}},
        {"name": "xtask", "version": "0.1.0", "features": {},
         "id": "path+file:///w/xtask#xtask@0.1.0",
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
      "resolve": null,
      "target_directory": "/w/target",
      "version": 1,
      "workspace_root": "/w"
    }"#;

    /// Guards against building host crates or the device library itself to PTX, or missing
    /// a kernel crate: only members that depend on the device crate (not for tests only) and
    /// opt in count.
    #[test]
    fn kernel_crates_are_those_that_opt_in() {
        let ws = Workspace::from_json(METADATA.as_bytes()).unwrap();
        assert_eq!(ws.root, PathBuf::from("/w"));
        assert_eq!(ws.target_dir, PathBuf::from("/w/target"));
        let names: Vec<_> = ws.kernel_crates().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["tutorial-kernels"]);
        let k = ws.package("tutorial_kernels").unwrap();
        assert_eq!(k.lib_name(), Some("tutorial_kernels"));
        assert_eq!(k.src_dir(), Some(PathBuf::from("/w/examples/kernels/src")));
        assert!(ws.package("xtask").unwrap().lib.is_none());
    }

    /// Guards against building a crate that is not a kernel crate with an answer that does
    /// not say what it lacks: the dependency on the device crate (not for tests only), the
    /// opt-in, or a library at all.
    #[test]
    fn not_a_kernel_crate_says_what_it_lacks() {
        let ws = Workspace::from_json(METADATA.as_bytes()).unwrap();
        assert_eq!(
            ws.kernel_crate("tutorial-kernels").unwrap().name,
            "tutorial-kernels"
        );
        let err = ws.kernel_crate("dev-only").unwrap_err().to_string();
        assert!(
            err.contains("`dev-only` is not a kernel crate")
                && err.contains("must depend on `oxccl-device`")
                && !err.contains("metadata"),
            "{err}"
        );
        let err = ws.kernel_crate("oxccl-proxy").unwrap_err().to_string();
        assert!(
            err.contains("/w/proxy/Cargo.toml")
                && err.contains("`[package.metadata.oxccl] kernels = true`")
                && !err.contains("depend on"),
            "{err}"
        );
        let err = ws.kernel_crate("xtask").unwrap_err().to_string();
        assert!(err.contains("no library"), "{err}");
        let all: Vec<_> = ws.select_kernel_crates(&[]).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name, "tutorial-kernels");
        assert!(ws.select_kernel_crates(&["oxccl-proxy".into()]).is_err());
        assert!(matches!(
            ws.kernel_crate("nope"),
            Err(Error::InvalidUsage(_))
        ));
    }

    /// Guards against a `-p` typo answered without saying what the choices are.
    #[test]
    fn unknown_package_names_the_members() {
        let ws = Workspace::from_json(METADATA.as_bytes()).unwrap();
        let err = ws.package("nope").unwrap_err().to_string();
        assert!(
            err.contains("oxccl-device") && err.contains("nope"),
            "{err}"
        );
    }

    /// Guards against a panic on output that is not `cargo metadata`'s.
    #[test]
    fn bad_json_is_an_error() {
        assert!(Workspace::from_json(b"{").is_err());
        assert!(Workspace::from_json(b"{}").is_err());
        assert!(Workspace::from_json(b"\xff").is_err());
    }

    /// Guards against a fixture that drifted from what cargo prints: this workspace, read
    /// through the real `cargo metadata`, has `oxccl-kernels` as a kernel crate, and neither
    /// the device library nor the host crates.
    #[test]
    fn loads_this_workspace() {
        let ws = Workspace::load().unwrap();
        assert!(
            ws.root.join("Cargo.toml").is_file(),
            "{}",
            ws.root.display()
        );
        let device = ws.package(DEVICE_CRATE).unwrap();
        assert!(!device.is_kernel_crate());
        assert_eq!(device.lib_name(), Some("oxccl_device"));
        let kernels = ws.package("oxccl-kernels").unwrap();
        assert!(kernels.is_kernel_crate());
        assert_eq!(kernels.lib_name(), Some("oxccl_kernels"));
        let proxy = ws.package("oxccl-proxy").unwrap();
        assert!(proxy.depends_on_device && !proxy.is_kernel_crate());
        assert!(ws.package("xtask").unwrap().lib.is_none());
    }

    /// Guards against a relative `--manifest-path` read from the wrong directory (cargo runs
    /// in the manifest's own), and against a member's manifest not leading to its workspace.
    #[test]
    fn loads_a_workspace_from_a_member_manifest() {
        // Tests run in this crate's directory.
        let ws =
            Workspace::load_manifest(Path::new("../device-kernels/kernels/Cargo.toml")).unwrap();
        assert!(ws.root.join("build/Cargo.toml").is_file(), "{:?}", ws.root);
        assert!(ws.kernel_crate("oxccl-kernels").is_ok());
        let err = Workspace::load_manifest(Path::new("no/such/Cargo.toml")).unwrap_err();
        assert!(matches!(err, Error::Metadata(_)), "{err:?}");
    }
}
