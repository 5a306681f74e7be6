//! Ring exchange with LL packets: each rank sends `bytes` of its buffer (at offset 0) to the
//! next rank's packet buffer, and unpacks what the previous rank sent into its own buffer at
//! offset `bytes`. No semaphore: the flag travels with the data.

use crate::coop::Block;
use crate::error::DeviceError;
use crate::kernel;
use crate::memory_channel::MemoryChannelDeviceHandle;
use crate::packet::{Ll8Packet, Ll16Packet, Packet};

fn exchange<P: Packet>(
    next: &MemoryChannelDeviceHandle,
    prev: &MemoryChannelDeviceHandle,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    next.put_packets::<P>(Block, 0, 0, bytes, flag)?;
    prev.unpack_packets::<P>(Block, bytes, 0, bytes, flag)
}

/// Ring exchange with 8-byte packets (4 bytes of data each).
#[kernel]
pub fn ll8_exchange(
    next: MemoryChannelDeviceHandle,
    prev: MemoryChannelDeviceHandle,
    bytes: u64,
    flag: u32,
) {
    let _ = exchange::<Ll8Packet>(&next, &prev, bytes, flag);
}

/// Ring exchange with 16-byte packets (8 bytes of data each).
#[kernel]
pub fn ll16_exchange(
    next: MemoryChannelDeviceHandle,
    prev: MemoryChannelDeviceHandle,
    bytes: u64,
    flag: u32,
) {
    let _ = exchange::<Ll16Packet>(&next, &prev, bytes, flag);
}
