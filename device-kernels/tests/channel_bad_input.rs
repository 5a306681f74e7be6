//! Channel calls with bad arguments, called directly on the host: each must refuse, write
//! nothing, and raise the abort flag with its error.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use core::sync::atomic::{AtomicU64, Ordering};
use oxccl_device::DeviceError;
use oxccl_device::coop::Thread;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::packet::{Ll8Packet, Ll16Packet};
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::wait::{AbortReason, WaitPolicy};

struct Buffers {
    remote: Vec<u64>,
    local: Vec<u64>,
    packets: Vec<u64>,
    flag: AtomicU64,
}

impl Buffers {
    fn new() -> Self {
        Buffers {
            remote: vec![7; 64],
            local: vec![9; 64],
            packets: vec![0; 64],
            flag: AtomicU64::new(0),
        }
    }

    fn handle(&self) -> MemoryChannelDeviceHandle {
        let mut h = MemoryChannelDeviceHandle::default();
        h.semaphore.wait = WaitPolicy {
            abort_flag: self.flag.as_ptr() as u64,
            timeout_ns: 1_000_000,
            site: 42,
            reserved: 0,
        };
        (h.remote, h.remote_size) = (self.remote.as_ptr() as u64, 512);
        (h.local, h.local_size) = (self.local.as_ptr() as u64, 512);
        (h.packets, h.packets_size) = (self.packets.as_ptr() as u64, 512);
        h
    }

    /// The error the abort flag carries, then lowers it.
    fn take_abort(&self) -> Option<DeviceError> {
        AbortReason::decode(self.flag.swap(0, Ordering::Relaxed)).and_then(|r| r.error)
    }

    fn untouched(&self) -> bool {
        self.remote.iter().all(|&w| w == 7) && self.local.iter().all(|&w| w == 9)
    }
}

/// Guards against a memory channel copy that writes past either buffer, including through
/// an offset + size that overflows.
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
        assert_eq!(b.take_abort(), Some(DeviceError::OutOfBounds));
        assert_eq!(
            h.get(Thread, dst, src, bytes),
            Err(DeviceError::OutOfBounds),
            "get {dst} {src} {bytes}"
        );
        assert_eq!(b.take_abort(), Some(DeviceError::OutOfBounds));
    }
    assert_eq!(h.write::<u64>(64, 1), Err(DeviceError::OutOfBounds));
    assert_eq!(
        h.write::<u64>(u64::MAX / 4, 1),
        Err(DeviceError::OutOfBounds)
    );
    assert_eq!(h.read::<u64>(64), Err(DeviceError::OutOfBounds));
    assert_eq!(b.take_abort(), Some(DeviceError::OutOfBounds));
    assert!(b.untouched());
    // In bounds it works, at the very end.
    assert_eq!(h.put(Thread, 504, 0, 8), Ok(()));
    assert_eq!(b.remote[63], 9);
    assert_eq!(b.take_abort(), None);
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
    let flag = AtomicU64::new(0);
    let mut h = PortChannelDeviceHandle::default();
    h.fifo.wait = WaitPolicy {
        abort_flag: flag.as_ptr() as u64,
        timeout_ns: 1_000_000,
        site: 3,
        reserved: 0,
    };
    // Zero-size FIFO handle: had the check passed, the push would have refused too, with
    // InvalidArgument; OutOfBounds shows the offset check came first.
    assert_eq!(h.put(u64::MAX, 0, 8), Err(DeviceError::OutOfBounds));
    assert_eq!(h.put(0, 1 << 32, 8), Err(DeviceError::OutOfBounds));
    let reason = AbortReason::decode(flag.load(Ordering::Relaxed)).unwrap();
    assert_eq!(
        (reason.error, reason.site),
        (Some(DeviceError::OutOfBounds), 3)
    );
    assert_eq!(
        h.put(0, 0, 8),
        Err(DeviceError::InvalidArgument),
        "a zeroed FIFO handle must refuse"
    );
}
