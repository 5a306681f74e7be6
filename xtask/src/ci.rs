//! `cargo xtask ci` and `cargo xtask loom`.
//!
//! `ci` is what CI runs (through `.ci/run`), and what to run before pushing: every step, in
//! order, stopping at the first failure, then a summary with each step's time.
//!
//! 1. `fmt`: `cargo fmt --all -- --check`, within [`FMT_TIME_LIMIT`]
//! 2. `clippy`: `cargo clippy --workspace --all-targets -- -D warnings`, within
//!    [`STEP_TIME_LIMIT`]
//! 3. `doc`: `cargo doc --workspace --no-deps` with rustdoc warnings denied (a broken or
//!    private intra-doc link fails), within [`STEP_TIME_LIMIT`]
//! 4. `doc-private`: the same with `--document-private-items`: the docs of internals, whose
//!    links name private items, within [`STEP_TIME_LIMIT`]
//! 5. `test`: `cargo test --workspace`, within [`STEP_TIME_LIMIT`]
//! 6. `ib`: the InfiniBand / RoCE transport, built with the `ib` feature (off by default):
//!    clippy on the crates that have it ([`IB_CLIPPY`]), then its tests and oxccl's unit
//!    tests in that build ([`IB_TEST`]), each within [`STEP_TIME_LIMIT`]. No RDMA device is
//!    needed: the tests check the transport's encodings and its errors without one
//! 7. `netns`: `cargo xtask netns-test` ([`crate::netns_test`]): port channels between two
//!    nodes emulated by network namespaces, each job within
//!    [`crate::netns_test::JOB_TIME_LIMIT`]. Where the machine cannot run it (not root, no
//!    `ip` or `unshare`), the step passes and says why it skipped
//! 8. `loom`: the loom models of the FIFO and semaphore protocols ([`run_loom`]), within
//!    [`STEP_TIME_LIMIT`]; fails if a crate's models ran no test
//! 9. `build-ptx`: `build-ptx --check` for sm_70, sm_80 and sm_90, where each build,
//!    each ptxas run and the installation of ptxas has its own limit
//!    ([`oxccl_build::ptx::BUILD_TIME_LIMIT`], [`oxccl_build::ptxas`]); then the ignored
//!    end-to-end test of oxccl-build that builds a kernel crate outside this workspace to
//!    PTX, as a user builds theirs ([`USER_KERNELS_TEST`], within [`STEP_TIME_LIMIT`]; it
//!    builds `core` for nvptx64 once more, in a target directory of its own, about half a
//!    minute on two cores); fails if it ran no test
//! 10. `embed-ptx`: oxccl built with the `embed-ptx` feature, which embeds the modules of
//!     step 9: clippy on it ([`EMBED_CLIPPY`]), then its unit tests ([`EMBED_TEST`]), which
//!     check that what is embedded is the files build-ptx wrote, each within
//!     [`STEP_TIME_LIMIT`]; fails if it ran no test
//! 11. `gpu-bundle`: builds `target/gpu-bundle/` from the PTX of step 9 (compile only: no
//!     GPU here), so what runs on a GPU machine cannot rot ([`crate::gpu_bundle`])
//!
//! Every command runs under a deadline (see [`oxccl_build::bounded`]): one that hangs fails its
//! step, named in the error, instead of holding CI until the runner's own limit.
//!
//! Under `CI=true` the rustup components all steps need are installed first.

use crate::build_ptx;
use crate::libtest::{self, Summary};
use anyhow::{Context, Result, bail};
use oxccl_build::Workspace;
use oxccl_build::arch::DEFAULT_ARCHES;
use oxccl_build::bounded::{fmt_duration, run_bounded, run_bounded_tee, show};
use oxccl_build::tool::{Tool, is_ci};
use oxccl_build::toolchain::{self, ensure_components};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Crates whose `tests/loom.rs` `cargo xtask loom` runs.
pub const LOOM_CRATES: &[&str] = &["oxccl-device", "oxccl-proxy"];

/// Preemption bound loom explores by default; `LOOM_MAX_PREEMPTIONS` overrides it.
pub const LOOM_MAX_PREEMPTIONS: &str = "3";

