//! Every program refuses counts that mean nothing, before it starts any work, naming the
//! option: a zero that used to be quietly taken as one (or as a launch of no thread).

use std::process::Command;
use std::time::{Duration, Instant};

/// Longest a refused run may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// The path of the example program `name`.
fn program(name: &str) -> &'static str {
    match name {
        "pingpong" => env!("CARGO_BIN_EXE_pingpong"),
        "put_bw" => env!("CARGO_BIN_EXE_put_bw"),
        "launch_bench" => env!("CARGO_BIN_EXE_launch_bench"),
        "fifo_bench" => env!("CARGO_BIN_EXE_fifo_bench"),
        "port_ring" => env!("CARGO_BIN_EXE_port_ring"),
        "bootstrap_bench" => env!("CARGO_BIN_EXE_bootstrap_bench"),
        "allreduce" => env!("CARGO_BIN_EXE_allreduce"),
        "collectives" => env!("CARGO_BIN_EXE_collectives"),
        other => panic!("no program {other}"),
    }
}

/// Guards against a program taking `--iters 0`, `--runs 0`, a grid of no thread, a job of
/// no rank or more than one process can hold, or a zero timeout, for something else.
#[test]
fn zero_counts_are_refused_naming_the_option() {
    let cases: &[(&str, &[&str])] = &[
        ("pingpong", &["--iters", "0"]),
        ("pingpong", &["--runs", "0"]),
        ("put_bw", &["--runs", "0"]),
        ("put_bw", &["--max-iters", "0"]),
        ("put_bw", &["--timeout-s", "0"]),
        ("launch_bench", &["--threads", "1,0"]),
        ("launch_bench", &["--streams", "0"]),
        ("fifo_bench", &["--items", "0"]),
        ("port_ring", &["--chunk", "0"]),
        ("bootstrap_bench", &["--ranks", "0"]),
        ("bootstrap_bench", &["--ranks", "100000"]),
        ("allreduce", &["--ranks", "100000"]),
        ("collectives", &["--iters", "0"]),
    ];
    for &(name, args) in cases {
        let (program, option) = (program(name), args[0]);
        let started = Instant::now();
        let (status, text) = oxccl_examples::run_captured(
            Command::new("sh")
                .args(["-c", "exec \"$0\" \"$@\" 2>&1", program])
                .args(args),
            "arguments-test",
            started + DEADLINE,
        )
        .unwrap();
        let case = format!("{name} {args:?}");
        assert!(!status.is_some_and(|s| s.success()), "{case} ran:\n{text}");
        assert!(text.contains(option), "{case}:\n{text}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{case} started work"
        );
    }
}
