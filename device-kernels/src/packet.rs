//! LL ("low latency") packets: data and a flag that travel in the same store.
//!
//! A receiver polls a packet until its flag equals the flag of the current round, and then
//! the data beside it is valid: no separate signal, no fence. Flags change from round to
//! round (a counter), so a buffer is reused without clearing; flag 0 is refused because a
//! zeroed buffer would read as valid.
//!
//! | packet | bytes | layout | atomicity relied on |
//! |---|---|---|---|
//! | [`Ll8Packet`] | 8 | `data: u32, flag: u32` | one 64-bit store |
//! | [`Ll16Packet`] | 16 | `data1, flag1, data2, flag2: u32` | each 64-bit half (one 128-bit store on the GPU) |
//!
//! Writers store with relaxed order at system scope; readers load relaxed and check every
//! flag of the packet. The payload is half the packet, so a packet buffer needs twice the
//! bytes it carries.

use crate::arch::{Awaited, Scope, atomic, atomic::AtomicU64};
use crate::error::{DeviceError, DeviceOp};
use crate::wait::{Deadline, WaitPolicy};

/// An 8-byte packet: 4 bytes of data and a 4-byte flag, written with one 64-bit store.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Ll8Packet {
    /// The data.
    pub data: u32,
    /// The round's flag.
    pub flag: u32,
}

/// A 16-byte packet: two 4-byte data words, each with its own flag in the same 64-bit half.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Ll16Packet {
    /// First data word.
    pub data1: u32,
    /// Flag of the first half.
    pub flag1: u32,
    /// Second data word.
    pub data2: u32,
    /// Flag of the second half.
    pub flag2: u32,
}

const _: () = assert!(core::mem::size_of::<Ll8Packet>() == 8);
const _: () = assert!(core::mem::size_of::<Ll16Packet>() == 16);
const _: () = assert!(core::mem::offset_of!(Ll8Packet, flag) == 4);
const _: () = assert!(core::mem::offset_of!(Ll16Packet, flag1) == 4);
const _: () = assert!(core::mem::offset_of!(Ll16Packet, data2) == 8);
const _: () = assert!(core::mem::offset_of!(Ll16Packet, flag2) == 12);

/// A packet format: how a payload and a flag are stored and read back.
pub trait Packet: Copy + bytemuck::Pod {
    /// The data one packet carries: a word the arch layer loads and stores in one access.
    type Payload: Copy + bytemuck::Pod + crate::arch::GlobalWord;
    /// Bytes of `Payload` (half the packet).
    const PAYLOAD_BYTES: u64 = core::mem::size_of::<Self::Payload>() as u64;
    /// Bytes of the packet.
    const PACKET_BYTES: u64 = core::mem::size_of::<Self>() as u64;

    /// Stores `payload` with `flag` into the packet at `addr`.
    ///
    /// # Safety
    /// `addr` must be a live packet slot, aligned for `Self`, that only packet stores and
    /// loads touch while in use.
    unsafe fn store(addr: u64, payload: Self::Payload, flag: u32);

    /// The payload of the packet at `addr` if its flags all equal `flag`.
    ///
    /// # Safety
    /// As [`Self::store`].
    unsafe fn try_load(addr: u64, flag: u32) -> Option<Self::Payload>;

    /// The flag of the packet at `addr` as it is now (of its first half, for a packet with
    /// several): what a timed-out wait reports having seen.
    ///
    /// # Safety
    /// As [`Self::store`].
    unsafe fn seen_flag(addr: u64) -> u32;

    /// Waits (under `policy`, against `deadline`: see [`WaitPolicy::wait_until_within`])
    /// until the packet at `addr` carries `flag`, then returns its payload. `offset` (the
    /// packet's byte offset in its buffer) and `op` go into the abort record if the wait
    /// times out, with the flag waited for and the flag seen.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] past the wait limit.
    ///
    /// # Safety
    /// As [`Self::store`].
    #[inline(always)]
    unsafe fn load(
        addr: u64,
        flag: u32,
        policy: &WaitPolicy<'_>,
        deadline: &mut Deadline,
        op: DeviceOp,
        offset: u64,
    ) -> Result<Self::Payload, DeviceError> {
        let mut out = None;
        policy.wait_on_memory_within(
            deadline,
            op,
            // The flag of the first half: the second, if any, is polled once resumed.
            Awaited::Flag { addr, flag },
            || {
                // SAFETY: forwarded contract.
                out = unsafe { Self::try_load(addr, flag) };
                out.is_some()
            },
            // SAFETY: forwarded contract.
            || [offset, flag as u64, unsafe { Self::seen_flag(addr) } as u64],
        )?;
        out.ok_or(DeviceError::Aborted)
    }
}

