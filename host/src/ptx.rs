//! Finding the PTX of kernel crates, so the CUDA backend loads kernels without the user
//! copying files.
//!
//! `cargo xtask build-ptx` writes one PTX module per kernel crate and GPU architecture to
//! `<target dir>/ptx/<arch>/<crate>.ptx`, the crate name with underscores
//! (`target/ptx/sm_90/oxccl_kernels.ptx`). [`locate`] looks for `<arch>/<crate>.ptx` under
//! these directories, in order, and takes the first file that exists:
//!
//! 1. `$OXCCL_PTX_DIR`: for deployments. Copy `target/ptx` anywhere and point the variable
//!    at it; it wins over everything else, so it also overrides a stale build.
//! 2. `$CARGO_TARGET_DIR/ptx`: cargo passes the variable on to the programs and tests it runs,
//!    so a custom target directory works under `cargo run` and `cargo test`.
//! 3. `<target>/ptx`, where `<target>` is the nearest ancestor of the running executable that
//!    is a cargo target directory (named `target`, or holding the `CACHEDIR.TAG` cargo writes
//!    into every target directory). This is how `cargo run`, `cargo test` and binaries left
//!    in `target/release` find the PTX with no setup at all.
//!
//! The files are found at run time by default rather than embedded: the PTX is built by a
//! separate cargo invocation for another target, which a build script of this crate could
//! only start by running cargo recursively inside a build (slow, and fragile with the build
//! lock); and one host binary then serves every architecture without carrying them all.
//! With the `embed-ptx` feature the build script embeds what an earlier `build-ptx` left
//! ([`crate::embedded_ptx`]), which the CUDA backend takes where no file is found.
//!
//! A PTX module built for `sm_80` also runs on later GPUs (the driver compiles it for the
//! device when loading), never on earlier ones. [`locate_for_device`] picks the newest
//! architecture a device can run.
//!
//! That compilation is slow for a large crate (the collectives' module takes the driver
//! over a minute, once per machine until its cache is cleared), so `cargo xtask build-ptx
//! --check` also assembles each module with ptxas into `<arch>/<crate>.cubin`, machine code
//! the driver loads as it is. [`locate_cubin_for_device`] finds one a device runs: built
//! for the same major architecture, at a minor one no newer than the device's, and of the
//! PTX beside it: not older by its file time, or, where it is (a copy that did not keep
//! file times), assembled from that PTX by the SHA-256 recorded beside it
//! ([`cubin_source_hash_path`]).

pub use crate::ptx_files::cubin_source_hash_path;
use crate::ptx_files::{assembled_from, enclosing_target_dir};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable naming a directory laid out as `<arch>/<crate>.ptx`, searched first.
pub const PTX_DIR_ENV: &str = "OXCCL_PTX_DIR";

/// No PTX file was found for a crate and architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxNotFound {
    /// Crate name, with underscores (`oxccl_kernels`).
    pub crate_name: String,
    /// Architecture asked for (`sm_90`), or a description such as `sm_90 or older`.
    pub arch: String,
    /// Every file path tried, in search order; empty if the names were not valid.
    pub searched: Vec<PathBuf>,
}

impl fmt::Display for PtxNotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.searched.is_empty() {
            return write!(
                f,
                "no PTX for crate `{}`, architecture `{}`: not a valid crate and architecture \
                 name (expected e.g. `oxccl_kernels` and `sm_90`)",
                self.crate_name, self.arch
            );
        }
        write!(
            f,
            "no PTX for crate `{}`, architecture {}; searched:",
            self.crate_name, self.arch
        )?;
        for p in &self.searched {
            write!(f, "\n  {}", p.display())?;
        }
        write!(
            f,
            "\nbuild it with `cargo xtask build-ptx` in the oxccl workspace, or with \
             `oxccl-build --package {} --arch <arch>` for a kernel crate of your own (or set \
             {PTX_DIR_ENV} to a directory holding <arch>/{}.ptx)",
            self.crate_name, self.crate_name
        )
    }
}

