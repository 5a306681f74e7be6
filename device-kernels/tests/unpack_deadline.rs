//! The wait limit of `unpack_packets` covers the whole call, not each packet.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use core::sync::atomic::AtomicU64;
use oxccl_device::DeviceError;
use oxccl_device::abort::AbortRecord;
use oxccl_device::coop::Thread;
use oxccl_device::error::DeviceOp;
use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
use oxccl_device::packet::{Ll8Packet, Packet};
use oxccl_device::semaphore::{Device2DeviceSemaphoreDeviceHandle, SemaphoreRawParts};
use oxccl_device::wait::WaitPolicy;
use std::time::Duration;

/// 16-byte aligned words, as registered memory is.
#[repr(C, align(16))]
struct Words([u64; 8]);

/// Guards against a deadline per packet: a call of n packets could then wait n times the
/// limit. Packets that arrive one every 15 ms each come within a 40 ms limit, but the six
/// of them together do not; the call must time out, recording how far it got.
#[test]
fn unpack_times_out_when_the_whole_call_is_late() {
    let limit = Duration::from_millis(40);
    let interval = Duration::from_millis(15);
    let packets = Box::new(Words([0; 8]));
    let data = Box::new(Words([0; 8]));
    let counters = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let record = AbortRecord::new();
    let stop = AtomicU64::new(0);
    let raw = SemaphoreRawParts {
        inbound: counters[0].as_ptr() as u64,
        expected: counters[1].as_ptr() as u64,
        remote_inbound: counters[2].as_ptr() as u64,
    };
    let buffers = MemoryChannelBuffers {
        remote: 0,
        remote_size: 0,
        local: data.0.as_ptr() as u64,
        local_size: 64,
        packets: packets.0.as_ptr() as u64,
        packets_size: 64,
    };
    // SAFETY: every address points into values that outlive the handle, 16-byte aligned and
    // sized as said; the counters, record and stop word are only accessed atomically.
    let chan = unsafe {
        let policy = WaitPolicy::from_raw_parts(&record, &stop, limit.as_nanos() as u64, 7);
        let semaphore = Device2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, policy);
        MemoryChannelDeviceHandle::from_raw_parts(semaphore, buffers)
    };
    let first_packet = packets.0.as_ptr() as u64;
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..6u64 {
                std::thread::sleep(interval);
                // SAFETY: packet `i` of the live, aligned packet buffer, touched only by
                // packet stores and loads.
                unsafe { Ll8Packet::store(first_packet + 8 * i, i as u32, 1) };
            }
        });
        // Six packets of 4 bytes from packet offset 0 to data offset 0, flag 1.
        chan.unpack_packets::<Ll8Packet>(Thread, 0, 0, 24, 1)
    });
    assert_eq!(outcome, Err(DeviceError::Timeout));
    let reason = record.read().expect("the timeout is recorded");
    assert_eq!(reason.op, DeviceOp::UnpackPackets);
    let [offset, flag, _seen] = reason.detail.expect("with its details");
    assert_eq!(flag, 1);
    assert!(
        offset > 0 && offset < 48,
        "it gave up at a later packet, not the first nor after the last: offset {offset}"
    );
}
