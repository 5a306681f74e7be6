//! Model checks of the trigger FIFO: device-side `push` from several producers against the
//! host-side `Fifo::poll`/`pop`. Run with `cargo xtask loom` (`--cfg oxccl_loom`).
#![cfg(oxccl_loom)]
#![allow(missing_docs)]

use loom::sync::Arc;
use loom::thread;
use oxccl_device::arch::atomic::{self, Ordering, Scope};
use oxccl_device::fifo::{FifoDeviceHandle, ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::Fifo;

fn trigger(producer: u32, seq: u64) -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::DATA,
        dst_memory_id: producer,
        dst_offset: seq,
        src_memory_id: 0,
        src_offset: 0x1234_5678,
        size: 0xabcd,
        semaphore_id: producer,
    })
}

/// Pops `n` triggers, yielding while the ring is empty; returns them decoded.
fn consume(fifo: &mut Fifo, n: usize) -> Vec<TriggerFields> {
    let mut out = Vec::new();
    while out.len() < n {
        match fifo.poll() {
            Some(t) => {
                out.push(t.decode());
                fifo.pop();
            }
            None => thread::yield_now(),
        }
    }
    out
}

/// A handle for producer threads, which loom requires to be `'static`.
///
/// # Safety
/// The caller keeps the FIFO's cells alive (a share of `fifo.cells()`) in every thread that
/// uses the handle, until it stops using it.
unsafe fn handle(fifo: &Fifo) -> FifoDeviceHandle<'static> {
    // A limit loom never reaches: its models have no clock to run out.
    let wait = WaitPolicy::with_timeout_ns(u64::MAX);
    // SAFETY: the cells' own parts; the caller keeps them alive while the handle is used.
    unsafe { FifoDeviceHandle::from_raw_parts(fifo.cells().raw_parts(), wait) }
}

/// Guards against two producers claiming the same slot, a trigger read before both of its
/// words are visible, or a lost trigger.
#[test]
fn two_producers_one_consumer() {
    loom::model(|| {
        let mut fifo = Fifo::new(2).unwrap();
        // SAFETY: every producer holds `keep`, a share of the cells, while it pushes.
        let h = unsafe { handle(&fifo) };
        let keep = fifo.cells();
        let producers: Vec<_> = (1..=2u32)
            .map(|p| {
                let keep = keep.clone();
                thread::spawn(move || {
                    let _keep = keep;
                    h.push(trigger(p, 7)).unwrap();
                })
            })
            .collect();
        let got = consume(&mut fifo, 2);
        for p in producers {
            p.join().unwrap();
        }
        let mut ids: Vec<u32> = got.iter().map(|f| f.dst_memory_id).collect();
        ids.sort();
        assert_eq!(ids, [1, 2]);
        for f in got {
            assert_eq!(f, trigger(f.dst_memory_id, 7).decode());
        }
    });
}

/// Guards against a push into a full ring overwriting an unexecuted trigger, and against
/// the lap-parity commit bit letting the consumer take a stale slot after wrap-around.
#[test]
fn full_ring_waits_for_tail_and_wraps() {
    loom::model(|| {
        let mut fifo = Fifo::new(1).unwrap();
        // SAFETY: every producer holds `keep`, a share of the cells, while it pushes.
        let h = unsafe { handle(&fifo) };
        let keep = fifo.cells();
        let producer = thread::spawn(move || {
            let _keep = keep;
            for seq in 0..3 {
                assert_eq!(h.push(trigger(1, seq)).unwrap(), seq);
            }
        });
        let got = consume(&mut fifo, 3);
        producer.join().unwrap();
        let seqs: Vec<u64> = got.iter().map(|f| f.dst_offset).collect();
        assert_eq!(seqs, [0, 1, 2]);
        // Nothing left: the slot still holds lap 2's trigger, which must not read as lap 3's.
        assert!(fifo.poll().is_none());
    });
}

/// Guards against `sync` returning before the proxy executed the trigger (a flush that
/// does not wait for the copy it is meant to cover).
#[test]
fn sync_waits_for_execution() {
    loom::model(|| {
        let mut fifo = Fifo::new(2).unwrap();
        // SAFETY: every producer holds `keep`, a share of the cells, while it pushes.
        let h = unsafe { handle(&fifo) };
        let keep = fifo.cells();
        let effect = Arc::new(loom::sync::atomic::AtomicU64::new(0));
        let seen = effect.clone();
        let producer = thread::spawn(move || {
            let _keep = keep;
            let pos = h.push(trigger(1, 0)).unwrap();
            h.sync(pos).unwrap();
            // Relaxed: the Acquire in `sync` must order the proxy's effect before this.
            assert_eq!(seen.load(Ordering::Relaxed), 1);
        });
        loop {
            if fifo.poll().is_some() {
                // The trigger's effect (a copy), then the release of `tail` in `pop`.
                effect.store(1, Ordering::Relaxed);
                fifo.pop();
                // As the proxy does: the poll that finds the ring empty writes the tail back.
                assert!(fifo.poll().is_none());
                break;
            }
            thread::yield_now();
        }
        producer.join().unwrap();
    });
}

/// The check has teeth: a producer that publishes the commit word without release lets the
/// consumer read a stale first word, and loom must find that execution.
#[test]
#[should_panic(expected = "first word of the trigger")]
fn weakened_publish_is_caught() {
    loom::model(|| {
        let mut fifo = Fifo::new(2).unwrap();
        // SAFETY: every producer holds `keep`, a share of the cells, while it pushes.
        let h = unsafe { handle(&fifo) };
        let keep = fifo.cells();
        let producer = thread::spawn(move || {
            let _keep = keep;
            let t = trigger(1, 5).with_commit_bit(1);
            // SAFETY: the handle's addresses point into the FIFO cells kept alive above.
            let slot =
                unsafe { &*(h.raw_parts().triggers as usize as *const [atomic::AtomicU64; 2]) };
            // Deliberately weakened: both words relaxed (the real push releases `snd`).
            atomic::store(&slot[0], t.fst, Ordering::Relaxed, Scope::System);
            atomic::store(&slot[1], t.snd, Ordering::Relaxed, Scope::System);
        });
        let got = consume(&mut fifo, 1);
        producer.join().unwrap();
        assert_eq!(got[0], trigger(1, 5).decode(), "first word of the trigger");
    });
}