impl std::error::Error for PtxNotFound {}

/// Why [`load`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    /// No file was found.
    #[error(transparent)]
    NotFound(#[from] PtxNotFound),
    /// The file was found but could not be read.
    #[error("reading PTX {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The path of the PTX module of `crate_name` (`oxccl-kernels` or `oxccl_kernels`) for `arch`
/// (`sm_90`), searched as the module docs describe.
///
/// # Errors
/// [`PtxNotFound`], listing every path tried, if no file exists.
pub fn locate(crate_name: &str, arch: &str) -> Result<PathBuf, PtxNotFound> {
    locate_in(&search_dirs(), crate_name, arch)
}

/// The text of the PTX module of `crate_name` for `arch`, found with [`locate`].
///
/// # Errors
/// [`PtxError::NotFound`] if no file exists, [`PtxError::Read`] if it cannot be read.
pub fn load(crate_name: &str, arch: &str) -> Result<String, PtxError> {
    let path = locate(crate_name, arch)?;
    std::fs::read_to_string(&path).map_err(|source| PtxError::Read { path, source })
}

/// The PTX of `crate_name` for the newest architecture a device of compute capability
/// `major.minor` can run (`sm_XY` with `XY <= major * 10 + minor`), and that architecture.
/// Within the first search directory that has any such module, the newest one wins.
///
/// # Errors
/// [`PtxNotFound`] if no search directory has a module the device can run.
pub fn locate_for_device(
    crate_name: &str,
    major: u32,
    minor: u32,
) -> Result<(PathBuf, String), PtxNotFound> {
    locate_for_device_in(&search_dirs(), crate_name, major * 10 + minor)
}

/// The directories searched, in order, each laid out as `<arch>/<crate>.ptx`.
pub fn search_dirs() -> Vec<PathBuf> {
    search_dirs_from(|k| std::env::var_os(k), std::env::current_exe().ok())
}

/// The file name of a crate's PTX module: `oxccl_kernels.ptx` for `oxccl-kernels`.
pub fn file_name(crate_name: &str) -> String {
    format!("{}.ptx", crate_name.replace('-', "_"))
}

/// [`search_dirs`] from an environment lookup and the executable's path.
fn search_dirs_from(env: impl Fn(&str) -> Option<OsString>, exe: Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut add = |d: PathBuf| {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    };
    if let Some(d) = env(PTX_DIR_ENV).filter(|d| !d.is_empty()) {
        add(PathBuf::from(d));
    }
    if let Some(d) = env("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        add(PathBuf::from(d).join("ptx"));
    }
    if let Some(target) = exe.as_deref().and_then(enclosing_target_dir) {
        add(target.join("ptx"));
    }
    dirs
}

fn locate_in(dirs: &[PathBuf], crate_name: &str, arch: &str) -> Result<PathBuf, PtxNotFound> {
    let crate_name = crate_name.replace('-', "_");
    let not_found = |searched| PtxNotFound {
        crate_name: crate_name.clone(),
        arch: format!("`{arch}`"),
        searched,
    };
    if !valid_name(&crate_name) || !valid_name(arch) {
        return Err(PtxNotFound {
            arch: arch.to_string(),
            ..not_found(Vec::new())
        });
    }
    let candidates: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join(arch).join(file_name(&crate_name)))
        .collect();
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(not_found(candidates)),
    }
}

/// The cubin (ptxas output) of `crate_name` that a device of compute capability
/// `major.minor` runs as it is, and its architecture: `sm_XY` with `X == major` and
/// `Y <= minor`, the newest such in the first search directory that has one. `None` if
/// there is none (the PTX is then compiled by the driver).
pub fn locate_cubin_for_device(
    crate_name: &str,
    major: u32,
    minor: u32,
) -> Option<(PathBuf, String)> {
    locate_cubin_in(&search_dirs(), crate_name, major, minor)
}

