//! How the FIFO's consumer paces itself after draining a stream of triggers.
//!
//! A consumer that has caught up with its producers polls the very slot they write next. On
//! a CPU (the emulator's pushers are CPU threads) every such poll takes the slot's cache
//! line away from the pusher, whose next atomic claim of the head then waits for the line
//! to come back: one cross-core round trip per trigger, however cheap the trigger.
//!
//! So after a drain that found a stream (at least [`STREAM_BATCH`] triggers in a row), the
//! consumer leaves the ring alone for [`STREAM_PAUSE`] before polling again. The pushers
//! fill whole lines undisturbed and the consumer takes them a line at a time. A lone
//! trigger (a ping-pong, a flag) drains as a batch of one and is never paced, so latency
//! stays that of a tight poll; the cost is at most `STREAM_PAUSE` added to the first
//! trigger after a stream ends.
//!
//! With the push's write prefetch (`oxccl_device::arch::prefetch_for_write`), this takes
//! `fifo_bench` from about 30 ns to about 13 ns per trigger on a 2-core x86 machine.

use std::time::{Duration, Instant};

/// Triggers one drain must execute to count as a stream.
pub const STREAM_BATCH: u64 = 4;

/// How long the consumer leaves the ring alone after draining a stream.
pub const STREAM_PAUSE: Duration = Duration::from_nanos(300);

/// Spin-loop hints between two looks at the clock while pausing.
const PAUSE_CHECK_EVERY: u32 = 8;

/// Paces the consumer after a drain that executed `executed` triggers: returns at once
/// after fewer than [`STREAM_BATCH`], else once [`STREAM_PAUSE`] has passed.
pub fn after_drain(executed: u64) {
    if executed < STREAM_BATCH {
        return;
    }
    let until = Instant::now() + STREAM_PAUSE;
    loop {
        for _ in 0..PAUSE_CHECK_EVERY {
            std::hint::spin_loop();
        }
        if Instant::now() >= until {
            return;
        }
    }
}
