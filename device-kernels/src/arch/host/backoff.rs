//! How emulated kernel threads wait: spin, then yield the core, then sleep, with a spin
//! budget that adapts to whether the thread waited for is sharing our core.

use crate::arch::Awaited;
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
/// Spinning polls per look for the process's wait work (see [`set_wait_work`]). A look is
/// a system call (Ethernet's: one `epoll_wait`). Every 64 polls instead made 4 ranks as
/// processes over Ethernet faster while their looks were `poll` calls of every socket, but
/// a wait whose spin budget is under 64 polls then looks only at its first poll and after
/// it yields: a 2-rank Ethernet ping-pong took 17-23 µs a round trip instead of 12.5-13
/// (proxy assist off; 12.7 instead of 10.8-11 with it), and with the `epoll` looks, 16
/// was as fast as 64 for the 4 ranks.
#[cfg(not(oxccl_loom))]
const WORK_EVERY_SPINS: u32 = 16;
/// Polls that yield (after spinning) before the emulator starts sleeping.
#[cfg(not(oxccl_loom))]
const YIELD_ITERATIONS: u32 = 768;
/// Longest sleep of one poll: bounds the extra latency a long wait sees at its end.
#[cfg(not(oxccl_loom))]
const MAX_SLEEP: Duration = Duration::from_micros(200);
/// Waits in a row that ended only after a yield ran another thread, from which a thread
/// takes it that it shares its core with the thread it waits for (see [`escape`]).
#[cfg(not(oxccl_loom))]
const SHARED_WAITS: u32 = 16;
/// Each thread waits for a random number below this of shared waits more before it
/// escapes, so that of two threads sharing a core one escapes first and alone.
#[cfg(not(oxccl_loom))]
const ESCAPE_JITTER: u32 = 64;
/// Least time between two escapes of one thread; it doubles while escapes keep failing (to
/// [`MAX_ESCAPE_GAP`]), and comes back once the thread goes a while without needing one.
#[cfg(not(oxccl_loom))]
const MIN_ESCAPE_GAP: Duration = Duration::from_millis(1);
/// Most time between two escapes: where every core is busy anyway, an escape (some 50 µs
/// asleep) then costs a thread about a thousandth of its time.
#[cfg(not(oxccl_loom))]
const MAX_ESCAPE_GAP: Duration = Duration::from_millis(64);

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
    /// Waits in a row that ended only after a yield that ran another thread.
    shared: u32,
    /// When the thread last escaped its core (see [`escape`]).
    escaped: Option<Instant>,
    /// Least time until the next escape.
    escape_gap: Duration,
    /// Shared waits after which the thread escapes next (0: not drawn yet).
    escape_after: u32,
    /// State of the thread's random draws (0: not seeded yet).
    random: u32,
}

