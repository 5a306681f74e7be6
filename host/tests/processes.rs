//! Ranks as separate processes on the CPU backend: each process joins through the TCP
//! bootstrap (torchrun variables), maps its peers' device memory (memfd shared between the
//! processes), and runs the port ring, the memory ring, the ring all-reduce, the
//! communicator's all-reduce on registered buffers (read in the peers' processes), and its
//! eager packet broadcasts and reduces back to back.
//!
//! Then again with `OXCCL_TRANSPORT=ethernet`: the port ring and the communicator's
//! all-reduce (over port channels) over TCP between processes.
//!
//! The parent test re-runs this test binary once per rank with `child_rank` selected.
#![allow(missing_docs)]

mod common;

use common::{assert_all_gathered, assert_all_reduce_sums, exchange_over_both_rings, ring_buffer};
use oxccl::{
    CollectiveConfig, Communicator, CommunicatorConfig, Error, IdlePolicy, PollSchedule, ReduceOp,
    Result, TransportChoice,
};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};
use oxccl_kernels::ring_exchange::port_ring_exchange;
use oxccl_testing::{Job, child_rank};
use std::time::Duration;

/// Longest a whole job may take before its children are killed.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

fn run_rank() -> Result<u32> {
    let mut comm = Communicator::from_env(CommunicatorConfig {
        wait_timeout: Duration::from_secs(30),
        proxy_assist: false,
        ..Default::default()
    })?;
    let (rank, ranks) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;

    // Port channels (the proxy copies into the peer process's mapped memory), then memory
    // channels (kernel threads store into it directly).
    exchange_over_both_rings(&mut comm, &stream, 3001, 2)?;

    // All-reduce across processes.
    let n = 10_007usize;
    let value = |r: u32, i: usize| ((i * 7 + r as usize * 13) % 101) as f32;
    let mut host = vec![0f32; 2 * n];
    for (i, v) in host.iter_mut().take(n).enumerate() {
        *v = value(rank, i);
    }
    let work = comm.device().alloc_from(&host)?;
    let all = comm.all_gather_memory(&comm.register(&work)?)?;
    let (next, prev) = comm.ring_memory_channels(&all, &all[rank as usize], None)?;
    let args = RingAllReduceArgs {
        next: next.device_handle(),
        prev: prev.device_handle(),
        input: work.view(),
        work: work.view_mut(),
        n: n as u64,
        capacity: n as u64,
        rank,
        n_ranks: ranks,
    };
    ring_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(1).block(2), args)?;
    comm.synchronize(&stream)?;
    let got = work.to_vec()?;
    for (i, &have) in got.iter().take(n).enumerate() {
        let want: f32 = (0..ranks).map(|r| value(r, i)).sum();
        assert_eq!(have, want, "all-reduce: rank {rank} element {i}");
    }

    // The communicator's all-reduce on registered buffers: each rank reads its peers'
    // buffers in their processes, out of place and in place.
    let count = 100_003usize;
    let mine: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
    let mut send = comm.device().alloc_from(&mine)?;
    let mut recv = comm.alloc::<f32>(count)?;
    comm.register_collective_buffer(&send)?;
    comm.register_collective_buffer(&recv)?;
    comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
    comm.all_reduce_in_place(&mut send, count, ReduceOp::Sum, &stream)?;
    comm.synchronize(&stream)?;
    let (out, in_place) = (recv.to_vec()?, send.to_vec()?);
    for i in 0..count {
        let want: f32 = (0..ranks).map(|r| value(r, i)).sum();
        assert_eq!(
            out[i], want,
            "registered all-reduce: rank {rank} element {i}"
        );
        assert_eq!(
            in_place[i], want,
            "registered, in place: rank {rank} element {i}"
        );
    }
    eager_packets_back_to_back(&mut comm, &stream)?;
    comm.barrier()?;
    Ok(rank)
}

