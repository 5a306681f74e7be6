//! Port channels: a kernel asks the host proxy to move data and raise the peer's semaphore.
//!
//! Each call pushes one [`ProxyTrigger`] into the FIFO (see [`crate::fifo`]); the proxy
//! executes triggers in order, checking each against the registered sizes and known ids
//! (a refused trigger writes nothing and stops the channel; the host reports it). Offsets
//! are bytes into the memories the host bound to the channel (`dst_memory_id` on the peer,
//! `src_memory_id` here). One trigger carries at most [`MAX_TRIGGER_BYTES`] of offset and
//! size; `put` splits larger copies.
//!
//! Ordering: triggers of one channel execute in push order, so a `signal` after a `put`
//! arrives after the data. A `put` returns when the request is queued, not done: reuse the
//! source only after `flush` (or after the peer's answer).

use crate::error::{DeviceError, DeviceOp};
use crate::fifo::{FifoDeviceHandle, MAX_TRIGGER_BYTES, ProxyTrigger, TriggerFields, trigger_type};
use crate::semaphore::Host2DeviceSemaphoreDeviceHandle;

/// The ids a port channel's triggers carry: the layout inside [`PortChannelDeviceHandle`].
/// Ids are not addresses: the proxy checks every one against its tables, so any value is
/// safe to send.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortChannelIds {
    /// The channel's id at the proxy (its semaphore id).
    pub semaphore_id: u32,
    /// Id of the destination memory (the peer's) at the proxy.
    pub dst_memory_id: u32,
    /// Id of the source memory (ours) at the proxy.
    pub src_memory_id: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// Kernel-side handle of a port channel. Valid for `'a`, the life of the host channel that
/// made it; a zeroed one (`Default`) refuses every call with [`DeviceError::NullHandle`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct PortChannelDeviceHandle<'a> {
    fifo: FifoDeviceHandle<'a>,
    semaphore: Host2DeviceSemaphoreDeviceHandle<'a>,
    ids: PortChannelIds,
}

