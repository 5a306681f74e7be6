//! The CPU emulator: how kernels run without a GPU.
//!
//! - [`memory`]: emulated device memory (page-aligned, zeroed host memory).
//! - [`pool`]: the process-wide pool of OS threads that run kernel threads, all threads of
//!   a launch at once.
//! - [`inline`]: a kernel thread run by the host thread that waits for it, on a stack of
//!   its own, moved to the pool if it runs past the wait's deadline.
//! - [`launch`]: one launch — its copied parameters, block barriers, running count and
//!   failures.
//! - [`stream`]: the in-order queue of launches of one stream, and waiting for it.
//! - [`deferral`]: launches left for the `synchronize` that follows them, and the thread
//!   that starts those nobody synchronizes.
//!
//! - [`coarse_clock`]: a cheap, never early reading of the clock for host deadlines.
//!
//! Every wait here backs off (spin, then yield, then sleep on a condition variable or
//! park), so that several ranks, each with kernel threads and a proxy, progress on few
//! cores.

pub(crate) mod coarse_clock;
pub(crate) mod corun;
pub(crate) mod deferral;
pub(crate) mod inline;
pub(crate) mod launch;
pub(crate) mod memory;
pub(crate) mod pool;
pub(crate) mod stream;

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

/// Keeps the default panic hook quiet for emulated kernel threads: a kernel whose threads
/// panic is reported once, by its launch (the first thread's message and a count of the
/// others), not as one backtrace per thread. Other threads' panics print as before.
/// Installed once per process, by the first launch.
pub(crate) fn quiet_kernel_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !oxccl_device::arch::host::in_kernel() {
                previous(info);
            }
        }));
    });
}

/// The most kernel threads one launch may start on the CPU backend: each is an OS thread,
/// and all of a launch's threads run at once.
pub(crate) const MAX_THREADS_PER_LAUNCH: u64 = 1024;

/// State of one emulated device shared by its handles, streams and buffers.
#[derive(Debug)]
pub(crate) struct CpuDevice {
    pub(crate) ordinal: usize,
    /// Launches enqueued on any stream of this device and not yet complete.
    in_flight: AtomicU64,
    /// Raised when `in_flight` drops to zero.
    idle: Signal,
    /// Set when a wait for this device's launches timed out (a stream's `synchronize`, a
    /// buffer's drop); cleared when the device goes idle. While set, dropping a buffer
    /// leaks it at once instead of waiting a whole timeout again.
    stuck: AtomicBool,
    /// Numbers the device's streams, for messages.
    next_stream: AtomicU64,
    /// Whether its streams' kernel threads may take turns with those of other such devices
    /// on one host thread (see [`corun`]): set for the device of a communicator's rank.
    pub(crate) corun: AtomicBool,
}

impl CpuDevice {
    pub(crate) fn new(ordinal: usize) -> Self {
        Self {
            ordinal,
            in_flight: AtomicU64::new(0),
            idle: Signal::default(),
            stuck: AtomicBool::new(false),
            next_stream: AtomicU64::new(0),
            corun: AtomicBool::new(false),
        }
    }

    pub(crate) fn next_stream_id(&self) -> u64 {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    fn launch_enqueued(&self) {
        // SeqCst: the Dekker pair of `Signal` (see there).
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    fn launch_completed(&self) {
        // SeqCst: the Dekker pair of `Signal`; also releases the launch's writes to a
        // thread that then frees memory (`wait_idle`).
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.stuck.store(false, Ordering::Relaxed);
            self.idle.notify();
        }
    }

    /// Whether no launch of this device is queued or running.
    pub(crate) fn is_idle(&self) -> bool {
        // SeqCst: as in `wait_idle`; acquires the writes of the last completed launch.
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Records that a wait for this device's launches timed out.
    pub(crate) fn mark_stuck(&self) {
        // Relaxed: a hint that only shortens later waits.
        self.stuck.store(true, Ordering::Relaxed);
    }

    /// Waits until no launch of this device is queued or running, at most `timeout`, or
    /// not at all if an earlier wait already timed out and the device has not gone idle
    /// since. Returns whether the device is idle.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        if self.is_idle() {
            return true;
        }
        if self.stuck.load(Ordering::Relaxed) {
            return false;
        }
        let deadline = Instant::now().checked_add(timeout);
        let idle = self.idle.wait_until(|| self.is_idle(), deadline);
        if !idle {
            self.mark_stuck();
        }
        idle
    }
}

