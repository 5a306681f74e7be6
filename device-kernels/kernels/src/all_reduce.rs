//! Ring all-reduce (sum of `f32`) over memory channels: a reduce-scatter of `n_ranks - 1`
//! steps, then an all-gather of `n_ranks - 1` steps, each step one chunk per rank.
//!
//! Buffers of every rank: `input` (`n` elements; may be `work` itself for in-place), and a
//! registered `work` buffer of `2 * capacity` elements: the output is its first `n`
//! elements, and the second half, from element `capacity` on, receives the previous rank's
//! partial sums. Each channel's `remote` is the next (`next`) or previous (`prev`) rank's
//! `work`, its `local` our `work`.
//!
//! The kernel is safe: `input` and `work` are views ([`oxccl_device::device_view`]), so a
//! buffer shorter than the arguments say is refused ([`DeviceError::OutOfRange`]) instead of
//! read or written past its end, and every access to peer memory goes through the channels'
//! bounds checks. Wrong arguments (a `work` that is not the channels' `local`) give wrong
//! sums, nothing worse.
//!
//! Why no step reads a chunk another rank overwrites: in the reduce-scatter each rank
//! receives every chunk index at most once, into its own scratch slot; in the all-gather
//! the final value a peer writes into our chunk already includes our contribution, which
//! we sent before that peer could compute it.
//!
//! **Back to back.** Calls may follow each other on the same buffers and channels with no
//! host barrier, whatever their `n`: the scratch sits at the fixed offset `capacity`, never
//! inside any call's output; and a rank that starts call `k + 1` has completed call `k`,
//! which the ring of signals allows only once `next` (the rank whose scratch it writes) has
//! signalled its first all-gather step of call `k`, after its last read of its scratch in
//! call `k`. (With the scratch at offset `n`, a shrinking `n` let a rank one call ahead write
//! into `next`'s output.)

use oxccl_device::KernelArg;
use oxccl_device::arch;
use oxccl_device::block::block_signal_and_wait;
use oxccl_device::coop::Block;
use oxccl_device::coop::contiguous_chunk;
use oxccl_device::error::{DeviceError, DeviceOp};
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::{DeviceView, DeviceViewMut};

/// Arguments of [`ring_all_reduce_sum_f32()`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct RingAllReduceArgs<'a> {
    /// Channel to the next rank (its `work` is the remote).
    pub next: MemoryChannelDeviceHandle<'a>,
    /// Channel to the previous rank (it signals us on this one).
    pub prev: MemoryChannelDeviceHandle<'a>,
    /// The input: at least `n` elements (the first `n` of `work` for in-place).
    pub input: DeviceView<'a, f32>,
    /// Our `work` buffer (`2 * capacity` elements), the registered buffer the channels'
    /// `local` names.
    pub work: DeviceViewMut<'a, f32>,
    /// Elements to reduce: at most `capacity`.
    pub n: u64,
    /// Elements the `work` buffers were sized for (the same on every rank).
    pub capacity: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks in the ring.
    pub n_ranks: u32,
}

const _: () = assert!(core::mem::size_of::<RingAllReduceArgs<'static>>() == 2 * 104 + 56);

/// Sums `n` `f32`s across the ring; every rank ends with the sum in the first `n` elements
/// of its `work`. Launch one block (any number of threads) per rank.
///
/// Nothing but this kernel and its peers' writes through the channels may touch `input` and
/// `work` until it completes, or the sums are unspecified; an out-of-place `input` that
/// overlaps `work` makes them unspecified too.
///
/// # Errors
/// [`DeviceError::InvalidArgument`] (recorded on `next`) if `n` exceeds `capacity` or
/// `rank` is not below `n_ranks`; [`DeviceError::OutOfRange`] if `input` holds fewer than
/// `n` elements or `work` fewer than `capacity + n`; channel errors of any step.
#[kernel(max_blocks = 1)]
pub fn ring_all_reduce_sum_f32(args: RingAllReduceArgs<'_>) -> Result<(), DeviceError> {
    all_reduce(&args)
}

/// Elements of chunk `c` when `n` elements are split among `n_ranks` chunks.
#[inline(always)]
fn chunk(c: u32, n_ranks: u32, n: u64) -> core::ops::Range<u64> {
    contiguous_chunk(c as u64, n_ranks as u64, n)
}

fn all_reduce(a: &RingAllReduceArgs<'_>) -> Result<(), DeviceError> {
    let (r, nr, n, cap) = (a.rank, a.n_ranks, a.n, a.capacity);
    if n > cap || r >= nr {
        return Err(a.next.semaphore().wait_policy().raise(
            DeviceError::InvalidArgument,
            DeviceOp::Kernel,
            [n, cap, r as u64],
        ));
    }
    // Every thread checks the same views, so all agree on a refusal.
    let out = a.work.slice(0..n)?;
    let scratch = a.work.as_view().slice(cap..cap.saturating_add(n))?;
    let scratch_off = cap * 4;
    if a.input.addr() != out.addr() {
        out.copy_from(Block, a.input)?;
    }
    if nr <= 1 {
        return Ok(());
    }
    // Our output must be complete before a peer reads it in step 0's put.
    arch::sync_threads();
    let step_chunk = |s: u32, back: u32| (r + 2 * nr - s - back) % nr;
    for s in 0..nr - 1 {
        let send = chunk(step_chunk(s, 0), nr, n);
        let bytes = (send.end - send.start) * 4;
        a.next
            .put(Block, scratch_off + send.start * 4, send.start * 4, bytes)?;
        // All threads' shares are sent before thread 0 signals; then it waits for `prev`'s
        // partial sums, and the block stops together if the wait failed.
        block_signal_and_wait(|| a.next.signal(), || a.prev.wait())?;
        let recv = chunk(step_chunk(s, 1), nr, n);
        // Each thread adds its own share of the chunk: no element is touched by two.
        out.slice(recv.clone())?
            .combine_from(Block, scratch.slice(recv)?, |sum, add| sum + add)?;
        arch::sync_threads();
    }
    for s in 0..nr - 1 {
        let send = chunk((r + 1 + nr - s) % nr, nr, n);
        let bytes = (send.end - send.start) * 4;
        a.next.put(Block, send.start * 4, send.start * 4, bytes)?;
        block_signal_and_wait(|| a.next.signal(), || a.prev.wait())?;
    }
    Ok(())
}
