//! The emulator's block barrier (`sync_threads`), and what it does when a thread of the block
//! can never arrive.
//!
//! On a GPU, a barrier that some thread of the block skips (it returned early, or took
//! another branch) hangs the block, or worse. The emulator turns both ways a barrier can
//! never complete into an error of the launch instead of a hang:
//! - a thread of the block panicked ([`BlockBarrier::poison`]);
//! - threads of the block finished their kernel without reaching it
//!   ([`BlockBarrier::thread_exited`]): once every thread still running is waiting at the
//!   barrier and some have exited, nobody else can come.

use super::backoff::spin_pause;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A reusable barrier for the threads of one emulated block (`sync_threads`).
///
/// Generation-counting: the last thread to arrive resets the count and opens the next
/// generation; the others poll the generation with [`spin_pause`] back-off.
///
/// A barrier that cannot complete makes every thread waiting at it, and every thread
/// arriving later, panic with a message saying why; the emulator reports the panic as the
/// launch's failure (naming the kernel and the block) instead of hanging.
#[derive(Debug)]
pub struct BlockBarrier {
    threads: u32,
    arrived: AtomicU32,
    generation: AtomicU32,
    /// Threads of the block that finished the kernel (they will never arrive again).
    exited: AtomicU32,
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
            exited: AtomicU32::new(0),
            poisoned: AtomicBool::new(false),
            any: AtomicBool::new(false),
            result: AtomicBool::new(false),
        }
    }

    /// Waits until all `threads` threads have called `wait` in this generation.
    ///
    /// # Panics
    /// If the barrier can never complete, before or while waiting: a thread of the block
    /// failed, or finished its kernel without reaching the barrier.
    pub fn wait(&self) {
        self.wait_or(false);
    }

    /// [`Self::wait`], and returns whether any thread of the block passed `predicate` true
    /// (every thread gets the same answer).
    ///
    /// # Panics
    /// As [`Self::wait`].
    pub fn wait_or(&self, predicate: bool) -> bool {
        self.check_alive();
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
            self.check_alive();
            spin_pause(iteration);
            iteration = iteration.saturating_add(1);
        }
        self.result.load(Ordering::Relaxed)
    }

    /// Records that one thread of the block finished its kernel: it will not arrive at any
    /// later barrier. Called by the emulator, once per thread, whether the kernel returned
    /// or failed.
    pub fn thread_exited(&self) {
        // Release: nothing to publish beyond the count; Relaxed would do, but the waiters'
        // check reads `arrived` and `exited` together and a stronger order costs nothing here.
        self.exited.fetch_add(1, Ordering::Release);
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

    /// Panics if the current generation can never complete.
    fn check_alive(&self) {
        if self.is_poisoned() {
            panic!("{POISONED}");
        }
        // Acquire: pairs with the Release in `thread_exited`.
        let exited = self.exited.load(Ordering::Acquire);
        if exited > 0 && self.arrived.load(Ordering::Acquire) + exited >= self.threads {
            panic!(
                "sync_threads can never complete: {exited} of the block's {} threads finished \
                 the kernel without reaching it (every thread of a block must reach each \
                 block barrier; a GPU would hang here)",
                self.threads
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn panic_text(err: &(dyn std::any::Any + Send)) -> &str {
        err.downcast_ref::<std::string::String>()
            .map(std::string::String::as_str)
            .or_else(|| err.downcast_ref::<&str>().copied())
            .unwrap_or("")
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

    /// `n` threads that wait at `barrier`, given time to get there.
    fn waiting_threads(
        barrier: &Arc<BlockBarrier>,
        n: usize,
    ) -> std::vec::Vec<std::thread::JoinHandle<()>> {
        let waiters = (0..n)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || barrier.wait())
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        waiters
    }

    /// Guards against threads of a block hanging forever in `sync_threads` when another
    /// thread of the block panicked and will never arrive.
    #[test]
    fn poisoned_block_barrier_releases_waiters() {
        let barrier = Arc::new(BlockBarrier::new(3));
        let waiters = waiting_threads(&barrier, 2);
        barrier.poison();
        for w in waiters {
            let err = w.join().expect_err("a waiter passed a poisoned barrier");
            assert!(panic_text(err.as_ref()).contains("poisoned"));
        }
        // Late arrivals fail at once too.
        let late = std::panic::catch_unwind(|| barrier.wait());
        assert!(late.is_err());
    }

    /// Guards against a barrier that some threads of the block will never reach (they
    /// finished the kernel) hanging the others: waiting and late threads fail, saying why.
    #[test]
    fn exited_threads_fail_the_barrier_instead_of_hanging_it() {
        let barrier = Arc::new(BlockBarrier::new(4));
        let waiters = waiting_threads(&barrier, 2);
        // Two threads return from the kernel without reaching the barrier.
        barrier.thread_exited();
        barrier.thread_exited();
        for w in waiters {
            let err = w
                .join()
                .expect_err("a waiter passed a barrier two threads skipped");
            let text = panic_text(err.as_ref());
            assert!(text.contains("2 of the block's 4 threads"), "{text}");
        }
    }
}
