//! Port channels: a kernel asks the host proxy to move data and raise the peer's semaphore.
//!
//! Each call pushes one [`ProxyTrigger`] into the FIFO (see [`crate::fifo`]); the proxy
//! executes triggers in order, checking each against the registered sizes and known ids
//! (a refused trigger writes nothing and stops the channel; the host reports it). Offsets
//! are bytes into the memories the host bound to the channel (`dst_memory_id` on the peer,
//! `src_memory_id` here), or into others registered for it that a put names through
//! [`PortChannelDeviceHandle::with_memories`] ([`DstMemoryId`], [`SrcMemoryId`]). One
//! trigger carries at most [`MAX_TRIGGER_BYTES`] of offset and size; `put` sends a copy
//! larger than that from offset 0 as two triggers, and refuses offsets a trigger cannot
//! carry.
//!
//! Ordering: triggers of one channel execute in push order, so a `signal` after a `put`
//! arrives after the data. A `put` returns when the request is queued, not done: reuse the
//! source only after `flush` (or after the peer's answer).

use crate::arch::in_place;
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

/// A memory of a port channel's peer that its puts may write instead of the destination it
/// was built with: the memory's id at this rank's proxy, from the host's
/// `Communicator::port_dst_memory`. Passed to a kernel like any argument (it is `Pod`).
///
/// With [`SrcMemoryId`] and [`PortChannelDeviceHandle::with_memories`] this is MSCCL++'s
/// `put(dst, dstOffset, src, srcOffset, size)` with memory ids: one channel (one semaphore,
/// one connection) moves data between any of the memories registered for it. An id is not
/// an address: the proxy checks each trigger's ids against its table (the destination must
/// be a memory of the channel's peer reached over the channel's transport, the source one
/// of this rank) and the range against the memory's size, so a wrong id is a reported
/// failure of the channel, never a write elsewhere.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DstMemoryId(u32);

/// A memory of this rank that a port channel's puts may read instead of the source it was
/// built with: the memory's id at this rank's proxy, from the host's
/// `Communicator::port_src_memory`. See [`DstMemoryId`].
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SrcMemoryId(u32);

impl DstMemoryId {
    /// The destination memory with id `id` at the proxy (checked there, see the type).
    pub const fn from_raw(id: u32) -> Self {
        DstMemoryId(id)
    }

    /// The id at the proxy.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl SrcMemoryId {
    /// The source memory with id `id` at the proxy (checked there, see [`DstMemoryId`]).
    pub const fn from_raw(id: u32) -> Self {
        SrcMemoryId(id)
    }

    /// The id at the proxy.
    pub const fn raw(self) -> u32 {
        self.0
    }
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

    /// This channel with its puts going from `src` (ours) into `dst` (the peer's) instead
    /// of the memories it was built with; signals, flushes and waits are the channel's own,
    /// and ordered with its other puts as usual. The handle is a copy: the original keeps
    /// its memories.
    ///
    /// ```ignore
    /// // MSCCL++: chan.put(dst_id, dst_off, src_id, src_off, bytes)
    /// chan.with_memories(dst, src).put_with_signal(dst_off, src_off, bytes)?;
    /// ```
    #[inline(always)]
    pub const fn with_memories(self, dst: DstMemoryId, src: SrcMemoryId) -> Self {
        PortChannelDeviceHandle {
            ids: PortChannelIds {
                dst_memory_id: dst.0,
                src_memory_id: src.0,
                ..self.ids
            },
            ..self
        }
    }

    /// This channel with its puts going from `src` (ours) into the peer's memory it was
    /// built with: [`Self::with_memories`] with the channel's own destination.
    #[inline(always)]
    pub const fn with_src_memory(self, src: SrcMemoryId) -> Self {
        PortChannelDeviceHandle {
            ids: PortChannelIds {
                src_memory_id: src.0,
                ..self.ids
            },
            ..self
        }
    }

    #[inline(always)]
    fn trigger(&self, kind: u64, dst_off: u64, src_off: u64, bytes: u64) -> ProxyTrigger {
        trigger_of(self.ids, kind, dst_off, src_off, bytes)
    }

    /// Pushes the data triggers of a copy of `bytes` from `src_off` to `dst_off`; the last
    /// gets `last_kind` bits added. Returns the last trigger's position.
    ///
    /// One trigger carries offsets and a size below 2^32, so a larger copy takes two: a
    /// first piece of [`MAX_TRIGGER_BYTES`], which must start at offset 0 for the second
    /// piece's offsets to fit, then the rest. Everything is checked before anything is
    /// pushed, and the common case (one trigger) pays one compare for the other.
    #[inline(always)]
    fn push_copy(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        last_kind: u64,
    ) -> Result<u64, DeviceError> {
        let fits = (dst_off | src_off | bytes) <= MAX_TRIGGER_BYTES;
        if !fits {
            return self.push_copy_in_two(dst_off, src_off, bytes, last_kind);
        }
        self.fifo
            .push(self.trigger(trigger_type::DATA | last_kind, dst_off, src_off, bytes))
    }

