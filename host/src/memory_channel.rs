//! Memory channels on the host: a device-to-device semaphore and the three buffers of
//! [`oxccl_device::memory_channel`]. [`MemoryChannel::device_handle`] is what kernels get.
//!
//! Built by [`Communicator::memory_channel`](crate::Communicator::memory_channel). A
//! channel holds a share of every buffer its handles point to (our memory, and our mappings
//! of the peer's), so a handle borrowed from it is valid as long as the channel.

use crate::channel_abort::ChannelAbort;
use crate::error::ChannelRef;
use crate::semaphore::SemaphoreCells;
use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
use oxccl_device::semaphore::Device2DeviceSemaphoreDeviceHandle;
use oxccl_proxy::MemoryRegion;

/// A load/store channel to one peer.
#[derive(Debug)]
pub struct MemoryChannel {
    pub(crate) channel: ChannelRef,
    pub(crate) semaphore: SemaphoreCells,
    /// The peer's inbound counter, reachable here (a share of the mapping kept).
    pub(crate) remote_inbound: MemoryRegion,
    pub(crate) remote: MemoryRegion,
    pub(crate) local: MemoryRegion,
    pub(crate) packets: Option<MemoryRegion>,
    pub(crate) abort: ChannelAbort,
}

impl MemoryChannel {
    /// The peer.
    pub fn peer(&self) -> u32 {
        self.channel.peer
    }

    /// The channel as errors name it (kind, peer, index).
    pub fn channel(&self) -> ChannelRef {
        self.channel
    }

    /// The kernel-side handle, valid while the channel is borrowed.
    pub fn device_handle(&self) -> MemoryChannelDeviceHandle<'_> {
        let wait = self.abort.wait_policy();
        // SAFETY: our counters are the zeroed device memory `self.semaphore` owns; the peer's
        // inbound counter is mapped here and `remote_inbound` holds a share of the mapping;
        // all live for the borrow and are only accessed atomically (`expected` by our waiting
        // thread alone).
        let semaphore = unsafe {
            Device2DeviceSemaphoreDeviceHandle::from_raw_parts(
                self.semaphore.raw_parts(self.remote_inbound.addr),
                wait,
            )
        };
        let (packets, packets_size) = self.packets.as_ref().map_or((0, 0), |p| (p.addr, p.size));
        let buffers = MemoryChannelBuffers {
            remote: self.remote.addr,
            remote_size: self.remote.size,
            local: self.local.addr,
            local_size: self.local.size,
            packets,
            packets_size,
        };
        // SAFETY: each region holds a share of its memory (our allocation, or our mapping of
        // the peer's), which the communicator checked is at least the region's size, and
        // each starts 16-byte aligned (registrations are aligned in page-aligned objects).
        unsafe { MemoryChannelDeviceHandle::from_raw_parts(semaphore, buffers) }
    }
}
