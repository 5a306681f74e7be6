//! Kernels that check a backend end to end: memory the device writes, read back by the host.

use oxccl_device::error::DeviceError;
use oxccl_device::fifo::{FifoDeviceHandle, ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::grid_barrier::GridBarrierDeviceHandle;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::port_channel::{DstMemoryId, PortChannelDeviceHandle, SrcMemoryId};
use oxccl_device::{DeviceViewMut, arch, kernel};

/// Does nothing: its launch is all there is to time (`launch_bench`).
#[kernel]
pub fn empty_kernel() {}

/// Sets `out[i] = first + i` (wrapping) for every element, the grid's threads striding over
/// the buffer.
///
/// # Errors
/// None in practice: every index written lies inside the view.
#[kernel]
pub fn fill_sequence(out: DeviceViewMut<'_, u32>, first: u32) -> Result<(), DeviceError> {
    let threads = arch::grid_dim().volume() * arch::block_dim().volume();
    let mut i = arch::thread_rank_in_grid();
    while i < out.len() {
        out.set(i, first.wrapping_add(i as u32))?;
        i += threads;
    }
    Ok(())
}

/// The stamp block `block` writes in round `round`: distinct for every (round, block) pair
/// of a check, never 0 (which fresh memory may hold).
#[inline(always)]
pub const fn barrier_stamp(round: u32, block: u32) -> u32 {
    (round << 16 | block) + 1
}

/// Checks the grid barrier on a grid of any size the device holds at once: `rounds` times,
/// thread 0 of each block writes [`barrier_stamp`] into `stamps[block]`, the grid
/// synchronizes, and thread 0 reads the stamp of the next block, adding 1 to
/// `wrong[block]` for each stamp that is not that round's; the grid synchronizes again
/// before the next round overwrites the stamps. After a launch, `wrong` is all zeros and
/// `stamps` holds the last round's stamps if the barrier orders every block's writes before
/// every block's reads.
///
/// # Errors
/// A barrier's wait that timed out (a block that never arrived) or was stopped; an index
/// outside `stamps` or `wrong` (each needs one element per block).
#[kernel(cooperative)]
pub fn grid_barrier_check(
    barrier: GridBarrierDeviceHandle<'_>,
    stamps: DeviceViewMut<'_, u32>,
    wrong: DeviceViewMut<'_, u32>,
    rounds: u32,
) -> Result<(), DeviceError> {
    let blocks = arch::blocks_per_grid();
    let block = arch::block_rank();
    let leader = arch::thread_rank_in_block() == 0;
    for round in 0..rounds {
        if leader {
            stamps.set(u64::from(block), barrier_stamp(round, block))?;
        }
        barrier.sync_grid()?;
        if leader {
            let next = (block + 1) % blocks;
            if stamps.get(u64::from(next))? != barrier_stamp(round, next) {
                let seen = wrong.get(u64::from(block))?;
                wrong.set(u64::from(block), seen + 1)?;
            }
        }
        barrier.sync_grid()?;
    }
    Ok(())
}

/// Pushes `triggers` signal triggers of channel 0 from every thread of the grid through
/// `fifo`, recording the position each got in `positions[thread * triggers + i]`, then
/// waits until the proxy has executed the thread's last one. After a launch, `positions`
/// holds every position from 0 to the total, once each, and the proxy has executed them
/// all, if pushes never lose or share a slot and the proxy's tail reaches the device.
///
/// # Errors
/// A push or the final wait that timed out or was stopped; `positions` too short.
#[kernel]
pub fn fifo_push_check(
    fifo: FifoDeviceHandle<'_>,
    triggers: u32,
    positions: DeviceViewMut<'_, u64>,
) -> Result<(), DeviceError> {
    let thread = arch::thread_rank_in_grid();
    let trigger = ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::FLAG,
        dst_memory_id: 0,
        dst_offset: thread,
        src_memory_id: 0,
        src_offset: 0,
        size: 0,
        semaphore_id: 0,
    });
    let mut last = None;
    for i in 0..triggers as u64 {
        let position = fifo.push(trigger)?;
        positions.set(thread * triggers as u64 + i, position)?;
        last = Some(position);
    }
    if let Some(position) = last {
        fifo.sync(position)?;
    }
    Ok(())
}

/// Puts `bytes` from `src_off` to `dst_off` on a port channel, then flushes: what a bad
/// put (a range outside the registered memory, an unknown id) looks like to the proxy.
///
/// # Errors
/// The put or the flush failed (a refused trigger stops the channel: the flush reports it).
#[kernel]
pub fn put_then_flush(
    chan: PortChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.put(dst_off, src_off, bytes)?;
    chan.flush()
}

/// Puts `bytes` from `src` into `dst` (memories named through
/// [`PortChannelDeviceHandle::with_memories`]) with a signal, then `bytes - 16` from offset
/// 16 of the channel's own memories to the same offset with a signal, flushes, and waits
/// for the peer's two signals: one channel moving data between two pairs of memories.
///
/// # Errors
/// A put, the flush or a wait failed.
#[kernel]
pub fn put_between_memories(
    chan: PortChannelDeviceHandle<'_>,
    dst: DstMemoryId,
    src: SrcMemoryId,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.with_memories(dst, src).put_with_signal(0, 0, bytes)?;
    chan.put_with_signal(16, 16, bytes.saturating_sub(16))?;
    chan.flush()?;
    chan.wait()?;
    chan.wait()
}

/// Flushes a port channel once.
///
/// # Errors
/// The flush timed out, was stopped, or found the channel failed.
#[kernel]
pub fn flush_once(chan: PortChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.flush()
}

/// Waits once on a memory channel.
///
/// # Errors
/// The wait timed out or was stopped.
#[kernel]
pub fn wait_memory_channel_once(chan: MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.wait()
}

/// Waits once on a port channel.
///
/// # Errors
/// The wait timed out or was stopped.
#[kernel]
pub fn wait_port_channel_once(chan: PortChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.wait()
}

/// Signals once on a memory channel.
///
/// # Errors
/// The handle is zeroed (never set up), or the signal failed.
#[kernel]
pub fn signal_memory_channel_once(chan: MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.signal()
}
