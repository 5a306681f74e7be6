//! One measurement: the channel's round trip between two ranks of this process, and the
//! atomic baseline, each the best of `--runs`, the baseline's runs taken between the
//! channel's.

use crate::{Args, Assist, Channel};
use oxccl::Result;
use oxccl::in_process::{self, InProcessConfig};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::thread_stats::Snapshot;
use oxccl_examples::{atomic_pingpong, micros};
use oxccl_kernels::pingpong::{memory_pingpong, port_pingpong};
use std::time::{Duration, Instant};

/// How long `--thread-stats` watches the threads after the timed runs, with nothing to do.
const IDLE_WINDOW: Duration = Duration::from_millis(1000);

/// What one measurement found.
pub(crate) struct Measurement {
    channel: Channel,
    assist: Assist,
    iters: u32,
    round_trip: Duration,
    baseline: Duration,
    /// With `--thread-stats`: every thread's counters before and after the timed runs, and
    /// after an idle window that follows them.
    threads: Option<[Snapshot; 3]>,
}

impl Measurement {
    /// The channel's round trip over the baseline's.
    pub(crate) fn ratio(&self) -> f64 {
        self.round_trip.as_secs_f64() / self.baseline.as_secs_f64().max(1e-12)
    }

    /// What each thread did during the timed runs, then during the idle window (with
    /// `--thread-stats`; else nothing).
    pub(crate) fn thread_lines(&self) -> Vec<String> {
        let Some([before, after, idle]) = &self.threads else {
            return Vec::new();
        };
        let mut lines = after.lines_since(before);
        lines.push(format!(
            "idle_window ms={} (both ranks idle, channels open)",
            IDLE_WINDOW.as_millis()
        ));
        lines.extend(idle.lines_since(after));
        lines
    }

    /// The program's output line.
    pub(crate) fn line(&self) -> String {
        format!(
            "pingpong channel={} assist={} ranks=2 iters={} round_trip_us={} baseline_atomic_us={} ratio={:.2}",
            self.channel.name(),
            self.assist.name(),
            self.iters,
            micros(self.round_trip),
            micros(self.baseline),
            self.ratio()
        )
    }
}

/// Measures as `args` say.
pub(crate) fn run(args: &Args) -> Result<Measurement> {
    let iters = args.iters.max(1);
    let warmup = (iters / 10).clamp(1, 1000);
    let mut config = InProcessConfig::default();
    config.communicator.proxy_assist = args.assist == Assist::On;
    config.backend = args.backend;
    let times = in_process::run(2, config, |comm| {
        let buf = comm.alloc::<u8>(args.bytes.max(8) as usize)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let mine = all[rank as usize].clone();
        let stream = comm.device().stream()?;
        let cfg = LaunchConfig::grid(1).block(1);
        let launch = |n: u32,
                      comm: &mut oxccl::Communicator,
                      port: &Option<oxccl::PortChannel>,
                      mem: &Option<oxccl::MemoryChannel>|
         -> Result<Duration> {
            comm.barrier()?;
            let start = Instant::now();
            if let Some(p) = port {
                port_pingpong::launch(
                    &stream,
                    cfg,
                    p.device_handle(),
                    n,
                    u32::from(rank == 0),
                    args.bytes,
                )?;
            }
            if let Some(m) = mem {
                memory_pingpong::launch(
                    &stream,
                    cfg,
                    m.device_handle(),
                    n,
                    u32::from(rank == 0),
                    args.bytes,
                )?;
            }
            comm.synchronize(&stream)?;
            Ok(start.elapsed())
        };
        let (port, mem) = match args.channel {
            Channel::Port => (
                Some(comm.port_channel(peer, &all[peer as usize], &mine)?),
                None,
            ),
            Channel::Memory => (
                None,
                Some(comm.memory_channel(peer, &all[peer as usize], &mine, None)?),
            ),
        };
        launch(warmup, comm, &port, &mem)?;
        // Rank 0 takes the snapshots while every thread of both ranks is alive: the peer
        // waits at the barrier below until the second one is taken.
        let stats = args.thread_stats && rank == 0;
        let before = stats.then(Snapshot::take);
        let (mut best, mut baseline) = (Duration::MAX, Duration::MAX);
        for _ in 0..args.runs.max(1) {
            best = best.min(launch(iters, comm, &port, &mem)?);
            if !args.thread_stats {
                baseline = baseline.min(baseline_run(comm, iters)?);
            }
        }
        let after = stats.then(Snapshot::take);
        // The idle window: what the threads of a communicator with nothing to do cost.
        let idle = stats.then(|| {
            std::thread::sleep(IDLE_WINDOW);
            Snapshot::take()
        });
        // With `--thread-stats` the baseline runs after the windows the snapshots watch.
        if args.thread_stats {
            for _ in 0..args.runs.max(1) {
                baseline = baseline.min(baseline_run(comm, iters)?);
            }
        }
        comm.barrier()?;
        let threads = match (before, after, idle) {
            (Some(b), Some(a), Some(i)) => Some([b, a, i]),
            _ => None,
        };
        Ok((best, baseline, threads))
    })?;
    let Some((best, baseline, threads)) = times.into_iter().next() else {
        return Err(oxccl::Error::Internal("no result from rank 0".into()));
    };
    Ok(Measurement {
        channel: args.channel,
        assist: args.assist,
        iters,
        round_trip: best / iters,
        baseline,
        threads,
    })
}

/// One run of the atomic baseline, of `iters` round trips, between each of the channel's
/// runs: taken beside them, it sees the cores as they do (on a virtual machine the
/// latency between two vCPUs moves with where the host places them, within a process
/// too: a baseline taken after all the channel's runs made their ratio 0.6-3.4 across 30
/// processes whose round trips were all 0.20-0.33 µs). Rank 0 runs it on its host thread
/// and one more, while rank 1 waits at the next barrier, asleep; rank 1 reports none.
fn baseline_run(comm: &oxccl::Communicator, iters: u32) -> Result<Duration> {
    comm.barrier()?;
    Ok(match comm.rank() {
        0 => atomic_pingpong(u64::from(iters)),
        _ => Duration::MAX,
    })
}
