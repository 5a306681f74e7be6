//! Channel calls with bad arguments, called directly on the host: each must refuse, write
//! nothing, and raise the abort flag with its error.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use core::sync::atomic::AtomicU64;
use oxccl_device::DeviceError;
use oxccl_device::abort::{AbortReason, AbortRecord};
use oxccl_device::coop::Thread;
use oxccl_device::error::DeviceOp;
use oxccl_device::fifo::FifoDeviceHandle;
use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
use oxccl_device::packet::{Ll8Packet, Ll16Packet};
use oxccl_device::port_channel::{PortChannelDeviceHandle, PortChannelIds};
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts,
};
use oxccl_device::wait::WaitPolicy;

/// 16-byte aligned words, as registered memory is.
#[repr(C, align(16))]
struct Words([u64; 64]);

struct Buffers {
    remote: Box<Words>,
    local: Box<Words>,
    packets: Box<Words>,
    counters: [AtomicU64; 3],
    record: AbortRecord,
    stop: AtomicU64,
}

impl Buffers {
    fn new() -> Self {
        Buffers {
            remote: Box::new(Words([7; 64])),
            local: Box::new(Words([9; 64])),
            packets: Box::new(Words([0; 64])),
            counters: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            record: AbortRecord::new(),
            stop: AtomicU64::new(0),
        }
    }

    fn wait(&self) -> WaitPolicy<'_> {
        // SAFETY: the record and the stop word live as long as `self`.
        unsafe { WaitPolicy::from_raw_parts(&self.record, &self.stop, 1_000_000, 42) }
    }

    fn handle(&self) -> MemoryChannelDeviceHandle<'_> {
        let counter = |i: usize| self.counters[i].as_ptr() as u64;
        let raw = SemaphoreRawParts {
            inbound: counter(0),
            expected: counter(1),
            remote_inbound: counter(2),
        };
        let buffers = MemoryChannelBuffers {
            remote: self.remote.0.as_ptr() as u64,
            remote_size: 512,
            local: self.local.0.as_ptr() as u64,
            local_size: 512,
            packets: self.packets.0.as_ptr() as u64,
            packets_size: 512,
        };
        // SAFETY: counters and buffers live as long as `self`, 16-byte aligned, sized as said.
        unsafe {
            let semaphore = Device2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, self.wait());
            MemoryChannelDeviceHandle::from_raw_parts(semaphore, buffers)
        }
    }

    /// The recorded failure (error, op, details), then lowers the record and the stop word.
    fn take_abort(&self) -> Option<AbortReason> {
        let reason = self.record.read();
        self.record.clear();
        self.stop.store(0, core::sync::atomic::Ordering::Relaxed);
        reason
    }

    fn take_error(&self) -> Option<DeviceError> {
        self.take_abort().and_then(|r| r.error)
    }

    fn untouched(&self) -> bool {
        self.remote.0.iter().all(|&w| w == 7) && self.local.0.iter().all(|&w| w == 9)
    }
}

/// Guards against a memory channel copy that writes past either buffer, including through
/// an offset + size that overflows, and against a refusal that does not say which range
/// was asked for and what is registered.
#[test]
fn memory_channel_copies_stay_in_bounds() {
    let b = Buffers::new();
    let h = b.handle();
    for (dst, src, bytes) in [
        (505, 0, 8),
        (0, 505, 8),
        (0, 0, 513),
        (u64::MAX, 0, 2),
        (8, u64::MAX - 4, 8),
    ] {
        assert_eq!(
            h.put(Thread, dst, src, bytes),
            Err(DeviceError::OutOfBounds),
            "put {dst} {src} {bytes}"
        );
        let reason = b.take_abort().unwrap();
        assert_eq!(
            (reason.error, reason.op),
            (Some(DeviceError::OutOfBounds), DeviceOp::MemoryPut)
        );
        let [offset, size, registered] = reason.detail.unwrap();
        assert!(offset == dst || offset == src, "{offset}");
        assert_eq!((size, registered), (bytes, 512));
        assert_eq!(
            h.get(Thread, dst, src, bytes),
            Err(DeviceError::OutOfBounds),
            "get {dst} {src} {bytes}"
        );
        assert_eq!(b.take_error(), Some(DeviceError::OutOfBounds));
    }
    assert_eq!(h.write::<u64>(64, 1), Err(DeviceError::OutOfBounds));
    assert_eq!(
        b.take_abort().unwrap().detail,
        Some([512, 8, 512]),
        "offset, element size, registered size"
    );
    assert_eq!(
        h.write::<u64>(u64::MAX / 4, 1),
        Err(DeviceError::OutOfBounds)
    );
    assert_eq!(h.read::<u64>(64), Err(DeviceError::OutOfBounds));
    assert_eq!(b.take_error(), Some(DeviceError::OutOfBounds));
    assert!(b.untouched());
    // In bounds it works, at the very end.
    assert_eq!(h.put(Thread, 504, 0, 8), Ok(()));
    assert_eq!(b.remote.0[63], 9);
    assert_eq!(b.take_abort(), None);
}

