//! `cargo xtask ci` and `cargo xtask loom`.
//!
//! `ci` is what CI runs (through `.ci/run`), and what to run before pushing: every step, in
//! order, stopping at the first failure, then a summary with each step's time.
//!
//! 1. `fmt`: `cargo fmt --all -- --check`, within [`FMT_TIME_LIMIT`]
//! 2. `clippy`: `cargo clippy --workspace --all-targets -- -D warnings`, within
//!    [`STEP_TIME_LIMIT`]
//! 3. `test`: `cargo test --workspace`, within [`STEP_TIME_LIMIT`]
//! 4. `loom`: the loom models of the FIFO and semaphore protocols ([`run_loom`]), within
//!    [`STEP_TIME_LIMIT`]
//! 5. `build-ptx`: `build-ptx --check` for sm_70, sm_80 and sm_90, where each build,
//!    each ptxas run and the installation of ptxas has its own limit
//!    ([`build_ptx::BUILD_TIME_LIMIT`], [`crate::ptxas`])
//!
//! Every command runs under a deadline (see [`crate::bounded`]): one that hangs fails its
//! step, named in the error, instead of holding CI until the runner's own limit.
//!
//! Under `CI=true` the rustup components all steps need are installed first.

use crate::bounded::run_bounded;
use crate::build_ptx::{self, DEFAULT_ARCHES};
use crate::util::{Tool, ensure_components, fmt_duration, is_ci, show};
use crate::workspace::Workspace;
use anyhow::{Result, bail};
use std::process::Command;
use std::time::{Duration, Instant};

/// Crates whose `tests/loom.rs` `cargo xtask loom` runs.
pub const LOOM_CRATES: &[&str] = &["oxccl-device", "oxccl-proxy"];

/// Preemption bound loom explores by default; `LOOM_MAX_PREEMPTIONS` overrides it.
pub const LOOM_MAX_PREEMPTIONS: &str = "3";

/// Longest the `clippy`, `test` and `loom` steps may each take, builds included (a full
/// run takes a few minutes): past it the step is killed and fails, so a hung test or build
/// cannot hold CI.
pub const STEP_TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Longest the `fmt` step may take (it takes seconds).
pub const FMT_TIME_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Options of `cargo xtask ci`.
#[derive(Debug, Clone, Default)]
pub struct CiOptions {
    /// Let kernels spill registers (a warning instead of a failure).
    pub allow_spills: bool,
}

enum Outcome {
    Passed(Duration),
    Failed(Duration),
    NotRun,
}

/// Runs every CI step; see the module docs.
pub fn run_ci(ws: &Workspace, opts: &CiOptions) -> Result<()> {
    if is_ci() {
        let mut all = vec!["rustfmt", "clippy"];
        all.extend_from_slice(build_ptx::COMPONENTS);
        ensure_components("ci", &all)?;
    }
    let cargo = || {
        let mut c = Tool::cargo().cmd();
        c.current_dir(&ws.root);
        c
    };
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    let mut test = cargo();
    test.args(["test", "--workspace"]);
    let ptx_opts = build_ptx::Options {
        packages: Vec::new(),
        arches: DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect(),
        check: true,
        allow_spills: opts.allow_spills,
    };

    type Step<'a> = (&'static str, String, Box<dyn FnOnce() -> Result<()> + 'a>);
    let steps: Vec<Step> = vec![
        (
            "fmt",
            show(&fmt),
            Box::new(move || run_bounded(&mut fmt, FMT_TIME_LIMIT)),
        ),
        (
            "clippy",
            show(&clippy),
            Box::new(move || run_bounded(&mut clippy, STEP_TIME_LIMIT)),
        ),
        (
            "test",
            show(&test),
            Box::new(move || run_bounded(&mut test, STEP_TIME_LIMIT)),
        ),
        (
            "loom",
            "cargo xtask loom".into(),
            Box::new(|| run_loom(ws, &[])),
        ),
        (
            "build-ptx",
            format!(
                "cargo xtask build-ptx --check --arch {}",
                DEFAULT_ARCHES.join(",")
            ),
            Box::new(move || build_ptx::run_build_ptx(ws, &ptx_opts)),
        ),
    ];

    let total = steps.len();
    let names: Vec<&str> = steps.iter().map(|s| s.0).collect();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut error = None;
    let started = Instant::now();
    for (i, (name, what, step)) in steps.into_iter().enumerate() {
        println!("\n==== ci [{}/{total}] {name}: {what}", i + 1);
        let t = Instant::now();
        match step() {
            Ok(()) => outcomes.push(Outcome::Passed(t.elapsed())),
            Err(e) => {
                outcomes.push(Outcome::Failed(t.elapsed()));
                error = Some((name, e));
                break;
            }
        }
    }
    while outcomes.len() < total {
        outcomes.push(Outcome::NotRun);
    }

    println!("\n==== ci summary");
    for (name, outcome) in names.iter().zip(&outcomes) {
        let (status, time) = match outcome {
            Outcome::Passed(d) => ("ok", fmt_duration(*d)),
            Outcome::Failed(d) => ("FAILED", fmt_duration(*d)),
            Outcome::NotRun => ("not run", String::new()),
        };
        println!("  {name:<10} {status:<8} {time:>9}");
    }
    let elapsed = fmt_duration(started.elapsed());
    match error {
        None => {
            println!("  {:<10} {:<8} {elapsed:>9}", "total", "ok");
            Ok(())
        }
        Some((name, e)) => {
            println!("  {:<10} {:<8} {elapsed:>9}", "total", "FAILED");
            bail!("ci failed at step `{name}`: {e:#}")
        }
    }
}

/// Runs the loom models: `cargo test --release -p <crate> --test loom` for each crate of
/// [`LOOM_CRATES`] that has a `tests/loom.rs`, with `--cfg oxccl_loom` (so the device crate's
/// atomic shim serves loom atomics), `LOOM_MAX_PREEMPTIONS` (default 3) and its own target
/// directory (`<target>/loom`) so the cfg does not invalidate the normal build. `args` go to
/// the test binaries (a test name filter, `--nocapture`).
pub fn run_loom(ws: &Workspace, args: &[String]) -> Result<()> {
    let mut selected = Vec::new();
    for name in LOOM_CRATES {
        match ws.package(name) {
            Ok(p) if p.dir.join("tests").join("loom.rs").is_file() => selected.push(*name),
            Ok(p) => println!(
                "loom: skipping {name}: no {} yet",
                p.dir.join("tests").join("loom.rs").display()
            ),
            Err(_) => println!("loom: skipping {name}: not a workspace member"),
        }
    }
    if selected.is_empty() {
        println!("loom: no loom tests to run");
        return Ok(());
    }
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.trim().is_empty() => format!("{f} --cfg oxccl_loom"),
        _ => "--cfg oxccl_loom".to_string(),
    };
    let preemptions =
        std::env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_MAX_PREEMPTIONS.into());
    let mut cmd: Command = Tool::cargo().cmd();
    cmd.current_dir(&ws.root)
        .env("RUSTFLAGS", rustflags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("LOOM_MAX_PREEMPTIONS", preemptions)
        .env("CARGO_TARGET_DIR", ws.target_dir.join("loom"))
        .args(["test", "--release"]);
    for name in &selected {
        cmd.args(["-p", name]);
    }
    cmd.args(["--test", "loom"]);
    if !args.is_empty() {
        cmd.arg("--").args(args);
    }
    run_bounded(&mut cmd, STEP_TIME_LIMIT)
}
