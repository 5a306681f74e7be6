//! Ring all-reduce (sum of `f32`) over memory channels: a reduce-scatter of `n_ranks - 1`
//! steps, then an all-gather of `n_ranks - 1` steps, each step one chunk per rank.
//!
//! Buffers of every rank: `input` (n elements; may be `output` itself for in-place), and a
//! registered `work` buffer of `2 * n` elements: `output` is its first half, the second half
//! receives the previous rank's partial sums. Each channel's `remote` is the next (`next`) or
//! previous (`prev`) rank's `work`, its `local` our `work`.
//!
//! Why no step reads a chunk another rank overwrites: in the reduce-scatter each rank
//! receives every chunk index at most once, into its own scratch slot; in the all-gather
//! the final value a peer writes into our chunk already includes our contribution, which
//! we sent before that peer could compute it.

use crate::arch;
use crate::coop::contiguous_chunk;
use crate::coop::{Block, Coop};
use crate::error::DeviceError;
use crate::kernel;
use crate::memory_channel::MemoryChannelDeviceHandle;

/// Arguments of [`ring_all_reduce_sum_f32`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RingAllReduceArgs {
    /// Channel to the next rank (its `work` is the remote).
    pub next: MemoryChannelDeviceHandle,
    /// Channel to the previous rank (it signals us on this one).
    pub prev: MemoryChannelDeviceHandle,
    /// Address of the `n` input elements (may equal `work` for in-place).
    pub input: u64,
    /// Address of our `work` buffer (`2 * n` elements).
    pub work: u64,
    /// Elements to reduce.
    pub n: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks in the ring.
    pub n_ranks: u32,
}

const _: () = assert!(core::mem::size_of::<RingAllReduceArgs>() == 2 * 104 + 32);

/// Sums `n` `f32`s across the ring; every rank ends with the sum in the first half of its
/// `work`. Launch one block (any number of threads) per rank.
#[kernel]
pub fn ring_all_reduce_sum_f32(args: RingAllReduceArgs) {
    let _ = all_reduce(&args);
}

/// Elements of chunk `c` when `n` elements are split among `n_ranks` chunks.
#[inline(always)]
fn chunk(c: u32, n_ranks: u32, n: u64) -> core::ops::Range<u64> {
    contiguous_chunk(c as u64, n_ranks as u64, n)
}

/// All threads meet; then thread 0 signals `next` and waits for `prev`; all meet again and
/// stop together if the wait failed.
#[inline(always)]
fn exchange_step(a: &RingAllReduceArgs) -> Result<(), DeviceError> {
    arch::sync_threads();
    let mut failed = false;
    if arch::thread_rank_in_block() == 0 {
        a.next.signal();
        failed = a.prev.wait().is_err();
    }
    if arch::sync_threads_or(failed) {
        return Err(DeviceError::Aborted);
    }
    Ok(())
}

fn all_reduce(a: &RingAllReduceArgs) -> Result<(), DeviceError> {
    let (r, nr, n) = (a.rank, a.n_ranks, a.n);
    let out = a.work as usize as *mut f32;
    let scratch_off = n * 4;
    if a.input != a.work {
        // SAFETY: `input` holds `n` elements, `work` at least `n`, and they differ (out of
        // place); each thread copies its own share.
        unsafe { crate::copy::copy(Block, a.work, a.input, n * 4) };
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
        exchange_step(a)?;
        let recv = chunk(step_chunk(s, 1), nr, n);
        let len = recv.end - recv.start;
        for i in Block.split(len) {
            let e = (recv.start + i) as usize;
            // SAFETY: `e < n`; element `e` of the output and of the scratch half are ours,
            // and each thread touches only its share.
            unsafe { *out.add(e) += *out.add(n as usize + e) };
        }
        arch::sync_threads();
    }
    for s in 0..nr - 1 {
        let send = chunk((r + 1 + nr - s) % nr, nr, n);
        let bytes = (send.end - send.start) * 4;
        a.next.put(Block, send.start * 4, send.start * 4, bytes)?;
        exchange_step(a)?;
    }
    Ok(())
}
