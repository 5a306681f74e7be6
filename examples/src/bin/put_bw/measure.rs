//! The measurement every rank runs: the port channel's timed runs for each size, then the
//! baseline's, and rank 0's output line.

use crate::Args;
use crate::memcpy_baseline::SharedCopy;
use crate::tcp_baseline::TcpStreamPair;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, Error, Result, TransportChoice};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::figure;
use oxccl_kernels::put_bandwidth::port_put_bandwidth;
use std::time::{Duration, Instant};

/// The baseline a run is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Baseline {
    /// One thread copying between two shared memory mappings.
    Memcpy,
    /// One TCP stream between the two ranks.
    Tcp,
}

impl Baseline {
    fn name(self) -> &'static str {
        match self {
            Baseline::Memcpy => "memcpy",
            Baseline::Tcp => "tcp",
        }
    }
}

/// What one size gave.
struct Figure {
    bytes: u64,
    /// The channel's best run: bytes delivered per second.
    bytes_per_s: f64,
    /// The baseline's best run.
    baseline_bytes_per_s: f64,
}

impl Figure {
    /// The program's output line.
    fn line(&self, transport: &str, baseline: Baseline) -> String {
        let gbps = self.bytes_per_s / 1e9;
        let baseline_gbps = self.baseline_bytes_per_s / 1e9;
        format!(
            "put_bw transport={transport} bytes={} gbps={} baseline={} baseline_gbps={} ratio={}",
            self.bytes,
            figure(gbps),
            baseline.name(),
            figure(baseline_gbps),
            figure(gbps / baseline_gbps.max(1e-12)),
        )
    }
}

/// Runs both ranks as threads of this process; rank 0 prints.
///
/// # Errors
/// Every failing rank's error.
pub(crate) fn run_in_process(args: &Args) -> Result<()> {
    let config = InProcessConfig {
        communicator: args.communicator_config(),
        ..InProcessConfig::default()
    };
    in_process::run(2, config, |comm| rank_body(comm, args)).map(drop)
}

/// Runs this process's rank of a job a launcher started; rank 0 prints.
///
/// # Errors
/// A failed set-up, run or exchange.
pub(crate) fn run_launched(args: &Args) -> Result<()> {
    let mut comm = Communicator::from_env(args.communicator_config())?;
    rank_body(&mut comm, args)
}

/// One rank's part: rank 0 sends and prints, rank 1 receives.
fn rank_body(comm: &mut Communicator, args: &Args) -> Result<()> {
    if comm.size() != 2 {
        return Err(Error::InvalidUsage(format!(
            "put_bw runs on 2 ranks, this job has {}",
            comm.size()
        )));
    }
    let sizes = args.sizes();
    let largest = sizes.last().copied().ok_or_else(|| {
        Error::InvalidUsage(format!(
            "no size between --min-bytes {} and --max-bytes {}",
            args.min_bytes, args.max_bytes
        ))
    })?;
    let len = usize::try_from(largest)
        .map_err(|_| Error::InvalidUsage(format!("{largest} bytes do not fit in memory")))?;
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let buf = comm.alloc::<u8>(len)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    let chan = comm.port_channel(peer, &all[peer as usize], &all[rank as usize])?;
    let transport = chan.transport().name();
    let baseline = match args.transport {
        TransportChoice::HostIpc => Baseline::Memcpy,
        // A stream between the two nodes, as for Ethernet: what the network carries without
        // RDMA.
        TransportChoice::Ethernet | TransportChoice::Ib => Baseline::Tcp,
        TransportChoice::Auto if comm.out_of_band().single_node() => Baseline::Memcpy,
        TransportChoice::Auto => Baseline::Tcp,
    };
    let mut tcp = match baseline {
        Baseline::Tcp => Some(TcpStreamPair::connect(comm, args.timeout())?),
        Baseline::Memcpy => None,
    };
    let mut memcpy = match (baseline, rank) {
        (Baseline::Memcpy, 0) => Some(SharedCopy::new(len)?),
        _ => None,
    };
    let stream = comm.device().stream()?;
    let sender = u32::from(rank == 0);
    for &bytes in &sizes {
        let iters = args.iters(bytes);
        let run = |comm: &mut Communicator, iters: u32| -> Result<Duration> {
            comm.barrier()?;
            let start = Instant::now();
            port_put_bandwidth::launch(
                &stream,
                LaunchConfig::grid(1).block(1),
                chan.device_handle(),
                iters,
                sender,
                bytes,
            )?;
            comm.synchronize(&stream)?;
            Ok(start.elapsed())
        };
        // Untimed: faults the pages in and settles the proxy.
        run(comm, iters.min(4))?;
        let mut best = Duration::MAX;
        for _ in 0..args.runs.max(1) {
            best = best.min(run(comm, iters)?);
        }
        comm.barrier()?;
        let moved = bytes as f64 * f64::from(iters);
        let baseline_best = match (&mut tcp, &mut memcpy) {
            (Some(tcp), _) => tcp.best_of(comm, bytes, iters, args.runs)?,
            (None, Some(copy)) => copy.best_of(bytes, iters, args.runs),
            // Rank 1 of a memcpy baseline: rank 0 copies alone.
            (None, None) => Duration::MAX,
        };
        comm.barrier()?;
        if rank == 0 {
            let figure = Figure {
                bytes,
                bytes_per_s: moved / best.as_secs_f64().max(1e-12),
                baseline_bytes_per_s: moved / baseline_best.as_secs_f64().max(1e-12),
            };
            println!("{}", figure.line(transport, baseline));
        }
    }
    comm.check()
}
