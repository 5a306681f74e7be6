//! Memory channels: a kernel loads and stores peer memory directly, and synchronizes with a
//! device-to-device semaphore.
//!
//! The handle describes three buffers, all mapped into this device's address space:
//!
//! | buffer | whose | written by | read by |
//! |---|---|---|---|
//! | `remote` | the peer's | this kernel (`put`, `write`, `put_packets`) | both |
//! | `local` | ours | our kernels, and `get` | this kernel (`put` source) |
//! | `packets` | ours | the peer (`put_packets` into its `remote`) | this kernel (`unpack_packets`) |
//!
//! Every call checks its offsets against the sizes in the handle: an out-of-bounds call
//! writes nothing, records [`DeviceError::OutOfBounds`] with the offset, size and registered
//! size in the channel's abort record, and returns it. Data calls carry no ordering: publish
//! them with [`MemoryChannelDeviceHandle::signal`], receive them with
//! [`MemoryChannelDeviceHandle::wait`]. LL packets need neither.
//!
//! Device memory is shared with other agents (the peer's kernels, the host): if a buggy
//! kernel lets two agents write the same bytes at once, the bytes read back are unspecified,
//! as on a GPU, but no access ever leaves the checked ranges.

use crate::arch::GlobalWord;
use crate::coop::Coop;
use crate::copy;
use crate::error::{DeviceError, DeviceOp};
use crate::packet::Packet;
use crate::semaphore::Device2DeviceSemaphoreDeviceHandle;
use crate::wait::Deadline;

/// Where a memory channel's buffers are and how large: the layout inside
/// [`MemoryChannelDeviceHandle`], without the promise that the addresses are live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MemoryChannelBuffers {
    /// Address of the peer's buffer, mapped here.
    pub remote: u64,
    /// Bytes of `remote`.
    pub remote_size: u64,
    /// Address of our buffer.
    pub local: u64,
    /// Bytes of `local`.
    pub local_size: u64,
    /// Address of our packet buffer (the peer's `remote` when it sends packets), or 0.
    pub packets: u64,
    /// Bytes of `packets`.
    pub packets_size: u64,
}

const _: () = assert!(core::mem::size_of::<MemoryChannelBuffers>() == 48);

/// Kernel-side handle of a memory channel. Valid for `'a`, the life of the host channel
/// that made it; a zeroed one (`Default`) refuses every call that would touch memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct MemoryChannelDeviceHandle<'a> {
    semaphore: Device2DeviceSemaphoreDeviceHandle<'a>,
    buffers: MemoryChannelBuffers,
}

