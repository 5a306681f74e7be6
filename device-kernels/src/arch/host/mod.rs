//! The arch layer in the CPU emulator.
//!
//! The emulator's launcher runs each kernel thread on an OS thread and calls [`enter`] with
//! that thread's [`ThreadContext`] before it runs the kernel body; the index functions read
//! it back from a thread-local. A thread that never entered a context (a kernel function
//! called directly, a test) sees itself as the only thread of a one-block grid.
//!
//! | file | concept |
//! |---|---|
//! | `backoff.rs` | how kernel threads wait: spin, yield, sleep ([`spin_pause`]) |
//! | `block_barrier.rs` | [`BlockBarrier`]: `sync_threads`, and barriers that can never complete |
//! | `doorbell.rs` | [`Doorbell`]: how a push gets its trigger executed by the host proxy |
//! | `prefetch.rs` | write prefetch of FIFO slots |
//! | `global.rs` | [`GlobalWord`](super::GlobalWord): plain loads and stores, relaxed atomics here |
//! | `last_failure.rs` | [`LastFailure`]: the device call that last failed on this thread |
//!
//! Waits here must back off: several ranks, each with kernel threads and a proxy thread,
//! share few cores, and a wait that spins forever starves the thread it waits for.

mod backoff;
mod block_barrier;
mod doorbell;
mod global;
mod last_failure;
mod prefetch;

pub use backoff::spin_pause;
pub use block_barrier::BlockBarrier;
pub(crate) use doorbell::ring_doorbell;
pub use doorbell::{Assist, Doorbell};
pub(crate) use last_failure::note_failure;
pub use last_failure::{LastFailure, take_last_failure};
pub(crate) use prefetch::prefetch_for_write;

use super::{Dim3, Scope};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
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
    static IN_KERNEL: Cell<bool> = const { Cell::new(false) };
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
    IN_KERNEL.with(|k| k.set(true));
    let _ = take_last_failure();
    ContextGuard {
        _not_send: core::marker::PhantomData,
    }
}

/// Whether the calling thread is running a kernel (between [`enter`] and the guard's drop):
/// the emulator's panic hook stays quiet for kernel threads, whose panics the launch reports.
pub fn in_kernel() -> bool {
    IN_KERNEL.with(Cell::get)
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
        IN_KERNEL.with(|k| k.set(false));
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

#[inline(always)]
pub(crate) fn in_place(value: u64) -> u64 {
    value
}

pub(crate) fn trap() -> ! {
    panic!("kernel trapped")
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(in_kernel());
            assert_eq!(thread_idx(), Dim3::index(3));
            assert_eq!(crate::arch::thread_rank_in_grid(), 11);
        }
        assert!(!in_kernel());
        assert_eq!(thread_idx(), Dim3::ZERO);
        assert_eq!(block_dim(), Dim3::ONE);
    }
}
