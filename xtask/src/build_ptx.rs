//! `cargo xtask build-ptx`: builds the kernel crates to PTX, one module per architecture, and
//! with `--check` validates it.
//!
//! For each architecture and kernel crate (see [`crate::workspace`] for which crates):
//!
//! ```text
//! RUSTC_BOOTSTRAP=1 RUSTFLAGS="-C target-cpu=<arch> -Zmir-enable-passes=-JumpThreading" \
//!     cargo rustc -p <crate> --release \
//!     --target nvptx64-nvidia-cuda -Zbuild-std=core --crate-type cdylib \
//!     --target-dir <target>/nvptx/<arch>
//! ```
//!
//! then copies llvm-bitcode-linker's `<crate>.ptx` to `<target>/ptx/<arch>/<crate>.ptx`, where
//! `oxccl::ptx::locate` finds it. Each architecture has its own target directory, so
//! building one does not invalidate another. `RUSTC_BOOTSTRAP` is needed because the nvptx
//! `rust-std` is not distributed: `core` is built from `rust-src` (`-Zbuild-std`); MIR jump
//! threading is off because it can break block barriers (see `rustflags`).
//!
//! Every `#[kernel]` in the crate's sources must appear as a `.entry` in its PTX, and every
//! `.entry` must come from a `#[kernel]`.
//!
//! `--check` also runs `ptxas -arch=<arch> -v` on every module (see [`crate::ptxas`]),
//! prints registers, spills and shared memory per kernel, then the probe kernels' table
//! beside MSCCL++'s references (see [`crate::probe_table`]), and applies the memory-model
//! rules of [`crate::ptx_rules`]. A kernel that spills fails the check unless
//! `--allow-spills`: a communication primitive that spills has regressed.

use crate::bounded::run_bounded;
use crate::kernels::{self, KernelFn};
use crate::probe_table;
use crate::ptx::Module;
use crate::ptx_rules;
use crate::ptxas::{self, FunctionStats};
use crate::text_table::text_table;
use crate::util::{Tool, ensure_components, fmt_duration};
use crate::workspace::{DEVICE_CRATE, Package, Workspace};
use anyhow::{Context, Result, bail};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The LLVM target of NVIDIA GPUs.
pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// Architectures built when `--arch` is not given: Volta (the floor: acquire/release and
/// `nanosleep` need sm_70), Ampere, Hopper.
pub const DEFAULT_ARCHES: &[&str] = &["sm_70", "sm_80", "sm_90"];

/// Longest one `cargo rustc` of a kernel crate for one architecture may take. From a cold
/// cache it builds `core` too, a few minutes on two cores; past the limit the build is
/// killed and build-ptx fails naming the crate and the architecture.
pub const BUILD_TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Rustup components the nvptx build needs.
pub const COMPONENTS: &[&str] = &["rust-src", "llvm-tools", "llvm-bitcode-linker"];

/// What to build and check.
#[derive(Debug, Clone)]
pub struct Options {
    /// Packages to build; empty means every kernel crate.
    pub packages: Vec<String>,
    /// Architectures, e.g. `sm_90`.
    pub arches: Vec<String>,
    /// Run ptxas and the PTX rules.
    pub check: bool,
    /// Report spills as warnings only.
    pub allow_spills: bool,
}

