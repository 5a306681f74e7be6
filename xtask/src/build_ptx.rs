//! `cargo xtask build-ptx`: builds the kernel crates to PTX, one module per architecture, and
//! with `--check` validates it.
//!
//! Each kernel crate of the workspace (see [`oxccl_build::workspace`]) is built for each
//! architecture with [`oxccl_build::Ptx`], which says how, into `<target>/ptx/<arch>/<crate>.ptx`,
//! where `oxccl::ptx::locate` finds it.
//!
//! Every `#[kernel]` in the crate's sources must appear as a `.entry` in its PTX, and every
//! `.entry` must come from a `#[kernel]`.
//!
//! `--check` also runs `ptxas -arch=<arch> -v` on every module (see [`oxccl_build::ptxas`]),
//! prints registers, spills and shared memory per kernel, then the probe kernels' table
//! beside MSCCL++'s references (see [`crate::probe_table`]), and applies the memory-model
//! rules of [`crate::ptx_rules`] (the shipped kernels' expectations to `oxccl-kernels` only,
//! see [`crate::ptx_rules::expectations_for`]). A kernel that spills fails the check unless
//! `--allow-spills`: a communication primitive that spills has regressed.

use crate::kernels::{self, KernelFn};
use crate::probe_table;
use crate::ptx::Module;
use crate::ptx_rules;
use anyhow::{Context, Result, bail};
use oxccl_build::arch::validate_arch;
use oxccl_build::bounded::fmt_duration;
use oxccl_build::report::{kernel_table, spill_warning};
use oxccl_build::toolchain::{COMPONENTS, ensure_components};
use oxccl_build::workspace::{DEVICE_CRATE, Package, Workspace};
use oxccl_build::{FunctionStats, Ptx, Ptxas};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
    let crates = ws.select_kernel_crates(&opts.packages)?;
    ensure_components("build-ptx", COMPONENTS)?;
    // The device library's sources: kernels call its functions (a block barrier inside
    // `block_agrees`, say), and counting a kernel's barrier sites follows those calls.
    let device_src = ws.package(DEVICE_CRATE).ok().and_then(Package::src_dir);

    let mut outputs = Vec::new();
    for arch in &opts.arches {
        for pkg in &crates {
            let started = Instant::now();
            println!("build-ptx: building {} for {arch}", pkg.name);
            let ptx = Ptx::new(&pkg.name).arch(arch).build_in(ws)?;
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
        let ptxas = Ptxas::locate(&ws.target_dir)?;
        let started = Instant::now();
        let assembled = assemble_all(&ptxas, &outputs);
        println!(
            "build-ptx: ptxas assembled {} module(s) ({})",
            outputs.len(),
            fmt_duration(started.elapsed())
        );
        let mut rows = Vec::new();
        for ((out, kernels), stats) in outputs.iter().zip(&sources).zip(assembled) {
            let stats = match stats {
                Ok(s) => s,
                Err(e) => {
                    failures.push(format!("{e:#}"));
                    continue;
                }
            };
            for f in stats {
                if let Some(warning) = spill_warning(&out.arch, out.lib(), &f) {
                    println!("{warning}");
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
            let expectations = ptx_rules::expectations_for(&out.pkg.name);
            let report = ptx_rules::check(&Module::parse(&text), kernels, expectations);
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
        let modules: Vec<(&str, &str)> =
            outputs.iter().map(|o| (o.arch.as_str(), o.lib())).collect();
        print!("{}", kernel_table(&kernels, &modules));
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

/// ptxas on every output (each module's cubin left beside its PTX), as many at once as the
/// machine has cores: each is one single-threaded process, minutes for the collectives'
/// module, and one after another they were most of a CI run. Results in the outputs' order.
fn assemble_all(ptxas: &Ptxas, outputs: &[Output]) -> Vec<Result<Vec<FunctionStats>>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, outputs.len().max(1));
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Vec<FunctionStats>>>>> =
        outputs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                // Relaxed: the counter only hands out indices; results go through the mutexes.
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(out) = outputs.get(i) else { break };
                    let result = ptxas
                        .assemble(&out.ptx, &out.arch, &out.ptx.with_extension("cubin"))
                        .map_err(anyhow::Error::new);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .zip(outputs)
        .map(|(r, out)| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| {
                    bail!("ptxas did not run on {} ({})", out.ptx.display(), out.arch)
                })
        })
        .collect()
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

/// The `#[kernel]` functions of `pkg`'s sources, their barrier sites counted through calls
/// into `device_src` (the device library's sources) too.
fn scan_kernels(pkg: &Package, device_src: Option<&std::path::Path>) -> Result<Vec<KernelFn>> {
    match pkg.src_dir() {
        Some(dir) => kernels::scan_dir(&dir, device_src),
        None => Ok(Vec::new()),
    }
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
}
