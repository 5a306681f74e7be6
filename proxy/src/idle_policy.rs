//! How the proxy thread waits for the next trigger when its FIFO is empty.
//!
//! On the CPU emulator the pushers are host threads, which can wake a parked proxy: the
//! proxy announces that it parks in the FIFO head and the next push rings the FIFO's
//! doorbell ([`IdlePolicy::Doorbell`]). A GPU cannot wake a host thread, and the host must
//! never read-modify-write the head, which lives in device memory there. So a proxy whose
//! pushers are GPU threads polls the ring: continuously for a while after its last trigger
//! (a kernel's next trigger usually comes within microseconds), then in naps that grow to a
//! ceiling ([`IdlePolicy::Poll`]). Two costs follow, both set by the [`PollSchedule`]: the
//! first trigger after a long idle spell waits up to one nap, and an idle proxy wakes once
//! per longest nap. MSCCL++'s proxy polls without ever sleeping, one core for each GPU.

use std::time::{Duration, Instant};

/// How an idle proxy thread waits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    /// Park until a push rings the FIFO's doorbell: host pushers only (the CPU emulator).
    #[default]
    Doorbell,
    /// Poll, then nap: what a FIFO whose pushers are GPU threads needs. The FIFO's handles
    /// carry no doorbell, and the proxy never touches the head.
    Poll(PollSchedule),
}

/// The proxy's polling when no one can wake it: how long it stays hot after a trigger, and
/// how long it naps between polls after that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollSchedule {
    /// How long after its last trigger the proxy polls without sleeping.
    pub hot: Duration,
    /// The first nap once the hot spell is over; each nap that finds nothing doubles the
    /// next, up to [`Self::max_nap`].
    pub first_nap: Duration,
    /// The longest nap: the most a trigger after a long idle spell waits to be seen, and
    /// the period at which an idle proxy wakes.
    pub max_nap: Duration,
}

impl Default for PollSchedule {
    /// Hot for 10 ms after the last trigger, then naps from 50 µs to 5 ms: an idle proxy
    /// wakes 200 times a second. A wakeup costs about 3-5 µs of CPU on bare metal and
    /// 30-40 µs in a small VM (`fifo_bench --idle`: 0.8-0.9 % of a core there at 5 ms,
    /// 1.0 at 4 ms, 3.4 at 1 ms). A trigger after a long idle spell waits 2.5 ms on average,
    /// unless the host announced it ([`crate::ProxyService::expect_triggers`]).
    fn default() -> Self {
        PollSchedule {
            hot: Duration::from_millis(10),
            first_nap: Duration::from_micros(50),
            max_nap: Duration::from_millis(5),
        }
    }
}

impl PollSchedule {
    /// A schedule that never naps: the proxy polls all the time, as MSCCL++'s does (a core
    /// for each proxy, the lowest latency).
    pub fn always_hot() -> Self {
        PollSchedule {
            hot: Duration::MAX,
            ..PollSchedule::default()
        }
    }

    /// Where the naps start, for a proxy that has just found work. (The proxy thread, which
    /// the loom models leave out, is its only user.)
    #[cfg_attr(oxccl_loom, allow(dead_code))]
    pub(crate) fn start(&self) -> PollState {
        PollState {
            last_work: Instant::now(),
            nap: self.first_nap,
        }
    }
}

/// Where a polling proxy is in its [`PollSchedule`].
#[derive(Clone, Copy, Debug)]
#[cfg_attr(oxccl_loom, allow(dead_code))]
pub(crate) struct PollState {
    last_work: Instant,
    nap: Duration,
}

#[cfg_attr(oxccl_loom, allow(dead_code))]
impl PollState {
    /// Work was found: hot again, naps from the start.
    pub(crate) fn work_found(&mut self, schedule: &PollSchedule) {
        *self = schedule.start();
    }

    /// The nap to take after a poll that found nothing: `None` while still hot.
    pub(crate) fn next_nap(&mut self, schedule: &PollSchedule) -> Option<Duration> {
        if self.last_work.elapsed() < schedule.hot {
            return None;
        }
        let nap = self.nap.min(schedule.max_nap);
        self.nap = (self.nap * 2).min(schedule.max_nap);
        Some(nap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_double_up_to_the_ceiling_once_the_hot_spell_is_over() {
        let schedule = PollSchedule {
            hot: Duration::ZERO,
            first_nap: Duration::from_micros(50),
            max_nap: Duration::from_micros(300),
        };
        let mut state = schedule.start();
        let naps: Vec<u128> = (0..5)
            .map(|_| state.next_nap(&schedule).unwrap().as_micros())
            .collect();
        assert_eq!(naps, [50, 100, 200, 300, 300]);
        state.work_found(&schedule);
        assert_eq!(state.next_nap(&schedule), Some(Duration::from_micros(50)));
    }

    #[test]
    fn no_nap_while_hot() {
        let schedule = PollSchedule::always_hot();
        let mut state = schedule.start();
        assert_eq!(state.next_nap(&schedule), None);
    }
}
