//! One kernel launch in the emulator: its copied parameters, its block barriers, and the
//! count of its threads still running.
//!
//! Written by the stream (creation) and by the launch's own kernel threads (failures, the
//! running count); read by the stream when the last thread reports done.

use super::pool::Worker;
use super::stream::CpuStream;
use oxccl_device::DeviceError;
use oxccl_device::arch::Dim3;
use oxccl_device::arch::host::{
    BlockBarrier, LastFailure, ThreadContext, enter, take_last_failure,
};
use oxccl_device::launch::{KernelInfo, LaunchConfig};
use parking_lot::Mutex;
use std::alloc::Layout;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A launch in flight or queued on a stream.
pub(crate) struct Launch {
    pub(crate) kernel: &'static KernelInfo,
    pub(crate) config: LaunchConfig,
    params: ParamBlock,
    /// One barrier per block, indexed by linear block rank.
    barriers: Box<[Arc<BlockBarrier>]>,
    /// Threads claimed so far (see [`Self::claim_thread`]).
    claimed: AtomicU32,
    /// The worker given this one-thread launch, until it claims the thread: a host thread
    /// that claims it first takes the task back from that worker ([`Pool::retract`]).
    ///
    /// [`Pool::retract`]: super::pool::Pool::retract
    pub(crate) worker: Mutex<Option<Arc<Worker>>>,
    /// Threads not yet done; the thread that takes it to zero completes the launch.
    remaining: AtomicU32,
    /// The first failure of a thread of this launch, and how many threads failed.
    failure: Mutex<Failure>,
    /// The stream to tell when the launch completes.
    stream: Arc<CpuStream>,
}

#[derive(Default)]
struct Failure {
    first: Option<(FailureKind, String)>,
    failed_threads: u32,
}

/// How a kernel thread failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// It panicked (or trapped).
    Panicked,
    /// It returned this error.
    Returned(DeviceError),
}

impl Launch {
    /// A launch of `kernel` with a private copy of the parameter values `params` points to.
    ///
    /// The caller has checked the configuration (non-zero extents, total threads within
    /// the emulator's limit, so it fits in `u32`) and that `params` has one pointer per
    /// parameter.
    ///
    /// # Safety
    /// The i-th pointer of `params` must point to a valid value of the i-th parameter of
    /// `kernel` (at least `kernel.params[i].size` readable bytes).
    pub(crate) unsafe fn new(
        kernel: &'static KernelInfo,
        config: LaunchConfig,
        params: &[*const c_void],
        stream: Arc<CpuStream>,
    ) -> crate::Result<Self> {
        super::quiet_kernel_panics();
        // SAFETY: forwarded contract.
        let params = unsafe { ParamBlock::copy(kernel, params)? };
        let threads_per_block = config.block.volume() as u32;
        let barriers = (0..config.grid.volume())
            .map(|_| Arc::new(BlockBarrier::new(threads_per_block)))
            .collect();
        Ok(Self {
            kernel,
            config,
            params,
            barriers,
            claimed: AtomicU32::new(0),
            worker: Mutex::new(None),
            remaining: AtomicU32::new(config.total_threads() as u32),
            failure: Mutex::new(Failure::default()),
            stream,
        })
    }

    /// Number of kernel threads of the launch.
    pub(crate) fn total_threads(&self) -> u32 {
        self.config.total_threads() as u32
    }

