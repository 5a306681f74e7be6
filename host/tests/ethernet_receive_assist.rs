//! A kernel thread that waits over Ethernet applies the peer's frames itself: alone in its
//! test binary, since it counts a thread's context switches by the thread's name, which
//! other tests of the same binary running at once would share.

mod common;

use common::config_with_assist;
use oxccl::TransportChoice;
use oxccl::in_process::{self, InProcessConfig};
use oxccl_device::launch::LaunchConfig;
use std::time::{Duration, Instant};

fn ethernet(assist: bool) -> InProcessConfig {
    let mut config = config_with_assist(assist);
    config.communicator.transport = TransportChoice::Ethernet;
    config
}

/// Context switches of this process's thread named `name` so far (voluntary and not), or
/// `None` if no thread has that name (of which Linux keeps the first 15 bytes).
fn context_switches_of(name: &str) -> Option<u64> {
    let name = &name.as_bytes()[..name.len().min(15)];
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end().as_bytes() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        let switches = status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        return Some(switches);
    }
    None
}

/// Guards against every Ethernet frame waking its receiver thread while a kernel waits for
/// it: a kernel thread that waits for the peer's signal applies the frames that have
/// arrived itself (`ethernet_receive_assist.rs`), so over a ping-pong of `ROUNDS` round
/// trips (each a write and a signal frame to each rank) the receiver threads, which used to
/// be switched in more than once a round trip (6,800 times for 4,000), stay parked but for
/// their periodic look (one a millisecond: 110-200 times over the 0.12-0.21 s it takes here).
/// Checked with the proxy executing triggers on its own thread and on the pushing kernel
/// thread.
#[test]
fn ethernet_receiver_thread_sleeps_while_kernels_wait() {
    const ROUNDS: u32 = 4000;
    for assist in [false, true] {
        in_process::run(2, ethernet(assist), |comm| {
            let (rank, peer) = (comm.rank(), 1 - comm.rank());
            let buf = comm.device().alloc_zeroed::<u8>(4096)?;
            let all = comm.all_gather_memory(&comm.register(&buf)?)?;
            let chan = comm.port_channel(peer, &all[peer as usize], &all[rank as usize])?;
            let stream = comm.device().stream()?;
            // One round first: connections admitted, receiver threads started.
            let ping = |rounds| {
                oxccl_kernels::pingpong::port_pingpong::launch(
                    &stream,
                    LaunchConfig::grid(1),
                    chan.device_handle(),
                    rounds,
                    u32::from(rank == 0),
                    64,
                )
            };
            ping(1)?;
            comm.synchronize(&stream)?;
            comm.barrier()?;
            let receiver = format!("oxccl-eth-r{rank}-from{peer}");
            // A new thread takes its name once it first runs, and the waiting kernel
            // threads may have applied the first round's frames before it did.
            let named_by = Instant::now() + Duration::from_secs(10);
            let before = loop {
                match context_switches_of(&receiver) {
                    Some(switches) => break switches,
                    None if Instant::now() < named_by => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    None => panic!("no thread named {receiver} after 10 s"),
                }
            };
            let start = Instant::now();
            ping(ROUNDS)?;
            comm.synchronize(&stream)?;
            let woken = context_switches_of(&receiver).expect("the receiver thread") - before;
            // Its periodic looks, one a millisecond (two allowed, and a quarter of the
            // round trips for hand-overs), on a machine as slow as it may be; never as
            // many as one a round trip, which the receiver woken per frame exceeded.
            let elapsed = start.elapsed();
            let looks = u64::try_from(2 * elapsed.as_millis()).unwrap_or(u64::MAX);
            let allowed = (u64::from(ROUNDS) / 4).saturating_add(looks);
            // Round trips longer than a waiting thread's cover (1 ms: a machine so loaded
            // that the kernel threads are off their cores for whole time slices) leave the
            // frames to the receiver threads, as they should: then only the looks' bound.
            let per_round_trip = if elapsed < Duration::from_millis(u64::from(ROUNDS)) {
                u64::from(ROUNDS)
            } else {
                u64::MAX
            };
            assert!(
                woken < allowed.min(per_round_trip),
                "assist {assist}, rank {rank}: the receiver thread was switched in {woken} \
                 times over {ROUNDS} round trips ({elapsed:?})"
            );
            comm.barrier()
        })
        .unwrap();
    }
}