/// Wakes host threads that wait for a condition kernel threads make true.
///
/// A waiter polls the condition for a short while (a kernel often finishes within
/// microseconds), then sleeps on a condition variable. Dekker handshake: the waiter
/// increments `sleepers`, registers (under `lock`) the progress count it needs in
/// `wake_at`, and then checks the condition; the notifier makes progress and then checks
/// `sleepers` and `wake_at`, all with SeqCst, so either the waiter sees the progress or the
/// notifier sees the registration, and a wake-up is never lost. The notifier takes `lock`
/// before notifying, and resets `wake_at` there; woken waiters register again.
///
/// `wake_at` spares a waiter for the 20th of 20 queued launches a wake-up (a futex call and
/// a context switch) at each of the 19 before.
#[derive(Debug)]
pub(crate) struct Signal {
    sleepers: AtomicU32,
    /// The smallest progress count a sleeper waits for (`u64::MAX`: none registered since
    /// the last wake-up).
    wake_at: AtomicU64,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Default for Signal {
    fn default() -> Self {
        Signal {
            sleepers: AtomicU32::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }
}

/// How long a host wait polls before it sleeps.
pub(crate) const HOST_POLL: Duration = Duration::from_micros(50);

impl Signal {
    /// Wakes every sleeping waiter. Call after making the condition true.
    pub(crate) fn notify(&self) {
        self.notify_progress(u64::MAX);
    }

    /// Wakes the sleeping waiters if one of them waits for a progress count of at most
    /// `progress`. Call after the (SeqCst) update that made the progress.
    pub(crate) fn notify_progress(&self, progress: u64) {
        fence(Ordering::SeqCst);
        // SeqCst: the notifier's half of the handshake (see the type's docs).
        if self.sleepers.load(Ordering::SeqCst) > 0
            && progress >= self.wake_at.load(Ordering::SeqCst)
        {
            let _guard = self.lock.lock();
            self.wake_at.store(u64::MAX, Ordering::SeqCst);
            self.cond.notify_all();
        }
    }

    /// Waits until `done()` holds or `deadline` passes (`None`: no deadline), woken by any
    /// notification. Returns whether `done()` held.
    pub(crate) fn wait_until(&self, done: impl Fn() -> bool, deadline: Option<Instant>) -> bool {
        self.wait_for(0, done, deadline)
    }

    /// As [`Self::wait_until`], but woken only by notifications of a progress count of at
    /// least `target`. `done()` must load the progress with SeqCst.
    pub(crate) fn wait_for(
        &self,
        target: u64,
        done: impl Fn() -> bool,
        deadline: Option<Instant>,
    ) -> bool {
        // Done already (a launch run by the waiting thread itself): no clock read.
        if done() {
            return true;
        }
        let start = Instant::now();
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            if done() {
                return true;
            }
            if !backoff.is_completed() {
                backoff.snooze();
            } else if start.elapsed() < HOST_POLL {
                std::thread::yield_now();
            } else {
                break;
            }
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let mut guard = self.lock.lock();
        let finished = loop {
            // Under the lock, so a notifier's reset cannot erase it unseen; again after
            // every wake-up, which reset it.
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if done() {
                break true;
            }
            let wait = match deadline {
                None => Duration::from_secs(1),
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break false,
                },
            };
            self.cond.wait_for(&mut guard, wait);
        };
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::Signal;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// Guards against a waiter for a progress count left asleep when progress races its
    /// registration (a lost wake-up would show as a multi-second stall: the deadline is
    /// 10 s), and against a waiter that returns before its count.
    #[test]
    fn progress_waiter_wakes_at_its_count() {
        let signal = Arc::new(Signal::default());
        let progress = Arc::new(AtomicU64::new(0));
        for round in 1..=200u64 {
            let target = round * 3;
            let notifier = {
                let (signal, progress) = (signal.clone(), progress.clone());
                std::thread::spawn(move || {
                    for _ in 0..3 {
                        // Odd rounds: slower than the waiter's polling phase, so it sleeps.
                        if round % 2 == 1 {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        let now = progress.fetch_add(1, Ordering::SeqCst) + 1;
                        signal.notify_progress(now);
                    }
                })
            };
            let started = Instant::now();
            let deadline = Some(started + Duration::from_secs(10));
            let reached = || progress.load(Ordering::SeqCst) >= target;
            assert!(signal.wait_for(target, reached, deadline), "round {round}");
            assert!(progress.load(Ordering::SeqCst) >= target);
            let waited = started.elapsed();
            assert!(
                waited < Duration::from_secs(2),
                "round {round}: the waiter slept {waited:?}"
            );
            notifier.join().unwrap();
        }
    }
}
