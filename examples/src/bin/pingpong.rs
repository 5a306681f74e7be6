//! Channel round-trip latency between two ranks, against a plain atomic ping-pong measured
//! in the same run.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin pingpong -- --channel port --iters 10000
//! pingpong channel=port assist=on ranks=2 iters=10000 round_trip_us=<x> baseline_atomic_us=<y> ratio=<x/y>
//! ```
//!
//! On a port channel, `--assist on` (the default, as in `CommunicatorConfig`) lets the
//! pushing kernel thread execute its own trigger when the proxy thread is not busy;
//! `--assist off` has the proxy thread execute every trigger, as on a GPU.

use clap::{Parser, ValueEnum};
use oxccl::Result;
use oxccl::in_process::{self, InProcessConfig};
use oxccl_device::kernels::pingpong::{memory_pingpong, port_pingpong};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::{atomic_pingpong, micros};
use std::time::{Duration, Instant};

/// Whether pushing kernel threads may execute proxy work themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Assist {
    /// Proxy assist on (the CPU backend's default).
    On,
    /// The proxy thread executes every trigger.
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Channel {
    /// Proxy-driven: signals travel through the trigger FIFO and the proxy thread.
    Port,
    /// Direct: kernels raise each other's semaphores.
    Memory,
}

/// Measures the round-trip latency of a channel between two ranks.
#[derive(Parser, Debug)]
struct Args {
    /// Channel kind.
    #[arg(long, value_enum, default_value = "port")]
    channel: Channel,
    /// Round trips to time.
    #[arg(long, default_value_t = 10_000)]
    iters: u32,
    /// Bytes carried by each message (0: signals only).
    #[arg(long, default_value_t = 0)]
    bytes: u64,
    /// Timed runs of the channel and of the baseline; the best of each is reported, so a
    /// run disturbed by the OS scheduler does not decide the figure.
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Proxy assist (port channels): `on` lets the pushing kernel thread execute its own
    /// trigger when the proxy thread is idle; `off` leaves every trigger to the proxy thread.
    #[arg(long, value_enum, default_value = "on")]
    assist: Assist,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pingpong: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<String> {
    let iters = args.iters.max(1);
    let warmup = (iters / 10).clamp(1, 1000);
    let mut config = InProcessConfig::default();
    config.communicator.proxy_assist = args.assist == Assist::On;
    let times = in_process::run(2, config, |comm| {
        let buf = comm.alloc::<u8>(args.bytes.max(8) as usize)?;
        let all = comm.all_gather_memory(&comm.register(&buf))?;
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
                    (p.device_handle(), n, u32::from(rank == 0), args.bytes),
                )?;
            }
            if let Some(m) = mem {
                memory_pingpong::launch(
                    &stream,
                    cfg,
                    (m.device_handle(), n, u32::from(rank == 0), args.bytes),
                )?;
            }
            comm.synchronize(&stream)?;
            let elapsed = start.elapsed();
            Ok(elapsed)
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
        let mut best = Duration::MAX;
        for _ in 0..args.runs.max(1) {
            best = best.min(launch(iters, comm, &port, &mem)?);
        }
        Ok(best)
    })?;
    let round_trip = times[0] / iters;
    let baseline = (0..args.runs.max(1))
        .map(|_| atomic_pingpong(u64::from(iters)))
        .min()
        .unwrap_or(Duration::MAX);
    let ratio = round_trip.as_secs_f64() / baseline.as_secs_f64().max(1e-12);
    let channel = match args.channel {
        Channel::Port => "port",
        Channel::Memory => "memory",
    };
    let assist = match args.assist {
        Assist::On => "on",
        Assist::Off => "off",
    };
    Ok(format!(
        "pingpong channel={channel} assist={assist} ranks=2 iters={iters} round_trip_us={} baseline_atomic_us={} ratio={ratio:.2}",
        micros(round_trip),
        micros(baseline)
    ))
}