const _: () = assert!(core::mem::size_of::<MemoryChannelDeviceHandle<'static>>() == 104);
const _: () = assert!(core::mem::offset_of!(MemoryChannelDeviceHandle<'static>, buffers) == 56);

/// Byte offsets of the handle's parts, for tools that read a kernel's machine code: `cargo xtask build-ptx --check` finds the
/// protocol's cells among a kernel's parameters through them.
impl MemoryChannelDeviceHandle<'_> {
    /// Byte offset of the semaphore's handle.
    pub const SEMAPHORE_OFFSET: usize = core::mem::offset_of!(Self, semaphore);
    /// Byte offset of the buffers' addresses and sizes ([`MemoryChannelBuffers`]).
    pub const BUFFERS_OFFSET: usize = core::mem::offset_of!(Self, buffers);
}

// SAFETY: values safe code can hold are built by `from_raw_parts` (buffers live for 'a) or
// zeroed, whose sizes of 0 make every bounds check fail before memory is touched; no drop
// glue.
unsafe impl crate::launch::KernelArg for MemoryChannelDeviceHandle<'_> {}

/// Whether `off..off+bytes` lies inside a buffer of `size` bytes (no overflow).
#[inline(always)]
const fn in_bounds(off: u64, bytes: u64, size: u64) -> bool {
    off <= size && bytes <= size - off
}

/// One side of a copy: a buffer's address and size, and the offset into it.
#[derive(Clone, Copy)]
struct Side {
    base: u64,
    size: u64,
    off: u64,
}

impl<'a> MemoryChannelDeviceHandle<'a> {
    /// A handle over `buffers`, synchronizing through `semaphore`.
    ///
    /// # Safety
    /// For `'a`, each buffer of `buffers` with a non-zero address is live device memory of
    /// at least its size that every thread using the handle can read and write, 16-byte
    /// aligned (page-aligned registered memory is); a buffer with address 0 has size 0.
    pub unsafe fn from_raw_parts(
        semaphore: Device2DeviceSemaphoreDeviceHandle<'a>,
        buffers: MemoryChannelBuffers,
    ) -> Self {
        MemoryChannelDeviceHandle { semaphore, buffers }
    }

    /// The buffers' addresses and sizes.
    pub const fn buffers(&self) -> MemoryChannelBuffers {
        self.buffers
    }

    /// The channel's semaphore.
    pub const fn semaphore(&self) -> Device2DeviceSemaphoreDeviceHandle<'a> {
        self.semaphore
    }

    /// Records `error` in `op` (as [`DeviceError::NullHandle`] for a zeroed handle).
    #[cold]
    fn refuse(&self, error: DeviceError, op: DeviceOp, detail: [u64; 3]) -> DeviceError {
        let b = &self.buffers;
        let error = if b.remote == 0 && b.local == 0 && b.packets == 0 {
            DeviceError::NullHandle
        } else {
            error
        };
        self.semaphore.wait_policy().raise(error, op, detail)
    }

    /// Copies `bytes` between two of the channel's buffers after checking both ranges;
    /// split among `coop`.
    #[inline(always)]
    fn copy_checked(
        &self,
        coop: impl Coop,
        op: DeviceOp,
        dst: Side,
        src: Side,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        for side in [dst, src] {
            if !in_bounds(side.off, bytes, side.size) {
                return Err(self.refuse(
                    DeviceError::OutOfBounds,
                    op,
                    [side.off, bytes, side.size],
                ));
            }
        }
        // SAFETY: both ranges are inside buffers the constructor's contract keeps live for
        // 'a (checked just above); `copy` tolerates overlapping ranges.
        unsafe { copy::copy(coop, dst.base + dst.off, src.base + src.off, bytes) };
        Ok(())
    }

    /// Checks a transfer of `bytes` of data as packets of type `P` with `flag`, between a
    /// packet range at `packets.off` and a data range at `data.off`; returns the number of
    /// packets.
    #[inline(always)]
    fn packet_count<P: Packet>(
        &self,
        op: DeviceOp,
        flag: u32,
        bytes: u64,
        packets: Side,
        data: Side,
    ) -> Result<u64, DeviceError> {
        if flag == 0
            || !bytes.is_multiple_of(P::PAYLOAD_BYTES)
            || !packets.off.is_multiple_of(P::PACKET_BYTES)
            || !data.off.is_multiple_of(P::PAYLOAD_BYTES)
        {
            return Err(self.refuse(
                DeviceError::InvalidArgument,
                op,
                [packets.off, bytes, flag as u64],
            ));
        }
        let count = bytes / P::PAYLOAD_BYTES;
        // Checked: a wrapped packet size would pass the bounds check.
        let packet_bytes = count.checked_mul(P::PACKET_BYTES);
        match packet_bytes {
            Some(pb) if in_bounds(packets.off, pb, packets.size) => {}
            _ => {
                return Err(self.refuse(
                    DeviceError::OutOfBounds,
                    op,
                    [packets.off, packet_bytes.unwrap_or(u64::MAX), packets.size],
                ));
            }
        }
        if !in_bounds(data.off, bytes, data.size) {
            return Err(self.refuse(DeviceError::OutOfBounds, op, [data.off, bytes, data.size]));
        }
        Ok(count)
    }

    fn remote(&self, off: u64) -> Side {
        Side {
            base: self.buffers.remote,
            size: self.buffers.remote_size,
            off,
        }
    }

    fn local(&self, off: u64) -> Side {
        Side {
            base: self.buffers.local,
            size: self.buffers.local_size,
            off,
        }
    }

    fn packet_side(&self, off: u64) -> Side {
        Side {
            base: self.buffers.packets,
            size: self.buffers.packets_size,
            off,
        }
    }

    /// Copies `bytes` from our buffer at `src_off` to the peer's buffer at `dst_off`, split
    /// among `coop` (every thread of it calls this with the same arguments).
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] if either range leaves its buffer (nothing is copied).
    #[inline(always)]
    pub fn put(
        &self,
        coop: impl Coop,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        self.copy_checked(
            coop,
            DeviceOp::MemoryPut,
            self.remote(dst_off),
            self.local(src_off),
            bytes,
        )
    }

    /// Copies `bytes` from the peer's buffer at `src_off` to our buffer at `dst_off`, split
    /// among `coop`.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] if either range leaves its buffer (nothing is copied).
    #[inline(always)]
    pub fn get(
        &self,
        coop: impl Coop,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        self.copy_checked(
            coop,
            DeviceOp::MemoryGet,
            self.local(dst_off),
            self.remote(src_off),
            bytes,
        )
    }

    /// Writes `value` as element `index` (in units of `T`) of the peer's buffer: a plain
    /// store, which the peer may read after the `wait` that matches our next `signal`.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] past the end of the peer's buffer;
    /// [`DeviceError::InvalidArgument`] for a zero-sized `T`.
    #[inline(always)]
    pub fn write<T: bytemuck::Pod>(&self, index: u64, value: T) -> Result<(), DeviceError> {
        let addr = self.element_addr::<T>(DeviceOp::MemoryWrite, index)?;
        // A plain store, like every data store of the channel (`put`'s too): the protocol
        // orders it for the peer through `signal`'s release and `wait`'s acquire, not
        // through the store itself. A volatile store would add nothing to that order; it
        // would only keep the compiler from merging neighbouring stores.
        // SAFETY: a whole `T` inside the registered peer buffer, aligned for `T` (both
        // checked by `element_addr`); `T: Pod` has no invalid bit patterns.
        unsafe { (addr as usize as *mut T).write(value) };
        Ok(())
    }

    /// Reads element `index` (in units of `T`) of the peer's buffer: a plain load, which
    /// sees what the peer wrote before the `signal` our last `wait` matched.
    ///
    /// # Errors
    /// As [`Self::write`].
    #[inline(always)]
    pub fn read<T: bytemuck::Pod>(&self, index: u64) -> Result<T, DeviceError> {
        let addr = self.element_addr::<T>(DeviceOp::MemoryRead, index)?;
        // A plain load, as in `write`: `wait`'s acquire orders it after the peer's stores.
        // A volatile load would add nothing to that order, and costs: the compiler may
        // neither merge nor reuse it, and on the GPU it is a system-scope load
        // (`ld.volatile`), which must go past the L1 cache.
        // SAFETY: as in `write`; any bits read are a valid `T: Pod`.
        Ok(unsafe { (addr as usize as *const T).read() })
    }

    /// `len` elements of `T` of the peer's buffer from byte `offset` on, as a view a kernel
    /// reads with plain loads (a reduction that reads peers' data in place, say). It sees
    /// what the peer wrote before the `signal` our last `wait` matched.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] if the range leaves the peer's buffer or `offset` is not
    /// aligned for `T`.
    #[inline(always)]
    pub fn remote_view<T: crate::device_view::Element>(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<crate::DeviceView<'a, T>, DeviceError> {
        let size = core::mem::size_of::<T>() as u64;
        match len.checked_mul(size) {
            Some(bytes)
                if offset.is_multiple_of(core::mem::align_of::<T>() as u64)
                    && in_bounds(offset, bytes, self.buffers.remote_size) =>
            {
                // SAFETY: the range lies inside the peer's registered buffer (checked), which
                // the handle's contract keeps mapped and readable for 'a; the buffer is
                // 16-byte aligned and `offset` aligned for `T`.
                Ok(unsafe { crate::DeviceView::from_raw_parts(self.buffers.remote + offset, len) })
            }
            _ => Err(self.refuse(
                DeviceError::OutOfBounds,
                DeviceOp::MemoryRead,
                [offset, len, self.buffers.remote_size],
            )),
        }
    }

    /// Address of element `index` of `T` in the peer's buffer, if the whole element fits
    /// and is aligned for `T`.
    #[inline(always)]
    fn element_addr<T>(&self, op: DeviceOp, index: u64) -> Result<u64, DeviceError> {
        let elem = core::mem::size_of::<T>() as u64;
        if elem == 0 {
            return Err(self.refuse(DeviceError::InvalidArgument, op, [index, 0, 0]));
        }
        let off = self.element_offset(op, index, elem, self.buffers.remote_size)?;
        // The buffer is 16-byte aligned (constructor contract) and `off` a multiple of the
        // element size, so only a `T` aligned beyond its size, or beyond 16, can fail this.
        let addr = self.buffers.remote + off;
        if !addr.is_multiple_of(core::mem::align_of::<T>() as u64) {
            return Err(self.refuse(
                DeviceError::InvalidArgument,
                op,
                [off, core::mem::align_of::<T>() as u64, 0],
            ));
        }
        Ok(addr)
    }

    /// Raises the peer's semaphore; this thread's earlier writes (and those of threads that
    /// synchronized with it first) are visible to the peer after its matching `wait`.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn signal(&self) -> Result<(), DeviceError> {
        self.semaphore.signal()
    }

    /// Raises the peer's semaphore without ordering: delivers the count, not data.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn relaxed_signal(&self) -> Result<(), DeviceError> {
        self.semaphore.relaxed_signal()
    }

    /// Waits for the peer's next signal; its data sent before it is visible afterwards.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] past the wait limit.
    #[inline(always)]
    pub fn wait(&self) -> Result<(), DeviceError> {
        self.semaphore.wait()
    }

    /// Consumes the peer's next signal if it has arrived; never blocks.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn poll(&self) -> Result<bool, DeviceError> {
        self.semaphore.poll()
    }

    /// Stores `payload` with `flag` as packet `index` (in units of `P`) of the peer's buffer:
    /// for kernels that compute what they send (a reduction) rather than copy it.
    ///
    /// # Errors
    /// [`DeviceError::InvalidArgument`] for flag 0; [`DeviceError::OutOfBounds`] past the
    /// end of the peer's buffer (nothing is written).
    #[inline(always)]
    pub fn write_packet<P: Packet>(
        &self,
        index: u64,
        payload: P::Payload,
        flag: u32,
    ) -> Result<(), DeviceError> {
        let off =
            self.packet_offset::<P>(DeviceOp::WritePacket, index, flag, self.buffers.remote_size)?;
        // SAFETY: a whole packet inside the registered peer buffer (checked), aligned for
        // `P` (the buffer is 16-byte aligned, `off` a multiple of the packet size).
        unsafe { P::store(self.buffers.remote + off, payload, flag) };
        Ok(())
    }

    /// Waits until packet `index` (in units of `P`) of our packet buffer carries `flag`, and
    /// returns its payload.
    ///
    /// # Errors
    /// As [`Self::write_packet`] for our packet buffer, and [`DeviceError::Timeout`] /
    /// [`DeviceError::Aborted`] if the packet does not arrive within the wait limit.
    #[inline(always)]
    pub fn read_packet<P: Packet>(&self, index: u64, flag: u32) -> Result<P::Payload, DeviceError> {
        let off =
            self.packet_offset::<P>(DeviceOp::ReadPacket, index, flag, self.buffers.packets_size)?;
        // SAFETY: as in `write_packet`, for our packet buffer.
        unsafe {
            P::load(
                self.buffers.packets + off,
                flag,
                &self.semaphore.wait_policy(),
                &mut Deadline::default(),
                DeviceOp::ReadPacket,
                off,
            )
        }
    }

    /// Byte offset of packet `index` of `P` in a buffer of `size` bytes, if the whole packet
    /// fits and `flag` is usable.
    #[inline(always)]
    fn packet_offset<P: Packet>(
        &self,
        op: DeviceOp,
        index: u64,
        flag: u32,
        size: u64,
    ) -> Result<u64, DeviceError> {
        if flag == 0 {
            return Err(self.refuse(DeviceError::InvalidArgument, op, [index, 0, 0]));
        }
        self.element_offset(op, index, P::PACKET_BYTES, size)
    }

    /// Byte offset of element `index` of `elem` bytes in a buffer of `size` bytes, if the
    /// whole element fits (no overflow); else the call is refused as out of bounds.
    #[inline(always)]
    fn element_offset(
        &self,
        op: DeviceOp,
        index: u64,
        elem: u64,
        size: u64,
    ) -> Result<u64, DeviceError> {
        match index.checked_mul(elem) {
            Some(off) if in_bounds(off, elem, size) => Ok(off),
            off => Err(self.refuse(
                DeviceError::OutOfBounds,
                op,
                [off.unwrap_or(u64::MAX), elem, size],
            )),
        }
    }

    /// Sends `bytes` of our buffer at `src_off` as packets of type `P` with `flag` into the
    /// peer's buffer at `dst_off` (which takes `2 * bytes`), split among `coop`.
    ///
    /// # Errors
    /// [`DeviceError::InvalidArgument`] for flag 0, a size that is not a whole number of
    /// payloads, or a misaligned offset; [`DeviceError::OutOfBounds`] outside a buffer.
    #[inline(always)]
    pub fn put_packets<P: Packet>(
        &self,
        coop: impl Coop,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        flag: u32,
    ) -> Result<(), DeviceError> {
        let count = self.packet_count::<P>(
            DeviceOp::PutPackets,
            flag,
            bytes,
            self.remote(dst_off),
            self.local(src_off),
        )?;
        let mut walk = PacketWalk::<P>::new(
            coop,
            count,
            self.buffers.remote + dst_off,
            self.buffers.local + src_off,
        );
        while let Some((packet, data)) = walk.next() {
            // SAFETY: one of the `count` packets and payloads, inside both checked ranges of
            // registered (global) memory; offsets aligned to packet and payload as checked
            // (the buffers are 16-byte aligned).
            unsafe {
                let payload = <P::Payload as GlobalWord>::load_global(data);
                P::store(packet, payload, flag);
            }
        }
        Ok(())
    }

    /// Waits for `bytes` of packets of type `P` with `flag` in our packet buffer at
    /// `src_off`, and writes their data into our buffer at `dst_off`, split among `coop`.
    ///
    /// # Errors
    /// As [`Self::put_packets`], and [`DeviceError::Timeout`] / [`DeviceError::Aborted`]
    /// if packets do not arrive within the wait limit.
    #[inline(always)]
    pub fn unpack_packets<P: Packet>(
        &self,
        coop: impl Coop,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        flag: u32,
    ) -> Result<(), DeviceError> {
        let count = self.packet_count::<P>(
            DeviceOp::UnpackPackets,
            flag,
            bytes,
            self.packet_side(src_off),
            self.local(dst_off),
        )?;
        let policy = self.semaphore.wait_policy();
        // One deadline for the whole call: a wait per packet with a limit each would let
        // a call of n packets wait n times the limit.
        let mut deadline = Deadline::default();
        let packets = self.buffers.packets;
        let mut walk =
            PacketWalk::<P>::new(coop, count, packets + src_off, self.buffers.local + dst_off);
        while let Some((packet, data)) = walk.next() {
            // SAFETY: as in `put_packets`, for our packet and data buffers.
            unsafe {
                let payload = P::load(
                    packet,
                    flag,
                    &policy,
                    &mut deadline,
                    DeviceOp::UnpackPackets,
                    packet - packets,
                )?;
                payload.store_global(data);
            }
        }
        Ok(())
    }
}

