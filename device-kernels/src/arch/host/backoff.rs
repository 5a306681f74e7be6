//! How emulated kernel threads wait: spin, then yield the core, then sleep, with a spin
//! budget that adapts to whether the thread waited for is sharing our core.

#[cfg(not(oxccl_loom))]
use std::cell::Cell;
#[cfg(not(oxccl_loom))]
use std::time::{Duration, Instant};

/// Most polls that only spin before the emulator starts yielding the core: a few
/// microseconds, about one cross-core round trip with room to spare.
#[cfg(not(oxccl_loom))]
const MAX_SPIN_ITERATIONS: u32 = 256;
/// Fewest: what a thread spins when its waits keep ending only after it yielded.
#[cfg(not(oxccl_loom))]
const MIN_SPIN_ITERATIONS: u32 = 16;
/// Polls that yield (after spinning) before the emulator starts sleeping.
#[cfg(not(oxccl_loom))]
const YIELD_ITERATIONS: u32 = 768;
/// Longest sleep of one poll: bounds the extra latency a long wait sees at its end.
#[cfg(not(oxccl_loom))]
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// The calling thread's spin budget and how far its current (or last) wait went.
#[cfg(not(oxccl_loom))]
#[derive(Clone, Copy)]
struct SpinHistory {
    /// Polls that spin before yielding, in `MIN_SPIN_ITERATIONS..=MAX_SPIN_ITERATIONS`.
    limit: u32,
    /// The iteration of the last `spin_pause` call.
    last: u32,
    /// Whether a yield of the current wait gave the core to another thread.
    handed_over: bool,
}

#[cfg(not(oxccl_loom))]
std::thread_local! {
    static SPIN_HISTORY: Cell<SpinHistory> = const {
        Cell::new(SpinHistory { limit: MAX_SPIN_ITERATIONS, last: 0, handed_over: false })
    };
}

#[cfg(not(oxccl_loom))]
impl SpinHistory {
    /// The budget for the next wait, given how the last one (ended at poll `last`) went.
    ///
    /// A wait that ended while spinning, or whose yields ran no other thread, earns the
    /// budget back (doubling). One that ended only after a yield that ran another thread
    /// halves it: the thread it waited for could not progress while we spun, most likely
    /// because it shares our core, so spinning only delayed the hand-over (with two ranks'
    /// kernel threads on one core, 3 µs of spinning per wait made an 8-byte all-reduce take
    /// 15–20 µs instead of 3). A wait that went on to sleep leaves the budget alone.
    fn after_wait(self) -> u32 {
        if self.last < self.limit || !self.handed_over {
            (self.limit * 2).min(MAX_SPIN_ITERATIONS)
        } else if self.last < self.limit + YIELD_ITERATIONS {
            (self.limit / 2).max(MIN_SPIN_ITERATIONS)
        } else {
            self.limit
        }
    }
}

/// A yield that returns sooner than this did not run another thread.
#[cfg(not(oxccl_loom))]
const SWITCH_COST: Duration = Duration::from_micros(1);

/// What the emulator has a thread run at each wait of the kernel thread it runs (see
/// [`set_wait_hook`]). It may return on another OS thread than the one that called it.
#[cfg(not(oxccl_loom))]
pub type WaitHook = fn();

#[cfg(not(oxccl_loom))]
std::thread_local! {
    static WAIT_HOOK: Cell<Option<WaitHook>> = const { Cell::new(None) };
}

/// Makes every [`spin_pause`] of the calling OS thread end by calling `hook` (none: nothing);
/// returns the hook it replaces.
///
/// The emulator installs one on a host thread that runs a kernel thread itself (on a stack
/// of its own) while it waits for it: at a wait past the host's deadline the hook suspends
/// the kernel thread there, and a pool thread resumes it. The kernel thread then continues
/// on another OS thread, which is why every thread-local of this module is reached only
/// through functions that are never inlined: a kernel's frame never holds a thread-local's
/// address across a wait.
#[cfg(not(oxccl_loom))]
#[inline(never)]
pub fn set_wait_hook(hook: Option<WaitHook>) -> Option<WaitHook> {
    WAIT_HOOK.with(|h| h.replace(hook))
}