/// Guards against `write`/`read` of a type more aligned than the offset allows (a volatile
/// access needs its alignment), and of a zero-sized type (nothing to check a range with).
#[test]
fn element_access_checks_alignment_and_size() {
    #[repr(C, align(32))]
    #[derive(Clone, Copy, Default)]
    struct Wide([u8; 32]);
    // SAFETY: `Wide` is plain bytes with no padding.
    unsafe impl bytemuck::Zeroable for Wide {}
    // SAFETY: as above.
    unsafe impl bytemuck::Pod for Wide {}
    let b = Buffers::new();
    let h = b.handle();
    // The buffer is 16-aligned, maybe 32-aligned: elements of a 32-byte, 32-aligned type
    // are then all aligned or all misaligned, and misaligned ones must be refused.
    let results = [h.read::<Wide>(0), h.read::<Wide>(1)];
    assert_eq!(
        results
            .iter()
            .filter(|r| matches!(r, Err(DeviceError::InvalidArgument)))
            .count(),
        if (b.remote.0.as_ptr() as usize).is_multiple_of(32) {
            0
        } else {
            2
        }
    );
    assert_eq!(h.write::<()>(0, ()), Err(DeviceError::InvalidArgument));
    assert!(b.untouched());
}

/// Guards against packet calls accepting flag 0 (a zeroed buffer reads as valid), sizes
/// that are not whole payloads, misaligned offsets, or a packet range whose size overflows.
#[test]
fn packet_calls_refuse_bad_arguments() {
    let b = Buffers::new();
    let h = b.handle();
    let invalid = [(0, 0, 8, 0), (0, 0, 6, 1), (4, 0, 8, 1), (0, 2, 8, 1)];
    for (dst, src, bytes, flag) in invalid {
        assert_eq!(
            h.put_packets::<Ll8Packet>(Thread, dst, src, bytes, flag),
            Err(DeviceError::InvalidArgument)
        );
        assert_eq!(
            h.unpack_packets::<Ll8Packet>(Thread, src, dst, bytes, flag),
            Err(DeviceError::InvalidArgument)
        );
    }
    // 16-byte packets need 16-aligned packet offsets and 8-byte payloads.
    assert_eq!(
        h.put_packets::<Ll16Packet>(Thread, 8, 0, 8, 1),
        Err(DeviceError::InvalidArgument)
    );
    assert_eq!(
        h.put_packets::<Ll16Packet>(Thread, 0, 0, 12, 1),
        Err(DeviceError::InvalidArgument)
    );
    // Twice the bytes must fit the packet side; a size whose packet range overflows u64.
    assert_eq!(
        h.put_packets::<Ll8Packet>(Thread, 0, 0, 260, 1),
        Err(DeviceError::OutOfBounds)
    );
    // (2^61 + 1) packets of 8 bytes wrap to 8 bytes; the data range refuses them too.
    assert_eq!(
        h.put_packets::<Ll8Packet>(Thread, 0, 0, (1 << 63) + 4, 1),
        Err(DeviceError::OutOfBounds)
    );
    assert_eq!(
        h.unpack_packets::<Ll16Packet>(Thread, 0, 0, 1 << 61, 1),
        Err(DeviceError::OutOfBounds)
    );
    assert!(b.untouched());
    assert!(b.take_abort().is_some());
}

/// Guards against a port channel put whose offset wraps around u64 and lands, as a small
/// valid offset, in the wrong place; and against offsets a trigger cannot carry.
#[test]
fn port_channel_put_refuses_offsets_it_cannot_carry() {
    let b = Buffers::new();
    // A FIFO without cells (zeroed): had the offset check passed, the push would have
    // refused too, with NullHandle; OutOfBounds shows the offset check came first.
    let fifo = FifoDeviceHandle::default().with_wait(b.wait());
    let h = PortChannelDeviceHandle::new(fifo, Default::default(), PortChannelIds::default());
    assert_eq!(h.put(u64::MAX, 0, 8), Err(DeviceError::OutOfBounds));
    let reason = b.take_abort().unwrap();
    assert_eq!(
        (reason.error, reason.op, reason.site, reason.detail),
        (
            Some(DeviceError::OutOfBounds),
            DeviceOp::PortPut,
            42,
            Some([u64::MAX, 0, 8])
        )
    );
    assert_eq!(h.put(0, 1 << 32, 8), Err(DeviceError::OutOfBounds));
    assert_eq!(
        h.put(0, 0, 8),
        Err(DeviceError::NullHandle),
        "a zeroed FIFO handle must refuse"
    );
}

/// Guards against a zeroed (never set up) handle reaching memory at address 0: every call
/// refuses it, as such.
#[test]
fn zeroed_handles_refuse_every_call() {
    let port = PortChannelDeviceHandle::default();
    assert_eq!(port.signal(), Err(DeviceError::NullHandle));
    assert_eq!(port.flush(), Err(DeviceError::NullHandle));
    assert_eq!(port.wait(), Err(DeviceError::NullHandle));
    assert_eq!(port.poll(), Err(DeviceError::NullHandle));
    let memory = MemoryChannelDeviceHandle::default();
    assert_eq!(memory.signal(), Err(DeviceError::NullHandle));
    assert_eq!(memory.relaxed_signal(), Err(DeviceError::NullHandle));
    assert_eq!(memory.wait(), Err(DeviceError::NullHandle));
    assert_eq!(memory.poll(), Err(DeviceError::NullHandle));
    assert_eq!(memory.put(Thread, 0, 0, 8), Err(DeviceError::NullHandle));
    assert_eq!(memory.write::<u64>(0, 1), Err(DeviceError::NullHandle));
    assert_eq!(
        memory.read_packet::<Ll16Packet>(0, 1),
        Err(DeviceError::NullHandle)
    );
    assert_eq!(
        Host2DeviceSemaphoreDeviceHandle::default().wait(),
        Err(DeviceError::NullHandle)
    );
}
