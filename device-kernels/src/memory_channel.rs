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
//! writes nothing, raises the abort flag with [`DeviceError::OutOfBounds`] and returns it.
//! Data calls carry no ordering; publish them with [`MemoryChannelDeviceHandle::signal`],
//! receive them with [`MemoryChannelDeviceHandle::wait`]. LL packets need neither.

use crate::coop::Coop;
use crate::copy;
use crate::error::DeviceError;
use crate::packet::Packet;
use crate::semaphore::Device2DeviceSemaphoreDeviceHandle;

/// Kernel-side handle of a memory channel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MemoryChannelDeviceHandle {
    /// The semaphore pair with the peer.
    pub semaphore: Device2DeviceSemaphoreDeviceHandle,
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

const _: () = assert!(core::mem::size_of::<MemoryChannelDeviceHandle>() == 104);
const _: () = assert!(core::mem::offset_of!(MemoryChannelDeviceHandle, remote) == 56);
const _: () = assert!(core::mem::offset_of!(MemoryChannelDeviceHandle, packets_size) == 96);

/// Whether `off..off+bytes` lies inside a buffer of `size` bytes (no overflow).
#[inline(always)]
const fn in_bounds(off: u64, bytes: u64, size: u64) -> bool {
    off <= size && bytes <= size - off
}

impl MemoryChannelDeviceHandle {
    #[inline(always)]
    fn refuse(&self, error: DeviceError) -> DeviceError {
        self.semaphore.wait.raise(error)
    }

    /// Copies `bytes` between two of the channel's buffers, each given as (address, size,
    /// offset), after checking both ranges; split among `coop`.
    #[inline(always)]
    fn copy_checked(
        &self,
        coop: impl Coop,
        dst: (u64, u64, u64),
        src: (u64, u64, u64),
        bytes: u64,
    ) -> Result<(), DeviceError> {
        let ((dst_base, dst_size, dst_off), (src_base, src_size, src_off)) = (dst, src);
        if !in_bounds(dst_off, bytes, dst_size) || !in_bounds(src_off, bytes, src_size) {
            return Err(self.refuse(DeviceError::OutOfBounds));
        }
        // SAFETY: both ranges are inside buffers the host registered for this channel and
        // keeps alive (checked just above); the local and the remote buffer are distinct.
        unsafe { copy::copy(coop, dst_base + dst_off, src_base + src_off, bytes) };
        Ok(())
    }

