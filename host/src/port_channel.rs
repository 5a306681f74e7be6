//! Port channels on the host: a semaphore, a registered channel at the proxy, and the ids
//! of the memories it moves data between. [`PortChannel::device_handle`] is what kernels get.
//!
//! Built by [`Communicator::port_channel`](crate::Communicator::port_channel); the proxy
//! that serves it belongs to the communicator and must outlive every kernel using it.

use crate::semaphore::Host2DeviceSemaphore;
use oxccl_device::fifo::FifoDeviceHandle;
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::{MemoryId, SemaphoreId};

/// A proxy-driven channel to one peer, between one local and one remote memory.
#[derive(Debug)]
pub struct PortChannel {
    pub(crate) semaphore: Host2DeviceSemaphore,
    pub(crate) id: SemaphoreId,
    pub(crate) dst: MemoryId,
    pub(crate) src: MemoryId,
    pub(crate) fifo: FifoDeviceHandle,
    pub(crate) wait: WaitPolicy,
}

impl PortChannel {
    /// The channel's id at the proxy.
    pub fn id(&self) -> u32 {
        self.id.0
    }

    /// The peer.
    pub fn peer(&self) -> u32 {
        self.semaphore.peer()
    }

    /// The kernel-side handle.
    pub fn device_handle(&self) -> PortChannelDeviceHandle {
        PortChannelDeviceHandle {
            fifo: self.fifo,
            semaphore: self.semaphore.device_handle(self.wait),
            semaphore_id: self.id.0,
            dst_memory_id: self.dst.0,
            src_memory_id: self.src.0,
            reserved: 0,
        }
    }
}
