//! Where a port collective's buffer is registered at the proxy, if it is: then the kernel
//! puts from the buffer itself instead of staging its data through the scratch first.
//!
//! The host sets it for a call whose input (or output) lies in a buffer the ranks
//! registered for the collectives (`Communicator::register_collective_buffer`), where every
//! port channel's transport has read a put's source once the proxy has executed it
//! (Ethernet, whose sender copies the bytes into the socket, or through its staging buffer,
//! before it goes on). A kernel that puts from a buffer waits for those puts to be executed
//! ([`FifoDeviceHandle::sync_before`](oxccl_device::fifo::FifoDeviceHandle::sync_before))
//! before it writes over what they read and before it returns: the caller may write the
//! buffer once the call has completed.

use oxccl_device::port_channel::SrcMemoryId;

/// A buffer's memory at the proxy and where in it the buffer starts; zeroed: the buffer is
/// not registered (the kernel stages what it sends of it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortSource {
    /// Byte offset of the buffer in the memory.
    pub offset: u64,
    /// The memory's id as a put's source ([`SrcMemoryId`]).
    pub memory_id: u32,
    /// 1 where the buffer is registered, 0 where it is not.
    pub registered: u32,
}

const _: () = assert!(core::mem::size_of::<PortSource>() == 16);

impl PortSource {
    /// The buffer at `offset` of the memory `memory_id` names.
    pub const fn new(memory_id: SrcMemoryId, offset: u64) -> Self {
        PortSource {
            offset,
            memory_id: memory_id.raw(),
            registered: 1,
        }
    }

    /// The memory, where the buffer is registered.
    pub const fn memory(&self) -> Option<SrcMemoryId> {
        match self.registered {
            0 => None,
            _ => Some(SrcMemoryId::from_raw(self.memory_id)),
        }
    }
}