    /// Claims a thread of the launch nobody has claimed yet, to run it: its index, or `None`
    /// if every thread is claimed. Each index is claimed once.
    ///
    /// Whoever claims runs the thread to its end on an OS thread of its own, so a launch's
    /// claimed threads all run at once (a thread may start late, as a slow OS thread would).
    pub(crate) fn claim_thread(&self) -> Option<u32> {
        let total = self.total_threads();
        // Relaxed: the count only hands out indices; the launch itself reached the claimer
        // through the lock or slot that gave it the `Arc`.
        self.claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < total).then_some(c + 1)
            })
            .ok()
    }

    /// Threads of the launch that have not finished yet.
    pub(crate) fn remaining_threads(&self) -> u32 {
        self.remaining.load(Ordering::Relaxed)
    }

    /// Runs kernel thread `index` (linear in the grid) on the calling worker.
    ///
    /// A panic of the kernel body is caught and recorded, and poisons the thread's block
    /// barrier so that the rest of the block does not wait for it in `sync_threads`; an
    /// error the kernel returns is recorded with the failed call's details. Either way the
    /// thread counts as exited for its block's barrier, so threads waiting for it there
    /// fail instead of hanging.
    pub(crate) fn run_thread(&self, index: u32) {
        let threads_per_block = self.config.block.volume() as u32;
        let block = index / threads_per_block;
        let thread = index % threads_per_block;
        let barrier = &self.barriers[block as usize];
        let ctx = ThreadContext {
            thread_idx: delinearize(thread, self.config.block),
            block_idx: delinearize(block, self.config.grid),
            block_dim: self.config.block,
            grid_dim: self.config.grid,
            block_barrier: barrier.clone(),
        };
        let entry = self.kernel.host_entry;
        let params = self.params.pointers.as_ptr();
        let guard = enter(ctx);
        // SAFETY: `params` holds one pointer per parameter of `self.kernel`, each aligned
        // for and pointing to a copy of a valid value of that parameter's type
        // (`ParamBlock::copy`), alive as long as `self`.
        let outcome = catch_unwind(AssertUnwindSafe(|| unsafe { entry(params) }));
        let last_failure = take_last_failure();
        drop(guard);
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                let message = returned_message(error, last_failure);
                self.record_failure(index, FailureKind::Returned(error), &message);
            }
            Err(payload) => {
                // Record before poisoning: the threads the poison wakes fail too, and the
                // first message must be the cause, not "barrier poisoned".
                let message = crate::error::panic_message(payload.as_ref()).to_string();
                self.record_failure(
                    index,
                    FailureKind::Panicked,
                    &format!("panicked: {message}"),
                );
                barrier.poison();
                // A payload whose drop panics must not take the worker down with it.
                if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                    std::mem::forget(again);
                }
            }
        }
        barrier.thread_exited();
    }

    /// Reports one thread done; the last one completes the launch on its stream (which may
    /// start the stream's next launch on this worker).
    pub(crate) fn thread_done(self: Arc<Self>) {
        // AcqRel: each thread releases its writes; the last one acquires them all before it
        // completes the launch (and the host acquires them from the stream's counter).
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let stream = self.stream.clone();
            stream.complete(&self);
        }
    }

    /// What went wrong, if a thread failed: how the first thread failed, its message, and
    /// a count of the others.
    pub(crate) fn failure(&self) -> Option<(FailureKind, String)> {
        let failure = self.failure.lock();
        let (kind, first) = failure.first.as_ref()?;
        Some((
            *kind,
            match failure.failed_threads {
                0 | 1 => first.clone(),
                n => format!("{first} ({} more threads failed after it)", n - 1),
            },
        ))
    }

    fn record_failure(&self, index: u32, kind: FailureKind, message: &str) {
        let threads_per_block = self.config.block.volume() as u32;
        let (block, thread) = (index / threads_per_block, index % threads_per_block);
        let mut failure = self.failure.lock();
        failure.failed_threads += 1;
        if failure.first.is_none() {
            let t = delinearize(thread, self.config.block);
            let b = delinearize(block, self.config.grid);
            failure.first = Some((
                kind,
                format!(
                    "thread ({}, {}, {}) of block ({}, {}, {}) {message}",
                    t.x, t.y, t.z, b.x, b.y, b.z
                ),
            ));
        }
    }
}

/// How a thread that returned `error` got there: its first failed device call, if the
/// device code recorded one.
fn returned_message(error: DeviceError, last: Option<LastFailure>) -> String {
    match last {
        Some(f) if f.error == error || error == DeviceError::Aborted => format!(
            "returned the error of {} ({}; details {:?}, site {})",
            f.op, f.error, f.detail, f.site
        ),
        _ => format!("returned `{error}`"),
    }
}

