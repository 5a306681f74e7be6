//! Building a kernel crate to a PTX module for one GPU architecture.
//!
//! [`Ptx::build`] runs, in the root of the crate's workspace,
//!
//! ```text
//! RUSTC_BOOTSTRAP=1 RUSTFLAGS="-C target-cpu=<arch> -Zmir-enable-passes=-JumpThreading" \
//!     CARGO_PROFILE_RELEASE_DEBUG=0 cargo rustc -p <crate> --release \
//!     --target nvptx64-nvidia-cuda -Zbuild-std=core --crate-type cdylib \
//!     --target-dir <target>/nvptx/<arch>
//! ```
//!
//! then copies llvm-bitcode-linker's `<crate>.ptx` to `<target>/ptx/<arch>/<crate>.ptx` (the
//! crate name with underscores), where `oxccl::ptx::locate` finds it. Each architecture has
//! its own cargo target directory, so building one does not invalidate another, and none is
//! the directory of the host build, so a build script may run it without waiting for the
//! lock its own build holds.
//!
//! Why each part:
//! - `RUSTC_BOOTSTRAP=1`: the nvptx `rust-std` is not distributed, so `core` is built from
//!   `rust-src` (`-Zbuild-std`), and kernels use the unstable `"ptx-kernel"` ABI; this lets a
//!   stable toolchain do both, for this build only.
//! - `--crate-type cdylib`: llvm-bitcode-linker links a cdylib into one PTX module holding
//!   every exported kernel; the crate itself stays an `rlib`, which the CPU emulator links.
//! - MIR jump threading is off because it can break block barriers (see [`rustflags`]).

use crate::arch::{TARGET, arch_number, validate_arch};
use crate::bounded::run_bounded;
use crate::error::{Error, Result};
use crate::tool::Tool;
use crate::toolchain::{COMPONENTS, require_components};
use crate::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longest one `cargo rustc` of a kernel crate for one architecture may take by default.
/// From a cold cache it builds `core` too, a few minutes on two cores; past the limit the
/// build is killed with everything it started and [`Ptx::build`] fails naming the crate and
/// the architecture.
pub const BUILD_TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// A kernel crate to build to PTX for one architecture: what [`Ptx::build`] needs, set
/// step by step.
///
/// ```no_run
/// // In a build script or a tool: my-kernels is a member of the workspace found from the
/// // current directory (for a build script, its package's directory).
/// let ptx = oxccl_build::Ptx::new("my-kernels").arch("sm_90").build()?;
/// println!("cargo:warning=kernels in {}", ptx.display());
/// # Ok::<(), oxccl_build::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Ptx {
    package: String,
    manifest_path: Option<PathBuf>,
    arch: String,
    target_dir: Option<PathBuf>,
    out_dir: Option<PathBuf>,
    time_limit: Duration,
}

impl Ptx {
    /// The kernel crate `package` (package name, or its library's crate name), in the
    /// workspace of the current directory, for [`MIN_ARCH`](crate::arch::MIN_ARCH).
    pub fn new(package: impl Into<String>) -> Ptx {
        Ptx {
            package: package.into(),
            manifest_path: None,
            arch: crate::arch::MIN_ARCH.to_string(),
            target_dir: None,
            out_dir: None,
            time_limit: BUILD_TIME_LIMIT,
        }
    }

    /// Finds the crate in the workspace of this manifest instead (the crate's own
    /// `Cargo.toml`, or its workspace's), as `cargo --manifest-path` would.
    pub fn manifest_path(mut self, path: impl Into<PathBuf>) -> Ptx {
        self.manifest_path = Some(path.into());
        self
    }

    /// Builds for `arch` (`sm_90`; see [`crate::arch`]).
    pub fn arch(mut self, arch: impl Into<String>) -> Ptx {
        self.arch = arch.into();
        self
    }

    /// Uses `dir` instead of the workspace's target directory: cargo builds in
    /// `<dir>/nvptx/<arch>`, and the module goes to `<dir>/ptx/<arch>/` unless
    /// [`out_dir`](Ptx::out_dir) says otherwise.
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Ptx {
        self.target_dir = Some(dir.into());
        self
    }

