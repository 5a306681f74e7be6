//! The `pingpong` program's `--processes` summary end to end, with few iterations: its
//! lines and fields, not its timings.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest the run may take before it is killed and the test fails.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Guards against a summary that drops or reorders a field, or whose figures do not come
/// from the process lines above it: two processes, each a line, then one summary whose
/// round trips and baselines span theirs.
#[test]
fn process_lines_and_summary() {
    let (status, text) = oxccl_examples::run_captured(
        Command::new(env!("CARGO_BIN_EXE_pingpong"))
            .args(["--channel", "port", "--assist", "on", "--processes", "2"])
            .args(["--iters", "300", "--runs", "1"])
            .stderr(Stdio::inherit()),
        "pingpong-test",
        Instant::now() + RUN_DEADLINE,
    )
    .unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{text}");
    let fields = |line: &str| -> Vec<(String, String)> {
        line.split_whitespace()
            .skip(1)
            .map(|f| {
                let (k, v) = f.split_once('=').unwrap_or_else(|| panic!("{f} in {line}"));
                (k.to_string(), v.to_string())
            })
            .collect()
    };
    let number = |v: &str| -> f64 { v.parse().unwrap_or_else(|_| panic!("{v} in {text}")) };
    let processes: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("pingpong "))
        .map(fields)
        .collect();
    assert_eq!(processes.len(), 2, "{text}");
    let of = |f: &[(String, String)], key: &str| {
        number(
            &f.iter()
                .find(|(k, _)| k == key)
                .unwrap_or_else(|| panic!("{key}"))
                .1,
        )
    };
    let trips: Vec<f64> = processes.iter().map(|f| of(f, "round_trip_us")).collect();
    let baselines: Vec<f64> = processes
        .iter()
        .map(|f| of(f, "baseline_atomic_us"))
        .collect();
    let summaries: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pingpong_summary "))
        .collect();
    assert_eq!(summaries.len(), 1, "{text}");
    let summary = fields(summaries[0]);
    let keys: Vec<&str> = summary.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "channel",
            "assist",
            "processes",
            "median_ratio",
            "max_ratio",
            "median_round_trip_us",
            "max_round_trip_us",
            "baseline_atomic_us"
        ],
        "{text}"
    );
    assert_eq!(summary[2].1, "2");
    let max_trip = trips.iter().copied().fold(0.0, f64::max);
    assert!(
        (of(&summary, "max_round_trip_us") - max_trip).abs() < 0.006,
        "{text}"
    );
    assert!(
        of(&summary, "median_ratio") <= of(&summary, "max_ratio"),
        "{text}"
    );
    let (lo, hi) = summary[7].1.split_once('-').expect("a range of baselines");
    let lowest = baselines.iter().copied().fold(f64::MAX, f64::min);
    let highest = baselines.iter().copied().fold(0.0, f64::max);
    assert!((number(lo) - lowest).abs() < 0.006, "{text}");
    assert!((number(hi) - highest).abs() < 0.006, "{text}");
}

/// Guards against the programs ignoring `OXCCL_BACKEND` (they ran on the emulator whatever
/// it said) or taking a misspelt one for the default.
#[test]
fn backend_comes_from_the_environment() {
    for (value, want) in [("garbage", "unknown backend `garbage`"), ("cuda", "cuda")] {
        let (status, text) = oxccl_examples::run_captured(
            Command::new("sh")
                .args(["-c", "exec \"$0\" --iters 10 --runs 1 2>&1"])
                .arg(env!("CARGO_BIN_EXE_pingpong"))
                .env("OXCCL_BACKEND", value),
            "pingpong-backend-test",
            Instant::now() + RUN_DEADLINE,
        )
        .unwrap();
        if value == "cuda" && status.is_some_and(|s| s.success()) {
            // A machine with a GPU: it ran there.
            continue;
        }
        assert!(!status.is_some_and(|s| s.success()), "{value}: {text}");
        assert!(text.contains(want), "{value}: {text}");
    }
}