#[cfg(not(oxccl_loom))]
std::thread_local! {
    static SPIN_HISTORY: Cell<SpinHistory> = const {
        Cell::new(SpinHistory {
            limit: MAX_SPIN_ITERATIONS,
            last: 0,
            handed_over: false,
            shared: 0,
            escaped: None,
            escape_gap: MIN_ESCAPE_GAP,
            escape_after: 0,
            random: 0,
        })
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
    fn ended_after_hand_over(self) -> bool {
        self.handed_over && self.last >= self.limit && self.last < self.limit + YIELD_ITERATIONS
    }

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
/// [`set_wait_hook`]), given what the wait waits for where the device library knows it
/// ([`spin_pause_awaiting`]). It may return on another OS thread than the one that called
/// it; it returns whether it suspended the kernel thread (other work ran meanwhile, which
/// stands in for the wait's spinning).
///
/// A hook that suspends the kernel thread may test `awaited` meanwhile (a load), instead of
/// resuming the kernel thread for each poll (a switch to a suspended kernel thread and back
/// costs some 40 ns), and resume it once the test holds; the wait then polls its own
/// condition.
#[cfg(not(oxccl_loom))]
pub type WaitHook = fn(awaited: Option<Awaited>) -> bool;

/// Work the host has for any waiting thread of the process, in place of giving up its core
/// (see [`set_wait_work`]): returns whether it did some.
#[cfg(not(oxccl_loom))]
pub type WaitWork = fn() -> bool;

/// The process's wait work, installed once by the host.
#[cfg(not(oxccl_loom))]
static WAIT_WORK: std::sync::OnceLock<WaitWork> = std::sync::OnceLock::new();

/// Installs `work` as what every waiting thread of the process does before it pauses: at
/// every 16th poll while it spins, at every poll once it yields or sleeps
/// (once: returns false if work was installed already). A poll at which `work` returns true
/// neither spins, yields nor sleeps: the work was its pause.
///
/// The host's Ethernet transport installs the reading of frames that arrived for this
/// process's receivers: a kernel thread that waits for a peer's signal then applies the
/// peer's frames itself, as an MPI rank progresses its own receives, instead of a receiver
/// thread being woken for each frame (see `ethernet_receive_assist.rs` in `oxccl`). The
/// work must be short (one frame at a time, whose bytes have all arrived) and must not wait
/// on kernel threads.
#[cfg(not(oxccl_loom))]
pub fn set_wait_work(work: WaitWork) -> bool {
    WAIT_WORK.set(work).is_ok()
}

/// Runs the process's wait work, if any was installed; returns whether it did some.
#[cfg(not(oxccl_loom))]
#[inline]
fn wait_work() -> bool {
    WAIT_WORK.get().is_some_and(|work| work())
}

#[cfg(not(oxccl_loom))]
std::thread_local! {
    static WAIT_HOOK: Cell<Option<WaitHook>> = const { Cell::new(None) };
    /// Time this OS thread has spent yielding the core or asleep in waits (see
    /// [`time_given_up`]).
    static GIVEN_UP: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// How long the calling OS thread has spent, in all, yielding its core or asleep in the
/// waits of the kernel threads it ran: time it waited, not ran kernel code. The emulator
/// subtracts it from a turn of a kernel thread to tell a thread that computes from one that
/// waits.
#[cfg(not(oxccl_loom))]
#[inline(never)]
pub fn time_given_up() -> Duration {
    GIVEN_UP.with(Cell::get)
}

/// Adds `d` to [`time_given_up`]. Never inlined: it reaches a thread-local.
#[cfg(not(oxccl_loom))]
#[inline(never)]
fn give_up(d: Duration) {
    GIVEN_UP.with(|g| g.set(g.get().saturating_add(d)));
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
/// the thread's wait hook, if the emulator installed one (after which the caller may be on
/// another OS thread); then spin, then yield the core, then sleep, from 1 µs doubling up to
/// a cap. A poll at which the hook suspended the kernel thread does not spin: the kernel
/// threads that ran meanwhile were its pause (it still yields and sleeps past the spin
/// budget, so a thread whose kernel threads all wait lets others have the core).
///
/// How long a thread spins adapts to how its previous waits ended: the first call of a wait (`iteration == 0`) judges the last.
#[inline]
pub fn spin_pause(iteration: u32) {
    pause_awaiting(iteration, None);
}

/// [`spin_pause`] for a wait that waits for what `awaited` tests: the hook may test it
/// while the kernel thread is suspended (see [`WaitHook`]).
#[inline]
pub fn spin_pause_awaiting(iteration: u32, awaited: Awaited) {
    pause_awaiting(iteration, Some(awaited));
}

/// The step of [`spin_pause`] and [`spin_pause_awaiting`].
#[inline]
fn pause_awaiting(iteration: u32, awaited: Option<Awaited>) {
    #[cfg(oxccl_loom)]
    {
        let _ = (iteration, awaited);
        loom::thread::yield_now();
    }
    #[cfg(not(oxccl_loom))]
    {
        // The hook may move the kernel thread to another OS thread: `pause` is never
        // inlined, and reaches the thread-locals of the thread it runs on then.
        let suspended = wait_hook().is_some_and(|hook| hook(awaited));
        pause(iteration, suspended);
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
fn pause(iteration: u32, suspended: bool) {
    let history = SPIN_HISTORY.with(|h| {
        let mut history = h.get();
        if iteration == 0 {
            history.shared = if history.ended_after_hand_over() {
                history.shared.saturating_add(1)
            } else {
                0
            };
            history.limit = history.after_wait();
            history.handed_over = false;
        }
        history.last = iteration;
        h.set(history);
        history
    });
    let spin = history.limit;
    // While spinning, the work (system calls) only every few polls: the spin budget counts
    // polls of a few dozen nanoseconds each.
    let work_now = iteration >= spin || iteration.is_multiple_of(WORK_EVERY_SPINS);
    if work_now && wait_work() {
        // Frames applied for a peer: likely what this thread waits for.
    } else if iteration < spin {
        if !suspended {
            core::hint::spin_loop();
        }
    } else if iteration < spin + YIELD_ITERATIONS {
        if history.shared >= SHARED_WAITS && escape(history) {
            return;
        }
        let before = Instant::now();
        std::thread::yield_now();
        let yielded = before.elapsed();
        give_up(yielded);
        if !history.handed_over && yielded >= SWITCH_COST {
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
        let before = Instant::now();
        std::thread::sleep(Duration::from_micros(micros).min(MAX_SLEEP));
        give_up(before.elapsed());
    }
}

/// Sleeps once, briefly, if the thread's waits ended after a hand-over often enough and it
/// did not escape less than its escape gap ago; returns whether it did.
///
/// Why: two threads that wait for each other and share a core (the two ranks' kernel
/// threads of a collective, say) hand the core back and forth at each wait, a context switch
/// of microseconds each time, even while another core idles: Linux moves a thread to an
/// idle core when it wakes up, not while it runs, and these threads never sleep (they spin
/// and yield). A sleep makes the thread wake up again, and the scheduler then places it on
/// an idle core if there is one. Only one of the two may sleep at a time: the timer slack
/// would wake both in one interrupt, onto the core they left, hence a random share of
/// [`ESCAPE_JITTER`] in each thread's threshold. Where every core is busy an escape only
/// costs its sleep: one that comes as soon as the gap allows failed to help, and doubles
/// the gap.
#[cfg(not(oxccl_loom))]
#[inline(never)]
fn escape(history: SpinHistory) -> bool {
    let mut h = history;
    if h.random == 0 {
        // Seeded by where this thread's variable lives: distinct for every thread.
        h.random = (SPIN_HISTORY.with(|cell| cell as *const _ as usize) >> 4) as u32 | 1;
    }
    let escaping = h.plan_escape(Instant::now());
    let (random, escape_after, escape_gap, escaped, shared) =
        (h.random, h.escape_after, h.escape_gap, h.escaped, h.shared);
    SPIN_HISTORY.with(|cell| {
        cell.set(SpinHistory {
            random,
            escape_after,
            escape_gap,
            escaped,
            shared,
            ..cell.get()
        })
    });
    if escaping {
        // The shortest sleep there is; the OS rounds it up (by its timer slack, 50 µs by
        // default on Linux).
        let before = Instant::now();
        std::thread::sleep(Duration::from_micros(1));
        give_up(before.elapsed());
    }
    escaping
}

#[cfg(not(oxccl_loom))]
impl SpinHistory {
    /// Whether to escape now (see [`escape`]), updating the escape state either way: draws
    /// the threshold if none is drawn; on an escape, resets the count, draws the next
    /// threshold and sets the next gap (doubled if this escape came soon after the last).
    fn plan_escape(&mut self, now: Instant) -> bool {
        if self.escape_after == 0 {
            self.escape_after = SHARED_WAITS + draw(&mut self.random) % ESCAPE_JITTER;
        }
        let since = self.escaped.map(|at| now.duration_since(at));
        if self.shared < self.escape_after || since.is_some_and(|s| s < self.escape_gap) {
            return false;
        }
        self.escape_gap = match since {
            // Sharing again soon after the last escape: it did not help.
            Some(since) if since < 4 * self.escape_gap => (self.escape_gap * 2).min(MAX_ESCAPE_GAP),
            _ => MIN_ESCAPE_GAP,
        };
        self.escaped = Some(now);
        self.shared = 0;
        self.escape_after = SHARED_WAITS + draw(&mut self.random) % ESCAPE_JITTER;
        true
    }
}

/// The next number of a xorshift sequence (`state` never 0), its bits mixed by a
/// multiplication (a raw xorshift of a small seed keeps its low bits alike).
#[cfg(not(oxccl_loom))]
fn draw(state: &mut u32) -> u32 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    x.wrapping_mul(0x9e37_79b9).rotate_left(16)
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
            shared: 0,
            escaped: None,
            escape_gap: MIN_ESCAPE_GAP,
            escape_after: 0,
            random: 1,
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

    /// Guards against escapes (see `escape`) that come before their thread's threshold of
    /// shared waits, more often than the gap allows, with a gap that does not double while
    /// they keep failing (to its cap) or does not come back once they stop, and against
    /// thresholds that do not differ between threads.
    #[test]
    fn escapes_follow_shared_waits_and_back_off() {
        let fresh = |random| SpinHistory {
            limit: MAX_SPIN_ITERATIONS,
            last: 0,
            handed_over: false,
            shared: 0,
            escaped: None,
            escape_gap: MIN_ESCAPE_GAP,
            escape_after: 0,
            random,
        };
        let t0 = Instant::now();
        let mut h = fresh(12345);
        h.shared = SHARED_WAITS - 1;
        assert!(!h.plan_escape(t0), "below any threshold");
        let threshold = h.escape_after;
        assert!((SHARED_WAITS..SHARED_WAITS + ESCAPE_JITTER).contains(&threshold));
        h.shared = threshold;
        assert!(h.plan_escape(t0));
        assert_eq!((h.shared, h.escape_gap), (0, MIN_ESCAPE_GAP));
        // Sharing again at once: not before the gap, then with a doubled gap, up to the cap.
        let mut at = t0;
        let mut gap = MIN_ESCAPE_GAP;
        for _ in 0..10 {
            h.shared = h.escape_after;
            assert!(!h.plan_escape(at + gap / 2), "escaped within the gap");
            at += gap;
            assert!(h.plan_escape(at));
            gap = (gap * 2).min(MAX_ESCAPE_GAP);
            assert_eq!(h.escape_gap, gap);
        }
        assert_eq!(h.escape_gap, MAX_ESCAPE_GAP);
        // Long after: back to the least gap.
        h.shared = h.escape_after;
        assert!(h.plan_escape(at + 10 * MAX_ESCAPE_GAP));
        assert_eq!(h.escape_gap, MIN_ESCAPE_GAP);
        // Threads draw different thresholds (from different seeds), in range.
        let thresholds: std::collections::BTreeSet<u32> = (1..=32u32)
            .map(|seed| {
                let mut h = fresh(seed * 7919);
                h.plan_escape(t0);
                h.escape_after
            })
            .collect();
        assert!(thresholds.len() > 16, "{thresholds:?}");
        assert!(
            thresholds
                .iter()
                .all(|t| (SHARED_WAITS..SHARED_WAITS + ESCAPE_JITTER).contains(t))
        );
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
