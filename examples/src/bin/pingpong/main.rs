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
//!
//! `--processes N` runs the measurement in N fresh processes, one after another, prints
//! each one's line and then
//! `pingpong_summary channel=<c> assist=<on|off> processes=<N> median_ratio=<x> max_ratio=<y>
//! median_round_trip_us=<t> max_round_trip_us=<u> baseline_atomic_us=<lo>-<hi>`:
//! a state a process settles into for its whole life shows in the spread, which the best of
//! `--runs` inside one process cannot show. The round trips and the baselines' range are
//! there to tell a slow process from a fast baseline (on a virtual machine the two-thread
//! baseline moves several-fold between processes, with where the vCPUs land).
//! `--thread-stats` adds a line per thread of the process (CPU time, voluntary and
//! involuntary context switches, from `/proc`).

mod measure;
mod processes;

use clap::{Parser, ValueEnum};

/// Whether pushing kernel threads may execute proxy work themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Assist {
    /// Proxy assist on (the CPU backend's default).
    On,
    /// The proxy thread executes every trigger.
    Off,
}

impl Assist {
    fn name(self) -> &'static str {
        match self {
            Assist::On => "on",
            Assist::Off => "off",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Channel {
    /// Proxy-driven: signals travel through the trigger FIFO and the proxy thread.
    Port,
    /// Direct: kernels raise each other's semaphores.
    Memory,
}

impl Channel {
    fn name(self) -> &'static str {
        match self {
            Channel::Port => "port",
            Channel::Memory => "memory",
        }
    }
}

/// Measures the round-trip latency of a channel between two ranks.
#[derive(Parser, Debug)]
struct Args {
    /// Channel kind.
    #[arg(long, value_enum, default_value = "port")]
    channel: Channel,
    /// Round trips to time.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 10_000)]
    iters: u32,
    /// Bytes carried by each message (0: signals only).
    #[arg(long, default_value_t = 0)]
    bytes: u64,
    /// Timed runs of the channel and of the baseline; the best of each is reported, so a
    /// run disturbed by the OS scheduler does not decide the figure.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 5)]
    runs: u32,
    /// Proxy assist (port channels): `on` lets the pushing kernel thread execute its own
    /// trigger when the proxy thread is idle; `off` leaves every trigger to the proxy thread.
    #[arg(long, value_enum, default_value = "on")]
    assist: Assist,
    /// Run the measurement in this many fresh processes, one after another, and add a
    /// summary line (median and largest ratio).
    #[arg(long, value_name = "N")]
    processes: Option<u32>,
    /// After the measurement, print each thread's CPU time and context switches.
    #[arg(long)]
    thread_stats: bool,
    /// Backend of both ranks' devices: `auto`, `cpu` (the emulator) or `cuda`.
    #[arg(long, env = oxccl::backend::BACKEND_ENV, default_value = "cpu", value_parser = oxccl_examples::collective_bench::options::parse_backend)]
    backend: oxccl::Backend,
}

fn main() -> std::process::ExitCode {
    oxccl_examples::init_logging();
    let args = Args::parse();
    let outcome = match args.processes {
        Some(n) => processes::run_processes(&args, n),
        None => measure::run(&args)
            .map(|m| {
                println!("{}", m.line());
                for line in m.thread_lines() {
                    println!("{line}");
                }
            })
            .map_err(|e| e.to_string()),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