/// Small broadcasts from rank 0, then small reduces to the last rank (eager packets: each
/// sender runs ahead of its receivers, through memory shared between the processes), then
/// an all-reduce after the switch, all back to back; every output is checked at the end.
fn eager_packets_back_to_back(comm: &mut Communicator, stream: &oxccl::Stream) -> Result<()> {
    let (rank, ranks, count) = (comm.rank(), comm.size(), 37usize);
    let data = |r: u32, call: u32| -> Vec<i32> {
        (0..count)
            .map(|i| i as i32 * 3 + r as i32 * 100 + call as i32)
            .collect()
    };
    let mut kept = vec![];
    for call in 0..9u32 {
        let send = comm.device().alloc_from(&data(rank, call))?;
        let mut recv = comm.device().alloc_from(&vec![0i32; count])?;
        match call {
            0..4 => comm.broadcast(&send, &mut recv, count, 0, stream)?,
            4..8 => comm.reduce(&send, &mut recv, count, ReduceOp::Sum, ranks - 1, stream)?,
            _ => comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, stream)?,
        }
        kept.push((call, send, recv));
    }
    comm.synchronize(stream)?;
    for (call, _, recv) in &kept {
        let sum = || {
            (0..ranks)
                .map(|r| data(r, *call))
                .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x + y).collect())
                .unwrap_or_default()
        };
        let want = match call {
            0..4 => data(0, *call),
            4..8 if rank != ranks - 1 => vec![0; count],
            _ => sum(),
        };
        assert_eq!(recv.to_vec()?, want, "rank {rank}, call {call}");
    }
    Ok(())
}

/// One rank of a job whose `OXCCL_TRANSPORT` is `ethernet`: the port ring over TCP, with
/// chunks larger than a wire chunk; a memory channel is refused. The proxy polls, as it does
/// on a GPU: its FIFO has no doorbell, so nothing but its polling finds the triggers.
fn run_rank_over_ethernet() -> Result<u32> {
    let mut comm = Communicator::from_env(CommunicatorConfig {
        wait_timeout: Duration::from_secs(30),
        proxy_assist: false,
        proxy_idle: Some(IdlePolicy::Poll(PollSchedule::default())),
        collectives: CollectiveConfig {
            port_direct_bytes: Some(0),
            ..Default::default()
        },
        ..Default::default()
    })?;
    assert_eq!(comm.proxy().fifo_cells().raw_parts().doorbell, 0);
    assert_eq!(comm.config().transport, TransportChoice::Ethernet);
    let (rank, ranks) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    let chunk = 70_001;
    let (buf, all) = ring_buffer(&comm, chunk)?;
    let (to_next, to_prev) = comm.ring_port_channels(&all, &all[rank as usize])?;
    port_ring_exchange::launch(
        &stream,
        LaunchConfig::grid(1).block(1),
        to_next.device_handle(),
        to_prev.device_handle(),
        rank,
        ranks,
        (chunk * 4) as u64,
    )?;
    comm.synchronize(&stream)?;
    assert_all_gathered(&comm, &buf, chunk, 0);
    let next = (rank + 1) % ranks;
    match comm.memory_channel(next, &all[next as usize], &all[rank as usize], None) {
        Err(Error::InvalidUsage(why)) => assert!(why.contains("load/store"), "{why}"),
        other => panic!("a memory channel over Ethernet: {other:?}"),
    }
    // The communicator's all-reduce between processes over Ethernet: port channels, several
    // rounds; staged, then put from registered inputs (the job puts from them at every
    // size).
    let value = |r: u32, i: usize| ((i * 3 + r as usize * 5) % 97) as f32;
    for registered in [false, true] {
        assert_all_reduce_sums(
            &mut comm,
            &stream,
            200_003,
            value,
            &format!("all-reduce over Ethernet, registered {registered}"),
            registered,
        )?;
    }
    comm.barrier()?;
    Ok(rank)
}

