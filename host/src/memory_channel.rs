//! Memory channels on the host: a device-to-device semaphore and the three buffers of
//! [`oxccl_device::memory_channel`]. [`MemoryChannel::device_handle`] is what kernels get.
//!
//! Built by [`Communicator::memory_channel`](crate::Communicator::memory_channel).

use crate::semaphore::Device2DeviceSemaphore;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::MemoryRegion;

/// A load/store channel to one peer.
#[derive(Debug)]
pub struct MemoryChannel {
    pub(crate) semaphore: Device2DeviceSemaphore,
    pub(crate) remote: MemoryRegion,
    pub(crate) local: MemoryRegion,
    pub(crate) packets: Option<MemoryRegion>,
    pub(crate) wait: WaitPolicy,
}

impl MemoryChannel {
    /// The peer.
    pub fn peer(&self) -> u32 {
        self.semaphore.peer()
    }

    /// The number the channel's failures are reported under.
    pub fn site(&self) -> u32 {
        self.wait.site
    }

    /// The kernel-side handle.
    pub fn device_handle(&self) -> MemoryChannelDeviceHandle {
        let (packets, packets_size) = self.packets.as_ref().map_or((0, 0), |p| (p.addr, p.size));
        MemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle(self.wait),
            remote: self.remote.addr,
            remote_size: self.remote.size,
            local: self.local.addr,
            local_size: self.local.size,
            packets,
            packets_size,
        }
    }
}
