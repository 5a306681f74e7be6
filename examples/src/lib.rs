//! Shared helpers of the oxccl example programs, and the harness of the collective
//! benchmarks ([`collective_bench`]).
#![warn(missing_docs)]

pub mod collective_bench;
pub mod thread_stats;

use std::process::{Child, ExitStatus};
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

/// A duration in microseconds with two decimals.
pub fn micros(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
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

#[cfg(test)]
mod tests {
    use super::{parse_bytes, wait_until};
    use std::time::{Duration, Instant};

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
