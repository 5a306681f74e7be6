//! Model checks of the semaphore and grid barrier protocols. Run with `cargo xtask loom` (`--cfg oxccl_loom`).
#![cfg(oxccl_loom)]
#![allow(missing_docs)]

use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;
use loom::thread;
use oxccl_device::arch::atomic::{Ordering, Scope};
use oxccl_device::grid_barrier::{GridBarrierDeviceHandle, GridBarrierRawParts};
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts,
};
use oxccl_device::wait::WaitPolicy;

/// A limit loom never reaches: its models have no clock to run out.
const NO_CLOCK: WaitPolicy<'static> = WaitPolicy::with_timeout_ns(u64::MAX);

/// One side's counters: inbound, expected.
struct Cells([AtomicU64; 2]);

impl Cells {
    fn new() -> Arc<Self> {
        Arc::new(Cells([AtomicU64::new(0), AtomicU64::new(0)]))
    }
    fn addr(&self, i: usize) -> u64 {
        &self.0[i] as *const AtomicU64 as u64
    }
}

/// The handle of side `me` whose signals go to `peer`.
///
/// # Safety
/// Both sides' cells must outlive every use of the handle (the models keep them in `Arc`s
/// held by every thread until it is done).
unsafe fn d2d(me: &Cells, peer: &Cells) -> Device2DeviceSemaphoreDeviceHandle<'static> {
    let raw = SemaphoreRawParts {
        inbound: me.addr(0),
        expected: me.addr(1),
        remote_inbound: peer.addr(0),
    };
    // SAFETY: the caller keeps the cells alive.
    unsafe { Device2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, NO_CLOCK) }
}

/// Sends `rounds` payloads from A to B, each published by a signal (`relaxed` picks the
/// signal kind); B checks each payload after its wait.
fn data_then_signal(relaxed: bool, rounds: u64) {
    loom::model(move || {
        let (a, b) = (Cells::new(), Cells::new());
        let data = Arc::new(AtomicU64::new(0));
        // SAFETY: the sender holds `a` and `b` until it is done; this thread holds them too.
        let (ha, hb) = unsafe { (d2d(&a, &b), d2d(&b, &a)) };
        let sender = {
            let (a, b, data) = (a.clone(), b.clone(), data.clone());
            thread::spawn(move || {
                let _keep = (a, b);
                for round in 1..=rounds {
                    // Relaxed: the signal below must publish it.
                    data.store(round, Ordering::Relaxed);
                    if relaxed {
                        ha.relaxed_signal().unwrap();
                    } else {
                        ha.signal().unwrap();
                    }
                    if round < rounds {
                        ha.wait().unwrap();
                    }
                }
            })
        };
        for round in 1..=rounds {
            hb.wait().unwrap();
            assert_eq!(
                data.load(Ordering::Relaxed),
                round,
                "payload of round {round}"
            );
            if round < rounds {
                hb.signal().unwrap();
            }
        }
        sender.join().unwrap();
        drop((a, b));
    });
}

/// Guards against a signal that does not order the data written before it.
#[test]
fn signal_publishes_data() {
    data_then_signal(false, 1);
}

/// Guards against a lost or double-counted signal across rounds in both directions.
#[test]
fn signals_count_across_rounds() {
    data_then_signal(false, 2);
}

/// The check has teeth: a relaxed signal does not publish data, and loom must find it.
#[test]
#[should_panic(expected = "payload of round 1")]
fn relaxed_signal_does_not_publish_data() {
    data_then_signal(true, 1);
}

/// Guards against `poll` consuming a signal that has not arrived, or missing one that has.
#[test]
fn host_to_device_poll_and_wait() {
    loom::model(|| {
        let cells = Cells::new();
        let data = Arc::new(AtomicU64::new(0));
        let raw = SemaphoreRawParts {
            inbound: cells.addr(0),
            expected: cells.addr(1),
            remote_inbound: 0,
        };
        // SAFETY: `cells` outlives the handle (held until the end of the model).
        let h = unsafe { Host2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, NO_CLOCK) };
        let proxy = {
            let (cells, data) = (cells.clone(), data.clone());
            thread::spawn(move || {
                data.store(9, Ordering::Relaxed);
                // What the connection's update_and_sync does: a release store of the count.
                oxccl_device::arch::atomic::store(&cells.0[0], 1, Ordering::Release, Scope::System);
                oxccl_device::arch::atomic::store(&cells.0[0], 2, Ordering::Release, Scope::System);
            })
        };
        let mut got = 0;
        while got < 2 {
            if h.poll().unwrap() {
                got += 1;
                assert_eq!(data.load(Ordering::Relaxed), 9);
            } else {
                thread::yield_now();
            }
        }
        assert!(!h.poll().unwrap(), "a third signal was never sent");
        proxy.join().unwrap();
    });
}

