//! `ptxas`: where it comes from, running it, and what its `-v` report says.
//!
//! `ptxas` assembles PTX to machine code without a GPU, so it tells whether the PTX a CUDA
//! driver would load is valid, and what each kernel costs in registers, spills and shared
//! memory. It comes from the PyPI wheel `nvidia-cuda-nvcc-cu12==12.9.86` (12.x still accepts
//! `sm_70`, which ptxas 13 dropped), installed on first use into a private virtualenv under
//! the target directory (`<target>/ptxas-venv`, which needs `python3` with `venv` and
//! network access to PyPI). `OXCCL_PTXAS=/path/to/ptxas` uses another one (a CUDA 12
//! installation's, say) and installs nothing.
//!
//! Each step of the installation and each ptxas run has a time limit, so that a network or
//! a tool that hangs fails with the command it was running instead of holding the build.

use crate::arch::validate_arch;
use crate::bounded::{CommandError, output_bounded, run_bounded};
use crate::error::{Error, Result};
use crate::tool::{Tool, is_ci, is_root};
use crate::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Environment variable naming a ptxas to use instead of installing one.
pub const PTXAS_ENV: &str = "OXCCL_PTXAS";

/// The wheel that provides ptxas.
pub const WHEEL: &str = "nvidia-cuda-nvcc-cu12==12.9.86";

/// Longest one ptxas run (one module, one architecture) may take by default; it takes
/// seconds.
pub const RUN_TIME_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Longest `python3 -m venv` may take (it installs pip from a wheel Python ships).
pub const VENV_TIME_LIMIT: Duration = Duration::from_secs(3 * 60);

/// Longest `pip install` of [`WHEEL`] may take: it downloads about 40 MB from PyPI.
pub const PIP_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

/// Longest each `apt-get` (update, then install python3-venv) may take, in CI as root only.
pub const APT_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

/// Assembles the PTX module `ptx` for `arch` and returns what ptxas reported for each
/// function, kernels (`is_entry`) and device functions alike, in ptxas's order; the cubin is
/// left beside the module (`<crate>.cubin`, for `cuobjdump -sass`).
///
/// ptxas is `$OXCCL_PTXAS`, else the one installed into the target directory of the
/// workspace of the current directory (see [`Ptxas::locate`]), the directory that
/// [`Ptx::build`](crate::Ptx::build) builds in by default.
///
/// ```no_run
/// let ptx = oxccl_build::Ptx::new("my-kernels").arch("sm_90").build()?;
/// for f in oxccl_build::assemble_check(&ptx, "sm_90")? {
///     if f.is_entry {
///         println!("{}: {:?} registers, spills: {}", f.name, f.registers, f.spills());
///     }
/// }
/// # Ok::<(), oxccl_build::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::PtxasRejected`] with ptxas's error lines if the module is not valid PTX for
/// `arch`; [`Error::PtxasUnavailable`] or [`Error::Command`] if ptxas cannot be found or
/// installed; [`Error::InvalidUsage`] for a bad architecture name.
pub fn assemble_check(ptx: &Path, arch: &str) -> Result<Vec<FunctionStats>> {
    validate_arch(arch)?;
    let ptxas = match Ptxas::from_env() {
        Some(p) => p?,
        None => Ptxas::locate(&Workspace::load()?.target_dir)?,
    };
    ptxas.assemble(ptx, arch, &ptx.with_extension("cubin"))
}

/// A ptxas program, and how long one run of it may take.
#[derive(Clone, Debug)]
pub struct Ptxas {
    path: PathBuf,
    time_limit: Duration,
}

