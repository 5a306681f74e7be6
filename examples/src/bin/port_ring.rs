//! A ring all-gather over port channels among the ranks a launcher started, checked on the
//! host: the smallest program that shows port channels work between the ranks of a job,
//! whatever transport each pair of neighbours gets.
//!
//! ```text
//! torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) \
//!     cargo run --release -p oxccl-examples --bin port_ring
//! port_ring rank=<r> ranks=<n> node=<host name> to_next=<transport> to_prev=<transport> ok
//! ```
//!
//! Each rank starts with its own chunk (`--chunk` 32-bit words, more than one Ethernet
//! frame by default) and ends with every rank's, `--rounds` times on the same channels.
//! The transport follows `OXCCL_TRANSPORT` (default `auto`: host IPC between ranks with the
//! same host name, Ethernet between the others). A wrong word, a failed channel or a wait
//! past `--timeout-s` ends the program with an error naming the rank.

use clap::Parser;
use oxccl::{Communicator, CommunicatorConfig, Error, Result};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::ring_exchange::port_ring_exchange;
use std::time::Duration;

/// Runs a port-channel ring all-gather among the ranks of a launched job.
#[derive(Parser, Debug)]
struct Args {
    /// 32-bit words each rank contributes.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), default_value_t = 70_001)]
    chunk: usize,
    /// All-gathers to run on the same channels.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    rounds: u32,
    /// Longest any single wait may take, in seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), default_value_t = 30)]
    timeout_s: u64,
}

/// The word at `index` of `rank`'s chunk in `round`.
fn word(rank: u32, index: usize, round: u32) -> u32 {
    (rank << 24) ^ (round << 20) ^ (index as u32).wrapping_mul(2_654_435_761)
}

fn run(args: &Args) -> Result<String> {
    let mut comm = Communicator::from_env(CommunicatorConfig {
        wait_timeout: Duration::from_secs(args.timeout_s.max(1)),
        ..Default::default()
    })?;
    let (rank, ranks) = (comm.rank(), comm.size());
    let chunk = args.chunk.max(1);
    let len = chunk
        .checked_mul(ranks as usize)
        .ok_or_else(|| Error::InvalidUsage(format!("{chunk} words times {ranks} ranks")))?;
    let mut buf = comm.alloc::<u32>(len)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    let (to_next, to_prev) = comm.ring_port_channels(&all, &all[rank as usize])?;
    let stream = comm.device().stream()?;
    let mut host = vec![0u32; len];
    for round in 0..args.rounds.max(1) {
        host.fill(0xdead_beef);
        for (i, w) in host[rank as usize * chunk..][..chunk]
            .iter_mut()
            .enumerate()
        {
            *w = word(rank, i, round);
        }
        buf.copy_from_host(&host)?;
        // Every rank's buffer is reset before any rank writes into it.
        comm.barrier()?;
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
        buf.copy_to_host(&mut host)?;
        for (at, &have) in host.iter().enumerate() {
            let (r, i) = ((at / chunk) as u32, at % chunk);
            if have != word(r, i, round) {
                return Err(Error::Internal(format!(
                    "rank {rank}: round {round}, word {i} of rank {r}'s chunk is {have:#x}, \
                     not {:#x}",
                    word(r, i, round)
                )));
            }
        }
        // No rank resets its buffer before every rank has checked its own.
        comm.barrier()?;
    }
    Ok(format!(
        "port_ring rank={rank} ranks={ranks} node={} to_next={} to_prev={} ok",
        oxccl::host_ipc::node_name(),
        to_next.transport(),
        to_prev.transport()
    ))
}

fn main() -> std::process::ExitCode {
    oxccl_examples::init_logging();
    match run(&Args::parse()) {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("port_ring: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