/// Builds (and with `check`, validates) the PTX; fails on the first build error, or after
/// all checks ran if any failed.
pub fn run_build_ptx(ws: &Workspace, opts: &Options) -> Result<()> {
    for arch in &opts.arches {
        validate_arch(arch)?;
    }
    let crates = select_crates(ws, &opts.packages)?;
    ensure_components("build-ptx", COMPONENTS)?;
    // The device library's sources: kernels call its functions (a block barrier inside
    // `block_agrees`, say), and counting a kernel's barrier sites follows those calls.
    let device_src = ws.package(DEVICE_CRATE).ok().and_then(Package::src_dir);

    let mut outputs = Vec::new();
    for arch in &opts.arches {
        for pkg in &crates {
            let started = Instant::now();
            let ptx = build_one(ws, pkg, arch)?;
            println!(
                "build-ptx: wrote {} ({})",
                ptx.display(),
                fmt_duration(started.elapsed())
            );
            outputs.push(Output {
                arch: arch.clone(),
                pkg: (*pkg).clone(),
                ptx,
            });
        }
    }

    let mut failures = Vec::new();
    // Per output: the kernels of its sources, for the PTX rules.
    let mut sources: Vec<Vec<KernelFn>> = Vec::new();
    for out in &outputs {
        let own = scan_kernels(&out.pkg, device_src.as_deref())?;
        let text = std::fs::read_to_string(&out.ptx)
            .with_context(|| format!("reading {}", out.ptx.display()))?;
        let module = Module::parse(&text);
        if let Err(e) = check_entries(&module, &own) {
            failures.push(format!("{} {}: {e}", out.arch, out.lib()));
        }
        sources.push(own);
    }

    if opts.check {
        let ptxas = ptxas::ensure(&ws.target_dir)?;
        let mut rows = Vec::new();
        for (out, kernels) in outputs.iter().zip(&sources) {
            let cubin = cubin_path(&ws.target_dir, &out.arch, out.lib());
            let assembled =
                ptxas::assemble(&ptxas, &out.arch, &out.ptx, &cubin, ptxas::RUN_TIME_LIMIT);
            let stderr = match assembled {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{e:#}"));
                    continue;
                }
            };
            for f in ptxas::parse_verbose(&stderr) {
                if f.spills() {
                    println!(
                        "WARNING: {} {}: `{}` spills registers ({} bytes stored, {} loaded)",
                        out.arch,
                        out.lib(),
                        f.name,
                        f.spill_stores.unwrap_or(0),
                        f.spill_loads.unwrap_or(0)
                    );
                    if !opts.allow_spills {
                        failures.push(format!(
                            "{} {}: `{}` spills registers (--allow-spills to accept)",
                            out.arch,
                            out.lib(),
                            f.name
                        ));
                    }
                }
                if f.is_entry {
                    rows.push((out.arch.clone(), out.lib().to_string(), f));
                }
            }

            let text = std::fs::read_to_string(&out.ptx)
                .with_context(|| format!("reading {}", out.ptx.display()))?;
            let report = ptx_rules::check(&Module::parse(&text), kernels, ptx_rules::EXPECTATIONS);
            for v in &report.violations {
                failures.push(format!("{} {}: {v}", out.arch, out.lib()));
            }
            if out.arch == opts.arches[0] {
                for note in &report.notes {
                    println!("build-ptx: note: {}: {note}", out.lib());
                }
            }
        }
        let (probes, kernels): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .partition(|(_, _, f)| f.name.starts_with(probe_table::PREFIX));
        print!("{}", table(&kernels, &outputs));
        let probes: Vec<(String, FunctionStats)> =
            probes.into_iter().map(|(arch, _, f)| (arch, f)).collect();
        if !probes.is_empty() {
            print!("{}", probe_table::tables(&probes));
            for line in probe_table::above_reference(&probes) {
                println!("build-ptx: note: {line} (reported, not failed)");
            }
        }
    }

    if !failures.is_empty() {
        let mut msg = format!("build-ptx: {} problem(s):", failures.len());
        for f in &failures {
            let _ = write!(msg, "\n  - {}", f.replace('\n', "\n    "));
        }
        bail!(msg);
    }
    if opts.check {
        println!(
            "build-ptx: {} module(s) passed ptxas and the PTX rules",
            outputs.len()
        );
    }
    Ok(())
}

/// Checks `arch` names an architecture this project can build for.
pub fn validate_arch(arch: &str) -> Result<()> {
    match arch_number(arch) {
        Some(n) if n >= 70 => Ok(()),
        Some(_) => bail!(
            "`{arch}` is below sm_70, the floor: acquire/release and nanosleep need it \
             (and llc crashes on atomics for older targets)"
        ),
        None => bail!("`{arch}` is not an architecture name like `sm_90`"),
    }
}

/// `90` for `sm_90` and `sm_90a`.
fn arch_number(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_")
        .map(|n| n.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|n| n.parse().ok())
}

/// Code generation flags for `arch`.
///
/// MIR jump threading is off: it may duplicate a block that ends in a barrier into the
/// arms of a branch, so threads of one block reach different `bar.sync` instructions, which
/// the aligned barrier forbids (a hang or worse; rust-lang/rust#137086). rustc lacks a
/// `convergent` notion in MIR to stop it, and turns the pass off for GPU targets only from
/// rust-lang/rust#149637 on. `-Z` needs `RUSTC_BOOTSTRAP`, which [`build_one`] sets.
///
/// LLVM emits PTX ISA 6.0 for sm_70 and 6.1 for sm_72, but `nanosleep` (in every bounded
/// wait) needs 6.3, so ptxas rejects those modules; sm_75 and later default to 6.3 or newer.
/// The ISA is raised only where needed: asking for less than an architecture's minimum is an
/// LLVM error. rustc calls `ptx63` an unstable target feature and says so in one warning.
fn rustflags(arch: &str) -> String {
    let mut flags = format!("-C target-cpu={arch} -Zmir-enable-passes=-JumpThreading");
    if arch_number(arch).is_some_and(|n| n < 75) {
        flags.push_str(" -C target-feature=+ptx63");
    }
    flags
}

