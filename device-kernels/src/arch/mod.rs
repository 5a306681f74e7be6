//! The arch layer: where kernel code meets the machine it runs on.
//!
//! Every function here has two implementations with one contract: `nvptx` on the GPU
//! (special registers, `bar.sync`, scoped PTX through `asm!`) and `host` in the CPU
//! emulator (thread-locals set by the launcher, a per-block barrier, core atomics). Code above
//! this module never uses `#[cfg]` for the target: it calls these functions.
//!
//! Atomics go through [`atomic`], the one shim that also serves `loom` under `cfg(oxccl_loom)`.
//! Plain data moves through [`GlobalWord`]: weak loads and stores of global memory, what a
//! bulk copy is made of.

pub mod atomic;
mod awaited;
#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(target_arch = "nvptx64")]
mod nvptx;

#[cfg(not(target_arch = "nvptx64"))]
use host as imp;
#[cfg(target_arch = "nvptx64")]
use nvptx as imp;

pub use atomic::Scope;
pub use awaited::Awaited;

/// A three-dimensional index or extent, as CUDA's `dim3`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Dim3 {
    /// Fastest-varying component.
    pub x: u32,
    /// Middle component.
    pub y: u32,
    /// Slowest-varying component.
    pub z: u32,
}

const _: () = assert!(core::mem::size_of::<Dim3>() == 12);

impl core::fmt::Display for Dim3 {
    /// `XxYxZ`, as launch configurations are usually written.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}x{}x{}", self.x, self.y, self.z)
    }
}

impl Dim3 {
    /// The extent of a single element in every dimension.
    pub const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };
    /// The index of the first element.
    pub const ZERO: Dim3 = Dim3 { x: 0, y: 0, z: 0 };

    /// An index or extent from its three components.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }

    /// A one-dimensional extent: `x` elements along x, one along y and z.
    pub const fn extent(x: u32) -> Dim3 {
        Dim3 { x, y: 1, z: 1 }
    }

    /// A one-dimensional index: position `x` along x, zero along y and z.
    pub const fn index(x: u32) -> Dim3 {
        Dim3 { x, y: 0, z: 0 }
    }

    /// Number of elements of an extent (`x * y * z`), widened so it cannot overflow.
    pub const fn volume(self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }

    /// Row-major linear position of index `self` inside extent `extent`.
    pub const fn linear_in(self, extent: Dim3) -> u64 {
        (self.z as u64 * extent.y as u64 + self.y as u64) * extent.x as u64 + self.x as u64
    }
}

/// Index of the calling thread within its block (`threadIdx`).
#[inline(always)]
pub fn thread_idx() -> Dim3 {
    imp::thread_idx()
}

/// Index of the calling thread's block within the grid (`blockIdx`).
#[inline(always)]
pub fn block_idx() -> Dim3 {
    imp::block_idx()
}

/// Extent of a block in threads (`blockDim`).
#[inline(always)]
pub fn block_dim() -> Dim3 {
    imp::block_dim()
}

/// Extent of the grid in blocks (`gridDim`).
#[inline(always)]
pub fn grid_dim() -> Dim3 {
    imp::grid_dim()
}

/// Linear rank of the calling thread within its block.
#[inline(always)]
pub fn thread_rank_in_block() -> u32 {
    thread_idx().linear_in(block_dim()) as u32
}

/// Number of threads in a block.
#[inline(always)]
pub fn threads_per_block() -> u32 {
    block_dim().volume() as u32
}

/// Linear rank of the calling thread's block within the grid.
#[inline(always)]
pub fn block_rank() -> u32 {
    block_idx().linear_in(grid_dim()) as u32
}

/// Number of blocks in the grid.
#[inline(always)]
pub fn blocks_per_grid() -> u32 {
    grid_dim().volume() as u32
}

/// Linear rank of the calling thread within the whole grid.
#[inline(always)]
pub fn thread_rank_in_grid() -> u64 {
    block_rank() as u64 * threads_per_block() as u64 + thread_rank_in_block() as u64
}

/// Number of threads in the whole grid.
#[inline(always)]
pub fn threads_per_grid() -> u64 {
    blocks_per_grid() as u64 * threads_per_block() as u64
}

/// Waits until every thread of the block has reached this call (`__syncthreads`), and makes
/// their prior writes visible to each other. Every thread of the block must call it.
#[inline(always)]
pub fn sync_threads() {
    imp::sync_threads()
}

/// [`sync_threads`], and tells every thread whether any thread of the block passed
/// `predicate` true (`__syncthreads_or`): the way a block takes one decision, such as
/// "a wait failed, stop", that every thread then follows alike.
#[inline(always)]
pub fn sync_threads_or(predicate: bool) -> bool {
    imp::sync_threads_or(predicate)
}

/// Orders the calling thread's earlier memory accesses before its later ones for every
/// observer within `scope` (acquire-release fence).
#[inline(always)]
pub fn fence(scope: Scope) {
    imp::fence(scope)
}

/// A monotonic clock in nanoseconds, comparable between threads of one device.
/// Used only to bound waits.
#[inline(always)]
pub fn clock_ns() -> u64 {
    imp::clock_ns()
}

