//! A rank whose process ends mid-exchange: the other ranks' pending waits end with an error
//! naming it, long before their wait limit, and nobody hangs.
//!
//! The parent test re-runs this test binary once per rank with `child_rank` selected; the
//! victim ends its own process in the middle of the exchange without dropping anything, as
//! a kill does: no destructor runs, the system closes its sockets.
#![allow(missing_docs)]

use oxccl::{Communicator, CommunicatorConfig, Result};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::ring_exchange::port_ring_exchange;
use oxccl_testing::{Job, child_rank};
use std::time::{Duration, Instant};

/// The device wait limit of the ranks: a survivor that noticed the death only through it
/// would take this long.
const WAIT_LIMIT: Duration = Duration::from_secs(40);

/// Longest the whole job may take before its children are killed.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// The rank that dies, and after how many exchanges.
const VICTIM: u32 = 1;
const ROUNDS_BEFORE_DEATH: u32 = 20;

/// Exit status of the victim, so the parent tells its end from a failure.
const VICTIM_EXIT: i32 = 77;

/// Exchanges around the ring until something fails; the victim ends its process midway.
/// Returns the error that ended the exchanges.
fn exchange_until_failure() -> Result<String> {
    let mut comm = Communicator::from_env(CommunicatorConfig {
        wait_timeout: WAIT_LIMIT,
        proxy_assist: false,
        ..Default::default()
    })?;
    let (rank, ranks) = (comm.rank(), comm.size());
    let chunk_bytes = 64u64 << 10;
    let buf = comm.alloc_zeroed::<u8>((chunk_bytes * u64::from(ranks)) as usize)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    let (to_next, to_prev) = comm.ring_port_channels(&all, &all[rank as usize])?;
    let stream = comm.device().stream()?;
    for round in 0.. {
        if rank == VICTIM && round == ROUNDS_BEFORE_DEATH {
            // Mid-exchange: the neighbours' kernels of this round wait for our signals.
            std::process::exit(VICTIM_EXIT);
        }
        let run = port_ring_exchange::launch(
            &stream,
            LaunchConfig::grid(1).block(1),
            to_next.device_handle(),
            to_prev.device_handle(),
            rank,
            ranks,
            chunk_bytes,
        )
        .and_then(|()| comm.synchronize(&stream));
        if let Err(e) = run {
            return Ok(format!("round {round}: {e}"));
        }
    }
    unreachable!("the loop ends by returning")
}

/// The child role over `OXCCL_TRANSPORT` of the parent.
#[test]
#[ignore = "the child role of the multi-process tests, started by them"]
fn child_dead_peer_role() {
    assert!(
        child_rank().is_some(),
        "run by the multi-process tests only"
    );
    match exchange_until_failure() {
        // On its own line: the test harness prints the test's name before it.
        Ok(error) => println!("\nCHILD-STOPPED {error}"),
        Err(e) => panic!("rank failed before the exchanges: {e}"),
    }
}

/// Starts 3 ranks with `transport`; checks the victim died as planned and that both
/// others reported an error naming it, well before their wait limit.
fn dead_peer_is_reported_over(transport: &str) {
    let ranks = 3;
    let port = oxccl_testing::free_port();
    let mut job = Job::new(ranks);
    job.child_test("child_dead_peer_role")
        .deadline(JOB_TIMEOUT)
        .env_all("OXCCL_TRANSPORT", transport)
        .env_all("WORLD_SIZE", ranks.to_string())
        .env_all("LOCAL_WORLD_SIZE", ranks.to_string())
        .env_all("MASTER_ADDR", "127.0.0.1")
        .env_all("MASTER_PORT", port.to_string())
        .env_all("OXCCL_SECRET", "00112233445566778899aabbccddeeff");
    for r in 0..ranks {
        job.env(r, "RANK", r.to_string())
            .env(r, "LOCAL_RANK", r.to_string());
    }
    let started = Instant::now();
    let outcomes = job.run().unwrap();
    let took = started.elapsed();
    for outcome in &outcomes {
        if outcome.rank == VICTIM as usize {
            assert_eq!(outcome.status.code(), Some(VICTIM_EXIT), "{outcome}");
            continue;
        }
        let line = outcome.find_line("CHILD-STOPPED").unwrap_or_default();
        println!("rank {}: {line}", outcome.rank);
        assert!(outcome.success(), "{outcome}");
        assert!(
            line.contains(&format!("lost peer {VICTIM}")),
            "{line}\n{outcome}"
        );
    }
    assert!(
        took < WAIT_LIMIT / 2,
        "the survivors took {took:?}: they waited out their limit instead of noticing"
    );
}

/// Guards against survivors of a killed rank waiting out their wait limit (or forever)
/// when its Ethernet connections close: the receiver must take a close without a goodbye
/// as the peer's death and stop the rank's waits with an error naming it.
#[test]
fn dead_peer_is_reported() {
    dead_peer_is_reported_over("ethernet");
}

/// Guards against the same over host IPC, where no connection closes: the survivors watch
/// the process of every peer whose memory they map, and its end without a goodbye must stop
/// their waits with an error naming it.
#[test]
fn dead_peer_is_reported_over_host_ipc() {
    dead_peer_is_reported_over("host-ipc");
}
