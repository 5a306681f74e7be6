//! Ring exchange with LL packets: each rank sends `bytes` of its buffer (at offset 0) to the
//! next rank's packet buffer, and unpacks what the previous rank sent into its own buffer at
//! offset `bytes`. The flag travels with the data; `flag` must be non-zero and differ from
//! the previous launch's on the same channels (a round counter).
//!
//! Launch again right away: each launch begins with the ring's ready handshake
//! ([`oxccl_device::handshake::ready_handshake`]), so a rank never overwrites packets `next` has not unpacked.

use oxccl_device::block::block_wait;
use oxccl_device::coop::Block;
use oxccl_device::error::DeviceError;
use oxccl_device::handshake::ready_handshake;
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::packet::{Ll8Packet, Ll16Packet, Packet};

fn exchange<P: Packet>(
    next: &MemoryChannelDeviceHandle<'_>,
    prev: &MemoryChannelDeviceHandle<'_>,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    block_wait(|| ready_handshake(|| prev.signal(), || next.wait()))?;
    next.put_packets::<P>(Block, 0, 0, bytes, flag)?;
    prev.unpack_packets::<P>(Block, bytes, 0, bytes, flag)
}

/// Ring exchange with 8-byte packets (4 bytes of data each).
#[kernel(max_blocks = 1)]
pub fn ll8_exchange(
    next: MemoryChannelDeviceHandle<'_>,
    prev: MemoryChannelDeviceHandle<'_>,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    exchange::<Ll8Packet>(&next, &prev, bytes, flag)
}

/// Ring exchange with 16-byte packets (8 bytes of data each).
#[kernel(max_blocks = 1)]
pub fn ll16_exchange(
    next: MemoryChannelDeviceHandle<'_>,
    prev: MemoryChannelDeviceHandle<'_>,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    exchange::<Ll16Packet>(&next, &prev, bytes, flag)
}