/// One step of a polling loop: the `iteration`-th unsuccessful poll of some condition.
///
/// On the GPU this is a short `nanosleep`; in the emulator it spins briefly, then yields,
/// then sleeps, so that ranks sharing a few cores keep making progress.
#[inline(always)]
pub fn spin_pause(iteration: u32) {
    imp::spin_pause(iteration)
}

/// [`spin_pause`] for a wait that waits for what `awaited` tests: the same on the GPU. In
/// the emulator, a kernel thread that takes turns with others on one OS thread is
/// suspended at its waits, and `awaited` lets the emulator tell when to resume it without
/// switching back to it for each poll (see `host::WaitHook`).
#[inline(always)]
pub fn spin_pause_awaiting(iteration: u32, awaited: Awaited) {
    imp::spin_pause_awaiting(iteration, awaited)
}

/// Tells the host proxy that consumes a FIFO that a trigger was published, given the FIFO
/// handle's doorbell address (zero: nobody to tell; always the case on the GPU, where the
/// proxy polls) and whether the pusher saw the proxy asleep.
#[inline(always)]
pub fn ring_doorbell(addr: u64, proxy_asleep: bool) {
    imp::ring_doorbell(addr, proxy_asleep)
}

/// Asks for the cache line holding `addr` in a writable state ahead of a store to it (a hint:
/// it never faults, and does nothing where it does not apply).
///
/// On the CPU emulator a FIFO push stores into lines the proxy thread last read a lap ago,
/// and the push's atomic claim waits for those stores to gain the line; asking early takes
/// that wait off the push. On the GPU, whose pushes cross to host memory, it does nothing.
#[inline(always)]
pub fn prefetch_for_write(addr: *const u8) {
    imp::prefetch_for_write(addr)
}

/// Notes a failed device call of the calling thread (the emulator keeps it to report with
/// the kernel's error; on the GPU the channel's abort record carries it instead).
#[inline(always)]
pub(crate) fn note_failure(
    error: crate::DeviceError,
    op: crate::error::DeviceOp,
    site: u32,
    detail: [u64; 3],
) {
    imp::note_failure(error, op, site, detail)
}

/// Returns `value`, computed where this call stands: the compiler may not hoist the call,
/// nor anything computed from its result, out of the branch it is in.
///
/// For failure paths that run inline in a loop: without it, LLVM computes their
/// loop-invariant parts (a record's field addresses, a reason word) ahead of the loop, and
/// those values then hold registers through every iteration of the hot path. On the GPU an
/// empty `asm!` block with side effects; on the host the value as it is.
#[inline(always)]
pub fn in_place(value: u64) -> u64 {
    imp::in_place(value)
}

/// Stops the kernel at once (`trap`); on the host, panics the calling kernel thread.
#[inline(always)]
pub fn trap() -> ! {
    imp::trap()
}

/// Sixteen bytes of plain data, aligned to 16: what one 128-bit load or store moves.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Word16(pub [u64; 2]);

const _: () = assert!(core::mem::size_of::<Word16>() == 16);

/// Plain data that one load and one store of global memory move whole: `u8`, `u16`, `u32`,
/// `u64` and [`Word16`], the units of a bulk copy.
///
/// The accesses are weak (on the GPU `ld.global` / `st.global` of the word's width, a
/// 128-bit vector for [`Word16`]; no `.volatile`, no scope): they carry data, not
/// synchronization, so they order nothing and may be cached; publish what they store with a
/// release (a semaphore signal) and read what a peer stored after the matching acquire. In
/// the emulator they are relaxed atomic accesses of the word's width (two halves for
/// [`Word16`]), so emulated kernel threads that race on a word get unspecified values, as on
/// a GPU, rather than undefined behaviour.
///
/// They name the global state space rather than a generic address: every buffer a device
/// handle addresses is global memory (device allocations, peer memory mapped through IPC,
/// device-mapped host memory), never shared or local memory.
pub trait GlobalWord: Copy + sealed::Sealed {
    /// Loads the word at `addr` (a weak load).
    ///
    /// # Safety
    /// `addr` is aligned to the word's size and addresses that many readable bytes of global
    /// memory. A concurrent write to them by another thread or agent makes the value read
    /// unspecified, as on a GPU.
    unsafe fn load_global(addr: u64) -> Self;

    /// Stores `self` at `addr` (a weak store).
    ///
    /// # Safety
    /// `addr` is aligned to the word's size and addresses that many writable bytes of global
    /// memory. A concurrent access to them by another thread or agent leaves what it reads,
    /// and what the bytes end up holding, unspecified.
    unsafe fn store_global(self, addr: u64);
}

mod sealed {
    /// Only the arch layer's words: each needs a load and a store of its exact width.
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for super::Word16 {}
}

/// Whether a thread should take one contiguous chunk of a copy (CPU cores, where caches and
/// `memcpy` favour long runs) rather than a strided share (GPU warps, where neighbouring
/// threads touching neighbouring words coalesce).
pub const PREFERS_CONTIGUOUS_SPLIT: bool = imp::PREFERS_CONTIGUOUS_SPLIT;