impl Ptxas {
    /// `$OXCCL_PTXAS` if set, else the ptxas of [`WHEEL`] in `<target_dir>/ptxas-venv`,
    /// which is installed first if it is not there yet (or holds another wheel).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUsage`] if `OXCCL_PTXAS` is not a file; [`Error::Command`] if the
    /// virtualenv cannot be made or the wheel not installed (no network, no `python3-venv`:
    /// the message says what to install); [`Error::PtxasUnavailable`] if the wheel holds
    /// no ptxas.
    pub fn locate(target_dir: &Path) -> Result<Ptxas> {
        if let Some(p) = Ptxas::from_env() {
            return p;
        }
        let venv = target_dir.join("ptxas-venv");
        // Names the wheel the venv holds, so changing `WHEEL` reinstalls instead of keeping an
        // older ptxas.
        let marker = venv.join("oxccl-wheel.txt");
        let current = std::fs::read_to_string(&marker).is_ok_and(|w| w.trim() == WHEEL);
        if let (true, Some(p)) = (current, find_in_venv(&venv)) {
            return Ok(Ptxas::at(p));
        }
        println!(
            "oxccl-build: installing ptxas ({WHEEL}) into {}",
            venv.display()
        );
        let pip = venv.join("bin").join("pip");
        if !pip.is_file() {
            make_venv(&venv)?;
        }
        run_bounded(
            Command::new(&pip).args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                WHEEL,
            ]),
            PIP_TIME_LIMIT,
        )
        .map_err(|e| {
            Error::command(
                format!("installing {WHEEL} (needs network access to PyPI)"),
                e,
            )
        })?;
        std::fs::write(&marker, WHEEL)
            .map_err(|e| Error::io(format!("writing {}", marker.display()), e))?;
        find_in_venv(&venv).map(Ptxas::at).ok_or_else(|| {
            Error::PtxasUnavailable(format!(
                "{WHEEL} installed, but no ptxas under \
                 {}/lib/python3.*/site-packages/nvidia/cuda_nvcc/bin",
                venv.display()
            ))
        })
    }

    /// The ptxas at `path`, as it is (12.x for `sm_70`; 13 dropped it).
    pub fn at(path: impl Into<PathBuf>) -> Ptxas {
        Ptxas {
            path: path.into(),
            time_limit: RUN_TIME_LIMIT,
        }
    }

    /// Gives each run `limit` instead of [`RUN_TIME_LIMIT`].
    pub fn time_limit(mut self, limit: Duration) -> Ptxas {
        self.time_limit = limit;
        self
    }

    /// The program.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `ptxas -arch=<arch> -v` on `ptx`, writing the cubin to `cubin` and the SHA-256
    /// of the PTX beside it (see [`cubin_source_hash_path`]), and returns what it reported
    /// for each function (see [`parse_verbose`]).
    ///
    /// # Errors
    ///
    /// [`Error::PtxasRejected`] with ptxas's error lines if it rejects the PTX;
    /// [`Error::Command`] if it cannot start or runs past its time limit; [`Error::Io`] if
    /// the PTX cannot be read or the hash written.
    pub fn assemble(&self, ptx: &Path, arch: &str, cubin: &Path) -> Result<Vec<FunctionStats>> {
        // Hashed before ptxas reads it, so the hash is never of a later PTX than the cubin.
        let source =
            std::fs::read(ptx).map_err(|e| Error::io(format!("reading {}", ptx.display()), e))?;
        let hash_path = cubin_source_hash_path(cubin);
        // No hash of an older cubin may outlive it, whatever ptxas does below.
        match std::fs::remove_file(&hash_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("removing {}", hash_path.display()), e));
            }
            _ => {}
        }
        let mut cmd = Command::new(&self.path);
        cmd.arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(ptx)
            .arg("-o")
            .arg(cubin);
        let out = output_bounded(&mut cmd, self.time_limit)
            .map_err(|e| Error::command(format!("assembling {} for {arch}", ptx.display()), e))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let errs = errors(&stderr);
            let shown = if errs.is_empty() {
                stderr.trim().to_string()
            } else {
                errs.join("\n")
            };
            return Err(Error::PtxasRejected {
                ptx: ptx.to_path_buf(),
                arch: arch.to_string(),
                status: out.status,
                errors: shown,
            });
        }
        std::fs::write(&hash_path, source_hash(&source))
            .map_err(|e| Error::io(format!("writing {}", hash_path.display()), e))?;
        Ok(parse_verbose(&stderr))
    }

    /// The ptxas `OXCCL_PTXAS` names, if it is set.
    fn from_env() -> Option<Result<Ptxas>> {
        let p = PathBuf::from(std::env::var_os(PTXAS_ENV)?);
        Some(if p.is_file() {
            Ok(Ptxas::at(p))
        } else {
            Err(Error::InvalidUsage(format!(
                "{PTXAS_ENV}={} is not a file",
                p.display()
            )))
        })
    }
}