/// A thread's share of a packet transfer as addresses: the packet and the payload of each of
/// its elements, in the order of [`Coop::split`].
///
/// Addresses step by a stride rather than being recomputed from an index each time, so a
/// loop over them keeps three addresses and no index live (what nvcc makes of the same loop).
struct PacketWalk<P: Packet> {
    packet: u64,
    data: u64,
    packet_end: u64,
    packet_stride: u64,
    data_stride: u64,
    _packet: core::marker::PhantomData<P>,
}

impl<P: Packet> PacketWalk<P> {
    /// The calling thread's share of `count` packets from `packets` and payloads from `data`.
    #[inline(always)]
    fn new(coop: impl Coop, count: u64, packets: u64, data: u64) -> Self {
        let range = coop.split(count);
        let (first, end, stride) = range.bounds();
        PacketWalk {
            packet: packets + first * P::PACKET_BYTES,
            data: data + first * P::PAYLOAD_BYTES,
            packet_end: packets + end.max(first) * P::PACKET_BYTES,
            packet_stride: stride * P::PACKET_BYTES,
            data_stride: stride * P::PAYLOAD_BYTES,
            _packet: core::marker::PhantomData,
        }
    }

    /// The next packet's and payload's addresses.
    #[inline(always)]
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.packet >= self.packet_end {
            return None;
        }
        let item = (self.packet, self.data);
        self.packet += self.packet_stride;
        self.data += self.data_stride;
        Some(item)
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use crate::abort::AbortRecord;
    use crate::arch::atomic::{AtomicU64, Ordering};
    use crate::coop::Thread;
    use crate::packet::Ll8Packet;
    use crate::semaphore::SemaphoreRawParts;
    use crate::wait::WaitPolicy;
    use std::time::Duration;
    use std::vec::Vec;