/// Row-major index of linear position `linear` in `extent` (inverse of `Dim3::linear_in`).
fn delinearize(linear: u32, extent: Dim3) -> Dim3 {
    Dim3 {
        x: linear % extent.x,
        y: (linear / extent.x) % extent.y,
        z: linear / (extent.x * extent.y),
    }
}

/// The launch's own copy of its parameter values, each aligned as its [`ParamLayout`]
/// says, and the pointer array (`kernelParams`) into it.
///
/// Invariants: `storage` was allocated with `layout` (non-zero size) and is freed only by
/// `Drop`; `pointers[i]` points into `storage` at an offset aligned to
/// `kernel.params[i].align` with `kernel.params[i].size` bytes after it.
///
/// [`ParamLayout`]: oxccl_device::launch::ParamLayout
struct ParamBlock {
    storage: NonNull<u8>,
    layout: Layout,
    pointers: Box<[*const c_void]>,
}

// SAFETY: the block owns its storage; the pointers point into it. After `copy` the storage
// is only read (kernel threads read parameters by value), so sharing between the kernel
// threads of a launch is sound.
unsafe impl Send for ParamBlock {}
// SAFETY: as above.
unsafe impl Sync for ParamBlock {}

impl ParamBlock {
    /// Copies the values `params` points to.
    ///
    /// # Safety
    /// As [`Launch::new`].
    unsafe fn copy(kernel: &KernelInfo, params: &[*const c_void]) -> crate::Result<Self> {
        let refuse = |why: String| {
            crate::Error::InvalidUsage(format!("launch of kernel `{}`: {why}", kernel.name))
        };
        let mut layout = Layout::new::<()>();
        let mut offsets = Vec::with_capacity(kernel.params.len());
        for (i, p) in kernel.params.iter().enumerate() {
            let field = Layout::from_size_align(p.size, p.align).map_err(|_| {
                refuse(format!(
                    "parameter {i} has an invalid layout (size {}, align {})",
                    p.size, p.align
                ))
            })?;
            let (grown, offset) = layout
                .extend(field)
                .map_err(|_| refuse("the parameters do not fit in memory".into()))?;
            layout = grown;
            offsets.push(offset);
        }
        // At least one byte, so there is always an allocation to point into (zero-sized
        // parameters and kernels without parameters included).
        let layout = Layout::from_size_align(layout.size().max(1), layout.align())
            .map_err(|_| refuse("the parameters do not fit in memory".into()))?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(storage) = NonNull::new(raw) else {
            return Err(crate::Error::System {
                context: format!(
                    "allocating {} bytes of parameters for kernel `{}`",
                    layout.size(),
                    kernel.name
                ),
                source: std::io::ErrorKind::OutOfMemory.into(),
            });
        };
        let pointers = offsets
            .iter()
            .zip(kernel.params)
            .zip(params)
            .map(|((&offset, p), &src)| {
                // SAFETY: `offset + p.size <= layout.size()` by construction of `layout`.
                let dst = unsafe { storage.as_ptr().add(offset) };
                // SAFETY: `src` points to `p.size` readable bytes (the caller's contract);
                // `dst` has room for them in our fresh allocation, so they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst, p.size) };
                dst.cast_const().cast::<c_void>()
            })
            .collect();
        Ok(Self {
            storage,
            layout,
            pointers,
        })
    }
}

impl Drop for ParamBlock {
    fn drop(&mut self) {
        // SAFETY: by the invariant, `storage` came from `alloc(self.layout)` and is freed
        // only here.
        unsafe { std::alloc::dealloc(self.storage.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against kernel threads seeing indices that do not match CUDA's row-major
    /// `threadIdx`/`blockIdx` (x fastest).
    #[test]
    fn delinearize_inverts_linear_in() {
        let extent = Dim3::new(3, 2, 4);
        for linear in 0..extent.volume() as u32 {
            let idx = delinearize(linear, extent);
            assert_eq!(idx.linear_in(extent), u64::from(linear));
            assert!(idx.x < 3 && idx.y < 2 && idx.z < 4);
        }
    }
}
