//! Ring all-gather: each rank starts with its own chunk at `rank * chunk_bytes` of its
//! buffer and ends with every rank's chunk at the same place, after `n_ranks - 1` steps of
//! "forward what arrived last step to the next rank".
//!
//! Launch again right away, on the same channels and buffer: each launch begins with the
//! ring's ready handshake ([`oxccl_device::handshake::ready_handshake`]), so a rank never writes into `next`'s
//! buffer before `next` has finished the previous launch (and whatever its stream ran
//! after it, such as a kernel that reads the result).

use oxccl_device::arch;
use oxccl_device::block::{block_signal_and_wait, block_wait};
use oxccl_device::coop::Block;
use oxccl_device::error::DeviceError;
use oxccl_device::handshake::ready_handshake;
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::port_channel::PortChannelDeviceHandle;

/// Offset of the chunk rank `rank` forwards at `step`: the one that started `step` ranks back.
#[inline(always)]
fn chunk_at_step(rank: u32, step: u32, n_ranks: u32, chunk_bytes: u64) -> u64 {
    ((rank + n_ranks - step % n_ranks) % n_ranks) as u64 * chunk_bytes
}

/// Ring all-gather over port channels: the proxy copies, thread 0 of the grid drives (any
/// launch shape). `next` writes into the next rank's buffer; `prev` is raised by the
/// previous rank.
#[kernel]
pub fn port_ring_exchange(
    next: PortChannelDeviceHandle<'_>,
    prev: PortChannelDeviceHandle<'_>,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() != 0 {
        return Ok(());
    }
    ready_handshake(|| prev.signal(), || next.wait())?;
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
/// thread 0 signals the next rank and waits for the previous one.
#[kernel(max_blocks = 1)]
pub fn memory_ring_exchange(
    next: MemoryChannelDeviceHandle<'_>,
    prev: MemoryChannelDeviceHandle<'_>,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) -> Result<(), DeviceError> {
    block_wait(|| ready_handshake(|| prev.signal(), || next.wait()))?;
    for step in 0..n_ranks.saturating_sub(1) {
        let off = chunk_at_step(rank, step, n_ranks, chunk_bytes);
        next.put(Block, off, off, chunk_bytes)?;
        // Every thread's share is written before thread 0 signals.
        block_signal_and_wait(|| next.signal(), || prev.wait())?;
    }
    Ok(())
}