/// Guards against concurrent signallers losing a signal: two threads (two blocks, say)
/// signal the same semaphore once each; the peer must count two. A signal that stored a
/// count it kept itself could move the counter backwards.
#[test]
fn semaphore_two_signallers() {
    loom::model(|| {
        let (a, b) = (Cells::new(), Cells::new());
        // SAFETY: every thread holds `a` and `b` until it is done.
        let (ha, hb) = unsafe { (d2d(&a, &b), d2d(&b, &a)) };
        let signallers: Vec<_> = (0..2)
            .map(|_| {
                let keep = (a.clone(), b.clone());
                thread::spawn(move || {
                    let _keep = keep;
                    ha.signal().unwrap();
                })
            })
            .collect();
        for s in signallers {
            s.join().unwrap();
        }
        assert_eq!(
            oxccl_device::arch::atomic::load(&b.0[0], Ordering::Acquire, Scope::System),
            2,
            "a signal was lost"
        );
        hb.wait().unwrap();
        hb.wait().unwrap();
        drop((a, b));
    });
}

/// A grid barrier's counters: arrivals, generation.
struct BarrierCells([AtomicU64; 2]);

impl BarrierCells {
    fn new() -> Arc<Self> {
        Arc::new(BarrierCells([AtomicU64::new(0), AtomicU64::new(0)]))
    }

    /// A handle over the cells.
    ///
    /// # Safety
    /// The cells must outlive every use of the handle (the models keep them in an `Arc` held
    /// by every thread until it is done).
    unsafe fn handle(&self) -> GridBarrierDeviceHandle<'static> {
        let raw = GridBarrierRawParts {
            count: &self.0[0] as *const AtomicU64 as u64,
            generation: &self.0[1] as *const AtomicU64 as u64,
        };
        // SAFETY: the caller keeps the cells alive; only barrier handles touch them.
        unsafe { GridBarrierDeviceHandle::from_raw_parts(raw, NO_CLOCK) }
    }
}

/// `participants` threads (thread 0 of each block) meet at one barrier `rounds` times. Before
/// each barrier a participant writes the round's number into its own slot (relaxed, as a
/// block's data); after it, it must see every slot at that round or later. Every round
/// uses the same two cells with no reset in between, as consecutive calls and launches do.
fn barrier_rounds(participants: usize, rounds: u64) {
    let mut model = loom::model::Builder::new();
    // Each poll of a waiting participant is a branch: with three threads, two of them
    // waiting, loom's default of 1000 branches per execution is too few.
    model.max_branches = 20_000;
    model.check(move || {
        let cells = BarrierCells::new();
        let slots: Arc<Vec<AtomicU64>> =
            Arc::new((0..participants).map(|_| AtomicU64::new(0)).collect());
        // SAFETY: every thread holds `cells` until it is done.
        let barrier = unsafe { cells.handle() };
        let body = move |me: usize, slots: &[AtomicU64]| {
            for round in 1..=rounds {
                // Relaxed: the barrier must publish it.
                slots[me].store(round, Ordering::Relaxed);
                barrier.arrive_and_wait(participants as u32).unwrap();
                for (other, slot) in slots.iter().enumerate() {
                    assert!(
                        slot.load(Ordering::Relaxed) >= round,
                        "round {round}: participant {me} passed before {other} wrote"
                    );
                }
            }
        };
        let others: Vec<_> = (1..participants)
            .map(|me| {
                let (cells, slots) = (cells.clone(), slots.clone());
                thread::spawn(move || {
                    let _keep = cells;
                    body(me, &slots);
                })
            })
            .collect();
        body(0, &slots);
        for t in others {
            t.join().unwrap();
        }
        // Every barrier completed and left the arrivals at zero for the next one.
        assert_eq!(cells.0[0].load(Ordering::Relaxed), 0, "arrivals left over");
        assert_eq!(cells.0[1].load(Ordering::Relaxed), rounds, "generations");
    });
}

/// Guards against a barrier that lets a participant through before another has arrived,
/// that does not publish what the others wrote before arriving, or that cannot be reused
/// without a reset: the last arriver's reset of the arrivals racing the next round's
/// arrivals, or a participant that races a whole barrier ahead and is counted at the wrong
/// one. Two participants: with three, the waiting participants' polls multiply the
/// interleavings past what the CI step can explore in minutes, and the counting does not
/// depend on how many arrive.
#[test]
fn grid_barrier_reused_round_after_round() {
    barrier_rounds(2, 3);
}
