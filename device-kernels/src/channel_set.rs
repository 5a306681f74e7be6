//! Channel sets: a kernel's channels to every peer, as one parameter whose handles stay in
//! device memory.
//!
//! A kernel that talks to every peer could take an array of handles by value, but a handle
//! is 104 (memory channel) or 152 (port channel) bytes, and an array of them indexed at run
//! time lands in each thread's local memory (hundreds of bytes per thread in PTX). A
//! [`ChannelSetDeviceHandle`] is 16 bytes: the device address of an array of handles, which
//! the host wrote once (`oxccl::ChannelSet`), indexed by peer rank, and its length.
//! [`ChannelSetDeviceHandle::get`] checks the peer and returns a reference into that array;
//! the handle's methods then load the few words each call needs.
//!
//! | memory | written by | read by |
//! |---|---|---|
//! | the handle array | the host, before any launch that gets the set; never again while the set lives | kernels: plain loads |
//!
//! Slot `p` holds the channel to peer `p`, or a zeroed handle where the set has none (this
//! rank's own slot, say); `get` refuses both a peer past the end and an empty slot with
//! [`DeviceError::OutOfRange`].

use crate::arch;
use crate::error::{DeviceError, DeviceOp};
use crate::memory_channel::MemoryChannelDeviceHandle;
use crate::port_channel::PortChannelDeviceHandle;
use core::marker::PhantomData;

/// A device handle a channel set can hold: one of the channel handles. Sealed.
pub trait ChannelSetMember: Copy + Send + Sync + sealed::Sealed {
    /// Whether this is a handle the host built, not a zeroed slot.
    fn is_set(&self) -> bool;
}

mod sealed {
    /// Only the channel handles: the set's slots are zeroed or written by the host.
    pub trait Sealed {}
    impl Sealed for crate::memory_channel::MemoryChannelDeviceHandle<'_> {}
    impl Sealed for crate::port_channel::PortChannelDeviceHandle<'_> {}
}

impl ChannelSetMember for MemoryChannelDeviceHandle<'_> {
    #[inline(always)]
    fn is_set(&self) -> bool {
        // A built channel always has its semaphore; a zeroed slot has nothing.
        self.semaphore().raw_parts().inbound != 0
    }
}

impl ChannelSetMember for PortChannelDeviceHandle<'_> {
    #[inline(always)]
    fn is_set(&self) -> bool {
        // A built channel always has its FIFO (a non-zero, power-of-two size).
        self.fifo().raw_parts().size != 0
    }
}

/// Channels to peers, by peer rank, in device memory. Valid for `'a`, the borrow of the host
/// set that made it (which holds the memory and borrows the channels); the zeroed set
/// (`Default`) is empty.
#[repr(C)]
pub struct ChannelSetDeviceHandle<'a, H> {
    /// Address of `len` handles (slot `p`: the channel to peer `p`, or zeroed); 0 if empty.
    handles: u64,
    /// Slots in the array: one past the highest peer.
    len: u32,
    reserved: u32,
    _handles: PhantomData<&'a [H]>,
}

/// A set of memory channels ([`MemoryChannelDeviceHandle`]).
pub type MemoryChannelSetDeviceHandle<'a> =
    ChannelSetDeviceHandle<'a, MemoryChannelDeviceHandle<'a>>;

/// A set of port channels ([`PortChannelDeviceHandle`]).
pub type PortChannelSetDeviceHandle<'a> = ChannelSetDeviceHandle<'a, PortChannelDeviceHandle<'a>>;

const _: () = assert!(core::mem::size_of::<MemoryChannelSetDeviceHandle<'static>>() == 16);
const _: () = assert!(core::mem::offset_of!(MemoryChannelSetDeviceHandle<'static>, len) == 8);

// SAFETY: values safe code can hold are built by `from_raw_parts` (the array and every
// handle in it live for 'a, each slot a host-built handle or zeroed, which its own methods
// refuse) or zeroed (empty: `get` refuses every peer before memory is touched); no drop glue.
unsafe impl<H: ChannelSetMember> crate::launch::KernelArg for ChannelSetDeviceHandle<'_, H> {}

// Manual impls: derives would bound `H` although only an address is held.
impl<H> Clone for ChannelSetDeviceHandle<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<H> Copy for ChannelSetDeviceHandle<'_, H> {}
impl<H> Default for ChannelSetDeviceHandle<'_, H> {
    /// The empty set.
    fn default() -> Self {
        ChannelSetDeviceHandle {
            handles: 0,
            len: 0,
            reserved: 0,
            _handles: PhantomData,
        }
    }
}
impl<H> core::fmt::Debug for ChannelSetDeviceHandle<'_, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "ChannelSetDeviceHandle({:#x}, len {})",
            self.handles, self.len
        )
    }
}

impl<'a, H: ChannelSetMember> ChannelSetDeviceHandle<'a, H> {
    /// A set over the `len` handles at `handles`.
    ///
    /// # Safety
    /// For `'a`, `handles` points to `len` values of `H` in device memory every thread of the
    /// kernels it is passed to can read, aligned for `H`, that nothing writes; each is a
    /// handle its own `from_raw_parts` (or constructor) made valid for `'a`, or zeroed. An
    /// address of 0 comes with a `len` of 0.
    pub const unsafe fn from_raw_parts(handles: u64, len: u32) -> Self {
        ChannelSetDeviceHandle {
            handles,
            len,
            reserved: 0,
            _handles: PhantomData,
        }
    }

    /// Slots of the set: one past the highest peer it holds a channel to.
    pub const fn len(&self) -> u32 {
        self.len
    }

    /// Whether the set has no slot.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the handle array (0 for the empty set).
    pub const fn addr(&self) -> u64 {
        self.handles
    }

    /// The channel to `peer`.
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`] if the set holds no channel to `peer` (past the end, or an
    /// empty slot such as this rank's own).
    #[inline(always)]
    pub fn get(&self, peer: u32) -> Result<&'a H, DeviceError> {
        if peer < self.len {
            // SAFETY: slot `peer` of the array the constructor's contract keeps live, aligned
            // and unwritten for 'a.
            let handle = unsafe { &*(self.handles as usize as *const H).add(peer as usize) };
            if handle.is_set() {
                return Ok(handle);
            }
        }
        arch::note_failure(
            DeviceError::OutOfRange,
            DeviceOp::ChannelSet,
            0,
            [peer as u64, self.len as u64, 0],
        );
        Err(DeviceError::OutOfRange)
    }

    /// Whether the set holds a channel to `peer`.
    #[inline(always)]
    pub fn contains(&self, peer: u32) -> bool {
        peer < self.len && {
            // SAFETY: as in `get`.
            let handle = unsafe { &*(self.handles as usize as *const H).add(peer as usize) };
            handle.is_set()
        }
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a peer past the end, or one the set has no channel to, reaching
    /// memory or a zeroed handle: both are refused.
    #[test]
    fn unknown_peers_are_refused() {
        let slots = [MemoryChannelDeviceHandle::default(); 3];
        // SAFETY: `slots` outlives the set and is not written meanwhile; zeroed handles.
        let set = unsafe {
            MemoryChannelSetDeviceHandle::from_raw_parts(slots.as_ptr() as usize as u64, 3)
        };
        for peer in [0, 2, 3, u32::MAX] {
            assert_eq!(set.get(peer).err(), Some(DeviceError::OutOfRange), "{peer}");
            assert!(!set.contains(peer));
        }
        let empty = PortChannelSetDeviceHandle::default();
        assert_eq!(empty.get(0).err(), Some(DeviceError::OutOfRange));
    }
}
