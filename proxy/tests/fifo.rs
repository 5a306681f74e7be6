//! The trigger FIFO with real threads: device-side `push` against the host consumer.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use oxccl_device::DeviceError;
use oxccl_device::abort::AbortRecord;
use oxccl_device::error::DeviceOp;
use oxccl_device::fifo::{FifoDeviceHandle, ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::fifo::{FifoRawParts, TriggerSlot};
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::fifo::MAX_FIFO_SIZE;
use oxccl_proxy::{Fifo, MappedFifoCells};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Every wait of these tests gives up after 30 s, so a broken consumer fails the test
/// instead of hanging it.
const WAIT: WaitPolicy = WaitPolicy::with_timeout_ns(30_000_000_000);

fn trigger(producer: u32, seq: u64) -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::DATA | trigger_type::FLAG,
        dst_memory_id: producer,
        dst_offset: seq,
        size: seq ^ 0xffff,
        semaphore_id: producer,
        ..Default::default()
    })
}

/// Pops `n` triggers (giving up after 30 s), returning them decoded.
fn drain(fifo: &mut Fifo, n: usize) -> Vec<TriggerFields> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} triggers arrived",
            out.len()
        );
        match fifo.poll() {
            Some(t) => {
                out.push(t.decode());
                fifo.pop();
            }
            None => std::thread::yield_now(),
        }
    }
    out
}

/// A handle for producer threads, which need it `'static`.
///
/// # Safety
/// The FIFO's cells must outlive every use of the handle: each test keeps its `Fifo` (or a
/// share of its cells) alive until the producers have joined.
unsafe fn handle(fifo: &Fifo) -> FifoDeviceHandle<'static> {
    // SAFETY: the cells' own parts; the caller keeps them alive.
    unsafe { FifoDeviceHandle::from_raw_parts(fifo.cells().raw_parts(), WAIT) }
}

/// Guards against a pushed trigger not arriving intact, or a zeroed ring reading as full.
#[test]
fn smoke() {
    let mut fifo = Fifo::new(4).unwrap();
    assert!(fifo.poll().is_none(), "a fresh ring must read empty");
    let cells = fifo.cells();
    let h = cells.device_handle(WAIT);
    assert_eq!(h.push(trigger(3, 9)).unwrap(), 0);
    assert_eq!(drain(&mut fifo, 1), [trigger(3, 9).decode()]);
    assert!(fifo.poll().is_none());
    assert_eq!(fifo.tail(), 1);
}

/// Guards against wrap-around at the lap boundary: a one-slot ring reuses its slot every
/// push, alternating the commit bit, and a stale slot must never be taken twice.
#[test]
fn wraps_at_lap_boundary() {
    for size in [1u32, 2, 4] {
        let mut fifo = Fifo::new(size).unwrap();
        let cells = fifo.cells();
        let h = cells.device_handle(WAIT);
        for seq in 0..(4 * size as u64 + 1) {
            h.push(trigger(1, seq)).unwrap();
            assert_eq!(drain(&mut fifo, 1)[0].dst_offset, seq, "size {size}");
            assert!(
                fifo.poll().is_none(),
                "size {size}: stale slot read after {seq}"
            );
        }
    }
}

/// Guards against a push into a full ring overwriting an unexecuted trigger: with a
/// consumer that has not popped, a bounded push must time out, and the ring must still hold
/// the original triggers.
#[test]
fn full_ring_push_waits_then_times_out() {
    let mut fifo = Fifo::new(2).unwrap();
    let record = AbortRecord::new();
    let stop = AtomicU64::new(0);
    // SAFETY: both live until the end of the test.
    let policy = unsafe { WaitPolicy::from_raw_parts(&record, &stop, 20_000_000, 4) };
    let cells = fifo.cells();
    let h = cells.device_handle(policy);
    h.push(trigger(1, 0)).unwrap();
    h.push(trigger(1, 1)).unwrap();
    assert_eq!(h.push(trigger(1, 2)), Err(DeviceError::Timeout));
    let reason = record.read().expect("the timeout must be recorded");
    assert_eq!(reason.op, DeviceOp::FifoPush);
    // Position 2 waited for a ring of 2 slots whose tail stayed at 0.
    assert_eq!(reason.detail, Some([2, 0, 2]));
    assert_ne!(stop.load(Ordering::Relaxed), 0, "the rank must be stopped");
    let got = drain(&mut fifo, 2);
    assert_eq!((got[0].dst_offset, got[1].dst_offset), (0, 1));
}