    /// Checks a transfer of `bytes` of data as packets of type `P` with `flag`, between a
    /// packet range at `packets.0` of a `packets.1`-byte buffer and a data range at `data.0`
    /// of a `data.1`-byte buffer; returns the number of packets.
    #[inline(always)]
    fn packet_count<P: Packet>(
        &self,
        flag: u32,
        bytes: u64,
        packets: (u64, u64),
        data: (u64, u64),
    ) -> Result<u64, DeviceError> {
        let ((packet_off, packet_size), (data_off, data_size)) = (packets, data);
        if flag == 0
            || !bytes.is_multiple_of(P::PAYLOAD_BYTES)
            || !packet_off.is_multiple_of(P::PACKET_BYTES)
            || !data_off.is_multiple_of(P::PAYLOAD_BYTES)
        {
            return Err(self.refuse(DeviceError::InvalidArgument));
        }
        let count = bytes / P::PAYLOAD_BYTES;
        // Checked: a wrapped packet size would pass the bounds check.
        let fits = count
            .checked_mul(P::PACKET_BYTES)
            .is_some_and(|packet_bytes| in_bounds(packet_off, packet_bytes, packet_size));
        if !fits || !in_bounds(data_off, bytes, data_size) {
            return Err(self.refuse(DeviceError::OutOfBounds));
        }
        Ok(count)
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
            (self.remote, self.remote_size, dst_off),
            (self.local, self.local_size, src_off),
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
            (self.local, self.local_size, dst_off),
            (self.remote, self.remote_size, src_off),
            bytes,
        )
    }

    /// Writes `value` as element `index` (in units of `T`) of the peer's buffer.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] past the end of the peer's buffer.
    #[inline(always)]
    pub fn write<T: bytemuck::Pod>(&self, index: u64, value: T) -> Result<(), DeviceError> {
        let off = self.element_offset(index, core::mem::size_of::<T>() as u64, self.remote_size)?;
        // SAFETY: in bounds of the registered peer buffer; unaligned-safe write.
        unsafe { ((self.remote + off) as usize as *mut T).write_volatile(value) };
        Ok(())
    }

    /// Reads element `index` (in units of `T`) of the peer's buffer.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] past the end of the peer's buffer.
    #[inline(always)]
    pub fn read<T: bytemuck::Pod>(&self, index: u64) -> Result<T, DeviceError> {
        let off = self.element_offset(index, core::mem::size_of::<T>() as u64, self.remote_size)?;
        // SAFETY: in bounds of the registered peer buffer.
        Ok(unsafe { ((self.remote + off) as usize as *const T).read_volatile() })
    }

    /// Raises the peer's semaphore; this thread's earlier writes (and those of threads that
    /// synchronized with it first) are visible to the peer after its matching `wait`.
    #[inline(always)]
    pub fn signal(&self) {
        self.semaphore.signal()
    }

    /// Raises the peer's semaphore without ordering: delivers the count, not data.
    #[inline(always)]
    pub fn relaxed_signal(&self) {
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
    #[inline(always)]
    pub fn poll(&self) -> bool {
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
        let off = self.packet_offset::<P>(index, flag, self.remote_size)?;
        // SAFETY: a whole packet inside the registered peer buffer (checked), aligned for
        // `P` (registered buffers are page-aligned, `off` a multiple of the packet size).
        unsafe { P::store(self.remote + off, payload, flag) };
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
        let off = self.packet_offset::<P>(index, flag, self.packets_size)?;
        // SAFETY: as in `write_packet`, for our packet buffer.
        unsafe { P::load(self.packets + off, flag, &self.semaphore.wait) }
    }

    /// Byte offset of packet `index` of `P` in a buffer of `size` bytes, if the whole packet
    /// fits and `flag` is usable.
    #[inline(always)]
    fn packet_offset<P: Packet>(
        &self,
        index: u64,
        flag: u32,
        size: u64,
    ) -> Result<u64, DeviceError> {
        if flag == 0 {
            return Err(self.refuse(DeviceError::InvalidArgument));
        }
        self.element_offset(index, P::PACKET_BYTES, size)
    }

    /// Byte offset of element `index` of `elem` bytes in a buffer of `size` bytes, if the
    /// whole element fits (no overflow); else the call is refused as out of bounds.
    #[inline(always)]
    fn element_offset(&self, index: u64, elem: u64, size: u64) -> Result<u64, DeviceError> {
        index
            .checked_mul(elem)
            .filter(|&off| in_bounds(off, elem, size))
            .ok_or_else(|| self.refuse(DeviceError::OutOfBounds))
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
            flag,
            bytes,
            (dst_off, self.remote_size),
            (src_off, self.local_size),
        )?;
        let (dst, src) = (self.remote + dst_off, self.local + src_off);
        for i in coop.split(count) {
            // SAFETY: `i < count`: inside both checked ranges; offsets aligned as checked
            // (registered buffers are page-aligned).
            unsafe {
                let payload = ((src + i * P::PAYLOAD_BYTES) as usize as *const P::Payload).read();
                P::store(dst + i * P::PACKET_BYTES, payload, flag);
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
            flag,
            bytes,
            (src_off, self.packets_size),
            (dst_off, self.local_size),
        )?;
        let (dst, src) = (self.local + dst_off, self.packets + src_off);
        for i in coop.split(count) {
            // SAFETY: as in `put_packets`, for our packet and data buffers.
            unsafe {
                let payload = P::load(src + i * P::PACKET_BYTES, flag, &self.semaphore.wait)?;
                ((dst + i * P::PAYLOAD_BYTES) as usize as *mut P::Payload).write(payload);
            }
        }
        Ok(())
    }
}
