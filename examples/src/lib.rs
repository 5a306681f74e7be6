//! Shared helpers of the oxccl example programs, and the harness of the collective
//! benchmarks ([`collective_bench`]).
#![warn(missing_docs)]

pub mod collective_bench;
pub mod local_job;
pub mod thread_stats;

use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Round-trip time of a plain two-thread ping-pong over two atomics, `iters` rounds: the
/// floor any channel's ping-pong on this machine is measured against.
pub fn atomic_pingpong(iters: u64) -> Duration {
    let ping = Arc::new(AtomicU64::new(0));
    let pong = Arc::new(AtomicU64::new(0));
    let responder = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::spawn(move || {
            for i in 1..=iters {
                // Acquire/Release: the same pairing a semaphore signal and wait use.
                while ping.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.store(i, Ordering::Release);
            }
        })
    };
    let start = Instant::now();
    for i in 1..=iters {
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
    }
    let elapsed = start.elapsed();
    responder.join().expect("responder thread");
    elapsed / iters.max(1) as u32
}

/// Waits for `child` until `deadline`; past it, kills the child and returns `Ok(None)`.
///
/// # Errors
/// The system's errors from polling or killing the child.
pub fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            child.kill()?;
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `command` with its standard output into a file of its own (a pipe nobody reads
/// while waiting could fill and stall it), waits for it until `deadline` (then kills it,
/// as [`wait_until`]), and returns how it ended (`None`: killed) and what it printed. `tag`
/// names the file's folder apart from other runs at the same time; the folder is removed.
///
/// # Errors
/// The system's errors from the file, starting, polling or killing the child.
pub fn run_captured(
    command: &mut Command,
    tag: &str,
    deadline: Instant,
) -> std::io::Result<(Option<ExitStatus>, String)> {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out_path = dir.join("stdout");
    let ended = std::fs::File::create(&out_path)
        .and_then(|out| command.stdout(out).spawn())
        .and_then(|mut child| wait_until(&mut child, deadline));
    let text = std::fs::read_to_string(&out_path);
    let _ = std::fs::remove_dir_all(&dir);
    Ok((ended?, text?))
}

/// A duration in microseconds with two decimals.
pub fn micros(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

/// `x` with three decimals, or as many more as keep three significant digits of a small
/// one (past nine, in exponent form): a ratio or rate measured far below 1 is never printed
/// as zero.
pub fn figure(x: f64) -> String {
    if !(x > 0.0 && x < 1.0) {
        return format!("{x:.3}");
    }
    match 2 - x.log10().floor() as i32 {
        ..=3 => format!("{x:.3}"),
        decimals @ 4..=9 => format!("{x:.*}", decimals as usize),
        _ => format!("{x:.2e}"),
    }
}

/// Parses a byte count with an optional `K`, `M` or `G` suffix (powers of 1024).
///
/// # Errors
/// Text that is not a number with one of those suffixes, or a value that overflows.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count like 64, 8K or 16M"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Sends the library's log (`tracing`) to standard error, at the level `RUST_LOG` asks
/// (`info` shows the transport and backend choices; the syntax is `tracing-subscriber`'s
/// `EnvFilter`), `warn` when it is unset: a setting the library ignores with a warning (a
/// misspelt `OXCCL_PROXY_THREAD`) is seen. Call first in `main`; a second call does nothing.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::{figure, parse_bytes, wait_until};
    use std::time::{Duration, Instant};

    /// Guards against a small measured figure printed as zero (a put that took 500 µs once
    /// printed its ratio to the baseline as `0.000`, which reads as nothing measured).
    #[test]
    fn small_figures_keep_three_significant_digits() {
        assert_eq!(figure(21.3894), "21.389");
        assert_eq!(figure(0.5), "0.500");
        assert_eq!(figure(0.012345), "0.0123");
        assert_eq!(figure(0.000374), "0.000374");
        assert_eq!(figure(0.00000123), "0.00000123");
        assert_eq!(figure(1.23e-9), "1.23e-9");
        assert_eq!(figure(1.5e-12), "1.50e-12");
        assert!(figure(1.5e-12).parse::<f64>().unwrap() > 0.0);
        assert_eq!(figure(0.0), "0.000");
    }

    /// Guards against a child that never ends holding its parent forever, and against a
    /// child that ends in time being reported as killed.
    #[test]
    fn children_are_waited_for_until_a_deadline() {
        let mut quick = std::process::Command::new("true").spawn().unwrap();
        let status = wait_until(&mut quick, Instant::now() + Duration::from_secs(30)).unwrap();
        assert!(status.is_some_and(|s| s.success()));
        let mut stuck = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = wait_until(&mut stuck, started + Duration::from_millis(100)).unwrap();
        assert_eq!(status, None);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// Guards against size suffixes being misread or garbage being accepted.
    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("8K"), Ok(8192));
        assert_eq!(parse_bytes("16M"), Ok(16 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("99999999999999G").is_err());
    }
}
