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
//!
//! A kernel thread may continue on another OS thread after a wait ([`set_wait_hook`],
//! [`detach`], [`attach`]). The compiler assumes a function runs on one thread and may keep
//! a thread-local's address across a call, so every thread-local here is reached only in
//! functions marked `#[inline(never)]` that return before any wait: no kernel frame holds
//! such an address across a wait. Kernel code itself must not use thread-locals (a GPU has
//! none either).

mod backoff;
mod block_barrier;
mod doorbell;
mod global;
mod last_failure;
mod prefetch;

#[cfg(not(oxccl_loom))]
pub use backoff::{WaitHook, WaitWork, set_wait_hook, set_wait_work, time_given_up};
pub use backoff::{spin_pause, spin_pause_awaiting};
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
    /// The barrier shared by the threads of this block, for [`super::sync_threads`]; none
    /// for a block of one thread, which has nobody to wait for.
    pub block_barrier: Option<Arc<BlockBarrier>>,
}

#[derive(Clone, Copy, Debug)]
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
#[inline(never)]
pub fn enter(ctx: ThreadContext) -> ContextGuard {
    INDICES.with(|i| {
        i.set(Indices {
            thread_idx: ctx.thread_idx,
            block_idx: ctx.block_idx,
            block_dim: ctx.block_dim,
            grid_dim: ctx.grid_dim,
        })
    });
    BARRIER.with(|b| *b.borrow_mut() = ctx.block_barrier);
    IN_KERNEL.with(|k| k.set(true));
    let _ = take_last_failure();
    ContextGuard {
        _not_send: core::marker::PhantomData,
    }
}

/// Whether the calling thread is running a kernel (between [`enter`] and the guard's drop):
/// the emulator's panic hook stays quiet for kernel threads, whose panics the launch reports.
#[inline(never)]
pub fn in_kernel() -> bool {
    IN_KERNEL.with(Cell::get)
}

/// The emulated kernel thread context of an OS thread, taken off it by [`detach`] to be
/// put on another by [`attach`]: its indices, its block barrier and its last failure.
#[derive(Debug)]
pub struct DetachedContext {
    indices: Indices,
    barrier: Option<Arc<BlockBarrier>>,
    in_kernel: bool,
    last_failure: Option<LastFailure>,
}

/// Takes the calling OS thread's kernel thread context off it, leaving it outside any
/// kernel (as after the guard of [`enter`] dropped): the kernel thread is suspended here,
/// to continue on another OS thread after [`attach`].
#[inline(never)]
pub fn detach() -> DetachedContext {
    DetachedContext {
        indices: INDICES.with(|i| i.replace(ALONE)),
        barrier: BARRIER.with(|b| b.borrow_mut().take()),
        in_kernel: IN_KERNEL.with(|k| k.replace(false)),
        last_failure: take_last_failure(),
    }
}

/// Puts a kernel thread context taken by [`detach`] on the calling OS thread, replacing
/// whatever context it had; the guard of the [`enter`] that began it, dropped here later,
/// ends it here.
#[inline(never)]
pub fn attach(ctx: DetachedContext) {
    INDICES.with(|i| i.set(ctx.indices));
    BARRIER.with(|b| *b.borrow_mut() = ctx.barrier);
    IN_KERNEL.with(|k| k.set(ctx.in_kernel));
    let _ = take_last_failure();
    if let Some(f) = ctx.last_failure {
        note_failure(f.error, f.op, f.site, f.detail);
    }
}

/// Restores the calling thread to "not in a kernel" when dropped.
#[must_use = "the context ends when the guard drops"]
pub struct ContextGuard {
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    #[inline(never)]
    fn drop(&mut self) {
        INDICES.with(|i| i.set(ALONE));
        BARRIER.with(|b| *b.borrow_mut() = None);
        IN_KERNEL.with(|k| k.set(false));
    }
}

#[inline(never)]
pub(crate) fn thread_idx() -> Dim3 {
    INDICES.with(|i| i.get().thread_idx)
}

#[inline(never)]
pub(crate) fn block_idx() -> Dim3 {
    INDICES.with(|i| i.get().block_idx)
}

#[inline(never)]
pub(crate) fn block_dim() -> Dim3 {
    INDICES.with(|i| i.get().block_dim)
}

#[inline(never)]
pub(crate) fn grid_dim() -> Dim3 {
    INDICES.with(|i| i.get().grid_dim)
}

#[inline(never)]
pub(crate) fn sync_threads() {
    sync_threads_or(false);
}

#[inline(never)]
pub(crate) fn sync_threads_or(predicate: bool) -> bool {
    let barrier = BARRIER.with(|b| b.borrow().clone());
    // No barrier: a block of one thread (see `ThreadContext`), or code outside a launch;
    // either way the caller is the block's only thread, with nobody to wait for.
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
            block_barrier: Some(Arc::new(BlockBarrier::new(8))),
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
