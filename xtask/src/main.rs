//! Project tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `build-ptx`: builds the kernel crates to PTX for each GPU architecture, into
//!   `target/ptx/<arch>/<crate>.ptx`; `--check` validates it with ptxas and the memory-model
//!   rules (see [`build_ptx`]).
//! - `loom`: model-checks the FIFO and semaphore protocols (see [`ci::run_loom`]).
//! - `ci`: everything CI checks, in order (see [`ci`]).

mod barrier_sites;
mod bounded;
mod build_ptx;
mod ci;
mod interrupt;
mod kernels;
mod layouts;
mod libtest;
mod probe_table;
mod ptx;
mod ptx_cfg;
mod ptx_flow;
mod ptx_rules;
mod ptxas;
mod text_table;
mod util;
mod workspace;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "oxccl project tasks",
    version
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the kernel crates to PTX: `target/ptx/<arch>/<crate>.ptx`.
    ///
    /// Kernel crates are the workspace members whose library depends on oxccl-device and
    /// sets `[package.metadata.oxccl] kernels = true` (oxccl-kernels, a user's own).
    BuildPtx {
        /// Build only this crate (repeatable); default: every kernel crate.
        #[arg(short = 'p', long = "package", value_name = "CRATE")]
        packages: Vec<String>,
        /// GPU architectures, comma-separated (sm_70 is the lowest supported).
        #[arg(
            long,
            value_delimiter = ',',
            default_values_t = build_ptx::DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        )]
        arch: Vec<String>,
        /// Assemble with ptxas (installed on first use), print registers and spills per
        /// kernel and the probe kernels beside MSCCL++'s register counts, and check the
        /// memory-model rules on the PTX.
        #[arg(long)]
        check: bool,
        /// With --check: report register spills as warnings instead of failing.
        #[arg(long)]
        allow_spills: bool,
    },
    /// Run the loom models (tests/loom.rs of oxccl-device and oxccl-proxy) with
    /// --cfg oxccl_loom; LOOM_MAX_PREEMPTIONS defaults to 3.
    ///
    /// Fails if a crate's models ran no test, or if a filter matched none.
    Loom {
        /// Arguments for the test binaries, after `--` (e.g. a test name filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Run every CI step: fmt, clippy, tests, loom, build-ptx --check.
    Ci {
        /// Report register spills in kernels as warnings instead of failing.
        #[arg(long)]
        allow_spills: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> anyhow::Result<()> {
    let ws = workspace::Workspace::load()?;
    match task {
        Task::BuildPtx {
            packages,
            arch,
            check,
            allow_spills,
        } => build_ptx::run_build_ptx(
            &ws,
            &build_ptx::Options {
                packages,
                arches: arch,
                check,
                allow_spills,
            },
        ),
        Task::Loom { args } => ci::run_loom(&ws, &args),
        Task::Ci { allow_spills } => ci::run_ci(&ws, &ci::CiOptions { allow_spills }),
    }
}