/// Guards against lost or duplicated triggers and broken per-producer order with many
/// producers racing on the head and a small ring that wraps constantly.
#[test]
fn many_producers() {
    const PRODUCERS: u32 = 6;
    const EACH: u64 = if cfg!(miri) { 20 } else { 20_000 };
    let mut fifo = Fifo::new(8).unwrap();
    // SAFETY: `fifo` outlives the producers, which are joined below.
    let h = unsafe { handle(&fifo) };
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            std::thread::spawn(move || {
                for seq in 0..EACH {
                    h.push(trigger(p, seq)).unwrap();
                }
            })
        })
        .collect();
    let got = drain(&mut fifo, (PRODUCERS as u64 * EACH) as usize);
    for p in producers {
        p.join().unwrap();
    }
    let mut next = [0u64; PRODUCERS as usize];
    for f in got {
        let p = f.dst_memory_id as usize;
        assert_eq!(
            f,
            trigger(p as u32, next[p]).decode(),
            "producer {p} out of order or corrupted"
        );
        next[p] += 1;
    }
    assert!(next.iter().all(|&n| n == EACH));
}

/// Guards against rings that cannot work (no slot) or would allocate without bound.
#[test]
fn bad_sizes_are_refused() {
    assert!(Fifo::new(0).is_err());
    assert!(Fifo::new(3).is_err());
    assert!(Fifo::new(MAX_FIFO_SIZE + 1).is_err());
    assert!(Fifo::new(MAX_FIFO_SIZE).is_ok());
}

/// Guards against `sync` returning before the consumer executed the position, and against
/// a tail that is never written back once the ring runs empty.
#[test]
fn sync_waits_for_pop() {
    let mut fifo = Fifo::new(4).unwrap();
    // SAFETY: `fifo` outlives the producer, which is joined below.
    let h = unsafe { handle(&fifo) };
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let seen = done.clone();
    let producer = std::thread::spawn(move || {
        let pos = h.push(trigger(1, 0)).unwrap();
        h.sync(pos).unwrap();
        seen.load(Ordering::Relaxed)
    });
    std::thread::sleep(Duration::from_millis(20));
    assert!(fifo.poll().is_some());
    done.store(1, Ordering::Relaxed);
    fifo.pop();
    // As the proxy does: the poll that finds the ring empty writes the tail back.
    assert!(fifo.poll().is_none());
    assert_eq!(producer.join().unwrap(), 1);
}

/// Guards against a push that does not wake a parked consumer (a lost wake-up in the
/// sleep-bit handshake). The consumer parks with a 10 s timeout, so a missed wake shows as
/// a stall; the rounds race pushes against the moment of parking.
#[test]
fn pushes_wake_a_parked_consumer() {
    const ROUNDS: u64 = 200;
    let mut fifo = Fifo::new(4).unwrap();
    let cells = fifo.cells();
    let h = cells.device_handle(WAIT);
    let park_cells = fifo.cells();
    let consumer = std::thread::spawn(move || {
        let mut longest = Duration::ZERO;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            loop {
                if let Some(t) = fifo.poll() {
                    let _ = t;
                    fifo.pop();
                    break;
                }
                // Returns false without parking when a push is already under way.
                if !park_cells.park_consumer(Duration::from_secs(10), || false) {
                    std::thread::yield_now();
                }
            }
            longest = longest.max(started.elapsed());
            // Write the tail back, as the proxy's next poll does. (It may already find the
            // next trigger: a pop that completes a batch writes the tail back itself, which
            // lets the producer's sync return and push at once.)
            let _ = fifo.poll();
        }
        longest
    });
    for round in 0..ROUNDS {
        // Alternate: push at once (racing the park) or after the consumer surely parked.
        if round % 2 == 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        h.push(trigger(1, round)).unwrap();
        h.sync(round).unwrap();
    }
    let longest = consumer.join().unwrap();
    assert!(
        longest < Duration::from_secs(5),
        "a push waited {longest:?} for a parked consumer"
    );
}

