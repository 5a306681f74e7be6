//! The arch layer in the CPU emulator.
//!
//! The emulator's launcher runs each kernel thread on an OS thread and calls [`enter`] with
//! that thread's [`ThreadContext`] before it runs the kernel body; the index functions read
//! it back from a thread-local. A thread that never entered a context (a kernel function
//! called directly, a test) sees itself as the only thread of a one-block grid.
//!
//! Waits here must back off: several ranks, each with kernel threads and a proxy thread,
//! share few cores, and a wait that spins forever starves the thread it waits for.

use super::{Dim3, Scope};
use std::boxed::Box;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
#[cfg(not(oxccl_loom))]
use std::time::Duration;
use std::time::Instant;

pub(crate) const PREFERS_CONTIGUOUS_SPLIT: bool = true;

/// Where one emulated kernel thread sits in its launch.
#[derive(Clone, Debug)]
pub struct ThreadContext {
    /// `threadIdx` of this thread.
    pub thread_idx: Dim3,
    /// `blockIdx` of this thread's block.
    pub block_idx: Dim3,
    /// `blockDim` of the launch.
    pub block_dim: Dim3,
    /// `gridDim` of the launch.
    pub grid_dim: Dim3,
    /// The barrier shared by the threads of this block, for [`super::sync_threads`].
    pub block_barrier: Arc<BlockBarrier>,
}

#[derive(Clone, Copy)]
struct Indices {
    thread_idx: Dim3,
    block_idx: Dim3,
    block_dim: Dim3,
    grid_dim: Dim3,
}

const ALONE: Indices = Indices {
    thread_idx: Dim3::ZERO,
    block_idx: Dim3::ZERO,
    block_dim: Dim3::ONE,
    grid_dim: Dim3::ONE,
};

std::thread_local! {
    static INDICES: Cell<Indices> = const { Cell::new(ALONE) };
    static BARRIER: RefCell<Option<Arc<BlockBarrier>>> = const { RefCell::new(None) };
}

/// Makes the calling OS thread an emulated kernel thread at `ctx` until the guard drops.
pub fn enter(ctx: ThreadContext) -> ContextGuard {
    INDICES.with(|i| {
        i.set(Indices {
            thread_idx: ctx.thread_idx,
            block_idx: ctx.block_idx,
            block_dim: ctx.block_dim,
            grid_dim: ctx.grid_dim,
        })
    });
    BARRIER.with(|b| *b.borrow_mut() = Some(ctx.block_barrier));
    ContextGuard {
        _not_send: core::marker::PhantomData,
    }
}

/// Restores the calling thread to "not in a kernel" when dropped.
#[must_use = "the context ends when the guard drops"]
pub struct ContextGuard {
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        INDICES.with(|i| i.set(ALONE));
        BARRIER.with(|b| *b.borrow_mut() = None);
    }
}

#[inline]
pub(crate) fn thread_idx() -> Dim3 {
    INDICES.with(|i| i.get().thread_idx)
}

#[inline]
pub(crate) fn block_idx() -> Dim3 {
    INDICES.with(|i| i.get().block_idx)
}

#[inline]
pub(crate) fn block_dim() -> Dim3 {
    INDICES.with(|i| i.get().block_dim)
}

#[inline]
pub(crate) fn grid_dim() -> Dim3 {
    INDICES.with(|i| i.get().grid_dim)
}

pub(crate) fn sync_threads() {
    sync_threads_or(false);
}

pub(crate) fn sync_threads_or(predicate: bool) -> bool {
    let barrier = BARRIER.with(|b| b.borrow().clone());
    // Outside a launch the caller is the block's only thread: nothing to wait for.
    match barrier {
        Some(barrier) => barrier.wait_or(predicate),
        None => predicate,
    }
}

#[inline]
pub(crate) fn fence(_scope: Scope) {
    #[cfg(oxccl_loom)]
    loom::sync::atomic::fence(Ordering::AcqRel);
    #[cfg(not(oxccl_loom))]
    std::sync::atomic::fence(Ordering::AcqRel);
}

/// Nanoseconds since the first call in this process.
pub(crate) fn clock_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

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

