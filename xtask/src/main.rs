//! Project tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `build-ptx`: builds the kernel crates to PTX for each GPU architecture, into
//!   `target/ptx/<arch>/<crate>.ptx`; `--check` validates it with ptxas and the memory-model
//!   rules (see [`build_ptx`]).
//! - `loom`: model-checks the FIFO and semaphore protocols (see [`ci::run_loom`]).
//! - `ci`: everything CI checks, in order (see [`ci`]).

mod barrier_sites;
mod build_ptx;
mod ci;
mod kernels;
mod layouts;
mod libtest;
mod probe_table;
mod ptx;
mod ptx_cfg;
mod ptx_flow;
mod ptx_rules;

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
            default_values_t = oxccl_build::arch::DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect::<Vec<_>>()
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
    let ws = oxccl_build::Workspace::load()?;
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

#[cfg(test)]
mod tests {
    /// Guards against a step that can hang CI again: xtask and oxccl-build start programs
    /// only through `oxccl_build::bounded::run_bounded` and its siblings (outside that
    /// file), never with `Command::status`, `output` or `spawn`, which wait without a limit.
    #[test]
    fn no_command_runs_unbounded() {
        use syn::visit::Visit;

        struct Calls<'a> {
            file: &'a str,
            found: Vec<String>,
        }
        impl<'ast> Visit<'ast> for Calls<'_> {
            fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
                let is_test = m.attrs.iter().any(|a| {
                    a.path().is_ident("cfg")
                        && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
                });
                if !is_test {
                    syn::visit::visit_item_mod(self, m);
                }
            }
            fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
                let method = call.method.to_string();
                if call.args.is_empty() && ["status", "output", "spawn"].contains(&&*method) {
                    self.found.push(format!("{}: .{method}()", self.file));
                }
                syn::visit::visit_expr_method_call(self, call);
            }
        }

        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut paths = Vec::new();
        for src in [here.join("src"), here.join("../build/src")] {
            for entry in std::fs::read_dir(&src).unwrap() {
                paths.push(entry.unwrap().path());
            }
        }
        let bounded = here.join("../build/src/bounded.rs");
        let mut found = Vec::new();
        for path in paths {
            let name = path.display().to_string();
            if !name.ends_with(".rs") || path == bounded {
                continue;
            }
            let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let mut calls = Calls {
                file: &name,
                found: Vec::new(),
            };
            calls.visit_file(&file);
            found.extend(calls.found);
        }
        found.sort();
        assert!(found.is_empty(), "unbounded commands: {found:#?}");
    }
}