const _: () = assert!(core::mem::size_of::<PortChannelDeviceHandle<'static>>() == 152);
const _: () = assert!(core::mem::offset_of!(PortChannelDeviceHandle<'static>, semaphore) == 80);
const _: () = assert!(core::mem::offset_of!(PortChannelDeviceHandle<'static>, ids) == 136);

/// Byte offsets of the handle's parts, for tools that read a kernel's machine code: `cargo xtask build-ptx --check` finds the
/// protocol's cells among a kernel's parameters through them.
impl PortChannelDeviceHandle<'_> {
    /// Byte offset of the FIFO's handle.
    pub const FIFO_OFFSET: usize = core::mem::offset_of!(Self, fifo);
    /// Byte offset of the semaphore's handle.
    pub const SEMAPHORE_OFFSET: usize = core::mem::offset_of!(Self, semaphore);
}

// SAFETY: made of handles that are themselves `KernelArg` and of ids the proxy checks; no
// drop glue.
unsafe impl crate::launch::KernelArg for PortChannelDeviceHandle<'_> {}

impl<'a> PortChannelDeviceHandle<'a> {
    /// A port channel pushing to `fifo`, waiting on `semaphore`, naming `ids` in its triggers.
    pub const fn new(
        fifo: FifoDeviceHandle<'a>,
        semaphore: Host2DeviceSemaphoreDeviceHandle<'a>,
        ids: PortChannelIds,
    ) -> Self {
        PortChannelDeviceHandle {
            fifo,
            semaphore,
            ids,
        }
    }

    /// The FIFO the channel pushes to.
    pub const fn fifo(&self) -> FifoDeviceHandle<'a> {
        self.fifo
    }

    /// The semaphore the peer raises.
    pub const fn semaphore(&self) -> Host2DeviceSemaphoreDeviceHandle<'a> {
        self.semaphore
    }

    /// The ids its triggers carry.
    pub const fn ids(&self) -> PortChannelIds {
        self.ids
    }

    #[inline(always)]
    fn trigger(&self, kind: u64, dst_off: u64, src_off: u64, bytes: u64) -> ProxyTrigger {
        ProxyTrigger::encode(&TriggerFields {
            kind,
            dst_memory_id: self.ids.dst_memory_id,
            dst_offset: dst_off,
            src_memory_id: self.ids.src_memory_id,
            src_offset: src_off,
            size: bytes,
            semaphore_id: self.ids.semaphore_id,
        })
    }

    /// Pushes data triggers for `bytes` from `src_off` to `dst_off`, in pieces a trigger can
    /// carry; the last piece gets `last_kind` bits added. Returns the last position.
    #[inline(always)]
    fn push_copy(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        last_kind: u64,
    ) -> Result<u64, DeviceError> {
        let mut done = 0;
        loop {
            let piece = (bytes - done).min(MAX_TRIGGER_BYTES);
            let last = done + piece == bytes;
            // Checked: a wrapped offset would name a valid but wrong place.
            let (dst, src) = match (dst_off.checked_add(done), src_off.checked_add(done)) {
                (Some(dst), Some(src)) if dst <= MAX_TRIGGER_BYTES && src <= MAX_TRIGGER_BYTES => {
                    (dst, src)
                }
                _ => {
                    return Err(self.fifo.wait_policy().raise(
                        DeviceError::OutOfBounds,
                        DeviceOp::PortPut,
                        [dst_off, src_off, bytes],
                    ));
                }
            };
            let kind = trigger_type::DATA | if last { last_kind } else { 0 };
            let position = self.fifo.push(self.trigger(kind, dst, src, piece))?;
            if last {
                return Ok(position);
            }
            done += piece;
        }
    }

    /// Asks the proxy to copy `bytes` from our memory at `src_off` to the peer's at
    /// `dst_off`. Returns once queued. One thread calls it.
    ///
    /// # Errors
    /// [`DeviceError::OutOfBounds`] for an offset a trigger cannot carry; FIFO wait errors.
    #[inline(always)]
    pub fn put(&self, dst_off: u64, src_off: u64, bytes: u64) -> Result<(), DeviceError> {
        self.push_copy(dst_off, src_off, bytes, 0).map(drop)
    }

    /// Asks the proxy to raise the peer's semaphore after every earlier request of this
    /// channel has been carried out.
    ///
    /// # Errors
    /// FIFO wait errors.
    #[inline(always)]
    pub fn signal(&self) -> Result<(), DeviceError> {
        self.fifo
            .push(self.trigger(trigger_type::FLAG, 0, 0, 0))
            .map(drop)
    }

    /// [`Self::put`] then [`Self::signal`], in one trigger.
    ///
    /// # Errors
    /// As [`Self::put`].
    #[inline(always)]
    pub fn put_with_signal(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        self.push_copy(dst_off, src_off, bytes, trigger_type::FLAG)
            .map(drop)
    }

    /// [`Self::put_with_signal`], then waits until the proxy has carried it out and flushed
    /// the connection (the source may be reused when this returns).
    ///
    /// # Errors
    /// As [`Self::put`], and FIFO wait errors while waiting for the flush.
    #[inline(always)]
    pub fn put_with_signal_and_flush(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceError> {
        let position = self.push_copy(
            dst_off,
            src_off,
            bytes,
            trigger_type::FLAG | trigger_type::SYNC,
        )?;
        self.fifo.sync(position)
    }

    /// Waits until the proxy has carried out every earlier request of this channel and
    /// flushed the connection.
    ///
    /// # Errors
    /// FIFO wait errors; [`DeviceError::Aborted`] if the channel has failed (its triggers
    /// are skipped, so nothing was flushed).
    #[inline(always)]
    pub fn flush(&self) -> Result<(), DeviceError> {
        let position = self.fifo.push(self.trigger(trigger_type::SYNC, 0, 0, 0))?;
        self.fifo.sync(position)
    }

    /// Waits for the peer's next signal on this channel; its data sent before is visible.
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
}