fn locate_cubin_in(
    dirs: &[PathBuf],
    crate_name: &str,
    major: u32,
    minor: u32,
) -> Option<(PathBuf, String)> {
    let crate_name = crate_name.replace('-', "_");
    if !valid_name(&crate_name) {
        return None;
    }
    let file = format!("{crate_name}.cubin");
    // Machine code runs only within its major architecture.
    dirs.iter()
        .find_map(|dir| newest_in(dir, &file, |n| cubin_runs_on(n, major, minor), current))
}

/// The number `XY` of a plain architecture `sm_XY` (`90` for `sm_90`); `None` for other
/// names, `sm_90a` and the like among them (their code runs on that one GPU alone).
pub(crate) fn arch_number(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_")?.parse().ok()
}

/// Whether PTX for architecture number `arch` runs on a device of compute capability
/// `capability` (`major * 10 + minor`): the driver compiles it for any device as new or
/// newer.
pub(crate) fn ptx_runs_on(arch: u32, capability: u32) -> bool {
    arch <= capability
}

/// Whether a cubin for architecture number `arch` runs on a device of compute capability
/// `major.minor`: machine code runs only within its major architecture, on the same minor
/// or a later one.
pub(crate) fn cubin_runs_on(arch: u32, major: u32, minor: u32) -> bool {
    arch / 10 == major && arch % 10 <= minor
}

/// In `dir` laid out as `<arch>/<file>`, the newest plain `sm_XY` whose number `XY`
/// `accept`s and whose `<file>` is `usable`: that file and its architecture. `sm_90a` and
/// the like are skipped: their code runs on that one GPU alone, not on later ones.
fn newest_in(
    dir: &Path,
    file: &str,
    accept: impl Fn(u32) -> bool,
    usable: impl Fn(&Path) -> bool,
) -> Option<(PathBuf, String)> {
    let mut best: Option<(u32, String, PathBuf)> = None;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let arch = entry.file_name().to_string_lossy().into_owned();
        let Some(n) = arch_number(&arch) else {
            continue;
        };
        let path = entry.path().join(file);
        if accept(n) && best.as_ref().is_none_or(|(b, ..)| n > *b) && usable(&path) {
            best = Some((n, arch, path));
        }
    }
    best.map(|(_, arch, path)| (path, arch))
}

/// Whether `cubin` exists and is of the PTX beside it, if any: not older than it, or
/// assembled from it as the hash recorded beside the cubin says (a PTX rebuilt since the
/// cubin was assembled wins: the cubin is of older code).
fn current(cubin: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let ptx = cubin.with_extension("ptx");
    match (modified(cubin), modified(&ptx)) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(c), Some(p)) if c >= p => true,
        // Read and hashed only here: most loads find the file times in order.
        (Some(_), Some(_)) => std::fs::read(&ptx).is_ok_and(|p| assembled_from(cubin, &p)),
    }
}

fn locate_for_device_in(
    dirs: &[PathBuf],
    crate_name: &str,
    capability: u32,
) -> Result<(PathBuf, String), PtxNotFound> {
    let crate_name = crate_name.replace('-', "_");
    let file = file_name(&crate_name);
    let mut searched = Vec::new();
    if valid_name(&crate_name) {
        for dir in dirs {
            if let Some(found) =
                newest_in(dir, &file, |n| ptx_runs_on(n, capability), Path::is_file)
            {
                return Ok(found);
            }
            searched.push(dir.join(format!("sm_*/{file}")));
        }
    }
    Err(PtxNotFound {
        crate_name,
        arch: format!("sm_{capability} or older"),
        searched,
    })
}