    /// Writes the module to `<dir>/<arch>/<crate>.ptx` instead of `<target>/ptx/<arch>/`
    /// (`OXCCL_PTX_DIR` tells `oxccl::ptx::locate` to look there).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Ptx {
        self.out_dir = Some(dir.into());
        self
    }

    /// Gives the cargo build `limit` instead of [`BUILD_TIME_LIMIT`].
    pub fn time_limit(mut self, limit: Duration) -> Ptx {
        self.time_limit = limit;
        self
    }

    /// Builds the crate and returns the path of its PTX module.
    ///
    /// Reads the workspace with `cargo metadata` first; [`Ptx::build_in`] takes one
    /// already read, for building several crates or architectures.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidUsage`]: the architecture is not supported, or the package is not
    ///   a kernel crate of the workspace (the message says what it lacks);
    /// - [`Error::MissingComponents`]: rustup components are missing (the message says
    ///   which, and the command that adds them);
    /// - [`Error::Command`]: `cargo metadata` or the build failed or ran past its limit;
    /// - [`Error::NoPtx`], [`Error::Io`]: the module was not produced or not copied;
    /// - [`Error::Metadata`]: cargo could not read the workspace.
    pub fn build(&self) -> Result<PathBuf> {
        // Before reading the workspace: a typo fails at once.
        validate_arch(&self.arch)?;
        let ws = match &self.manifest_path {
            Some(m) => Workspace::load_manifest(m)?,
            None => Workspace::load()?,
        };
        self.build_in(&ws)
    }

    /// Like [`Ptx::build`], in the workspace `ws` (read with [`Workspace::load`] or
    /// [`Workspace::load_manifest`]; [`manifest_path`](Ptx::manifest_path) is not used).
    ///
    /// # Errors
    ///
    /// As [`Ptx::build`].
    pub fn build_in(&self, ws: &Workspace) -> Result<PathBuf> {
        let arch = &self.arch;
        validate_arch(arch)?;
        let pkg = ws.kernel_crate(&self.package)?;
        let lib = pkg.lib_name().unwrap_or(&pkg.name);
        require_components(COMPONENTS)?;
        let target_dir = self.target_dir.as_deref().unwrap_or(&ws.target_dir);
        let cargo_dir = target_dir.join("nvptx").join(arch);
        let mut cmd = cargo_command(&ws.root, &pkg.name, arch, &cargo_dir);
        run_bounded(&mut cmd, self.time_limit)
            .map_err(|e| Error::command(format!("building {} for {arch}", pkg.name), e))?;

        let release = cargo_dir.join(TARGET).join("release");
        let file = format!("{lib}.ptx");
        let built = [release.join(&file), release.join("deps").join(&file)]
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| Error::NoPtx {
                package: pkg.name.clone(),
                arch: arch.clone(),
                file: file.clone(),
                dir: release.clone(),
            })?;
        let dest_dir = match &self.out_dir {
            Some(d) => d.join(arch),
            None => target_dir.join("ptx").join(arch),
        };
        std::fs::create_dir_all(&dest_dir)
            .map_err(|e| Error::io(format!("creating {}", dest_dir.display()), e))?;
        let dest = dest_dir.join(&file);
        // A cubin beside the module is ptxas's output for the module it replaces: the CUDA
        // backend would load it in preference to the new PTX, so it goes until ptxas
        // assembles the new one.
        let cubin = dest.with_extension("cubin");
        for stale in [crate::ptxas::cubin_source_hash_path(&cubin), cubin] {
            if stale.exists() {
                std::fs::remove_file(&stale)
                    .map_err(|e| Error::io(format!("removing the stale {}", stale.display()), e))?;
            }
        }
        std::fs::copy(&built, &dest).map_err(|e| {
            Error::io(
                format!("copying {} to {}", built.display(), dest.display()),
                e,
            )
        })?;
        Ok(dest)
    }
}

