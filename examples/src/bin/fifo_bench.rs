//! Trigger FIFO throughput: one producer thread pushes triggers through the device-side
//! `push`, one consumer thread pops them as the proxy thread does (drain, then pace after a
//! stream: `oxccl_proxy::consumer_pacing`); the same threads then move the same number of
//! triggers through `crossbeam::queue::ArrayQueue` of the same capacity, with its consumer
//! polling tightly and, separately, paced like ours; the faster of the two is the baseline.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin fifo_bench
//! fifo items=<N> push_pop_ns=<x> crossbeam_ns=<y> ratio=<x/y>
//! ```

use clap::Parser;
use crossbeam::queue::ArrayQueue;
use oxccl_device::fifo::{ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::{Fifo, consumer_pacing};
use std::time::{Duration, Instant};

/// Measures push→pop cost per trigger against crossbeam's bounded queue.
#[derive(Parser, Debug)]
struct Args {
    /// Triggers to move.
    #[arg(long, default_value_t = 2_000_000)]
    items: u64,
    /// Ring capacity (slots).
    #[arg(long, default_value_t = 512)]
    capacity: u32,
    /// Best of this many runs of each.
    #[arg(long, default_value_t = 3)]
    runs: u32,
}

fn trigger(i: u64) -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::DATA,
        dst_offset: i & 0xffff_ffff,
        size: 64,
        ..Default::default()
    })
}

fn oxccl_fifo(items: u64, capacity: u32) -> Result<Duration, oxccl_proxy::ProxyError> {
    let mut fifo = Fifo::new(capacity)?;
    let handle = fifo.device_handle(WaitPolicy::UNBOUNDED);
    let _cells = fifo.cells();
    let start = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..items {
            handle
                .push(trigger(i))
                .expect("unbounded push cannot time out");
        }
    });
    let mut sum = 0u64;
    let mut taken = 0;
    // The proxy thread's loop: drain what is published, then pace or poll again.
    while taken < items {
        let mut drained = 0;
        while let Some(t) = fifo.poll() {
            sum = sum.wrapping_add(t.decode().dst_offset);
            fifo.pop();
            drained += 1;
        }
        taken += drained;
        if drained == 0 {
            std::hint::spin_loop();
        } else {
            consumer_pacing::after_drain(drained);
        }
    }
    let elapsed = start.elapsed();
    producer.join().expect("producer thread");
    assert_eq!(
        sum,
        (0..items).map(|i| i & 0xffff_ffff).sum::<u64>(),
        "FIFO lost or changed triggers"
    );
    Ok(elapsed)
}

fn crossbeam_queue(items: u64, capacity: u32, paced: bool) -> Duration {
    let queue = std::sync::Arc::new(ArrayQueue::<ProxyTrigger>::new(capacity as usize));
    let start = Instant::now();
    let producer = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            for i in 0..items {
                let mut t = trigger(i);
                while let Err(back) = queue.push(t) {
                    t = back;
                    std::hint::spin_loop();
                }
            }
        })
    };
    let mut sum = 0u64;
    let mut taken = 0;
    while taken < items {
        let mut drained = 0;
        while let Some(t) = queue.pop() {
            sum = sum.wrapping_add(t.decode().dst_offset);
            drained += 1;
        }
        taken += drained;
        if drained > 0 && paced {
            consumer_pacing::after_drain(drained);
        } else {
            std::hint::spin_loop();
        }
    }
    let elapsed = start.elapsed();
    producer.join().expect("producer thread");
    assert_eq!(sum, (0..items).map(|i| i & 0xffff_ffff).sum::<u64>());
    elapsed
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let items = args.items.max(1);
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..args.runs.max(1) {
        match oxccl_fifo(items, args.capacity) {
            Ok(d) => best.0 = best.0.min(d),
            Err(e) => {
                eprintln!("fifo_bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
        for paced in [false, true] {
            best.1 = best.1.min(crossbeam_queue(items, args.capacity, paced));
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e9 / items as f64;
    let (ours, theirs) = (per(best.0), per(best.1));
    println!(
        "fifo items={items} push_pop_ns={ours:.1} crossbeam_ns={theirs:.1} ratio={:.2}",
        ours / theirs
    );
    std::process::ExitCode::SUCCESS
}
