//! One-way bandwidth of a port channel between two ranks: the sender puts `bytes` from the
//! start of its buffer to the start of the peer's, `iters` times, each put with a signal,
//! then flushes and waits for the receiver's acknowledgement; the receiver waits for every
//! signal, then acknowledges. The sender's kernel therefore ends only once every byte has
//! landed in the receiver's memory. Thread 0 of the grid runs it (any launch shape).
//!
//! Launch again right away on the same channel: each launch begins with a ready handshake,
//! so a sender never writes into a buffer the receiver's previous launch still waits on.

use oxccl_device::arch;
use oxccl_device::error::DeviceError;
use oxccl_device::handshake::ready_handshake;
use oxccl_device::kernel;
use oxccl_device::port_channel::PortChannelDeviceHandle;

/// Puts `bytes` `iters` times over `chan` (`sender != 0`), or receives them (`sender == 0`).
#[kernel]
pub fn port_put_bandwidth(
    chan: PortChannelDeviceHandle<'_>,
    iters: u32,
    sender: u32,
    bytes: u64,
) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() != 0 {
        return Ok(());
    }
    ready_handshake(|| chan.signal(), || chan.wait())?;
    if sender != 0 {
        for _ in 0..iters {
            chan.put_with_signal(0, 0, bytes)?;
        }
        // Every put must have left before the acknowledgement can count it.
        chan.flush()?;
        chan.wait()
    } else {
        for _ in 0..iters {
            chan.wait()?;
        }
        chan.signal()?;
        // The acknowledgement must have left before the kernel ends.
        chan.flush()
    }
}