#[inline(always)]
const fn half(data: u32, flag: u32) -> u64 {
    data as u64 | (flag as u64) << 32
}

impl Packet for Ll8Packet {
    type Payload = u32;

    #[inline(always)]
    unsafe fn store(addr: u64, payload: u32, flag: u32) {
        // SAFETY: forwarded contract; an 8-aligned packet is one AtomicU64 cell.
        let cell: &AtomicU64 = unsafe { atomic::cell(addr) };
        // Relaxed: the flag in the same store is what the reader checks.
        atomic::store(
            cell,
            half(payload, flag),
            atomic::Ordering::Relaxed,
            Scope::System,
        );
    }

    #[inline(always)]
    unsafe fn try_load(addr: u64, flag: u32) -> Option<u32> {
        // SAFETY: as in `store`.
        let cell: &AtomicU64 = unsafe { atomic::cell(addr) };
        let v = atomic::load(cell, atomic::Ordering::Relaxed, Scope::System);
        ((v >> 32) as u32 == flag).then_some(v as u32)
    }

    #[inline(always)]
    unsafe fn seen_flag(addr: u64) -> u32 {
        // SAFETY: as in `store`.
        let cell: &AtomicU64 = unsafe { atomic::cell(addr) };
        (atomic::load(cell, atomic::Ordering::Relaxed, Scope::System) >> 32) as u32
    }
}

impl Packet for Ll16Packet {
    type Payload = u64;

    #[inline(always)]
    unsafe fn store(addr: u64, payload: u64, flag: u32) {
        // SAFETY: forwarded contract; a 16-aligned packet is a pair of AtomicU64 cells.
        let pair: &[AtomicU64; 2] = unsafe { &*(addr as usize as *const [AtomicU64; 2]) };
        atomic::store_pair_relaxed(
            pair,
            half(payload as u32, flag),
            half((payload >> 32) as u32, flag),
            Scope::System,
        );
    }

    #[inline(always)]
    unsafe fn try_load(addr: u64, flag: u32) -> Option<u64> {
        // SAFETY: as in `store`.
        let pair: &[AtomicU64; 2] = unsafe { &*(addr as usize as *const [AtomicU64; 2]) };
        let [lo, hi] = atomic::load_pair_relaxed(pair, Scope::System);
        ((lo >> 32) as u32 == flag && (hi >> 32) as u32 == flag)
            .then_some((lo & 0xffff_ffff) | (hi << 32))
    }

    #[inline(always)]
    unsafe fn seen_flag(addr: u64) -> u32 {
        // SAFETY: as in `store`; the first half is one AtomicU64 cell.
        let cell: &AtomicU64 = unsafe { atomic::cell(addr) };
        (atomic::load(cell, atomic::Ordering::Relaxed, Scope::System) >> 32) as u32
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a packet reading as valid under the wrong flag, or losing data bits.
    #[test]
    fn packets_round_trip_only_with_their_flag() {
        let mut ll8 = Ll8Packet::default();
        let a8 = &mut ll8 as *mut _ as u64;
        let mut ll16 = Ll16Packet::default();
        let a16 = &mut ll16 as *mut _ as u64;
        // SAFETY: both are live, aligned locals accessed only through these calls.
        unsafe {
            assert_eq!(Ll8Packet::try_load(a8, 1), None);
            Ll8Packet::store(a8, 0xdead_beef, 5);
            assert_eq!(Ll8Packet::try_load(a8, 5), Some(0xdead_beef));
            assert_eq!(Ll8Packet::try_load(a8, 4), None);
            Ll16Packet::store(a16, 0x0123_4567_89ab_cdef, 9);
            assert_eq!(Ll16Packet::try_load(a16, 9), Some(0x0123_4567_89ab_cdef));
            assert_eq!(Ll16Packet::try_load(a16, 8), None);
        }
        assert_eq!(
            ll16,
            Ll16Packet {
                data1: 0x89ab_cdef,
                flag1: 9,
                data2: 0x0123_4567,
                flag2: 9
            }
        );
    }
}