struct Output {
    arch: String,
    pkg: Package,
    ptx: PathBuf,
}

impl Output {
    fn lib(&self) -> &str {
        self.pkg.lib_name().unwrap_or(&self.pkg.name)
    }
}

fn select_crates<'w>(ws: &'w Workspace, names: &[String]) -> Result<Vec<&'w Package>> {
    if names.is_empty() {
        let crates = ws.kernel_crates();
        if crates.is_empty() {
            bail!(
                "no kernel crates in the workspace: a kernel crate's library depends on \
                 `{DEVICE_CRATE}` and its Cargo.toml declares `[package.metadata.oxccl] kernels = true`"
            );
        }
        return Ok(crates);
    }
    names
        .iter()
        .map(|n| {
            let p = ws.package(n)?;
            if p.lib.is_none() {
                bail!("`{n}` has no library to build to PTX");
            }
            if !p.is_kernel_crate() {
                bail!(
                    "`{n}` is not a kernel crate: its library must depend on `{DEVICE_CRATE}` \
                     and its Cargo.toml declare `[package.metadata.oxccl] kernels = true`"
                );
            }
            Ok(p)
        })
        .collect()
}

/// The `#[kernel]` functions of `pkg`'s sources, their barrier sites counted through calls
/// into `device_src` (the device library's sources) too.
fn scan_kernels(pkg: &Package, device_src: Option<&std::path::Path>) -> Result<Vec<KernelFn>> {
    match pkg.src_dir() {
        Some(dir) => kernels::scan_dir(&dir, device_src),
        None => Ok(Vec::new()),
    }
}

/// Builds `pkg` for `arch` and copies its PTX to `<target>/ptx/<arch>/<crate>.ptx`.
fn build_one(ws: &Workspace, pkg: &Package, arch: &str) -> Result<PathBuf> {
    let lib = pkg
        .lib_name()
        .with_context(|| format!("`{}` has no library", pkg.name))?;
    let target_dir = ws.target_dir.join("nvptx").join(arch);
    println!("build-ptx: building {} for {arch}", pkg.name);
    let mut cmd = Tool::cargo().cmd();
    cmd.current_dir(&ws.root)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", rustflags(arch))
        // The workspace's release profile has `debug = 1`. The PTX is the same without it
        // (llvm-bitcode-linker drops debug info), and the build is faster.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        // Would take precedence over RUSTFLAGS.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args(["rustc", "-p", &pkg.name, "--release", "--target", TARGET])
        .args(["-Zbuild-std=core", "--crate-type", "cdylib", "--target-dir"])
        .arg(&target_dir);
    run_bounded(&mut cmd, BUILD_TIME_LIMIT)
        .with_context(|| format!("building {} for {arch}", pkg.name))?;

    let release = target_dir.join(TARGET).join("release");
    let built = [
        release.join(format!("{lib}.ptx")),
        release.join("deps").join(format!("{lib}.ptx")),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .with_context(|| {
        format!(
            "cargo built {} for {arch} but left no {lib}.ptx in {}",
            pkg.name,
            release.display()
        )
    })?;
    let dest_dir = ws.target_dir.join("ptx").join(arch);
    std::fs::create_dir_all(&dest_dir)
        .with_context(|| format!("creating {}", dest_dir.display()))?;
    let dest = dest_dir.join(format!("{lib}.ptx"));
    std::fs::copy(&built, &dest)
        .with_context(|| format!("copying {} to {}", built.display(), dest.display()))?;
    Ok(dest)
}

/// Checks every kernel in `own` became an entry and every entry comes from `own` or
/// `inherited` (kernels of a dependency that the cdylib exports too).
fn check_entries(module: &Module, own: &[KernelFn]) -> Result<()> {
    let entries: Vec<&str> = module.entries().map(|f| f.name.as_str()).collect();
    let missing: Vec<String> = own
        .iter()
        .filter(|k| !entries.iter().any(|e| kernels::entry_is_kernel(e, &k.name)))
        .map(|k| format!("`{}` ({})", k.name, k.file.display()))
        .collect();
    let unknown: Vec<&str> = entries
        .iter()
        .copied()
        .filter(|e| !own.iter().any(|k| kernels::entry_is_kernel(e, &k.name)))
        .collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "{} `#[kernel]` function(s) but {} `.entry` in the PTX; missing: {}",
            own.len(),
            entries.len(),
            missing.join(", ")
        ));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "`.entry` without a `#[kernel]` in the sources: {}",
            unknown.join(", ")
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!(problems.join("; "))
    }
}

