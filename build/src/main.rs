//! `oxccl-build`: builds kernel crates to PTX from the command line, and with `--check`
//! assembles each module with ptxas and prints registers and spills per kernel.
//!
//! ```text
//! oxccl-build --manifest-path my-kernels/Cargo.toml --package my-kernels --arch sm_90 --check
//! ```
//!
//! Each module goes to `<target>/ptx/<arch>/<crate>.ptx` (see [`oxccl_build::ptx`]), where
//! `oxccl::ptx::locate` finds it; the paths written are printed. Exits non-zero if a build
//! fails, if ptxas rejects a module, or with `--deny-spills` if a kernel spills registers.

use clap::Parser;
use oxccl_build::arch::{DEFAULT_ARCHES, validate_arch};
use oxccl_build::bounded::fmt_duration;
use oxccl_build::error::with_causes;
use oxccl_build::report::{kernel_table, spill_warning};
use oxccl_build::toolchain::{COMPONENTS, ensure_components};
use oxccl_build::{Ptx, Ptxas, Workspace};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "oxccl-build",
    version,
    about = "Build oxccl kernel crates to PTX: <target>/ptx/<arch>/<crate>.ptx",
    long_about = "Build oxccl kernel crates to PTX: <target>/ptx/<arch>/<crate>.ptx.\n\n\
                  A kernel crate's library depends on oxccl-device and its Cargo.toml sets \
                  `[package.metadata.oxccl] kernels = true`. Needs the rustup components \
                  rust-src, llvm-tools and llvm-bitcode-linker; --check also needs python3 \
                  with venv (ptxas is installed from PyPI on first use) or OXCCL_PTXAS."
)]
struct Cli {
    /// Cargo.toml of the kernel crate or of its workspace; default: found from the current
    /// directory, as cargo finds it.
    #[arg(long, value_name = "PATH")]
    manifest_path: Option<PathBuf>,
    /// Kernel crate to build (repeatable); default: every kernel crate of the workspace.
    #[arg(short = 'p', long = "package", value_name = "CRATE")]
    packages: Vec<String>,
    /// GPU architectures, comma-separated (sm_70 is the lowest supported).
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    )]
    arch: Vec<String>,
    /// Build in this directory instead of the workspace's target directory.
    #[arg(long, value_name = "DIR")]
    target_dir: Option<PathBuf>,
    /// Write each module to DIR/<arch>/<crate>.ptx instead of <target>/ptx/<arch>/.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// Assemble each module with ptxas (OXCCL_PTXAS, or installed into
    /// <target>/ptxas-venv on first use) and print registers, spills and shared memory per
    /// kernel; the cubin is left beside the module.
    #[arg(long)]
    check: bool,
    /// With --check: fail if a kernel spills registers (default: a warning).
    #[arg(long, requires = "check")]
    deny_spills: bool,
    /// Add the rustup components the build needs if they are missing, instead of failing.
    #[arg(long)]
    install_components: bool,
}

fn main() -> ExitCode {
    match run(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", with_causes(&*e));
            ExitCode::FAILURE
        }
    }
}

/// What went wrong after every module was built: a module ptxas rejected, a spill.
#[derive(Debug)]
struct Problems(Vec<String>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "oxccl-build: {} problem(s):", self.0.len())?;
        for p in &self.0 {
            write!(f, "\n  - {}", p.replace('\n', "\n    "))?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    for arch in &cli.arch {
        validate_arch(arch)?;
    }
    let ws = match &cli.manifest_path {
        Some(m) => Workspace::load_manifest(m)?,
        None => Workspace::load()?,
    };
    let crates = ws.select_kernel_crates(&cli.packages)?;
    if cli.install_components {
        ensure_components("oxccl-build", COMPONENTS)?;
    }

    let mut built = Vec::new();
    for arch in &cli.arch {
        for pkg in &crates {
            let started = Instant::now();
            println!("oxccl-build: building {} for {arch}", pkg.name);
            let mut ptx = Ptx::new(&pkg.name).arch(arch);
            if let Some(d) = &cli.target_dir {
                ptx = ptx.target_dir(d);
            }
            if let Some(d) = &cli.out_dir {
                ptx = ptx.out_dir(d);
            }
            let path = ptx.build_in(&ws)?;
            println!(
                "oxccl-build: wrote {} ({})",
                path.display(),
                fmt_duration(started.elapsed())
            );
            let lib = pkg.lib_name().unwrap_or(&pkg.name).to_string();
            built.push((arch.clone(), lib, path));
        }
    }
    if !cli.check {
        return Ok(());
    }

    let ptxas = Ptxas::locate(cli.target_dir.as_deref().unwrap_or(&ws.target_dir))?;
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    for (arch, lib, path) in &built {
        let stats = match ptxas.assemble(path, arch, &path.with_extension("cubin")) {
            Ok(s) => s,
            Err(e) => {
                problems.push(with_causes(&e));
                continue;
            }
        };
        for f in stats {
            if let Some(warning) = spill_warning(arch, lib, &f) {
                println!("{warning}");
                if cli.deny_spills {
                    problems.push(format!("{arch} {lib}: `{}` spills registers", f.name));
                }
            }
            if f.is_entry {
                rows.push((arch.clone(), lib.clone(), f));
            }
        }
    }
    let modules: Vec<(&str, &str)> = built
        .iter()
        .map(|(arch, lib, _)| (arch.as_str(), lib.as_str()))
        .collect();
    print!("{}", kernel_table(&rows, &modules));
    if !problems.is_empty() {
        return Err(Problems(problems).into());
    }
    println!("oxccl-build: {} module(s) passed ptxas", built.len());
    Ok(())
}
