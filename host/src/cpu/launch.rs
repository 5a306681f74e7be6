//! One kernel launch in the emulator: its copied parameters, its block barriers, and the
//! count of its threads still running.
//!
//! Written by the stream (creation) and by the launch's own kernel threads (failures, the
//! running count); read by the stream when the last thread reports done.
//!
//! A launch does not name its stream: whoever runs one of its threads holds the stream
//! too (a pool task, a helping host thread, a suspended kernel thread), so that a stream
//! may keep its completed launches for reuse without holding itself (see
//! [`Launch::new`]).

use super::pool::Worker;
use oxccl_device::DeviceError;
use oxccl_device::arch::Dim3;
use oxccl_device::arch::host::{
    BlockBarrier, LastFailure, ThreadContext, enter, take_last_failure,
};
use oxccl_device::launch::{KernelInfo, LaunchConfig, ParamLayout};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::alloc::Layout;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A launch in flight or queued on a stream.
pub(crate) struct Launch {
    pub(crate) kernel: &'static KernelInfo,
    pub(crate) config: LaunchConfig,
    params: ParamBlock,
    /// One barrier per block, indexed by linear block rank; none if a block has one thread
    /// (it has nobody to wait for, and a launch then costs no allocation for them).
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
    /// Whether `failure` has one: looked at without the lock, which every launch would
    /// otherwise take once more (two locked instructions) to find none.
    failed: AtomicBool,
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
    /// A launch of `kernel` with a private copy of the parameter values `params` points to,
    /// made in the allocation of `spare` (a completed launch of the same stream) if nothing
    /// else holds it, else in a new one.
    ///
    /// Reuse matters: a launch is allocated by the host thread that enqueues it and freed by
    /// the kernel thread that completes it, and glibc's allocator makes that hand-over of
    /// memory between threads cost a lock shared by both (a tenth of the host's time in a
    /// loop of small all-reduces, measured).
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
        spare: Option<Arc<Launch>>,
    ) -> crate::Result<Arc<Self>> {
        super::quiet_kernel_panics();
        let threads_per_block = config.block.volume() as u32;
        let barriers = if threads_per_block > 1 {
            (0..config.grid.volume())
                .map(|_| Arc::new(BlockBarrier::new(threads_per_block)))
                .collect()
        } else {
            Box::default()
        };
        let total = config.total_threads() as u32;
        let mut launch = match spare {
            Some(mut spare) => match Arc::get_mut(&mut spare) {
                Some(old) => {
                    // Field by field: moving a whole new launch in would copy its half
                    // kilobyte of parameter storage for nothing.
                    old.kernel = kernel;
                    old.config = config;
                    old.params.clear();
                    old.barriers = barriers;
                    *old.claimed.get_mut() = 0;
                    *old.worker.get_mut() = None;
                    *old.remaining.get_mut() = total;
                    *old.failure.get_mut() = Failure::default();
                    *old.failed.get_mut() = false;
                    spare
                }
                None => Arc::new(Self::fresh(kernel, config, barriers)),
            },
            None => Arc::new(Self::fresh(kernel, config, barriers)),
        };
        // The values are copied where they stay, inside the launch: its pointer array can
        // then be made once, not by every thread.
        let Some(block) = Arc::get_mut(&mut launch) else {
            return Err(crate::Error::Internal("a new launch was shared".into()));
        };
        // SAFETY: forwarded contract; the block sits in its launch's allocation and never
        // moves again.
        unsafe { block.params.fill(kernel, params)? };
        Ok(launch)
    }

    /// A launch with no parameter values yet.
    fn fresh(
        kernel: &'static KernelInfo,
        config: LaunchConfig,
        barriers: Box<[Arc<BlockBarrier>]>,
    ) -> Self {
        Self {
            kernel,
            config,
            params: ParamBlock::empty(),
            barriers,
            claimed: AtomicU32::new(0),
            worker: Mutex::new(None),
            remaining: AtomicU32::new(config.total_threads() as u32),
            failure: Mutex::new(Failure::default()),
            failed: AtomicBool::new(false),
        }
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
        // A one-thread launch (most of the emulator's: small collectives, ping-pongs) is at
        // index zero of everything, without the integer divisions, slow ones, that place a
        // thread of a larger one.
        let (block, thread_idx, block_idx) = if self.total_threads() == 1 {
            (0, Dim3::ZERO, Dim3::ZERO)
        } else {
            let block = index / threads_per_block;
            let thread = index % threads_per_block;
            (
                block,
                delinearize(thread, self.config.block),
                delinearize(block, self.config.grid),
            )
        };
        let barrier = self.barriers.get(block as usize);
        let ctx = ThreadContext {
            thread_idx,
            block_idx,
            block_dim: self.config.block,
            grid_dim: self.config.grid,
            block_barrier: barrier.cloned(),
        };
        let entry = self.kernel.host_entry;
        let params = self.params.pointers.as_ptr();
        let _running = super::corun::KernelThreadCount::start();
        let guard = enter(ctx);
        // SAFETY: `params` holds one pointer per parameter of `self.kernel`, each aligned
        // for and pointing to a copy of a valid value of that parameter's type
        // (`ParamBlock::fill`), alive as long as `self`.
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
                if let Some(barrier) = barrier {
                    barrier.poison();
                }
                // A payload whose drop panics must not take the worker down with it.
                if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                    std::mem::forget(again);
                }
            }
        }
        if let Some(barrier) = barrier {
            barrier.thread_exited();
        }
    }

    /// Reports one thread done: whether it was the last, whose caller completes the launch
    /// on its stream.
    pub(crate) fn thread_done(&self) -> bool {
        if self.total_threads() == 1 {
            // The only thread is the last, and the one that completes the launch: nothing
            // to acquire from others, and no locked instruction to count down.
            self.remaining.store(0, Ordering::Relaxed);
            return true;
        }
        // AcqRel: each thread releases its writes; the last one acquires them all before it
        // completes the launch (and the host acquires them from the stream's counter).
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// What went wrong, if a thread failed: how the first thread failed, its message, and
    /// a count of the others.
    pub(crate) fn failure(&self) -> Option<(FailureKind, String)> {
        // Acquire: pairs with the Release in `record_failure` (the launch's threads are
        // done when this is asked, and their completion ordered their writes before it
        // anyway).
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
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
        // Release: the failure is written (under the lock) before it is announced.
        self.failed.store(true, Ordering::Release);
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

/// Bytes of parameter values a launch keeps in itself, without an allocation of their own
/// (the shipped collectives' argument structs take 248 and 256).
const INLINE_PARAM_BYTES: usize = 256;
/// Largest alignment of a parameter kept in the launch itself.
const INLINE_PARAM_ALIGN: usize = 16;
/// Parameters whose pointers a launch keeps in itself (more take an allocation).
const INLINE_PARAMS: usize = 16;

/// Largest allocation of parameter values a launch keeps for its reuse (see
/// `ParamBlock::clear`).
const KEPT_PARAM_BYTES: usize = 4 << 10;

/// Storage for the parameter values of a launch that fit in it.
#[repr(C, align(16))]
struct InlineParams([MaybeUninit<u8>; INLINE_PARAM_BYTES]);

const _: () = assert!(core::mem::align_of::<InlineParams>() == INLINE_PARAM_ALIGN);

/// The launch's own copy of its parameter values, each aligned as its [`ParamLayout`]
/// says, and the pointer array (`kernelParams`) into it.
///
/// The values sit in `inline` if they fit (most launches: a launch then costs no
/// allocation for them), else in `heap`. The block is filled in place, inside its launch
/// ([`Self::fill`]), and never moves after: `pointers` may point into `inline`.
///
/// Invariants: `heap`, if set, was allocated with its layout (non-zero size) and is freed
/// only by `free_heap` (from `Drop`; from `clear` if it is larger than
/// [`KEPT_PARAM_BYTES`]; from `fill` when it needs a larger one: a launch reused for a
/// kernel of large parameters, such as an all-to-all-v's 1 KiB of counts, allocates
/// nothing); once filled, `pointers[i]` points into `heap` or else `inline`, aligned to
/// `kernel.params[i].align`, with `kernel.params[i].size` initialized bytes after it inside
/// that storage.
///
/// [`ParamLayout`]: oxccl_device::launch::ParamLayout
struct ParamBlock {
    inline: InlineParams,
    heap: Option<(NonNull<u8>, Layout)>,
    pointers: SmallVec<[*const c_void; INLINE_PARAMS]>,
}

// SAFETY: the block owns its storage, and its pointers point into it. After `fill` the
// storage is only read (kernel threads read parameters by value), so sharing between the
// kernel threads of a launch is sound.
unsafe impl Send for ParamBlock {}
// SAFETY: as above.
unsafe impl Sync for ParamBlock {}

impl ParamBlock {
    /// A block with no values yet, to be filled where it will stay.
    fn empty() -> Self {
        Self {
            inline: InlineParams([MaybeUninit::uninit(); INLINE_PARAM_BYTES]),
            heap: None,
            pointers: SmallVec::new(),
        }
    }

    /// Empties the block for [`Self::fill`] again. An allocation of its values is kept for
    /// the next values that need one, unless larger than [`KEPT_PARAM_BYTES`] (a stream
    /// keeps hundreds of launches for reuse).
    fn clear(&mut self) {
        self.pointers.clear();
        if self
            .heap
            .is_some_and(|(_, layout)| layout.size() > KEPT_PARAM_BYTES)
        {
            self.free_heap();
        }
    }

    /// Frees the allocation of values, if any. The block must hold no pointer into it
    /// (empty, or being dropped).
    fn free_heap(&mut self) {
        if let Some((heap, layout)) = self.heap.take() {
            // SAFETY: by the invariant, `heap` came from `alloc(layout)`; taken out of the
            // block, it is freed once, and no pointer into it is used again.
            unsafe { std::alloc::dealloc(heap.as_ptr(), layout) };
        }
    }

    /// Storage for values of `layout` (larger than the inline storage, or aligned above
    /// it): the kept allocation if it is large and aligned enough, else a new one (the old
    /// one freed).
    fn heap_for(&mut self, layout: Layout, kernel: &KernelInfo) -> crate::Result<NonNull<u8>> {
        if let Some((heap, kept)) = self.heap {
            if kept.size() >= layout.size() && kept.align() >= layout.align() {
                return Ok(heap);
            }
            self.free_heap();
        }
        // SAFETY: `layout` has a non-zero size (larger than the inline storage, or aligned
        // above 16, hence at least that large).
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(heap) = NonNull::new(raw) else {
            return Err(crate::Error::System {
                context: format!(
                    "allocating {} bytes of parameters for kernel `{}`",
                    layout.size(),
                    kernel.name
                ),
                source: std::io::ErrorKind::OutOfMemory.into(),
            });
        };
        self.heap = Some((heap, layout));
        Ok(heap)
    }

    /// Copies the values `params` points to into this (empty) block, and makes the pointer
    /// array.
    ///
    /// # Safety
    /// As [`Launch::new`]; and the block must not move after (it is inside its launch).
    unsafe fn fill(&mut self, kernel: &KernelInfo, params: &[*const c_void]) -> crate::Result<()> {
        let refuse = |why: String| {
            crate::Error::InvalidUsage(format!("launch of kernel `{}`: {why}", kernel.name))
        };
        // Parameter `i` placed after `layout`: the grown layout and the parameter's offset.
        let place = |layout: Layout, i: usize, p: &ParamLayout| {
            let field = Layout::from_size_align(p.size, p.align).map_err(|_| {
                refuse(format!(
                    "parameter {i} has an invalid layout (size {}, align {})",
                    p.size, p.align
                ))
            })?;
            layout
                .extend(field)
                .map_err(|_| refuse("the parameters do not fit in memory".into()))
        };
        // Two passes over the parameters, the offsets computed again in the second (a few
        // instructions each) rather than kept in a list the size of the launch's own: the
        // first pass sizes the storage, the second copies the values into it.
        let mut layout = Layout::new::<()>();
        for (i, p) in kernel.params.iter().enumerate() {
            layout = place(layout, i, p)?.0;
        }
        let base = if layout.size() > INLINE_PARAM_BYTES || layout.align() > INLINE_PARAM_ALIGN {
            self.heap_for(layout, kernel)?.as_ptr()
        } else {
            self.inline.0.as_mut_ptr().cast::<u8>()
        };
        let mut placed = Layout::new::<()>();
        for ((i, p), &src) in kernel.params.iter().enumerate().zip(params) {
            let (grown, offset) = place(placed, i, p)?;
            placed = grown;
            // SAFETY: `offset + p.size <= layout.size()`, `placed` growing as `layout` did
            // over the same parameters, and the storage holds `layout` (the inline one: its
            // size and alignment at most).
            let dst = unsafe { base.add(offset) };
            // SAFETY: `src` points to `p.size` readable bytes (the caller's contract); `dst`
            // has room for them in our own storage, so they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst, p.size) };
            self.pointers.push(dst.cast_const().cast::<c_void>());
        }
        Ok(())
    }
}

impl Drop for ParamBlock {
    fn drop(&mut self) {
        self.free_heap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight bytes aligned to 64, more than a launch's own storage is.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Aligned64 {
        word: u64,
        _pad: [u8; 56],
    }

    #[oxccl_device::kernel]
    fn small(_a: u8, _b: u64) {}

    #[oxccl_device::kernel]
    fn over_aligned(_a: u8, _b: Aligned64) {}

    #[oxccl_device::kernel]
    fn large(_a: u16, _b: [u64; 40]) {}

    #[oxccl_device::kernel]
    #[allow(clippy::too_many_arguments)]
    fn many(
        _p0: u8,
        _p1: u64,
        _p2: u8,
        _p3: u64,
        _p4: u8,
        _p5: u64,
        _p6: u8,
        _p7: u64,
        _p8: u8,
        _p9: u64,
        _p10: u8,
        _p11: u64,
        _p12: u8,
        _p13: u64,
        _p14: u8,
        _p15: u64,
        _p16: u8,
    ) {
    }

    /// Copies each value of `values` (one per parameter of `kernel`, as bytes) into a
    /// parameter block, and checks each pointer's alignment and bytes.
    fn round_trip(kernel: &KernelInfo, values: &[Vec<u8>], on_heap: bool) {
        use bytemuck::Zeroable;
        // Each value in storage aligned for any parameter here.
        let storage: Vec<Vec<Aligned64>> = values
            .iter()
            .map(|v| {
                let mut words = vec![Aligned64::zeroed(); v.len().div_ceil(64).max(1)];
                bytemuck::cast_slice_mut::<Aligned64, u8>(&mut words)[..v.len()].copy_from_slice(v);
                words
            })
            .collect();
        let params: Vec<*const c_void> = storage.iter().map(|w| w.as_ptr().cast()).collect();
        let mut block = Box::new(ParamBlock::empty());
        // SAFETY: one pointer per parameter, each to `size` readable bytes of its value;
        // the block stays in its box.
        unsafe { block.fill(kernel, &params) }.unwrap();
        assert_eq!(block.heap.is_some(), on_heap, "{}", kernel.name);
        let pointers = &block.pointers;
        assert_eq!(pointers.len(), values.len());
        for ((p, layout), value) in pointers.iter().zip(kernel.params).zip(values) {
            assert_eq!(*p as usize % layout.align, 0, "{}: misaligned", kernel.name);
            // SAFETY: the block holds `layout.size` bytes at `p`.
            let got = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), layout.size) };
            assert_eq!(got, &value[..], "{}", kernel.name);
        }
    }

    /// Bytes 1, 2, 3, ... of length `n`, starting at `seed`.
    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    /// Guards against parameter values that land misaligned or wrong in a launch's copy:
    /// kept in the launch (small ones), or given an allocation of their own (more bytes,
    /// or more aligned, than the launch keeps), with offsets kept in the launch or not
    /// (more than sixteen parameters).
    #[test]
    fn parameter_blocks_keep_values_aligned_and_intact() {
        round_trip(&small::KERNEL, &[bytes(1, 7), bytes(8, 20)], false);
        round_trip(&over_aligned::KERNEL, &[bytes(1, 7), bytes(64, 30)], true);
        round_trip(&large::KERNEL, &[bytes(2, 7), bytes(320, 40)], true);
        let many: Vec<Vec<u8>> = (0..17)
            .map(|i| bytes(if i % 2 == 0 { 1 } else { 8 }, i as u8 * 9))
            .collect();
        round_trip(&many::KERNEL, &many, false);
    }

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
