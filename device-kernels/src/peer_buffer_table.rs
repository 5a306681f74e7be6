//! Buffers that every rank registered, as this rank reaches them: what lets a kernel read a
//! peer's own input or output in place, with no staging copy (zero-copy collectives).
//!
//! The host registers a buffer on every rank at once (a collective call): each rank gets the
//! same slot number for it and maps every peer's buffer of that slot. The table, in device
//! memory, holds for each slot and rank where that rank's buffer is mapped here and its
//! size, slot after slot (`n_ranks` entries each, two words an entry: address, bytes). An
//! entry of 0 bytes is an empty slot. A kernel names a peer's buffer by slot and an offset
//! inside it (which the peer publishes), never by an address, and every view it gets is
//! checked against the entry.

use crate::device_view::{DeviceView, DeviceViewMut, Element};
use crate::error::DeviceError;

/// The slot number that names no registered buffer.
pub const NO_SLOT: u32 = u32::MAX;

/// Words of one entry: the address of the buffer here, then its bytes.
pub const ENTRY_WORDS: u64 = 2;

/// Kernel-side handle of the table of registered buffers (see the module docs). A zeroed
/// one (`Default`) has no slot: every lookup fails with [`DeviceError::OutOfRange`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerBufferTableDeviceHandle<'a> {
    entries: DeviceView<'a, u64>,
    n_ranks: u64,
}

const _: () = assert!(core::mem::size_of::<PeerBufferTableDeviceHandle<'static>>() == 24);

// SAFETY: values safe code can hold are built by `new`, whose contract makes every non-empty
// entry live memory for 'a, or zeroed (no entries); no drop glue.
unsafe impl crate::launch::KernelArg for PeerBufferTableDeviceHandle<'_> {}

impl<'a> PeerBufferTableDeviceHandle<'a> {
    /// The table in `entries`, of `n_ranks` entries a slot.
    ///
    /// # Safety
    /// For `'a`, every entry of `entries` (words `2 * (slot * n_ranks + rank)` and the next)
    /// either has 0 bytes or gives the address and size of live device memory that every
    /// thread of the kernels it is passed to may read and write, aligned to 16 bytes, not
    /// freed or unmapped meanwhile; and `entries` is not written while those kernels run.
    pub const unsafe fn new(entries: DeviceView<'a, u64>, n_ranks: u32) -> Self {
        PeerBufferTableDeviceHandle {
            entries,
            n_ranks: n_ranks as u64,
        }
    }

    /// Slots of the table.
    pub const fn slots(&self) -> u64 {
        match (self.entries.len() / ENTRY_WORDS).checked_div(self.n_ranks) {
            Some(n) => n,
            None => 0,
        }
    }

    /// `(address, bytes)` of `rank`'s buffer in `slot`, or `OutOfRange` for a slot or rank
    /// outside the table or an empty slot.
    #[inline(always)]
    fn entry(&self, slot: u32, rank: u32) -> Result<(u64, u64), DeviceError> {
        let (slot, rank) = (slot as u64, rank as u64);
        if slot >= self.slots() || rank >= self.n_ranks {
            return Err(DeviceError::OutOfRange);
        }
        let at = (slot * self.n_ranks + rank) * ENTRY_WORDS;
        match (self.entries.get(at)?, self.entries.get(at + 1)?) {
            (_, 0) => Err(DeviceError::OutOfRange),
            entry => Ok(entry),
        }
    }

    /// Where `bytes` bytes at `addr` start inside `rank`'s buffer in `slot`: how a rank
    /// finds the offset of its own view in its own registered buffer, to publish it.
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`]: no such entry, or the range is not inside it.
    #[inline(always)]
    pub fn offset_of(
        &self,
        slot: u32,
        rank: u32,
        addr: u64,
        bytes: u64,
    ) -> Result<u64, DeviceError> {
        let (base, size) = self.entry(slot, rank)?;
        match addr.checked_sub(base) {
            Some(offset) if in_entry(offset, bytes, size) => Ok(offset),
            _ => Err(DeviceError::OutOfRange),
        }
    }

    /// The `len` elements of `T` at byte `offset` of `rank`'s buffer in `slot`, to read.
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`]: no such entry, a range outside it, or an offset not
    /// aligned for `T`.
    #[inline(always)]
    pub fn view<T: Element>(
        &self,
        slot: u32,
        rank: u32,
        offset: u64,
        len: u64,
    ) -> Result<DeviceView<'a, T>, DeviceError> {
        let addr = self.checked_addr::<T>(slot, rank, offset, len)?;
        // SAFETY: the range lies inside the entry (checked), which `new`'s contract keeps
        // live and readable for 'a; the entry is 16-byte aligned and `offset` aligned for `T`.
        Ok(unsafe { DeviceView::from_raw_parts(addr, len) })
    }

    /// As [`Self::view`], to write. Two ranks may write one buffer this way: which parts
    /// each writes is the kernel's protocol.
    ///
    /// # Errors
    /// As [`Self::view`].
    #[inline(always)]
    pub fn view_mut<T: Element>(
        &self,
        slot: u32,
        rank: u32,
        offset: u64,
        len: u64,
    ) -> Result<DeviceViewMut<'a, T>, DeviceError> {
        let addr = self.checked_addr::<T>(slot, rank, offset, len)?;
        // SAFETY: as in `view`; `new`'s contract makes the entry writable as well.
        Ok(unsafe { DeviceViewMut::from_raw_parts(addr, len) })
    }

    #[inline(always)]
    fn checked_addr<T: Element>(
        &self,
        slot: u32,
        rank: u32,
        offset: u64,
        len: u64,
    ) -> Result<u64, DeviceError> {
        let (base, size) = self.entry(slot, rank)?;
        match len.checked_mul(core::mem::size_of::<T>() as u64) {
            Some(bytes)
                if offset.is_multiple_of(core::mem::align_of::<T>() as u64)
                    && in_entry(offset, bytes, size) =>
            {
                Ok(base + offset)
            }
            _ => Err(DeviceError::OutOfRange),
        }
    }
}