/// The child role over Ethernet (see [`run_rank_over_ethernet`]).
#[test]
#[ignore = "the child role of the multi-process tests, started by them"]
fn child_rank_ethernet_role() {
    assert!(
        child_rank().is_some(),
        "run by the multi-process tests only"
    );
    match run_rank_over_ethernet() {
        Ok(rank) => println!("\nCHILD-OK rank={rank}"),
        Err(e) => panic!("rank failed: {e}"),
    }
}

/// The child role of a job whose `OXCCL_TRANSPORT` names no transport: the communicator
/// must refuse to start, saying which variable is wrong.
#[test]
#[ignore = "the child role of the multi-process tests, started by them"]
fn child_rank_bad_transport_role() {
    assert!(
        child_rank().is_some(),
        "run by the multi-process tests only"
    );
    match Communicator::from_env(CommunicatorConfig::default()) {
        Err(Error::InvalidUsage(why)) if why.contains("OXCCL_TRANSPORT") => {
            println!("\nCHILD-OK rank={}", child_rank().unwrap_or(0))
        }
        other => panic!("a misspelt OXCCL_TRANSPORT gave {other:?}"),
    }
}

/// The child role: one rank of a job the parent started. Ignored in normal runs; the
/// parent runs it by name with `--ignored`.
#[test]
#[ignore = "the child role of the multi-process tests, started by them"]
fn child_rank_role() {
    assert!(
        child_rank().is_some(),
        "run by the multi-process tests only"
    );
    match run_rank() {
        // On its own line: the test harness prints the test's name before it.
        Ok(rank) => println!("\nCHILD-OK rank={rank}"),
        Err(e) => panic!("rank failed: {e}"),
    }
}

/// Starts `ranks` processes of this test binary as one job (torchrun's variables) and
/// checks every one finished its work.
fn run_job(ranks: usize) {
    run_job_as(ranks, "child_rank_role", &[]);
}

/// Starts `ranks` processes running the child test `role`, with `env` set in each.
fn run_job_as(ranks: usize, role: &str, env: &[(&str, &str)]) {
    let port = oxccl_testing::free_port();
    let mut job = Job::new(ranks);
    for (key, value) in env {
        job.env_all(key, value);
    }
    job.child_test(role)
        .deadline(JOB_TIMEOUT)
        .env_all("WORLD_SIZE", ranks.to_string())
        .env_all("LOCAL_WORLD_SIZE", ranks.to_string())
        .env_all("MASTER_ADDR", "127.0.0.1")
        .env_all("MASTER_PORT", port.to_string())
        .env_all("OXCCL_SECRET", "00112233445566778899aabbccddeeff");
    for r in 0..ranks {
        job.env(r, "RANK", r.to_string())
            .env(r, "LOCAL_RANK", r.to_string());
    }
    for outcome in job.run().unwrap() {
        let want = format!("CHILD-OK rank={}", outcome.rank);
        assert!(
            outcome.success() && outcome.find_line("CHILD-OK") == Some(want.as_str()),
            "{outcome}"
        );
    }
}

/// Guards against channels that only work between threads of one process: memory that is
/// not shared between processes, addresses of another process used as they are, a proxy
/// that cannot reach a peer's semaphore.
#[test]
fn two_ranks_as_processes() {
    run_job(2);
}

/// As above, with distinct next and previous ranks (three peers, three mapped objects each).
#[test]
fn three_ranks_as_processes() {
    run_job(3);
}

/// Guards against the Ethernet transport working only between threads of one process:
/// `OXCCL_TRANSPORT` not read by `Communicator::from_env`, a listener address or token that
/// does not survive the bootstrap exchange, registration ids of another process.
#[test]
fn three_ranks_as_processes_over_ethernet() {
    run_job_as(
        3,
        "child_rank_ethernet_role",
        &[("OXCCL_TRANSPORT", "ethernet")],
    );
}

/// Guards against a misspelt `OXCCL_TRANSPORT` silently running on another transport.
#[test]
fn misspelt_transport_is_refused() {
    run_job_as(
        1,
        "child_rank_bad_transport_role",
        &[("OXCCL_TRANSPORT", "ethernett")],
    );
}
