//! Ping-pong between two ranks: round-trip latency of a channel. The initiator sends and
//! waits for the answer `iters` times; the other side waits and answers. With `bytes == 0`
//! only signals travel. Thread 0 of the grid runs it (any launch shape).

use oxccl_device::arch;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::port_channel::PortChannelDeviceHandle;

/// Ping-pong over a port channel.
#[kernel]
pub fn port_pingpong(
    chan: PortChannelDeviceHandle<'_>,
    iters: u32,
    initiator: u32,
    bytes: u64,
) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() != 0 {
        return Ok(());
    }
    let send = || {
        if bytes == 0 {
            chan.signal()
        } else {
            chan.put_with_signal(0, 0, bytes)
        }
    };
    for _ in 0..iters {
        if initiator != 0 {
            send()?;
            chan.wait()?;
        } else {
            chan.wait()?;
            send()?;
        }
    }
    chan.flush()
}

/// Ping-pong over a memory channel (`bytes` are stored with `write` before each signal).
#[kernel]
pub fn memory_pingpong(
    chan: MemoryChannelDeviceHandle<'_>,
    iters: u32,
    initiator: u32,
    bytes: u64,
) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() != 0 {
        return Ok(());
    }
    let send = |round: u32| -> Result<(), DeviceError> {
        for i in 0..bytes / 8 {
            chan.write::<u64>(i, round as u64)?;
        }
        chan.signal()
    };
    for round in 0..iters {
        if initiator != 0 {
            send(round)?;
            chan.wait()?;
        } else {
            chan.wait()?;
            send(round)?;
        }
    }
    Ok(())
}
