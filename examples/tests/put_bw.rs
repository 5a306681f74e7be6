//! The `put_bw` program end to end with tiny sizes: its output lines, not its timings.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest one run of the program may take before it is killed and the test fails.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `put_bw` with `extra` arguments and tiny sizes; returns its standard output.
fn run(extra: &[&str]) -> String {
    // One folder per run: the tests run at once, and each removes its own.
    let tag = format!("put-bw-test-{}", extra.join("").replace('-', ""));
    let (status, text) = oxccl_examples::run_captured(
        Command::new(env!("CARGO_BIN_EXE_put_bw"))
            .args(["--min-bytes", "4K", "--max-bytes", "16K"])
            .args(["--total-bytes", "64K", "--runs", "1", "--timeout-s", "30"])
            .args(extra)
            .env_remove("OXCCL_TRANSPORT")
            .stderr(Stdio::inherit()),
        &tag,
        Instant::now() + RUN_DEADLINE,
    )
    .unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "put_bw {extra:?} ended with {status:?}:\n{text}"
    );
    text
}

/// Checks that `text` holds one line per size, each with every field in order.
fn check_lines(text: &str, transport: &str, baseline: &str) {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("put_bw ")).collect();
    assert_eq!(lines.len(), 2, "one line per size (4K, 16K):\n{text}");
    for (line, bytes) in lines.iter().zip([4096u64, 16384]) {
        let fields: Vec<(&str, &str)> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.split_once('=').unwrap_or_else(|| panic!("{f} in {line}")))
            .collect();
        let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "transport",
                "bytes",
                "gbps",
                "baseline",
                "baseline_gbps",
                "ratio"
            ],
            "{line}"
        );
        assert_eq!(fields[0].1, transport, "{line}");
        assert_eq!(fields[1].1, bytes.to_string(), "{line}");
        assert_eq!(fields[3].1, baseline, "{line}");
        for i in [2, 4, 5] {
            let x: f64 = fields[i].1.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(x.is_finite() && x > 0.0, "{line}");
        }
    }
}

/// Guards against a put_bw line that drops or reorders a field, names the wrong baseline,
/// or reports a size it did not measure, over host IPC between threads.
#[test]
fn host_ipc_lines() {
    check_lines(&run(&["--transport", "host-ipc"]), "host-ipc", "memcpy");
}

/// As above over Ethernet (loopback), with the TCP baseline.
#[test]
fn ethernet_lines() {
    check_lines(&run(&["--transport", "ethernet"]), "ethernet", "tcp");
}

/// Guards against ranks as processes not finding each other's baseline stream, or the
/// transport not reaching the processes started by `--processes`.
#[test]
fn ethernet_lines_as_processes() {
    check_lines(
        &run(&["--transport", "ethernet", "--processes"]),
        "ethernet",
        "tcp",
    );
}