/// A crate or architecture name usable as one path component.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let d = std::env::temp_dir().join(format!(
                "oxccl-ptx-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }

        fn put(&self, rel: &str, text: &str) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn env_of(vars: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn ptx_dir_env_wins_over_the_build() {
        // Guards against a stale build shadowing the PTX a deployment points at.
        let deploy = TempDir::new();
        let target = TempDir::new();
        let wanted = deploy.put("sm_90/oxccl_kernels.ptx", "deployed");
        target.put("ptx/sm_90/oxccl_kernels.ptx", "built");
        let dirs = search_dirs_from(
            env_of(&[(PTX_DIR_ENV, &deploy.0), ("CARGO_TARGET_DIR", &target.0)]),
            None,
        );
        assert_eq!(dirs, [deploy.0.clone(), target.0.join("ptx")]);
        assert_eq!(locate_in(&dirs, "oxccl-kernels", "sm_90").unwrap(), wanted);
    }

    #[test]
    fn falls_back_to_later_directories() {
        let deploy = TempDir::new();
        let target = TempDir::new();
        deploy.put("sm_80/oxccl_kernels.ptx", "other arch");
        let built = target.put("ptx/sm_90/oxccl_kernels.ptx", "built");
        let dirs = [deploy.0.clone(), target.0.join("ptx")];
        assert_eq!(locate_in(&dirs, "oxccl_kernels", "sm_90").unwrap(), built);
    }

    #[test]
    fn finds_the_target_dir_above_the_executable() {
        // `cargo test` runs target/debug/deps/<test>; `cargo run` runs target/release/<bin>.
        let root = TempDir::new();
        let exe = root.put("target/debug/deps/oxccl-0123abcd", "");
        let built = root.put("target/ptx/sm_70/oxccl_kernels.ptx", "built");
        let dirs = search_dirs_from(env_of(&[]), Some(exe));
        assert_eq!(dirs, [root.0.join("target/ptx")]);
        assert_eq!(locate_in(&dirs, "oxccl_kernels", "sm_70").unwrap(), built);

        // A target directory with another name is recognized by cargo's CACHEDIR.TAG.
        let custom = TempDir::new();
        custom.put(
            "build-out/CACHEDIR.TAG",
            "Signature: 8a477f597d28d172789f06886806bc55",
        );
        let exe = custom.put("build-out/release/examples/allreduce", "");
        let dirs = search_dirs_from(env_of(&[]), Some(exe));
        assert_eq!(dirs, [custom.0.join("build-out/ptx")]);
    }

    #[test]
    fn not_found_lists_the_paths_and_the_command() {
        let a = TempDir::new();
        let b = TempDir::new();
        let err = locate_in(&[a.0.clone(), b.0.clone()], "oxccl-kernels", "sm_90").unwrap_err();
        assert_eq!(
            err.searched,
            [
                a.0.join("sm_90/oxccl_kernels.ptx"),
                b.0.join("sm_90/oxccl_kernels.ptx")
            ]
        );
        let msg = err.to_string();
        assert!(msg.contains("cargo xtask build-ptx"), "{msg}");
        assert!(msg.contains(&a.0.join("sm_90/oxccl_kernels.ptx").display().to_string()));
        assert!(msg.contains(PTX_DIR_ENV), "{msg}");
    }

    #[test]
    fn names_that_are_not_one_path_component_are_refused() {
        // Guards against `../` in an arch string reading files outside the PTX directories.
        let d = TempDir::new();
        d.put("x.ptx", "");
        for (krate, arch) in [("oxccl_kernels", "../x"), ("../x", "sm_90"), ("", "sm_90")] {
            let err = locate_in(&[d.0.join("sm_90")], krate, arch).unwrap_err();
            assert!(err.searched.is_empty());
            assert!(err.to_string().contains("not a valid"), "{err}");
        }
    }

    #[test]
    fn load_reports_a_missing_module() {
        // `load` uses the real search path; with no build for this made-up crate it must
        // return an error naming the command, never panic.
        match load("oxccl_no_such_crate", "sm_90") {
            Err(PtxError::NotFound(e)) => {
                assert!(e.to_string().contains("cargo xtask build-ptx"));
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn device_gets_the_newest_architecture_it_can_run() {
        let d = TempDir::new();
        d.put("sm_70/oxccl_kernels.ptx", "70");
        let p80 = d.put("sm_80/oxccl_kernels.ptx", "80");
        d.put("sm_90/oxccl_kernels.ptx", "90");
        d.put("sm_90a/oxccl_kernels.ptx", "90a");
        d.put("sm_86/other.ptx", "other crate");
        let dirs = [d.0.clone()];
        // An sm_86 GPU runs sm_80 code, not sm_90 code.
        assert_eq!(
            locate_for_device_in(&dirs, "oxccl-kernels", 86).unwrap(),
            (p80, "sm_80".to_string())
        );
        assert_eq!(
            locate_for_device_in(&dirs, "oxccl_kernels", 90).unwrap().1,
            "sm_90"
        );
        let err = locate_for_device_in(&dirs, "oxccl_kernels", 61).unwrap_err();
        assert_eq!(err.arch, "sm_61 or older");
        assert!(err.to_string().contains("cargo xtask build-ptx"));
    }

    /// Guards against loading machine code a device cannot run (another major
    /// architecture, or a newer minor one), or missing the one it can.
    #[test]
    fn device_gets_a_cubin_of_its_own_major_architecture() {
        let d = TempDir::new();
        d.put("sm_70/oxccl_kernels.cubin", "70");
        let c80 = d.put("sm_80/oxccl_kernels.cubin", "80");
        d.put("sm_90/oxccl_kernels.ptx", "90 ptx only");
        d.put("sm_90a/oxccl_kernels.cubin", "90a");
        let dirs = [d.0.clone()];
        assert_eq!(
            locate_cubin_in(&dirs, "oxccl-kernels", 8, 6),
            Some((c80.clone(), "sm_80".to_string()))
        );
        assert_eq!(
            locate_cubin_in(&dirs, "oxccl_kernels", 8, 0),
            Some((c80, "sm_80".into()))
        );
        // An sm_90 device has PTX only; sm_80 machine code does not run on it.
        assert_eq!(locate_cubin_in(&dirs, "oxccl_kernels", 9, 0), None);
        // Same major, older minor: an sm_75 device runs sm_70 machine code.
        assert_eq!(
            locate_cubin_in(&dirs, "oxccl_kernels", 7, 5).unwrap().1,
            "sm_70"
        );
        assert_eq!(locate_cubin_in(&dirs, "oxccl_kernels", 6, 1), None);
        assert_eq!(locate_cubin_in(&dirs, "../x", 8, 0), None);
        // A PTX rebuilt after its cubin was assembled: the cubin is of older code.
        std::thread::sleep(std::time::Duration::from_millis(20));
        d.put("sm_80/oxccl_kernels.ptx", "80, rebuilt");
        assert_eq!(locate_cubin_in(&dirs, "oxccl_kernels", 8, 6), None);
    }

    /// Guards against a cubin passed over for its file time alone (a copy that does not
    /// keep file times can make it older than its PTX; the driver then compiles the PTX,
    /// for minutes), and against one trusted for a record of another PTX. The record is
    /// written as `oxccl-build` writes it.
    #[test]
    fn a_cubin_older_than_its_ptx_is_used_if_assembled_from_it() {
        let d = TempDir::new();
        let cubin = d.put("sm_80/oxccl_kernels.cubin", "machine code");
        let ptx = d.put("sm_80/oxccl_kernels.ptx", "the module");
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&cubin)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        let dirs = [d.0.clone()];
        let found = || locate_cubin_in(&dirs, "oxccl_kernels", 8, 0);
        // No record: judged by its time, it is of older code.
        assert_eq!(found(), None);
        let record = cubin_source_hash_path(&cubin);
        assert_eq!(record, oxccl_build::ptxas::cubin_source_hash_path(&cubin));
        std::fs::write(&record, oxccl_build::ptxas::source_hash(b"the module")).unwrap();
        assert_eq!(found(), Some((cubin.clone(), "sm_80".to_string())));
        // A PTX of other code beside it.
        std::fs::write(&ptx, "the module, changed").unwrap();
        assert_eq!(found(), None);
        // A record that is not a hash at all.
        std::fs::write(&ptx, "the module").unwrap();
        std::fs::write(&record, "x".repeat(4096)).unwrap();
        assert_eq!(found(), None);
    }
}