/// Longest the `clippy`, `doc`, `doc-private`, `test` and `loom` steps may each take,
/// builds included (a full run takes a few minutes): past it the step is killed and fails, so a hung test or build
/// cannot hold CI.
pub const STEP_TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Longest the `fmt` step may take (it takes seconds).
pub const FMT_TIME_LIMIT: Duration = Duration::from_secs(5 * 60);

/// The `cargo test` arguments that run oxccl-build's end-to-end test: the ignored tests of
/// `build/tests/user_kernels.rs` only (the others ran in the `test` step).
pub const USER_KERNELS_TEST: &[&str] = &[
    "test",
    "-p",
    "oxccl-build",
    "--test",
    "user_kernels",
    "--",
    "--ignored",
];

/// The `cargo clippy` arguments of the `embed-ptx` step: oxccl with the modules of the
/// `build-ptx` step embedded.
pub const EMBED_CLIPPY: &[&str] = &[
    "clippy",
    "-p",
    "oxccl",
    "--features",
    "embed-ptx",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];

/// The `cargo test` arguments of the `embed-ptx` step: oxccl's unit test of what it
/// embedded, which exists only with the feature (so a build without it runs no test).
pub const EMBED_TEST: &[&str] = &[
    "test",
    "-p",
    "oxccl",
    "--features",
    "embed-ptx",
    "--lib",
    "embedded_modules_are_the_files_they_came_from",
];

/// The `cargo clippy` arguments of the `ib` step: the crates with the `ib` feature, built
/// with it.
pub const IB_CLIPPY: &[&str] = &[
    "clippy",
    "-p",
    "oxccl",
    "-p",
    "oxccl-examples",
    "--features",
    "oxccl/ib",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];

/// The `cargo test` arguments of the `ib` step: oxccl's unit tests and the transport's
/// integration test, built with the `ib` feature.
pub const IB_TEST: &[&str] = &[
    "test",
    "-p",
    "oxccl",
    "--features",
    "ib",
    "--lib",
    "--test",
    "ib_transport",
];

/// Options of `cargo xtask ci`.
#[derive(Debug, Clone, Default)]
pub struct CiOptions {
    /// Let kernels spill registers (a warning instead of a failure).
    pub allow_spills: bool,
}

enum Outcome {
    /// Passed after this long, leaving this much disk free.
    Passed(Duration, Option<u64>),
    /// Failed after this long, leaving this much disk free.
    Failed(Duration, Option<u64>),
    NotRun,
}

/// One CI step: its name, the command line it shows, and what runs it.
type Step<'a> = (&'static str, String, Box<dyn FnOnce() -> Result<()> + 'a>);

/// A step that runs `clippy` over a build with a feature, then that build's tests
/// (`what`), and fails if no test ran.
fn clippy_then_tests<'a>(
    name: &'static str,
    mut clippy: Command,
    mut test: Command,
    what: &'static str,
) -> Step<'a> {
    (
        name,
        format!("{}, then {}", show(&clippy), show(&test)),
        Box::new(move || {
            run_bounded(&mut clippy, STEP_TIME_LIMIT)?;
            let stdout = run_bounded_tee(&mut test, STEP_TIME_LIMIT)?;
            check_ran(what, &libtest::summaries(&stdout))
        }),
    )
}

/// Free space below which `ci` warns before it starts: a full run from a clean clone writes
/// 4.7 GiB into the target directory (2.5 of them the test build; more on a warm one, whose
/// old artifacts stay).
pub const LOW_DISK_WARNING: u64 = 6 << 30;

/// Free space below which a failed step is reported as probably caused by a full disk (a
/// linker then dies of a bus error or `No space left on device`, far from the real cause).
pub const DISK_FULL: u64 = 512 << 20;