/// Whether `bytes` bytes at `offset` lie inside `size` bytes.
#[inline(always)]
const fn in_entry(offset: u64, bytes: u64, size: u64) -> bool {
    match offset.checked_add(bytes) {
        Some(end) => end <= size,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Two ranks, two slots; slot 1 of rank 0 empty. Rank 1's slot-0 buffer is `data`.
    fn table<'a>(words: &'a [u64], _data: &'a [u64]) -> PeerBufferTableDeviceHandle<'a> {
        // SAFETY: every non-empty entry names `data`, which outlives the handle; nothing
        // writes `words` meanwhile.
        unsafe {
            PeerBufferTableDeviceHandle::new(
                DeviceView::from_raw_parts(words.as_ptr() as u64, words.len() as u64),
                2,
            )
        }
    }

    /// Guards against a lookup that reaches past an entry, into an empty slot, or outside
    /// the table.
    #[test]
    fn views_stay_inside_their_entry() {
        let data: Vec<u64> = (0..8).collect();
        let base = data.as_ptr() as u64;
        let words = [base, 64, base, 64, 0, 0, base, 32];
        let t = table(&words, &data);
        assert_eq!(t.slots(), 2);
        let v = t.view::<u64>(0, 1, 16, 6).unwrap();
        assert_eq!(v.get(0).unwrap(), 2);
        assert_eq!(v.get(5).unwrap(), 7);
        assert_eq!(
            t.view::<u64>(0, 1, 16, 7).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(
            t.view::<u64>(0, 1, 4, 1).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(
            t.view::<u64>(1, 0, 0, 1).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(t.view::<u64>(1, 1, 0, 4).unwrap().len(), 4);
        assert_eq!(
            t.view::<u64>(1, 1, 0, 5).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(
            t.view::<u64>(2, 0, 0, 1).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(
            t.view::<u64>(0, 2, 0, 1).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(
            t.view::<u8>(0, 1, u64::MAX, 2).err(),
            Some(DeviceError::OutOfRange)
        );
        assert_eq!(t.offset_of(0, 1, base + 8, 56), Ok(8));
        assert_eq!(
            t.offset_of(0, 1, base + 8, 57),
            Err(DeviceError::OutOfRange)
        );
        assert_eq!(t.offset_of(0, 1, base - 8, 8), Err(DeviceError::OutOfRange));
        let none = PeerBufferTableDeviceHandle::default();
        assert_eq!(none.slots(), 0);
        assert_eq!(
            none.view::<u8>(0, 0, 0, 0).err(),
            Some(DeviceError::OutOfRange)
        );
    }
}
