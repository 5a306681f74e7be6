//! Ring all-gather: each rank starts with its own chunk at `rank * chunk_bytes` of its
//! buffer and ends with every rank's chunk at the same place, after `n_ranks - 1` steps of
//! "forward what arrived last step to the next rank".

use crate::arch;
use crate::coop::Block;
use crate::error::DeviceError;
use crate::kernel;
use crate::memory_channel::MemoryChannelDeviceHandle;
use crate::port_channel::PortChannelDeviceHandle;

/// Offset of the chunk rank `rank` forwards at `step`: the one that started `step` ranks back.
#[inline(always)]
fn chunk_at_step(rank: u32, step: u32, n_ranks: u32, chunk_bytes: u64) -> u64 {
    ((rank + n_ranks - step % n_ranks) % n_ranks) as u64 * chunk_bytes
}

/// Ring all-gather over port channels: the proxy copies, thread 0 drives.
/// `next` writes into the next rank's buffer; `prev` is raised by the previous rank.
#[kernel]
pub fn port_ring_exchange(
    next: PortChannelDeviceHandle,
    prev: PortChannelDeviceHandle,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) {
    if arch::thread_rank_in_grid() == 0 {
        let _ = port_ring(&next, &prev, rank, n_ranks, chunk_bytes);
    }
}

fn port_ring(
    next: &PortChannelDeviceHandle,
    prev: &PortChannelDeviceHandle,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) -> Result<(), DeviceError> {
    for step in 0..n_ranks.saturating_sub(1) {
        let off = chunk_at_step(rank, step, n_ranks, chunk_bytes);
        next.put_with_signal(off, off, chunk_bytes)?;
        prev.wait()?;
    }
    // The last forwarded chunk must have left before the kernel ends and the host reuses
    // the buffer.
    next.flush()
}

/// Ring all-gather over memory channels: every thread of the block copies its share, then
/// thread 0 signals the next rank and waits for the previous one. Launch one block.
#[kernel]
pub fn memory_ring_exchange(
    next: MemoryChannelDeviceHandle,
    prev: MemoryChannelDeviceHandle,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) {
    for step in 0..n_ranks.saturating_sub(1) {
        let off = chunk_at_step(rank, step, n_ranks, chunk_bytes);
        if next.put(Block, off, off, chunk_bytes).is_err() {
            return;
        }
        arch::sync_threads();
        let mut failed = false;
        if arch::thread_rank_in_block() == 0 {
            next.signal();
            failed = prev.wait().is_err();
        }
        // One decision for the whole block: a thread that stopped alone would leave the
        // others waiting at the next barrier.
        if arch::sync_threads_or(failed) {
            return;
        }
    }
}
