//! Where a port collective's input is registered at the proxy, if it is: then the kernel
//! puts from the input itself instead of staging it through the scratch first.
//!
//! The host sets it for a call whose input lies in a buffer the ranks registered for the
//! collectives (`Communicator::register_collective_buffer`), where every port channel's
//! transport has read a put's source once the proxy has executed it (Ethernet, whose
//! sender copies the bytes into the socket, or through its staging buffer, before it goes
//! on). A kernel that puts from the input then waits for its puts to be executed
//! ([`FifoDeviceHandle::sync_before`](oxccl_device::fifo::FifoDeviceHandle::sync_before))
//! before it writes over the input (in place) and before it returns: the caller may write
//! the input once the call has completed.

use oxccl_device::port_channel::SrcMemoryId;

/// The input's memory at the proxy and where in it the input starts; zeroed: the input is
/// not registered (the kernel stages it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortInputSource {
    /// Byte offset of the input in the memory.
    pub offset: u64,
    /// The memory's id as a put's source ([`SrcMemoryId`]).
    pub memory_id: u32,
    /// 1 where the input is registered, 0 where it is not.
    pub registered: u32,
}

const _: () = assert!(core::mem::size_of::<PortInputSource>() == 16);

impl PortInputSource {
    /// The input at `offset` of the memory `memory_id` names.
    pub const fn new(memory_id: SrcMemoryId, offset: u64) -> Self {
        PortInputSource {
            offset,
            memory_id: memory_id.raw(),
            registered: 1,
        }
    }

    /// The memory, where the input is registered.
    pub const fn memory(&self) -> Option<SrcMemoryId> {
        match self.registered {
            0 => None,
            _ => Some(SrcMemoryId::from_raw(self.memory_id)),
        }
    }
}