/// The `cargo rustc` that builds `package` of the workspace at `root` for `arch` in the
/// cargo target directory `cargo_dir` (see the module docs).
fn cargo_command(root: &Path, package: &str, arch: &str, cargo_dir: &Path) -> Command {
    let mut cmd = Tool::cargo().cmd();
    cmd.current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", rustflags(arch))
        // A release profile may ask for debug info (this workspace's has `debug = 1`). The
        // PTX is the same without it (llvm-bitcode-linker drops debug info), and the build
        // is faster.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        // Would take precedence over RUSTFLAGS; cargo sets it for build scripts.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        // Set when clippy runs the build script that runs this; the PTX is not what clippy
        // was asked to check.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .args(["rustc", "-p", package, "--release", "--target", TARGET])
        .args(["-Zbuild-std=core", "--crate-type", "cdylib", "--target-dir"])
        .arg(cargo_dir);
    // What cargo tells a build script about its own package, which the build scripts of this
    // build would otherwise read as theirs.
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("CARGO_CFG_") || k.starts_with("CARGO_FEATURE_"))
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Code generation flags for `arch`.
///
/// MIR jump threading is off: it may duplicate a block that ends in a barrier into the
/// arms of a branch, so threads of one block reach different `bar.sync` instructions, which
/// the aligned barrier forbids (a hang or worse; rust-lang/rust#137086). rustc lacks a
/// `convergent` notion in MIR to stop it, and turns the pass off for GPU targets only from
/// rust-lang/rust#149637 on. `-Z` needs `RUSTC_BOOTSTRAP`, which every build sets.
///
/// LLVM emits PTX ISA 6.0 for sm_70 and 6.1 for sm_72, but `nanosleep` (in every bounded
/// wait) needs 6.3, so ptxas rejects those modules; sm_75 and later default to 6.3 or newer.
/// The ISA is raised only where needed: asking for less than an architecture's minimum is an
/// LLVM error. rustc calls `ptx63` an unstable target feature and says so in one warning.
pub fn rustflags(arch: &str) -> String {
    let mut flags = format!("-C target-cpu={arch} -Zmir-enable-passes=-JumpThreading");
    if arch_number(arch).is_some_and(|n| n < 75) {
        flags.push_str(" -C target-feature=+ptx63");
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::show;
    use std::ffi::OsStr;

    /// Guards against a block barrier split across call sites: MIR jump threading can copy
    /// a `bar.sync` into both arms of a branch (rust-lang/rust#137086), so each
    /// architecture's build must turn the pass off, and `-Z` flags need `RUSTC_BOOTSTRAP`,
    /// which every build sets.
    #[test]
    fn mir_jump_threading_is_off_for_every_arch() {
        for arch in ["sm_70", "sm_75", "sm_80", "sm_90", "sm_90a", "sm_120"] {
            let flags = rustflags(arch);
            let words: Vec<&str> = flags.split_whitespace().collect();
            assert!(
                words.contains(&"-Zmir-enable-passes=-JumpThreading"),
                "{arch}: {flags}"
            );
            assert!(
                words.contains(&format!("target-cpu={arch}").as_str()),
                "{arch}: {flags}"
            );
        }
    }

    /// Guards against sm_70/sm_72 modules that ptxas rejects (`nanosleep` needs PTX ISA
    /// 6.3), and against asking newer architectures for less than their minimum ISA.
    #[test]
    fn ptx_isa_is_raised_only_below_sm_75() {
        const NO_JT: &str = "-Zmir-enable-passes=-JumpThreading";
        assert_eq!(
            rustflags("sm_70"),
            format!("-C target-cpu=sm_70 {NO_JT} -C target-feature=+ptx63")
        );
        assert_eq!(
            rustflags("sm_72"),
            format!("-C target-cpu=sm_72 {NO_JT} -C target-feature=+ptx63")
        );
        assert_eq!(rustflags("sm_75"), format!("-C target-cpu=sm_75 {NO_JT}"));
        assert_eq!(rustflags("sm_90a"), format!("-C target-cpu=sm_90a {NO_JT}"));
    }

    /// Guards against a build that a stable toolchain refuses (no `RUSTC_BOOTSTRAP`), that
    /// links no PTX (not a cdylib), that shares its target directory with the host build
    /// (a build script would wait for its own lock), or whose flags an outer cargo's
    /// `CARGO_ENCODED_RUSTFLAGS` silently replaces.
    #[test]
    fn the_cargo_command() {
        let cmd = cargo_command(
            Path::new("/w"),
            "my-kernels",
            "sm_90",
            Path::new("/w/target/nvptx/sm_90"),
        );
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/w")));
        let args: Vec<&OsStr> = cmd.get_args().collect();
        assert_eq!(
            args,
            [
                "rustc",
                "-p",
                "my-kernels",
                "--release",
                "--target",
                "nvptx64-nvidia-cuda",
                "-Zbuild-std=core",
                "--crate-type",
                "cdylib",
                "--target-dir",
                "/w/target/nvptx/sm_90"
            ]
        );
        let env = |k: &str| {
            cmd.get_envs()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
        };
        assert_eq!(env("RUSTC_BOOTSTRAP"), Some(Some("1".into())));
        assert_eq!(env("RUSTFLAGS"), Some(Some(rustflags("sm_90"))));
        assert_eq!(env("CARGO_PROFILE_RELEASE_DEBUG"), Some(Some("0".into())));
        // Removed, not set: `Some(None)`.
        assert_eq!(env("CARGO_ENCODED_RUSTFLAGS"), Some(None));
        assert_eq!(env("RUSTC_WORKSPACE_WRAPPER"), Some(None));
        assert!(show(&cmd).contains(
            "cargo rustc -p my-kernels --release --target nvptx64-nvidia-cuda \
             -Zbuild-std=core --crate-type cdylib --target-dir /w/target/nvptx/sm_90"
        ));
    }

    /// Guards against a bad architecture or a crate that is not a kernel crate reaching
    /// cargo (a long build, then an obscure error): both are refused before anything runs.
    #[test]
    fn bad_arguments_are_refused_before_building() {
        let ws = Workspace {
            root: PathBuf::from("/nonexistent"),
            target_dir: PathBuf::from("/nonexistent/target"),
            packages: vec![crate::Package {
                name: "host-only".into(),
                dir: PathBuf::from("/nonexistent/host-only"),
                lib: Some(("host_only".into(), PathBuf::from("src/lib.rs"))),
                depends_on_device: true,
                declares_kernels: false,
            }],
        };
        let err = Ptx::new("host-only")
            .arch("sm_60")
            .build_in(&ws)
            .unwrap_err();
        assert!(err.to_string().contains("below sm_70"), "{err}");
        let err = Ptx::new("host-only")
            .arch("sm_90")
            .build_in(&ws)
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidUsage(m) if m.contains("not a kernel crate")),
            "{err}"
        );
        let err = Ptx::new("nope").build_in(&ws).unwrap_err();
        assert!(err.to_string().contains("members: host-only"), "{err}");
    }
}
