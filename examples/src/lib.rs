//! Shared helpers of the oxccl example programs.
#![warn(missing_docs)]

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

/// A duration in microseconds with two decimals.
pub fn micros(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}
