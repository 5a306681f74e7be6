//! Project tasks, run as `cargo xtask <task>` (an alias in `.cargo/config.toml`).
//!
//! - `build-ptx`: builds the kernel crates to PTX for each GPU architecture, into
//!   `target/ptx/<arch>/<crate>.ptx`; `--check` validates it with ptxas and the memory-model
//!   rules (see [`build_ptx`]).
//! - `loom`: model-checks the FIFO and semaphore protocols (see [`ci::run_loom`]).
//! - `gpu-bundle`: the programs and kernels that need a GPU, packed with a script that runs
//!   them on a GPU machine without a Rust toolchain (see [`gpu_bundle`]).
//! - `netns-test`: port channels between two nodes emulated by network namespaces, over
//!   Ethernet, and put_bw between them (root only; see [`netns_test`]).
//! - `ci`: everything CI checks, in order (see [`ci`]).

mod barrier_sites;
mod build_ptx;
mod ci;
mod gpu_bundle;
mod kernels;
mod layouts;
mod libtest;
mod netns_test;
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
    /// Build `target/gpu-bundle/`: stripped programs, the PTX and `run.sh`, to run on a
    /// machine with an NVIDIA GPU and driver but no Rust toolchain or network.
    GpuBundle {
        /// Use the PTX already in `target/ptx` if every architecture has it.
        #[arg(long)]
        reuse_ptx: bool,
        /// Build the PTX for this architecture only (repeatable; default: sm_70, sm_80 and
        /// sm_90), for a quicker bundle aimed at one GPU.
        #[arg(long = "arch")]
        arches: Vec<String>,
    },
    /// Run port channels between two nodes emulated by network namespaces (one rank per
    /// node over Ethernet; two per node, host IPC within and Ethernet between), and put_bw
    /// over the veth pair that joins them. Needs root, `ip` and `unshare`.
    NetnsTest,
    /// Run every CI step: fmt, clippy, tests, ib, netns (where root), loom, build-ptx --check,
    /// gpu-bundle.
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
        Task::GpuBundle { reuse_ptx, arches } => {
            gpu_bundle::run_gpu_bundle(&ws, reuse_ptx, &arches)
        }
        Task::NetnsTest => netns_test::run_netns_test(&ws),
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

    /// Guards against a thread-local of the CPU emulator read through a stale address after
    /// its kernel thread moved to another OS thread. A host thread runs kernel threads on
    /// stacks of their own and hands one that waits past its deadline to a pool thread
    /// (`host/src/cpu/inline.rs`); the compiler takes a thread-local's address to be fixed
    /// for a whole function and may keep it across calls, so a function that reaches a
    /// thread-local and is inlined into a kernel's frame could read or write the first OS
    /// thread's variable after the move. Optimized builds only, so no run-time test sees
    /// it: hence this rule. Every function of the emulator's arch layer and of the host's
    /// CPU backend that names a thread-local must be `#[inline(never)]` (and return before
    /// any wait, which review checks).
    #[test]
    fn thread_locals_only_in_never_inlined_fns() {
        use syn::visit::Visit;

        /// The names a file declares in `thread_local!`.
        fn declared(file: &syn::File) -> Vec<String> {
            struct Decls(Vec<String>);
            impl<'ast> Visit<'ast> for Decls {
                fn visit_macro(&mut self, m: &'ast syn::Macro) {
                    if m.path.is_ident("thread_local")
                        || m.path
                            .segments
                            .last()
                            .is_some_and(|s| s.ident == "thread_local")
                    {
                        let mut after_static = false;
                        for token in m.tokens.clone() {
                            if let proc_macro2::TokenTree::Ident(i) = token {
                                if after_static {
                                    self.0.push(i.to_string());
                                }
                                after_static = i == "static";
                            } else {
                                after_static = false;
                            }
                        }
                    }
                }
            }
            let mut d = Decls(Vec::new());
            d.visit_file(file);
            d.0
        }

        struct Uses<'a> {
            file: &'a str,
            names: &'a [String],
            /// The enclosing functions: name and whether it is `#[inline(never)]`.
            fns: Vec<(String, bool)>,
            found: Vec<String>,
        }
        fn never_inlined(attrs: &[syn::Attribute]) -> bool {
            attrs.iter().any(|a| {
                a.path().is_ident("inline")
                    && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "never")
            })
        }
        impl<'ast> Visit<'ast> for Uses<'_> {
            fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
                let is_test = m.attrs.iter().any(|a| {
                    a.path().is_ident("cfg")
                        && a.parse_args::<syn::Meta>()
                            .is_ok_and(|meta| cfg_names(&meta, "test"))
                });
                if !is_test {
                    syn::visit::visit_item_mod(self, m);
                }
            }
            fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
                self.fns
                    .push((f.sig.ident.to_string(), never_inlined(&f.attrs)));
                syn::visit::visit_item_fn(self, f);
                self.fns.pop();
            }
            fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
                self.fns
                    .push((f.sig.ident.to_string(), never_inlined(&f.attrs)));
                syn::visit::visit_impl_item_fn(self, f);
                self.fns.pop();
            }
            fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
                if self.names.iter().any(|n| i == n)
                    && let Some((f, false)) = self.fns.last()
                {
                    self.found.push(format!("{}: fn {f} names {i}", self.file));
                }
            }
        }
        /// Whether a `cfg(...)` names `word` anywhere (`test`, `all(test, ...)`).
        fn cfg_names(meta: &syn::Meta, word: &str) -> bool {
            match meta {
                syn::Meta::Path(p) => p.is_ident(word),
                syn::Meta::List(l) => l
                    .tokens
                    .clone()
                    .into_iter()
                    .any(|t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == word)),
                syn::Meta::NameValue(_) => false,
            }
        }

        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        let mut names_seen = 0;
        for dir in ["device-kernels/src/arch/host", "host/src/cpu"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let name = path.display().to_string();
                let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let names = declared(&file);
                names_seen += names.len();
                let mut uses = Uses {
                    file: &name,
                    names: &names,
                    fns: Vec::new(),
                    found: Vec::new(),
                };
                uses.visit_file(&file);
                found.extend(uses.found);
            }
        }
        // The rule must see the thread-locals it is about (a parser change would hide them).
        assert!(names_seen >= 5, "found only {names_seen} thread-locals");
        found.sort();
        assert!(
            found.is_empty(),
            "thread-locals named outside #[inline(never)] functions: {found:#?}"
        );
    }
}