/// One back-off step of a wait at poll `iteration` (0 for the first poll of each wait):
/// spin, then yield the core, then sleep, from 1 µs doubling up to a cap; then the thread's
/// wait hook, if the emulator installed one (after which the caller may be on another OS
/// thread).
///
/// How long a thread spins adapts to how its previous waits ended: the first call of a wait (`iteration == 0`) judges the last.
#[inline]
pub fn spin_pause(iteration: u32) {
    #[cfg(oxccl_loom)]
    {
        let _ = iteration;
        loom::thread::yield_now();
    }
    #[cfg(not(oxccl_loom))]
    {
        pause(iteration);
        // Last: the hook may move the kernel thread to another OS thread, and nothing of
        // this call may run after that.
        if let Some(hook) = wait_hook() {
            hook();
        }
    }
}

/// The calling thread's wait hook.
#[cfg(not(oxccl_loom))]
#[inline(never)]
fn wait_hook() -> Option<WaitHook> {
    WAIT_HOOK.with(Cell::get)
}

/// The back-off step of [`spin_pause`]. Never inlined: it reaches thread-locals (see
/// [`set_wait_hook`]).
#[cfg(not(oxccl_loom))]
#[inline(never)]
fn pause(iteration: u32) {
    let history = SPIN_HISTORY.with(|h| {
        let mut history = h.get();
        if iteration == 0 {
            history.limit = history.after_wait();
            history.handed_over = false;
        }
        history.last = iteration;
        h.set(history);
        history
    });
    let spin = history.limit;
    if iteration < spin {
        core::hint::spin_loop();
    } else if iteration < spin + YIELD_ITERATIONS {
        let before = Instant::now();
        std::thread::yield_now();
        if !history.handed_over && before.elapsed() >= SWITCH_COST {
            SPIN_HISTORY.with(|h| {
                h.set(SpinHistory {
                    handed_over: true,
                    ..h.get()
                })
            });
        }
    } else {
        let doublings = (iteration - spin - YIELD_ITERATIONS) / 64;
        let micros = 1u64 << doublings.min(8);
        std::thread::sleep(Duration::from_micros(micros).min(MAX_SLEEP));
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Guards against a spin budget that shrinks on waits that ended while spinning, grows
    /// on waits whose yields ran another thread, leaves its bounds, or reacts to long waits.
    #[test]
    fn spin_budget_adapts_to_how_waits_end() {
        let at = |limit, last, handed_over| SpinHistory {
            limit,
            last,
            handed_over,
        };
        let max = MAX_SPIN_ITERATIONS;
        // Ended while spinning: doubles back, capped.
        assert_eq!(at(32, 10, true).after_wait(), 64);
        assert_eq!(at(max, 10, false).after_wait(), max);
        // Ended after yields that ran another thread: halves, floored.
        assert_eq!(at(max, max + 3, true).after_wait(), max / 2);
        assert_eq!(
            at(MIN_SPIN_ITERATIONS, MIN_SPIN_ITERATIONS + 1, true).after_wait(),
            MIN_SPIN_ITERATIONS
        );
        // Yields that ran nobody: spinning was as good, so it grows back.
        assert_eq!(at(64, 64 + 5, false).after_wait(), 128);
        // Went on to sleep: unchanged.
        assert_eq!(at(64, 64 + YIELD_ITERATIONS + 1, true).after_wait(), 64);
    }

    /// Guards against a wait with a shrunken spin budget that misses or delays the progress
    /// it waits for: two threads hand a token back and forth 2000 times through
    /// `spin_pause` waits (a lost hand-over would hang past the 10 s limit).
    #[test]
    fn ping_pong_progresses_with_adapted_budget() {
        let token = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(10);
        let play = |token: Arc<AtomicU64>, parity: u64| {
            move || {
                for round in 0..2000u64 {
                    let mine = 2 * round + parity;
                    let mut iteration = 0;
                    while token.load(Ordering::Acquire) != mine {
                        assert!(Instant::now() < deadline, "hand-over {mine} lost");
                        spin_pause(iteration);
                        iteration = iteration.saturating_add(1);
                    }
                    token.store(mine + 1, Ordering::Release);
                }
                SPIN_HISTORY.with(|h| h.get().limit)
            }
        };
        let other = std::thread::spawn(play(token.clone(), 1));
        let limit = play(token.clone(), 0)();
        let other_limit = other.join().unwrap();
        assert_eq!(token.load(Ordering::Relaxed), 4000);
        for l in [limit, other_limit] {
            assert!(
                (MIN_SPIN_ITERATIONS..=MAX_SPIN_ITERATIONS).contains(&l),
                "{l}"
            );
        }
    }
}