/// Where the SHA-256 of the PTX a cubin was assembled from is kept: beside the cubin, its
/// name with `.sha256` added. A cubin whose file time is older than the PTX beside it (a copy
/// that did not keep file times makes it so) is still of that PTX if this says so; the CUDA
/// backend checks it (`oxccl::ptx`) before compiling the PTX instead, which takes minutes.
pub fn cubin_source_hash_path(cubin: &Path) -> PathBuf {
    let mut name = cubin.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// The SHA-256 of `bytes`, in lowercase hex: what [`cubin_source_hash_path`] holds.
pub fn source_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What `ptxas -v` reported for one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionStats {
    /// Symbol name.
    pub name: String,
    /// Whether ptxas compiled it as an entry function (a kernel).
    pub is_entry: bool,
    /// Registers per thread.
    pub registers: Option<u32>,
    /// Bytes of stack frame per thread.
    pub stack_frame: Option<u64>,
    /// Bytes spilled to local memory (stores).
    pub spill_stores: Option<u64>,
    /// Bytes reloaded from spills (loads).
    pub spill_loads: Option<u64>,
    /// Bytes of static shared memory.
    pub shared_mem: u64,
}

impl FunctionStats {
    /// Whether ptxas spilled registers in this function.
    pub fn spills(&self) -> bool {
        self.spill_stores.unwrap_or(0) > 0 || self.spill_loads.unwrap_or(0) > 0
    }
}

/// Parses the info lines of `ptxas -v` (printed on stderr) into per-function statistics, in
/// the order ptxas reports them.
///
/// ```text
/// ptxas info    : Compiling entry function 'port_push' for 'sm_70'
/// ptxas info    : Function properties for port_push
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 14 registers, used 0 barriers, 376 bytes cmem[0]
/// ```
pub fn parse_verbose(stderr: &str) -> Vec<FunctionStats> {
    let mut out: Vec<FunctionStats> = Vec::new();
    let mut current: Option<usize> = None;
    let find_or_add = |out: &mut Vec<FunctionStats>, name: &str, is_entry: bool| {
        let i = match out.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                out.push(FunctionStats {
                    name: name.to_string(),
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        out[i].is_entry |= is_entry;
        i
    };
    for line in stderr.lines() {
        let info = line
            .strip_prefix("ptxas info")
            .and_then(|r| r.trim_start().strip_prefix(':'))
            .map(str::trim);
        if let Some(info) = info {
            if let Some(rest) = info.strip_prefix("Compiling entry function") {
                if let Some(name) = quoted(rest) {
                    current = Some(find_or_add(&mut out, name, true));
                }
            } else if let Some(rest) = info.strip_prefix("Function properties for") {
                current = Some(find_or_add(&mut out, rest.trim(), false));
            } else if let (true, Some(i)) = (info.starts_with("Used "), current) {
                parse_usage(info, &mut out[i]);
            }
        } else if let (true, Some(i)) = (line.contains("bytes stack frame"), current) {
            parse_frame(line, &mut out[i]);
        }
    }
    out
}

/// The error and fatal lines of ptxas output.
fn errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.starts_with("ptxas")
                && (l.contains("error") || l.contains("fatal"))
                && !l.starts_with("ptxas info")
        })
        .collect()
}

fn find_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
        .find(|p| p.is_file())
}

