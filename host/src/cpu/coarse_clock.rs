//! A cheap reading of the monotonic clock for the start of a host wait's deadline.
//!
//! `synchronize` reads the clock once per call, to set its deadline, whether or not it
//! waits at all; on a virtual machine `Instant::now` (`CLOCK_MONOTONIC`) took some 22 ns
//! there, about a tenth of an empty launch and its `synchronize`. The kernel's coarse
//! clock (`CLOCK_MONOTONIC_COARSE`, the same clock as of its last tick) reads in about 5.
//! A deadline a tick or two late costs nothing (the limits are seconds), one early would
//! give up on a wait the caller allowed: [`now_or_later`] is never early.

use rustix::time::{ClockId, Timespec, clock_getres, clock_gettime};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One reading of both clocks, and how late a coarse reading may be.
struct Anchor {
    /// `Instant::now()`, read first.
    fine: Instant,
    /// The coarse clock, read just after `fine`.
    coarse: Duration,
    /// The coarse clock's resolution (its tick), plus a margin for the time between the
    /// two readings of the anchor.
    slack: Duration,
}

/// The process's anchor, read at the first use.
fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let fine = Instant::now();
        let coarse = coarse_now();
        let tick = since_zero(clock_getres(ClockId::MonotonicCoarse));
        Anchor {
            fine,
            coarse,
            slack: tick + Duration::from_micros(1),
        }
    })
}

/// The coarse clock now.
fn coarse_now() -> Duration {
    since_zero(clock_gettime(ClockId::MonotonicCoarse))
}

/// `t` as a duration since the clock's zero (negative readings, which a monotonic clock
/// does not give, as zero).
fn since_zero(t: Timespec) -> Duration {
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(t.tv_nsec).unwrap_or(0).min(999_999_999);
    Duration::new(secs, nanos)
}

/// The time now as an [`Instant`], from the coarse clock: never earlier than
/// `Instant::now()` read at the call, and at most two ticks of the coarse clock later
/// (1-10 ms, by the kernel's configuration).
///
/// Why: the coarse clock is the fine one as of its last tick, so it lags by up to a tick,
/// and so did the anchor's coarse reading: the anchor plus the coarse time elapsed since is
/// within a tick of the truth either way; adding a tick makes it never early.
pub(crate) fn now_or_later() -> Instant {
    let a = anchor();
    a.fine + coarse_now().saturating_sub(a.coarse) + a.slack
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the contract the deadlines rely on: over 200 readings spread over some 20
    /// ms, each lies between a fine reading taken just before it and the fine reading
    /// taken just after plus two ticks.
    #[test]
    fn coarse_now_is_never_early_and_at_most_two_ticks_late() {
        let tick = since_zero(clock_getres(ClockId::MonotonicCoarse));
        for i in 0..200 {
            let before = Instant::now();
            let coarse = now_or_later();
            let after = Instant::now();
            assert!(
                coarse >= before,
                "reading {i} early by {:?}",
                before - coarse
            );
            let late = coarse.saturating_duration_since(after);
            assert!(
                late <= 2 * tick + Duration::from_micros(1),
                "reading {i} late by {late:?} (tick {tick:?})"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
