//! Every program refuses counts that mean nothing, before it starts any work, naming the
//! option: a zero that used to be quietly taken as one (or as a launch of no thread).

use std::process::Command;
use std::time::{Duration, Instant};

/// Longest a refused run may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// Guards against a program taking `--iters 0`, `--runs 0`, a grid of no thread, a job of
/// no rank or more than one process can hold, or a zero timeout, for something else.
#[test]
fn zero_counts_are_refused_naming_the_option() {
    let cases: &[(&str, &[&str], &str)] = &[
        (env!("CARGO_BIN_EXE_pingpong"), &["--iters", "0"], "--iters"),
        (env!("CARGO_BIN_EXE_pingpong"), &["--runs", "0"], "--runs"),
        (env!("CARGO_BIN_EXE_put_bw"), &["--runs", "0"], "--runs"),
        (env!("CARGO_BIN_EXE_put_bw"), &["--max-iters", "0"], "--max-iters"),
        (env!("CARGO_BIN_EXE_put_bw"), &["--timeout-s", "0"], "--timeout-s"),
        (env!("CARGO_BIN_EXE_launch_bench"), &["--threads", "1,0"], "--threads"),
        (env!("CARGO_BIN_EXE_launch_bench"), &["--streams", "0"], "--streams"),
        (env!("CARGO_BIN_EXE_fifo_bench"), &["--items", "0"], "--items"),
        (env!("CARGO_BIN_EXE_port_ring"), &["--chunk", "0"], "--chunk"),
        (env!("CARGO_BIN_EXE_bootstrap_bench"), &["--ranks", "0"], "--ranks"),
        (env!("CARGO_BIN_EXE_bootstrap_bench"), &["--ranks", "100000"], "--ranks"),
        (env!("CARGO_BIN_EXE_allreduce"), &["--ranks", "100000"], "--ranks"),
        (env!("CARGO_BIN_EXE_collectives"), &["--iters", "0"], "--iters"),
    ];
    for &(program, args, option) in cases {
        let started = Instant::now();
        let (status, text) = oxccl_examples::run_captured(
            Command::new("sh")
                .args(["-c", "exec \"$0\" \"$@\" 2>&1", program])
                .args(args),
            "arguments-test",
            started + DEADLINE,
        )
        .unwrap();
        let case = format!("{program} {args:?}");
        assert!(!status.is_some_and(|s| s.success()), "{case} ran:\n{text}");
        assert!(text.contains(option), "{case}:\n{text}");
        assert!(started.elapsed() < Duration::from_secs(10), "{case} started work");
    }
}