fn make_venv(venv: &Path) -> Result<()> {
    let python = Tool::new("python3");
    let create = || -> Result<(), CommandError> {
        // A half-made venv (ensurepip missing) would be taken for a good one next time.
        let _ = std::fs::remove_dir_all(venv);
        run_bounded(python.cmd().args(["-m", "venv"]).arg(venv), VENV_TIME_LIMIT)
    };
    let mut error = match create() {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if is_ci() && is_root() && Tool::new("apt-get").exists() {
        println!("oxccl-build: `python3 -m venv` failed; installing python3-venv with apt-get");
        let apt = |e| Error::command("installing python3-venv with apt-get", e);
        run_bounded(
            Command::new("apt-get").args(["update", "-qq"]),
            APT_TIME_LIMIT,
        )
        .map_err(apt)?;
        run_bounded(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "python3-venv"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            APT_TIME_LIMIT,
        )
        .map_err(apt)?;
        error = match create() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
    }
    let _ = std::fs::remove_dir_all(venv);
    Err(Error::command(
        format!(
            "cannot create a Python virtualenv at {} (install python3-venv, e.g. \
             `apt-get install python3-venv`, or point {PTXAS_ENV} at a ptxas 12.x)",
            venv.display()
        ),
        error,
    ))
}

fn quoted(s: &str) -> Option<&str> {
    let start = s.find('\'')? + 1;
    let len = s[start..].find('\'')?;
    Some(&s[start..start + len])
}

/// `Used 14 registers, used 0 barriers, 1024 bytes smem, 376 bytes cmem[0]`.
fn parse_usage(info: &str, f: &mut FunctionStats) {
    for item in info.split(',').map(str::trim) {
        let words: Vec<&str> = item.split_whitespace().collect();
        match words.as_slice() {
            ["Used", n, "registers"] => f.registers = n.parse().ok(),
            [n, "bytes", "smem"] => f.shared_mem = n.parse().unwrap_or(0),
            _ => {}
        }
    }
}

/// `    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads`.
fn parse_frame(line: &str, f: &mut FunctionStats) {
    for item in line.split(',').map(str::trim) {
        let words: Vec<&str> = item.split_whitespace().collect();
        match words.as_slice() {
            [n, "bytes", "stack", "frame"] => f.stack_frame = n.parse().ok(),
            [n, "bytes", "spill", "stores"] => f.spill_stores = n.parse().ok(),
            [n, "bytes", "spill", "loads"] => f.spill_loads = n.parse().ok(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from ptxas 12.9.86 (`-arch=sm_70 -v`) on two kernels; the first keeps an
    /// array on the stack.
    const SM70: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'seqcst' for 'sm_70'
ptxas info    : Function properties for seqcst
    512 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 512 bytes cumulative stack size, 368 bytes cmem[0]
ptxas info    : Compile time = 28.378 ms
ptxas info    : Compiling entry function 'port_push' for 'sm_70'
ptxas info    : Function properties for port_push
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 0 barriers, 376 bytes cmem[0]
ptxas info    : Compile time = 1.378 ms
";

    /// Captured from ptxas 12.9.86 (`-arch=sm_90 -v`): a kernel with static shared memory
    /// that calls a device function, which ptxas reports after it.
    const SM90: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'withshared' for 'sm_90'
ptxas info    : Function properties for withshared
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 2.864 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    /// Shaped like ptxas output under register pressure (`--maxrregcount`), with a warning.
    const SPILLS: &str = "\
ptxas warning : For profile sm_70 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for 'll16_exchange' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'll16_exchange' for 'sm_70'
ptxas info    : Function properties for ll16_exchange
    40 bytes stack frame, 36 bytes spill stores, 28 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 40 bytes cumulative stack size, 368 bytes cmem[0]
";

    /// Captured from ptxas 12.9.86 on invalid PTX.
    const BAD: &str = "\
ptxas /tmp/bad.ptx, line 5; error   : Unknown modifier '.bar'
ptxas /tmp/bad.ptx, line 5; error   : Not a name of any known instruction: 'foo'
ptxas fatal   : Ptx assembly aborted due to errors
";

    #[test]
    fn parses_entries_in_order() {
        let s = parse_verbose(SM70);
        assert_eq!(
            s,
            [
                FunctionStats {
                    name: "seqcst".into(),
                    is_entry: true,
                    registers: Some(32),
                    stack_frame: Some(512),
                    spill_stores: Some(0),
                    spill_loads: Some(0),
                    shared_mem: 0,
                },
                FunctionStats {
                    name: "port_push".into(),
                    is_entry: true,
                    registers: Some(14),
                    stack_frame: Some(0),
                    spill_stores: Some(0),
                    spill_loads: Some(0),
                    shared_mem: 0,
                },
            ]
        );
        assert!(!s[0].spills());
    }

    #[test]
    fn parses_shared_memory_and_device_functions() {
        let s = parse_verbose(SM90);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].registers, s[0].shared_mem), (Some(10), 1024));
        assert!(s[0].is_entry);
        assert_eq!(s[1].name, "helper");
        assert!(!s[1].is_entry);
        assert_eq!(s[1].registers, None);
        assert_eq!(s[1].stack_frame, Some(0));
    }

    #[test]
    fn detects_spills() {
        let s = parse_verbose(SPILLS);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].spill_stores, s[0].spill_loads), (Some(36), Some(28)));
        assert!(s[0].spills());
        assert_eq!(s[0].registers, Some(24));
    }

    #[test]
    fn error_lines() {
        assert_eq!(errors(BAD).len(), 3);
        assert!(errors(SM70).is_empty());
        assert!(errors(SPILLS).is_empty());
        assert!(parse_verbose(BAD).is_empty());
    }

    /// A ptxas stand-in: a shell script with `body`, in a directory of its own.
    fn fake_ptxas(name: &str, body: &str) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("oxccl-build-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("ptxas");
        std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, exe)
    }

    /// Guards against a ptxas that hangs holding build-ptx (and CI) forever: the run fails
    /// near its limit and names the module and architecture.
    #[test]
    fn a_hung_ptxas_fails_in_bounded_time() {
        let (dir, exe) = fake_ptxas(
            "hung-ptxas",
            "echo 'ptxas info    : 0 bytes gmem' >&2\nexec sleep 300",
        );
        let ptx = dir.join("k.ptx");
        std::fs::write(&ptx, "// k").unwrap();
        let started = std::time::Instant::now();
        let err = Ptxas::at(&exe)
            .time_limit(Duration::from_millis(500))
            .assemble(&ptx, "sm_70", &dir.join("k.cubin"))
            .unwrap_err();
        let msg = crate::error::with_causes(&err);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(msg.contains("k.ptx for sm_70"), "{msg}");
        assert!(msg.contains("did not finish within"), "{msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Guards against a rejected module reported without ptxas's own error lines.
    #[test]
    fn rejected_ptx_shows_the_error_lines() {
        let (dir, exe) = fake_ptxas("bad-ptxas", "cat \"$(dirname \"$0\")/said\" >&2; exit 1");
        std::fs::write(dir.join("said"), BAD).unwrap();
        let ptx = dir.join("bad.ptx");
        std::fs::write(&ptx, "// bad").unwrap();
        let cubin = dir.join("bad.cubin");
        let err = Ptxas::at(&exe)
            .assemble(&ptx, "sm_70", &cubin)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.ptx for sm_70"), "{err}");
        assert!(err.contains("Unknown modifier '.bar'"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Guards against a report lost on the way out, and a cubin without the record of its
    /// source: a ptxas that accepts the module gives the statistics its `-v` printed, the
    /// cubin goes where asked, and the SHA-256 of the PTX lies beside it (a record of an
    /// older module is replaced).
    #[test]
    fn accepted_ptx_gives_the_statistics_and_the_hash_of_its_source() {
        let (dir, exe) = fake_ptxas(
            "good-ptxas",
            "cat \"$(dirname \"$0\")/said\" >&2; [ \"$1\" = -arch=sm_70 ] && [ \"$4\" = -o ] && : > \"$5\"",
        );
        std::fs::write(dir.join("said"), SM70).unwrap();
        let ptx = dir.join("k.ptx");
        std::fs::write(&ptx, "// the module").unwrap();
        let cubin = dir.join("k.cubin");
        let record = cubin_source_hash_path(&cubin);
        assert_eq!(record, dir.join("k.cubin.sha256"));
        std::fs::write(&record, source_hash(b"// an older module")).unwrap();
        let stats = Ptxas::at(&exe).assemble(&ptx, "sm_70", &cubin).unwrap();
        assert_eq!(stats, parse_verbose(SM70));
        assert!(cubin.is_file());
        // The SHA-256 of "abc", as published (FIPS 180-2, appendix B.1).
        assert_eq!(
            source_hash(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            std::fs::read_to_string(&record).unwrap(),
            source_hash(b"// the module")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Guards against the record of an older cubin surviving a rejected module: it would
    /// vouch for an old cubin beside a new PTX.
    #[test]
    fn a_rejected_module_leaves_no_record_of_a_source() {
        let (dir, exe) = fake_ptxas("rejecting-ptxas", "exit 1");
        let ptx = dir.join("k.ptx");
        std::fs::write(&ptx, "// new").unwrap();
        let cubin = dir.join("k.cubin");
        let record = cubin_source_hash_path(&cubin);
        std::fs::write(&record, source_hash(b"// old")).unwrap();
        Ptxas::at(&exe).assemble(&ptx, "sm_70", &cubin).unwrap_err();
        assert!(!record.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn garbage_does_not_panic() {
        let s = parse_verbose(
            "ptxas info : Used registers\n  x bytes stack frame\nptxas info    : Compiling entry function 'unterminated",
        );
        assert!(s.is_empty());
        assert!(parse_verbose("").is_empty());
    }
}