/// Bytes free to an unprivileged writer on the file system holding `dir`; `None` where it
/// cannot be read (the directory does not exist yet, say).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let mut dir = dir;
    while !dir.exists() {
        dir = dir.parent()?;
    }
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `bytes` in GiB with one decimal, for the summary.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Runs every CI step; see the module docs.
pub fn run_ci(ws: &Workspace, opts: &CiOptions) -> Result<()> {
    let free = || free_bytes(&ws.target_dir);
    match free() {
        Some(b) if b < LOW_DISK_WARNING => println!(
            "ci: WARNING only {} free for {}: a full run writes about {}",
            gib(b),
            ws.target_dir.display(),
            gib(LOW_DISK_WARNING)
        ),
        Some(b) => println!("ci: {} free for {}", gib(b), ws.target_dir.display()),
        None => {}
    }
    if is_ci() {
        let mut all = vec!["rustfmt", "clippy"];
        all.extend_from_slice(toolchain::COMPONENTS);
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
    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings");
    // The private items' docs too: the notes on internals are read by the people who
    // change them, and a broken link there is as wrong as one in the public docs.
    let mut doc_private = cargo();
    doc_private
        .args([
            "doc",
            "--workspace",
            "--no-deps",
            "--document-private-items",
        ])
        .env("RUSTDOCFLAGS", "-D warnings");
    let mut test = cargo();
    test.args(["test", "--workspace"]);
    let mut ib_clippy = cargo();
    ib_clippy.args(IB_CLIPPY);
    let mut ib_test = cargo();
    ib_test.args(IB_TEST);
    let mut user_kernels = cargo();
    user_kernels.args(USER_KERNELS_TEST);
    let mut embed_clippy = cargo();
    embed_clippy.args(EMBED_CLIPPY);
    let mut embed_test = cargo();
    embed_test.args(EMBED_TEST);
    let ptx_opts = build_ptx::Options {
        packages: Vec::new(),
        arches: DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect(),
        check: true,
        allow_spills: opts.allow_spills,
    };

    let steps: Vec<Step> = vec![
        (
            "fmt",
            show(&fmt),
            Box::new(move || Ok(run_bounded(&mut fmt, FMT_TIME_LIMIT)?)),
        ),
        (
            "clippy",
            show(&clippy),
            Box::new(move || Ok(run_bounded(&mut clippy, STEP_TIME_LIMIT)?)),
        ),
        (
            "doc",
            show(&doc),
            Box::new(move || Ok(run_bounded(&mut doc, STEP_TIME_LIMIT)?)),
        ),
        (
            "doc-private",
            show(&doc_private),
            Box::new(move || Ok(run_bounded(&mut doc_private, STEP_TIME_LIMIT)?)),
        ),
        (
            "test",
            show(&test),
            Box::new(move || Ok(run_bounded(&mut test, STEP_TIME_LIMIT)?)),
        ),
        clippy_then_tests("ib", ib_clippy, ib_test, "the ib build's tests"),
        (
            "netns",
            match crate::netns_test::unsupported() {
                None => "cargo xtask netns-test".into(),
                Some(why) => format!("cargo xtask netns-test: skipped, {why}"),
            },
            Box::new(|| match crate::netns_test::unsupported() {
                None => crate::netns_test::run_netns_test(ws),
                Some(why) => {
                    println!("netns: SKIPPED, this machine cannot run it: {why}");
                    Ok(())
                }
            }),
        ),
        (
            "loom",
            "cargo xtask loom".into(),
            Box::new(|| run_loom(ws, &[])),
        ),
        (
            "build-ptx",
            format!(
                "cargo xtask build-ptx --check --arch {}, then {}",
                DEFAULT_ARCHES.join(","),
                show(&user_kernels)
            ),
            Box::new(move || {
                build_ptx::run_build_ptx(ws, &ptx_opts)?;
                let stdout = run_bounded_tee(&mut user_kernels, STEP_TIME_LIMIT)?;
                check_ran(
                    "oxccl-build's user_kernels test",
                    &libtest::summaries(&stdout),
                )
            }),
        ),
        clippy_then_tests(
            "embed-ptx",
            embed_clippy,
            embed_test,
            "the embed-ptx build's tests",
        ),
        (
            "gpu-bundle",
            "cargo xtask gpu-bundle --reuse-ptx (built, not run: no GPU here)".into(),
            Box::new(|| crate::gpu_bundle::run_gpu_bundle(ws, true, &[])),
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
        let result = step();
        let left = free();
        match result {
            Ok(()) => outcomes.push(Outcome::Passed(t.elapsed(), left)),
            Err(mut e) => {
                outcomes.push(Outcome::Failed(t.elapsed(), left));
                if let Some(b) = left.filter(|&b| b < DISK_FULL) {
                    e = e.context(format!(
                        "the disk holding {} is full ({} free): free space and run again",
                        ws.target_dir.display(),
                        gib(b)
                    ));
                }
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
        let (status, time, left) = match outcome {
            Outcome::Passed(d, left) => ("ok", fmt_duration(*d), *left),
            Outcome::Failed(d, left) => ("FAILED", fmt_duration(*d), *left),
            Outcome::NotRun => ("not run", String::new(), None),
        };
        let left = left.map_or(String::new(), |b| format!("  {} free after", gib(b)));
        println!("  {name:<11} {status:<8} {time:>9}{left}");
    }
    let elapsed = fmt_duration(started.elapsed());
    match error {
        None => {
            println!("  {:<11} {:<8} {elapsed:>9}", "total", "ok");
            Ok(())
        }
        Some((name, e)) => {
            println!("  {:<11} {:<8} {elapsed:>9}", "total", "FAILED");
            bail!("ci failed at step `{name}`: {e:#}")
        }
    }
}

/// Runs the loom models: `cargo test --release -p <crate> --test loom` for each crate of
/// [`LOOM_CRATES`], with `--cfg oxccl_loom` (so the device crate's atomic shim serves loom
/// atomics), `LOOM_MAX_PREEMPTIONS` (default 3) and its own target directory
/// (`<target>/loom`) so the cfg does not invalidate the normal build. `args` go to the test
/// binaries (a test name filter, `--nocapture`). All crates together get
/// [`STEP_TIME_LIMIT`].
///
/// Fails unless tests ran (see [`check_loom_ran`]): a crate of [`LOOM_CRATES`] without
/// `tests/loom.rs`, a model file with no test left in it, or a filter matching nothing
/// would otherwise pass while checking nothing.
pub fn run_loom(ws: &Workspace, args: &[String]) -> Result<()> {
    let mut crates = Vec::new();
    for name in LOOM_CRATES {
        let p = ws
            .package(name)
            .with_context(|| format!("loom: {name} is in LOOM_CRATES"))?;
        let models = p.dir.join("tests").join("loom.rs");
        if !models.is_file() {
            bail!(
                "loom: {} is missing, so {name}'s loom models would not run (take {name} out \
                 of LOOM_CRATES if it has none any more)",
                models.display()
            );
        }
        crates.push(*name);
    }
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.trim().is_empty() => format!("{f} --cfg oxccl_loom"),
        _ => "--cfg oxccl_loom".to_string(),
    };
    let preemptions =
        std::env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_MAX_PREEMPTIONS.into());
    let deadline = Instant::now() + STEP_TIME_LIMIT;
    let mut ran = Vec::new();
    // One cargo run per crate: both binaries are `tests/loom.rs`, and only this way does
    // each `test result:` line tell whose it is.
    for name in crates {
        let mut cmd: Command = Tool::cargo().cmd();
        cmd.current_dir(&ws.root)
            .env("RUSTFLAGS", &rustflags)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("LOOM_MAX_PREEMPTIONS", &preemptions)
            .env("CARGO_TARGET_DIR", ws.target_dir.join("loom"))
            .args(["test", "--release", "-p", name, "--test", "loom"]);
        if !args.is_empty() {
            cmd.arg("--").args(args);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "loom: the step ran past {} before {name}'s models",
                fmt_duration(STEP_TIME_LIMIT)
            );
        }
        let stdout = run_bounded_tee(&mut cmd, left)?;
        ran.push((name, libtest::summaries(&stdout)));
    }
    let passed = check_loom_ran(&ran, args)?;
    println!("loom: {passed} model(s) passed");
    Ok(())
}

/// Checks that a test binary that must run tests (`what`, for the message) reported at
/// least one passed: a renamed or removed test would otherwise pass while checking nothing.
pub fn check_ran(what: &str, summaries: &[Summary]) -> Result<()> {
    if summaries.iter().map(|s| s.passed).sum::<u64>() == 0 {
        bail!("{what} ran no test (`running 0 tests`, or no `test result:` line)");
    }
    Ok(())
}

/// Checks that the loom runs, `(crate, the test result lines of its binary)`, ran a test,
/// and returns how many passed.
///
/// Every crate must report a `test result:` line with at least one test passed, except
/// that when `args` are given a crate may run none of its tests if a filter left them all
/// out (`N filtered out`): a filter names the tests of one crate. A crate whose binary
/// holds no test, or only ignored ones, fails either way, and so do runs where nothing at
/// all passed.
pub fn check_loom_ran(ran: &[(&str, Vec<Summary>)], args: &[String]) -> Result<u64> {
    let mut problems = Vec::new();
    let mut total = 0;
    for (name, summaries) in ran {
        if summaries.is_empty() {
            problems.push(format!(
                "{name}: its loom binary printed no `test result:` line"
            ));
            continue;
        }
        let passed: u64 = summaries.iter().map(|s| s.passed).sum();
        let filtered_out: u64 = summaries.iter().map(|s| s.filtered_out).sum();
        total += passed;
        if passed == 0 && (args.is_empty() || filtered_out == 0) {
            problems.push(format!(
                "{name}: no loom test ran (`running 0 tests`, or all ignored): \
                 tests/loom.rs checks nothing"
            ));
        }
    }
    if problems.is_empty() && total == 0 {
        problems.push(format!(
            "no loom test matched `{}` in {}",
            args.join(" "),
            ran.iter().map(|r| r.0).collect::<Vec<_>>().join(" or ")
        ));
    }
    if !problems.is_empty() {
        bail!("loom: {}", problems.join("; "));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(passed: u64, ignored: u64, filtered_out: u64) -> Vec<Summary> {
        vec![Summary {
            passed,
            failed: 0,
            ignored,
            filtered_out,
        }]
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Guards against a build-ptx step that passes with the end-to-end test of a user's
    /// kernel crate gone: renamed, no longer ignored (so `--ignored` runs nothing), or its
    /// binary printing no result.
    #[test]
    fn a_required_test_must_have_run() {
        assert!(check_ran("t", &ran(1, 0, 0)).is_ok());
        let err = check_ran("t", &ran(0, 0, 0)).unwrap_err().to_string();
        assert!(err.contains("t ran no test"), "{err}");
        assert!(check_ran("t", &[]).is_err());
    }

    /// Guards against failing the step when every crate ran its models.
    #[test]
    fn loom_passes_when_each_crate_ran_tests() {
        let r = [
            ("oxccl-device", ran(4, 0, 0)),
            ("oxccl-proxy", ran(3, 0, 0)),
        ];
        assert_eq!(check_loom_ran(&r, &[]).unwrap(), 7);
    }

    /// Guards against a loom step that passes while checking nothing: a crate whose
    /// `tests/loom.rs` holds no test (`running 0 tests`) fails it, even when the other
    /// crate ran tests, and so does a crate whose tests are all ignored.
    #[test]
    fn loom_fails_when_a_crate_ran_no_test() {
        let r = [
            ("oxccl-device", ran(4, 0, 0)),
            ("oxccl-proxy", ran(0, 0, 0)),
        ];
        let err = check_loom_ran(&r, &[]).unwrap_err().to_string();
        assert!(err.contains("oxccl-proxy: no loom test ran"), "{err}");
        assert!(!err.contains("oxccl-device"), "{err}");
        let r = [("oxccl-device", ran(0, 2, 0))];
        assert!(check_loom_ran(&r, &[]).is_err());
        let r = [("oxccl-device", ran(0, 0, 0))];
        assert!(check_loom_ran(&r, &args(&["--nocapture"])).is_err());
    }

    /// Guards against a binary that reported nothing (a changed harness, `--list`) read as
    /// a pass.
    #[test]
    fn loom_fails_without_a_test_result_line() {
        let r = [("oxccl-device", Vec::new()), ("oxccl-proxy", ran(3, 0, 0))];
        let err = check_loom_ran(&r, &[]).unwrap_err().to_string();
        assert!(
            err.contains("oxccl-device: its loom binary printed no"),
            "{err}"
        );
    }

    /// Guards against `cargo xtask loom -- name` passing when `name` matches no test.
    #[test]
    fn loom_fails_when_a_filter_matches_nothing() {
        let r = [
            ("oxccl-device", ran(0, 0, 4)),
            ("oxccl-proxy", ran(0, 0, 4)),
        ];
        let err = check_loom_ran(&r, &args(&["no_such_model"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no loom test matched `no_such_model`"),
            "{err}"
        );
    }

    /// Guards against a filter for one crate's model failing the step for the other crate,
    /// whose tests it rightly left out.
    #[test]
    fn loom_filter_may_select_one_crate() {
        let r = [
            ("oxccl-device", ran(0, 0, 4)),
            ("oxccl-proxy", ran(1, 0, 3)),
        ];
        assert_eq!(check_loom_ran(&r, &args(&["fifo_wrap"])).unwrap(), 1);
    }
}