/// The per-kernel table: one row per kernel entry and architecture.
fn table(rows: &[(String, String, FunctionStats)], outputs: &[Output]) -> String {
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    let mut cells: Vec<[String; 8]> = vec![[
        "arch".into(),
        "crate".into(),
        "kernel".into(),
        "registers".into(),
        "stack".into(),
        "spill st".into(),
        "spill ld".into(),
        "smem".into(),
    ]];
    for (arch, lib, f) in rows {
        cells.push([
            arch.clone(),
            lib.clone(),
            f.name.clone(),
            opt(f.registers.map(u64::from)),
            opt(f.stack_frame),
            opt(f.spill_stores),
            opt(f.spill_loads),
            f.shared_mem.to_string(),
        ]);
    }
    for out in outputs {
        if !rows
            .iter()
            .any(|(a, l, _)| *a == out.arch && l == out.lib())
        {
            let mut empty: [String; 8] = Default::default();
            empty[0] = out.arch.clone();
            empty[1] = out.lib().to_string();
            empty[2] = "(no kernels)".into();
            cells.push(empty);
        }
    }
    let mut s = String::from("\n");
    s.push_str(&text_table(&cells, 3));
    s.push('\n');
    s
}

/// Where `--check` leaves a module's cubin (kept for inspection with `cuobjdump -sass`).
fn cubin_path(target_dir: &Path, arch: &str, lib: &str) -> PathBuf {
    target_dir
        .join("nvptx")
        .join(arch)
        .join(format!("{lib}.cubin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> KernelFn {
        KernelFn {
            name: name.into(),
            file: PathBuf::from("src/kernels/x.rs"),
            ..Default::default()
        }
    }

    fn module(entries: &[&str]) -> Module {
        let text: String = entries
            .iter()
            .map(|e| format!(".visible .entry {e}()\n{{\nret;\n}}\n"))
            .collect();
        Module::parse(&text)
    }

    #[test]
    fn arches() {
        assert!(validate_arch("sm_70").is_ok());
        assert!(validate_arch("sm_90a").is_ok());
        assert!(validate_arch("sm_120").is_ok());
        let low = validate_arch("sm_60").unwrap_err().to_string();
        assert!(low.contains("floor"), "{low}");
        assert!(validate_arch("compute_90").is_err());
        assert!(validate_arch("sm_").is_err());
        assert!(validate_arch("").is_err());
    }

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

    #[test]
    fn entries_match_kernels() {
        let m = module(&["port_pingpong", "memory_pingpong"]);
        assert!(check_entries(&m, &[k("port_pingpong"), k("memory_pingpong")]).is_ok());
    }

    #[test]
    fn missing_entry_is_named() {
        let m = module(&["port_pingpong"]);
        let err = check_entries(&m, &[k("port_pingpong"), k("ll8_exchange")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 `#[kernel]` function(s) but 1 `.entry`"),
            "{err}"
        );
        assert!(err.contains("`ll8_exchange`"), "{err}");
    }

    /// Guards against a module carrying entry points of another crate (a kernel crate that
    /// depends on a second one links both crates' kernels) without a word.
    #[test]
    fn unknown_entry_is_named() {
        let m = module(&["mine", "stray"]);
        let err = check_entries(&m, &[k("mine")]).unwrap_err().to_string();
        assert!(
            err.contains("without a `#[kernel]`") && err.contains("stray"),
            "{err}"
        );
        assert!(!err.contains("mine"), "{err}");
    }

    #[test]
    fn table_lists_kernels_and_empty_modules() {
        let stats = FunctionStats {
            name: "port_pingpong".into(),
            is_entry: true,
            registers: Some(14),
            stack_frame: Some(0),
            spill_stores: Some(0),
            spill_loads: Some(0),
            shared_mem: 0,
        };
        let pkg = Package {
            name: "oxccl-device".into(),
            dir: PathBuf::new(),
            lib: Some(("oxccl_device".into(), PathBuf::new())),
            depends_on_device: false,
            declares_kernels: false,
        };
        let outputs = vec![
            Output {
                arch: "sm_70".into(),
                pkg: pkg.clone(),
                ptx: PathBuf::new(),
            },
            Output {
                arch: "sm_80".into(),
                pkg,
                ptx: PathBuf::new(),
            },
        ];
        let t = table(&[("sm_70".into(), "oxccl_device".into(), stats)], &outputs);
        let lines: Vec<&str> = t.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("arch   crate"), "{t}");
        assert!(
            lines[2].contains("port_pingpong") && lines[2].contains("14"),
            "{t}"
        );
        assert!(
            lines[3].contains("sm_80") && lines[3].contains("(no kernels)"),
            "{t}"
        );
    }
}