    /// [`Self::push_copy`] of a copy one trigger cannot carry.
    #[inline(always)]
    fn push_copy_in_two(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        last_kind: u64,
    ) -> Result<u64, DeviceError> {
        const MAX: u64 = MAX_TRIGGER_BYTES;
        if (dst_off | src_off) != 0 || bytes > 2 * MAX {
            return Err(self.fifo.wait_policy().raise(
                DeviceError::OutOfBounds,
                DeviceOp::PortPut,
                [dst_off, src_off, bytes],
            ));
        }
        self.fifo
            .push(self.trigger(trigger_type::DATA, 0, 0, MAX))?;
        // The second trigger's ids are read here, after the first push: otherwise LLVM
        // encodes them once for both triggers, and the encoded words hold registers through
        // the whole first push (its wait included) in every kernel that calls `put`.
        let ids = ids_in_place(self.ids);
        self.fifo.push(trigger_of(
            ids,
            trigger_type::DATA | last_kind,
            MAX,
            MAX,
            in_place(bytes) - MAX,
        ))
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

/// The trigger of a channel with `ids` asking for `kind` with these offsets and size.
#[inline(always)]
fn trigger_of(
    ids: PortChannelIds,
    kind: u64,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind,
        dst_memory_id: ids.dst_memory_id,
        dst_offset: dst_off,
        src_memory_id: ids.src_memory_id,
        src_offset: src_off,
        size: bytes,
        semaphore_id: ids.semaphore_id,
    })
}

/// `ids`, as read where this call stands (see [`in_place`]).
#[inline(always)]
fn ids_in_place(ids: PortChannelIds) -> PortChannelIds {
    let [a, b]: [u64; 2] = bytemuck::cast(ids);
    bytemuck::cast([in_place(a), in_place(b)])
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use crate::arch::atomic::{AtomicU64, Ordering};
    use crate::fifo::{FifoRawParts, TriggerSlot};
    use crate::wait::WaitPolicy;

    /// A FIFO of 8 slots in host memory, consumed by reading the slots directly.
    struct Ring {
        slots: [TriggerSlot; 8],
        counters: [AtomicU64; 3],
    }

    impl Ring {
        fn new() -> Self {
            Ring {
                slots: Default::default(),
                counters: Default::default(),
            }
        }

        fn channel(&self) -> PortChannelDeviceHandle<'_> {
            let raw = FifoRawParts {
                triggers: self.slots.as_ptr() as u64,
                head: self.counters[0].as_ptr() as u64,
                tail: self.counters[1].as_ptr() as u64,
                tail_cache: self.counters[2].as_ptr() as u64,
                doorbell: 0,
                size: 8,
                reserved: 0,
            };
            // SAFETY: the slots and counters live as long as `self`; 8 is a power of two.
            let fifo = unsafe {
                FifoDeviceHandle::from_raw_parts(raw, WaitPolicy::with_timeout_ns(1_000_000))
            };
            let ids = PortChannelIds {
                semaphore_id: 3,
                dst_memory_id: 1,
                src_memory_id: 2,
                reserved: 0,
            };
            PortChannelDeviceHandle::new(fifo, Default::default(), ids)
        }

        /// The triggers pushed so far, decoded.
        fn pushed(&self) -> std::vec::Vec<TriggerFields> {
            let head = self.counters[0].load(Ordering::Relaxed);
            (0..head)
                .map(|p| {
                    let w = &self.slots[p as usize % 8].words;
                    ProxyTrigger {
                        fst: w[0].load(Ordering::Relaxed),
                        snd: w[1].load(Ordering::Relaxed),
                    }
                    .decode()
                })
                .collect()
        }
    }

    fn data(kind: u64, dst_offset: u64, src_offset: u64, size: u64) -> TriggerFields {
        TriggerFields {
            kind,
            dst_memory_id: 1,
            dst_offset,
            src_memory_id: 2,
            src_offset,
            size,
            semaphore_id: 3,
        }
    }

    /// Guards against a put one trigger cannot carry being truncated, or its signal going
    /// out with the first piece instead of after the whole copy.
    #[test]
    fn a_copy_above_the_trigger_limit_takes_two_triggers() {
        const MAX: u64 = MAX_TRIGGER_BYTES;
        let ring = Ring::new();
        let chan = ring.channel();
        chan.put(8, 16, 100).unwrap();
        chan.put_with_signal(0, 0, MAX + 100).unwrap();
        assert_eq!(
            ring.pushed(),
            [
                data(trigger_type::DATA, 8, 16, 100),
                data(trigger_type::DATA, 0, 0, MAX),
                data(trigger_type::DATA | trigger_type::FLAG, MAX, MAX, 100),
            ]
        );
    }

    /// Guards against a put on a channel with other memories naming the channel's own
    /// memories, or losing its semaphore id.
    #[test]
    fn with_memories_names_them_in_every_put() {
        let ring = Ring::new();
        let chan = ring.channel();
        let other = chan.with_memories(DstMemoryId::from_raw(7), SrcMemoryId::from_raw(9));
        other.put(8, 16, 100).unwrap();
        other.put_with_signal(0, 0, 4).unwrap();
        chan.put(1, 2, 3).unwrap();
        let moved = |kind, dst_offset, src_offset, size| TriggerFields {
            dst_memory_id: 7,
            src_memory_id: 9,
            ..data(kind, dst_offset, src_offset, size)
        };
        assert_eq!(
            ring.pushed(),
            [
                moved(trigger_type::DATA, 8, 16, 100),
                moved(trigger_type::DATA | trigger_type::FLAG, 0, 0, 4),
                data(trigger_type::DATA, 1, 2, 3),
            ]
        );
    }

    /// Guards against a copy that cannot be carried pushing part of itself before it is
    /// refused: nothing may be pushed.
    #[test]
    fn a_copy_that_cannot_be_carried_pushes_nothing() {
        const MAX: u64 = MAX_TRIGGER_BYTES;
        let ring = Ring::new();
        let chan = ring.channel();
        for (dst, src, bytes) in [
            (1, 0, MAX + 1),
            (0, 1, MAX + 1),
            (0, 0, 2 * MAX + 1),
            (MAX + 1, 0, 8),
            (0, 0, u64::MAX),
        ] {
            assert_eq!(
                chan.put(dst, src, bytes),
                Err(DeviceError::OutOfBounds),
                "put({dst}, {src}, {bytes})"
            );
        }
        assert_eq!(ring.pushed(), []);
    }
}