    /// Packets in flight: how many, in `u64` cells (one `Ll8Packet` each).
    const N: usize = 4;

    /// A channel whose packet buffer is `packets` and whose local buffer is `local`, with
    /// waits of at most `timeout_ns` that record failures in `record`.
    fn channel<'a>(
        packets: &'a [AtomicU64; N],
        local: &'a mut [u32; N],
        record: &'a AbortRecord,
        stop: &'a AtomicU64,
        timeout_ns: u64,
    ) -> MemoryChannelDeviceHandle<'a> {
        // SAFETY: record and stop live for 'a and are only accessed atomically.
        let policy = unsafe { WaitPolicy::from_raw_parts(record, stop, timeout_ns, 5) };
        // SAFETY: no counters: the test neither signals nor waits on the semaphore.
        let semaphore = unsafe {
            Device2DeviceSemaphoreDeviceHandle::from_raw_parts(SemaphoreRawParts::default(), policy)
        };
        let buffers = MemoryChannelBuffers {
            remote: 0,
            remote_size: 0,
            local: local.as_mut_ptr() as usize as u64,
            local_size: (N * 4) as u64,
            packets: packets.as_ptr() as usize as u64,
            packets_size: (N * 8) as u64,
        };
        // SAFETY: both buffers live for 'a, are 8-byte aligned (16 is only needed for LL16
        // packets and 128-bit copies, which this channel does not make) and sized as said.
        unsafe { MemoryChannelDeviceHandle::from_raw_parts(semaphore, buffers) }
    }

    fn packet(data: u32, flag: u32) -> u64 {
        bytemuck::cast(Ll8Packet { data, flag })
    }

    /// Guards against an unpack that loses its place when a packet it polls arrives late
    /// (the poll loop and the packet loop are one loop), or that stops at a stale flag.
    #[test]
    fn unpack_waits_for_each_packet_in_turn() {
        let packets: [AtomicU64; N] = Default::default();
        for (i, p) in packets.iter().enumerate() {
            p.store(packet(100 + i as u32, 6), Ordering::Relaxed);
        }
        let mut local = [0u32; N];
        let (record, stop) = (AbortRecord::new(), AtomicU64::new(0));
        std::thread::scope(|s| {
            s.spawn(|| {
                for (i, p) in packets.iter().enumerate() {
                    std::thread::sleep(Duration::from_millis(2));
                    p.store(packet(i as u32 * 3, 7), Ordering::Relaxed);
                }
            });
            let chan = channel(&packets, &mut local, &record, &stop, 10_000_000_000);
            assert_eq!(
                chan.unpack_packets::<Ll8Packet>(Thread, 0, 0, 16, 7),
                Ok(())
            );
        });
        assert_eq!(local, [0, 3, 6, 9]);
        assert_eq!(record.read(), None);
    }

    /// Guards against a deadline per packet: packets that each arrive within the limit, but
    /// not all of them within it, must time the call out. Also that the record names the
    /// packet waited for, the flag and the flag seen, and that what arrived was unpacked.
    #[test]
    fn unpack_has_one_deadline_per_call() {
        const LIMIT: Duration = Duration::from_millis(100);
        let packets: [AtomicU64; N] = Default::default();
        let mut local = [0u32; N];
        let (record, stop) = (AbortRecord::new(), AtomicU64::new(0));
        packets[0].store(packet(11, 7), Ordering::Relaxed);
        let done = AtomicU64::new(0);
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                // One packet every 0.8 limits: each would meet a limit of its own.
                for (i, p) in packets.iter().enumerate().skip(1) {
                    for _ in 0..8 {
                        if done.load(Ordering::Relaxed) != 0 {
                            return;
                        }
                        std::thread::sleep(LIMIT / 10);
                    }
                    p.store(packet(i as u32, 7), Ordering::Relaxed);
                }
            });
            let chan = channel(
                &packets,
                &mut local,
                &record,
                &stop,
                LIMIT.as_nanos() as u64,
            );
            let result = chan.unpack_packets::<Ll8Packet>(Thread, 0, 0, 16, 7);
            done.store(1, Ordering::Relaxed);
            result
        });
        assert_eq!(result, Err(DeviceError::Timeout));
        let reason = record.read().expect("the timeout is recorded");
        assert_eq!(reason.op, DeviceOp::UnpackPackets);
        let [offset, flag, seen] = reason.detail.expect("with its details");
        assert!(
            (8..N as u64 * 8).contains(&offset),
            "a late packet: {offset}"
        );
        assert_eq!(flag, 7);
        assert_eq!(seen, 0, "the packet had not arrived");
        let arrived = (offset / 8) as usize;
        let expected: Vec<u32> = (0..N as u32)
            .map(|i| match i {
                0 => 11,
                i if (i as usize) < arrived => i,
                _ => 0,
            })
            .collect();
        assert_eq!(local.to_vec(), expected);
    }
}
