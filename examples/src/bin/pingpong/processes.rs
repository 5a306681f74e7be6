//! `--processes N`: the measurement in N fresh processes, one after another, and a summary.

use crate::Args;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest one measuring process may run before it is stopped and the run fails.
const PROCESS_DEADLINE: Duration = Duration::from_secs(300);

/// Runs `n` measuring processes of this program, prints each one's output, then the
/// summary line.
pub(crate) fn run_processes(args: &Args, n: u32) -> Result<(), String> {
    if n == 0 {
        return Err("--processes must be at least 1".into());
    }
    let system = |context: String, source: std::io::Error| format!("{context}: {source}");
    let exe = std::env::current_exe().map_err(|e| system("finding this program".into(), e))?;
    // Per process: the ratio, the round trip and the baseline (microseconds).
    let (mut ratios, mut trips, mut baselines) = (vec![], vec![], vec![]);
    for i in 0..n {
        let mut child = Command::new(&exe)
            .args(child_args(args))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| system(format!("starting measuring process {i}"), e))?;
        // The child prints a few short lines, far below a pipe's capacity: waiting for it
        // to exit before reading cannot block it.
        let status = oxccl_examples::wait_until(&mut child, Instant::now() + PROCESS_DEADLINE)
            .map_err(|e| system(format!("waiting for measuring process {i}"), e))?;
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            use std::io::Read;
            stdout
                .read_to_string(&mut out)
                .map_err(|e| system(format!("reading measuring process {i}"), e))?;
        }
        print!("{out}");
        match status {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(format!("measuring process {i} failed: {s}"));
            }
            None => {
                return Err(format!(
                    "measuring process {i} was still running after {} s and was stopped",
                    PROCESS_DEADLINE.as_secs()
                ));
            }
        }
        let line = out
            .lines()
            .find(|l| l.starts_with("pingpong "))
            .ok_or_else(|| format!("measuring process {i} printed no pingpong line"))?;
        let field = |name: &str| {
            field_of(line, name)
                .ok_or_else(|| format!("measuring process {i} printed no {name}: {line}"))
        };
        ratios.push(field("ratio")?);
        trips.push(field("round_trip_us")?);
        baselines.push(field("baseline_atomic_us")?);
    }
    let (median, max) = median_and_max(&mut ratios);
    let (median_trip, max_trip) = median_and_max(&mut trips);
    let (_, max_baseline) = median_and_max(&mut baselines);
    // Sorted by `median_and_max`: the first is the smallest.
    let min_baseline = baselines.first().copied().unwrap_or(f64::NAN);
    println!(
        "pingpong_summary channel={} assist={} processes={n} median_ratio={median:.2} \
         max_ratio={max:.2} median_round_trip_us={median_trip:.2} \
         max_round_trip_us={max_trip:.2} baseline_atomic_us={min_baseline:.2}-{max_baseline:.2}",
        args.channel.name(),
        args.assist.name()
    );
    Ok(())
}

/// The arguments of one measuring process: the same measurement, once.
fn child_args(args: &Args) -> Vec<String> {
    let mut v: Vec<String> = [
        "--channel",
        args.channel.name(),
        "--assist",
        args.assist.name(),
        "--backend",
        args.backend.name(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (flag, value) in [
        ("--iters", u64::from(args.iters)),
        ("--bytes", args.bytes),
        ("--runs", u64::from(args.runs)),
    ] {
        v.push(flag.into());
        v.push(value.to_string());
    }
    if args.thread_stats {
        v.push("--thread-stats".into());
    }
    v
}

/// The value of field `name` (`name=<x>`) of a `pingpong` line.
fn field_of(line: &str, name: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
        .and_then(|r| r.parse().ok())
}

/// The median (the mean of the middle two for an even count) and the largest value.
fn median_and_max(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[n - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a summary that reads the wrong field or miscounts the middle.
    #[test]
    fn lines_parse_and_summaries_add_up() {
        let line = "pingpong channel=port assist=off ranks=2 iters=10 round_trip_us=0.50 \
                    baseline_atomic_us=0.25 ratio=2.00";
        assert_eq!(field_of(line, "ratio"), Some(2.0));
        assert_eq!(field_of(line, "round_trip_us"), Some(0.5));
        assert_eq!(field_of(line, "baseline_atomic_us"), Some(0.25));
        assert_eq!(field_of("pingpong channel=port", "ratio"), None);
        assert_eq!(median_and_max(&mut [3.0, 1.0, 2.0]), (2.0, 3.0));
        assert_eq!(median_and_max(&mut [4.0, 1.0, 2.0, 3.0]), (2.5, 4.0));
    }
}
