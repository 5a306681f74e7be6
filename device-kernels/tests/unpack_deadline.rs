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
use std::time::{Duration, Instant};

/// 16-byte aligned words, as registered memory is.
#[repr(C, align(16))]
struct Words([u64; 8]);

/// Guards against a deadline per packet: a call of n packets could then wait n times the
/// limit. Packets that arrive one every 15 ms each come within a 40 ms limit, but the six
/// of them together do not; the call must time out, recording how far it got.
///
/// A run in which the unpacking thread lost its core for most of the 90 ms the packets take
/// (a loaded machine) finds them all there and proves nothing: such a run is repeated, up to
/// twenty times. It shows as a call that began after the last packet was sent, or as time the
/// thread spent runnable but waiting for a core during the call (Linux's schedstat), which
/// a correct call cannot tell from a fast sender. With a deadline per packet a call that
/// began in time, on a core, returns Ok, and the test fails.
#[test]
fn unpack_times_out_when_the_whole_call_is_late() {
    for attempt in 1..=20 {
        match unpack_six_late_packets() {
            Some(()) => return,
            None => println!("attempt {attempt}: the unpacker started late; again"),
        }
    }
    panic!(
        "twenty calls of six late packets within a 40 ms limit did not time out, each having \
         waited for a core or started late: the machine is too loaded to tell"
    );
}

/// One call: `Some` if it timed out as it must (checked), `None` if it returned Ok having
/// started only after the last packet was sent (inconclusive). Fails the test if it returned
/// Ok although it started in time.
fn unpack_six_late_packets() -> Option<()> {
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
    let (outcome, started, last_sent) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            for i in 0..6u64 {
                std::thread::sleep(interval);
                // SAFETY: packet `i` of the live, aligned packet buffer, touched only by
                // packet stores and loads.
                unsafe { Ll8Packet::store(first_packet + 8 * i, i as u32, 1) };
            }
            Instant::now()
        });
        let started = Instant::now();
        let waited_before = runqueue_wait();
        // Six packets of 4 bytes from packet offset 0 to data offset 0, flag 1.
        let outcome = chan.unpack_packets::<Ll8Packet>(Thread, 0, 0, 24, 1);
        let waited = runqueue_wait()
            .zip(waited_before)
            .map(|(a, b)| a.saturating_sub(b));
        if let Some(waited) = waited.filter(|w| *w > Duration::from_millis(10)) {
            println!("the unpacker waited {waited:?} for a core during the call");
            if outcome.is_ok() {
                return (None, started, sender.join().expect("the sender"));
            }
        }
        (Some(outcome), started, sender.join().expect("the sender"))
    });
    let outcome = outcome?;
    if outcome.is_ok() {
        // The clock is read every few dozen polls, up to about 13 ms apart once the
        // emulator's waits sleep: a call that began less than the limit plus that before the
        // last packet proves nothing either way.
        let slack = Duration::from_millis(20);
        assert!(
            started + limit + slack > last_sent,
            "the call began {:?} before the last packet was sent, yet did not time out",
            last_sent - started
        );
        return None;
    }
    assert_eq!(outcome, Err(DeviceError::Timeout));
    let reason = record.read().expect("the timeout is recorded");
    assert_eq!(reason.op, DeviceOp::UnpackPackets);
    let [offset, flag, _seen] = reason.detail.expect("with its details");
    assert_eq!(flag, 1);
    assert!(
        offset > 0 && offset < 48,
        "it gave up at a later packet, not the first nor after the last: offset {offset}"
    );
    Some(())
}

/// Time this thread has spent runnable but waiting for a core (the second field of
/// `/proc/thread-self/schedstat`), where the kernel reports it.
fn runqueue_wait() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}