/// One back-off step of a wait at poll `iteration` (0 for the first poll of each wait):
/// spin, then yield the core, then sleep, from 1 µs doubling up to [`MAX_SLEEP`].
///
/// How long a thread spins adapts to how its previous waits ended (see
/// [`SpinHistory::after_wait`]); the first call of a wait (`iteration == 0`) judges the last.
#[inline]
pub(crate) fn spin_pause(iteration: u32) {
    #[cfg(oxccl_loom)]
    {
        let _ = iteration;
        loom::thread::yield_now();
    }
    #[cfg(not(oxccl_loom))]
    {
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
}

pub(crate) fn trap() -> ! {
    panic!("kernel trapped")
}

/// A reusable barrier for the threads of one emulated block (`sync_threads`).
///
/// Generation-counting: the last thread to arrive resets the count and opens the next
/// generation; the others poll the generation with [`spin_pause`] back-off.
///
/// Poisoning: when a thread of the block fails (its kernel body panicked), the emulator
/// calls [`BlockBarrier::poison`]; every thread waiting in [`BlockBarrier::wait`], and every
/// thread arriving later, then panics instead of waiting for a thread that will never come.
#[derive(Debug)]
pub struct BlockBarrier {
    threads: u32,
    arrived: AtomicU32,
    generation: AtomicU32,
    poisoned: AtomicBool,
    /// OR of the predicates of the threads arrived in the current generation.
    any: AtomicBool,
    /// OR of the predicates of the last completed generation; stable until every thread
    /// has arrived at the next one, so a slow waiter still reads its own generation's.
    result: AtomicBool,
}

/// What a thread sees when it waits on a barrier of a block that lost a thread.
const POISONED: &str = "block barrier poisoned: another thread of the block failed";

impl BlockBarrier {
    /// A barrier for `threads` threads (at least one).
    pub fn new(threads: u32) -> Self {
        Self {
            threads: threads.max(1),
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            poisoned: AtomicBool::new(false),
            any: AtomicBool::new(false),
            result: AtomicBool::new(false),
        }
    }

    /// Waits until all `threads` threads have called `wait` in this generation.
    ///
    /// # Panics
    /// If the barrier is poisoned, before or while waiting: a thread of the block failed
    /// and will never arrive, so the caller's kernel thread fails too instead of hanging.
    pub fn wait(&self) {
        self.wait_or(false);
    }

    /// [`Self::wait`], and returns whether any thread of the block passed `predicate` true
    /// (every thread gets the same answer).
    ///
    /// # Panics
    /// As [`Self::wait`].
    pub fn wait_or(&self, predicate: bool) -> bool {
        if self.is_poisoned() {
            panic!("{POISONED}");
        }
        // Acquire: pairs with the Release bump below, so the previous generation's writes
        // of every thread are visible once we pass.
        let generation = self.generation.load(Ordering::Acquire);
        if predicate {
            // Relaxed: published to the last arriver by the AcqRel fetch_add below.
            self.any.store(true, Ordering::Relaxed);
        }
        // AcqRel: our writes are released to the last arriver, which releases them to all.
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            let any = self.any.swap(false, Ordering::Relaxed);
            self.result.store(any, Ordering::Relaxed);
            self.arrived.store(0, Ordering::Relaxed);
            // Release: pairs with the Acquire loads of waiting threads (publishes `result`).
            self.generation.fetch_add(1, Ordering::Release);
            return any;
        }
        let mut iteration = 0;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.is_poisoned() {
                panic!("{POISONED}");
            }
            spin_pause(iteration);
            iteration = iteration.saturating_add(1);
        }
        self.result.load(Ordering::Relaxed)
    }

    /// Marks the barrier failed: current and future waiters panic instead of waiting.
    pub fn poison(&self) {
        // Relaxed: the flag carries no data; waiters poll it.
        self.poisoned.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::poison`] was called.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }
}

/// Work a doorbell can hand to the ringing thread: drains the FIFO on the caller's thread
/// if nobody else is draining it; returns false when someone else is.
pub type Assist = Box<dyn Fn() -> bool + Send + Sync>;

/// How a kernel thread that published a trigger gets it executed by a host proxy.
///
/// The FIFO device handle carries the doorbell's address (zero on the GPU, where the proxy
/// polls) and rings it after every push, saying whether the proxy had announced that it was
/// parking (a bit in the FIFO head, see `oxccl_device::fifo`). A ring:
/// - **assists** if the proxy installed an assist: the ringing thread drains the FIFO
///   itself, in order and through the same checks, when nobody else holds the consumer. On
///   a CPU with fewer cores than busy threads this saves two thread hand-offs per round
///   trip. It costs one uncontended lock attempt per push.
/// - otherwise, or if the consumer was busy, **wakes** the proxy thread if it was asleep.
///   A push to an awake proxy without an assist costs nothing here.
#[derive(Default)]
pub struct Doorbell {
    sleeper: OnceLock<Thread>,
    assist: OnceLock<Assist>,
}

impl core::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Doorbell")
            .field("sleeper", &self.sleeper.get().map(Thread::id))
            .field("assist", &self.assist.get().is_some())
            .finish()
    }
}

impl Doorbell {
    /// A doorbell with no sleeper and no assist yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs the assist (once); returns false if one was installed already.
    pub fn set_assist(&self, assist: Assist) -> bool {
        self.assist.set(assist).is_ok()
    }

    /// Records the calling thread as the one [`Self::wake_sleeper`] unparks.
    pub fn register_sleeper(&self) {
        let _ = self.sleeper.get_or_init(std::thread::current);
    }

    /// Gets published work done: assists if possible, else wakes the sleeper if
    /// `proxy_asleep`.
    #[inline]
    pub fn ring(&self, proxy_asleep: bool) {
        if let Some(assist) = self.assist.get()
            && assist()
        {
            return;
        }
        if proxy_asleep {
            self.wake_sleeper();
        }
    }

    /// Unparks the registered sleeper, if any (a wake before its park is kept by the OS
    /// thread's token, so it is never lost).
    pub fn wake_sleeper(&self) {
        if let Some(t) = self.sleeper.get() {
            t.unpark();
        }
    }
}

/// Rings the doorbell at `addr`, if any (zero means none).
#[inline]
pub(crate) fn ring_doorbell(addr: u64, proxy_asleep: bool) {
    if addr != 0 {
        // SAFETY: a non-zero doorbell address in a FIFO handle is set by the host from a
        // `Doorbell` that the proxy service keeps alive as long as the FIFO exists.
        let bell = unsafe { &*(addr as usize as *const Doorbell) };
        // Under loom the proxy never parks, so nothing rings; kept out of the model.
        if !cfg!(oxccl_loom) {
            bell.ring(proxy_asleep);
        }
    }
}

/// Whether the CPU has `prefetchw` (CPUID 8000_0001h, ECX bit 8, "PRFCHW"), asked once.
#[cfg(all(target_arch = "x86_64", not(oxccl_loom)))]
fn has_prefetchw() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        use core::arch::x86_64::__cpuid;
        // Every x86_64 CPU has `cpuid`; leaf 8000_0001h exists when the top extended leaf
        // (leaf 8000_0000h's EAX) reaches it.
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    })
}

/// `prefetchw` where the CPU has it, otherwise nothing. Under loom, nothing: the model has
/// no caches.
#[inline(always)]
pub(crate) fn prefetch_for_write(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(oxccl_loom)))]
    if has_prefetchw() {
        // SAFETY: a prefetch is a hint that never faults, whatever the address, and writes
        // no memory or register (`readonly`); the CPU supports the instruction.
        unsafe {
            core::arch::asm!(
                "prefetchw [{addr}]",
                addr = in(reg) addr,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(oxccl_loom))))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a write prefetch that faults: it is a hint, so any address, mapped or
    /// not, must be accepted (a push prefetches a slot it does not own yet).
    #[test]
    fn prefetch_for_write_never_faults() {
        let line = [0u8; 64];
        for addr in [
            line.as_ptr(),
            core::ptr::null(),
            usize::MAX as *const u8,
            8 as *const u8,
        ] {
            prefetch_for_write(addr);
        }
        assert_eq!(line, [0u8; 64], "a prefetch must not write");
    }

    /// Guards against a spin budget that shrinks on waits that ended while spinning, grows
    /// on waits whose yields ran another thread, leaves its bounds, or reacts to long waits.
    #[test]
    #[cfg(not(oxccl_loom))]
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
    #[cfg(not(oxccl_loom))]
    fn ping_pong_progresses_with_adapted_budget() {
        use std::sync::atomic::AtomicU64;
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

    /// Guards against a barrier that lets a thread through before all have arrived, or that
    /// cannot be reused for a second generation.
    #[test]
    fn block_barrier_orders_generations() {
        let threads = 4;
        let barrier = Arc::new(BlockBarrier::new(threads));
        let counter = Arc::new(AtomicU32::new(0));
        let handles: std::vec::Vec<_> = (0..threads)
            .map(|_| {
                let (barrier, counter) = (barrier.clone(), counter.clone());
                std::thread::spawn(move || {
                    for round in 1..=50u32 {
                        counter.fetch_add(1, Ordering::Relaxed);
                        barrier.wait();
                        assert!(counter.load(Ordering::Relaxed) >= round * threads);
                        barrier.wait();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 50 * threads);
    }

    /// Guards against threads of a block hanging forever in `sync_threads` when another
    /// thread of the block panicked and will never arrive.
    #[test]
    fn poisoned_block_barrier_releases_waiters() {
        let barrier = Arc::new(BlockBarrier::new(3));
        let waiters: std::vec::Vec<_> = (0..2)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || barrier.wait())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        barrier.poison();
        for w in waiters {
            let err = w.join().expect_err("a waiter passed a poisoned barrier");
            let msg = err
                .downcast_ref::<std::string::String>()
                .map(std::string::String::as_str)
                .unwrap_or("");
            assert!(msg.contains("poisoned"), "{msg}");
        }
        // Late arrivals fail at once too.
        let late = std::panic::catch_unwind(|| barrier.wait());
        assert!(late.is_err());
    }

    /// Guards against indices leaking out of a launch into code that runs later on the thread.
    #[test]
    fn context_guard_restores_single_thread_view() {
        let ctx = ThreadContext {
            thread_idx: Dim3::index(3),
            block_idx: Dim3::index(1),
            block_dim: Dim3::extent(8),
            grid_dim: Dim3::extent(2),
            block_barrier: Arc::new(BlockBarrier::new(8)),
        };
        {
            let _g = enter(ctx);
            assert_eq!(thread_idx(), Dim3::index(3));
            assert_eq!(crate::arch::thread_rank_in_grid(), 11);
        }
        assert_eq!(thread_idx(), Dim3::ZERO);
        assert_eq!(block_dim(), Dim3::ONE);
    }
}