/// Memory standing in for a backend's placement of a ring: the slots and tail (on a GPU,
/// pinned device-mapped host memory), the head and tail cache (device memory).
struct Placement {
    slots: Box<[TriggerSlot]>,
    /// tail, head, tail cache.
    counters: Box<[AtomicU64; 3]>,
}

impl Placement {
    fn new(size: u32) -> Placement {
        Placement {
            slots: (0..size).map(|_| TriggerSlot::new()).collect(),
            counters: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// The cells, the device's addresses equal to the host's (as they are on the CPU).
    fn cells(self) -> MappedFifoCells {
        let slots = self.slots.as_ptr() as *mut TriggerSlot;
        let [tail, head, tail_cache] = &*self.counters;
        let address = |c: &AtomicU64| c.as_ptr() as u64;
        MappedFifoCells {
            host_slots: slots,
            host_tail: tail as *const AtomicU64 as *mut AtomicU64,
            device: FifoRawParts {
                triggers: slots as u64,
                head: address(head),
                tail: address(tail),
                tail_cache: address(tail_cache),
                doorbell: 0,
                size: self.slots.len() as u32,
                reserved: 0,
            },
            keep_alive: Box::new(self),
        }
    }
}

/// Guards the GPU placement of the ring: over cells a backend placed, triggers go through
/// in order across several laps, and the host never claims to see the head (on a GPU it is
/// device memory).
#[test]
fn a_mapped_ring_moves_triggers_in_order() {
    // SAFETY: the placement's memory lives in `keep_alive`, zeroed, accessed atomically.
    let mut fifo = unsafe { Fifo::from_mapped(Placement::new(4).cells()) }.unwrap();
    // SAFETY: `fifo` outlives the producer, joined below.
    let producer = unsafe { handle(&fifo) };
    let pushing = std::thread::spawn(move || {
        for seq in 0..64 {
            producer.push(trigger(7, seq)).unwrap();
        }
    });
    let got = drain(&mut fifo, 64);
    pushing.join().unwrap();
    let expected: Vec<_> = (0..64).map(|seq| trigger(7, seq).decode()).collect();
    assert_eq!(got, expected);
    let cells = fifo.cells();
    assert_eq!((cells.claimed(), cells.head_word()), (None, None));
    assert_eq!(cells.raw_parts().doorbell, 0);
}

/// Guards against a misplaced ring being used: each flaw is refused with a reason, before
/// any trigger could be lost to it. Dirty memory matters most: GPU drivers do not zero what
/// they hand out, and a stale commit bit would read as a trigger.
#[test]
fn a_misplaced_mapped_ring_is_refused() {
    let refused = |change: &dyn Fn(&mut MappedFifoCells), why: &str| {
        let mut cells = Placement::new(4).cells();
        change(&mut cells);
        // SAFETY: the placement's memory lives in `keep_alive`; the changes only make
        // `from_mapped` refuse it before it is used.
        let err = unsafe { Fifo::from_mapped(cells) }
            .err()
            .unwrap_or_else(|| panic!("{why}: accepted"));
        assert!(err.to_string().contains(why), "{why}: {err}");
    };
    refused(&|c| c.device.doorbell = 0x1000, "doorbell");
    refused(&|c| c.device.size = 3, "power of two");
    refused(&|c| c.device.head = 0, "null or misaligned");
    refused(&|c| c.device.tail_cache += 4, "null or misaligned");
    refused(
        &|c| c.host_slots = (c.host_slots as usize + 8) as *mut TriggerSlot,
        "null or misaligned",
    );
    refused(
        &|c| {
            // SAFETY: slot 2 of the 4 the placement holds.
            let slot = unsafe { &*c.host_slots.add(2) };
            slot.words[1].store(1 << 63, Ordering::Relaxed);
        },
        "slot 2 is not zero",
    );
    refused(
        &|c| {
            // SAFETY: the placement's tail.
            unsafe { &*c.host_tail }.store(5, Ordering::Relaxed);
        },
        "tail is not zero",
    );
}
