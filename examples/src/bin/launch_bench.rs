//! What a kernel launch costs on the CPU emulator (or, `--backend cuda`, on a GPU): an empty
//! kernel launched and synchronized in a loop, against two thread hand-offs timed in the
//! same run.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin launch_bench -- --threads 1,4 --streams 1,2
//! launch backend=<b> threads=<t> streams=<s> launch_sync_us=<x> batch_us=<b> baseline_atomic_us=<a> baseline_condvar_us=<c>
//! ```
//!
//! - `launch_sync_us`: one launch of an empty kernel (one block of `threads` threads)
//!   followed by `synchronize`, per iteration: a kernel's fixed cost to a host that waits
//!   for each one.
//! - `batch_us`: `--batch` launches back to back, then one `synchronize`, per launch: what a
//!   launch costs when the host does not wait for each.
//! - `streams`: that many host threads, each with its own device and stream, run the loop
//!   at the same time (as ranks do), so threads share cores; the slowest one's figure.
//! - `baseline_atomic_us`: round trip of a plain two-thread ping-pong over two atomics
//!   (both threads spinning): the floor of any hand-off between two threads.
//! - `baseline_condvar_us`: round trip of a job handed to a thread that sleeps on a
//!   condition variable, and of its answer, for which the host sleeps too: what a hand-off
//!   costs when neither side spins.
//!
//! Every figure is the best of `--runs` runs, so a run disturbed by other work on the
//! machine does not decide it.

use clap::Parser;
use oxccl::{Backend, Device, Result, Stream};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::{atomic_pingpong, micros};
use oxccl_kernels::device_check::empty_kernel;
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Measures launch + synchronize of an empty kernel.
#[derive(Parser, Debug)]
struct Args {
    /// Threads per launch (one block), a comma-separated list.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_delimiter = ',', default_value = "1,4")]
    threads: Vec<u32>,
    /// Host threads launching at the same time, each on its own device, a comma-separated
    /// list.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_delimiter = ',', default_value = "1,2")]
    streams: Vec<u32>,
    /// Launch + synchronize iterations per run.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 20_000)]
    iters: u32,
    /// Launches per `synchronize` in the batched measurement.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 20)]
    batch: u32,
    /// Runs of each measurement; the best is reported.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 5)]
    runs: u32,
    /// Only these measurements (for profiling one of them), a comma-separated list.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "launch-sync,batch,baselines"
    )]
    only: Vec<Measure>,
    /// Where the kernels run: `cpu` (the emulator), `cuda` (GPU 0; with several streams,
    /// each its own `Device` of the GPUs in turn), or `auto`.
    #[arg(long, env = oxccl::backend::BACKEND_ENV, default_value = "cpu", value_parser = oxccl_examples::collective_bench::options::parse_backend)]
    backend: Backend,
}

/// One of the program's measurements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Measure {
    /// Launch + synchronize per iteration.
    LaunchSync,
    /// `--batch` launches per synchronize.
    Batch,
    /// The atomic and condition-variable hand-offs.
    Baselines,
}

fn main() -> std::process::ExitCode {
    oxccl_examples::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("launch_bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<()> {
    let backend = a.backend.resolve();
    let runs = a.runs.max(1);
    let iters = a.iters.max(1);
    for &streams in &a.streams {
        for &threads in &a.threads {
            let best = |f: &dyn Fn() -> Result<Duration>| -> Result<Duration> {
                (0..runs).try_fold(Duration::MAX, |best, _| Ok(best.min(f()?)))
            };
            let config = LaunchConfig::grid(1).block(threads.max(1));
            let wanted = |m| a.only.contains(&m);
            let launch_sync = if !wanted(Measure::LaunchSync) {
                None
            } else {
                Some(best(&|| {
                    on_streams(backend, streams, |stream| {
                        time_per(iters, || {
                            empty_kernel::launch(stream, config)?;
                            stream.synchronize()
                        })
                    })
                })?)
            };
            let batches = (iters / a.batch.max(1)).max(1);
            let batch = if !wanted(Measure::Batch) {
                None
            } else {
                Some(best(&|| {
                    on_streams(backend, streams, |stream| {
                        let per_batch = time_per(batches, || {
                            for _ in 0..a.batch.max(1) {
                                empty_kernel::launch(stream, config)?;
                            }
                            stream.synchronize()
                        })?;
                        Ok(per_batch / a.batch.max(1))
                    })
                })?)
            };
            let (atomic, condvar) = if !wanted(Measure::Baselines) {
                (None, None)
            } else {
                let atomic = (0..runs)
                    .map(|_| atomic_pingpong(u64::from(iters)))
                    .min()
                    .unwrap_or_default();
                let condvar = (0..runs)
                    .map(|_| condvar_pingpong(iters))
                    .min()
                    .unwrap_or_default();
                (Some(atomic), Some(condvar))
            };
            // A measurement left out by `--only` prints as `-`.
            let us = |d: Option<Duration>| d.map_or_else(|| "-".to_string(), micros);
            println!(
                "launch backend={backend} threads={threads} streams={streams} launch_sync_us={} batch_us={} baseline_atomic_us={} baseline_condvar_us={}",
                us(launch_sync),
                us(batch),
                us(atomic),
                us(condvar)
            );
        }
    }
    Ok(())
}

/// Runs `body` on `streams` host threads at once, each with a stream of its own device, and
/// returns the largest figure it returned.
fn on_streams(
    backend: Backend,
    streams: u32,
    body: impl Fn(&Stream) -> Result<Duration> + Sync,
) -> Result<Duration> {
    let start = Barrier::new(streams.max(1) as usize);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..streams.max(1))
            .map(|i| {
                let (start, body) = (&start, &body);
                scope.spawn(move || {
                    let stream = Device::for_local_rank(backend, i as usize)?.stream()?;
                    // Untimed: spawns the pool's workers and warms the caches.
                    empty_kernel::launch(&stream, LaunchConfig::grid(1))?;
                    stream.synchronize()?;
                    start.wait();
                    body(&stream)
                })
            })
            .collect();
        workers
            .into_iter()
            .try_fold(Duration::ZERO, |slowest, worker| {
                Ok(slowest.max(worker.join().expect("launching thread")?))
            })
    })
}

/// Mean time of `iters` calls of `f`.
fn time_per(iters: u32, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok(start.elapsed() / iters.max(1))
}

/// Round trip of a job handed through a mutex and condition variable to a thread that
/// sleeps on it, and of the answer handed back the same way.
fn condvar_pingpong(iters: u32) -> Duration {
    // (jobs posted, jobs done)
    let state = Arc::new((Mutex::new((0u32, 0u32)), Condvar::new(), Condvar::new()));
    let worker = {
        let state = state.clone();
        std::thread::spawn(move || {
            let (lock, posted, done) = &*state;
            let mut s = lock.lock().expect("lock");
            for i in 1..=iters {
                while s.0 < i {
                    s = posted.wait(s).expect("lock");
                }
                s.1 = i;
                done.notify_one();
            }
        })
    };
    let (lock, posted, done) = &*state;
    let start = Instant::now();
    for i in 1..=iters {
        let mut s = lock.lock().expect("lock");
        s.0 = i;
        posted.notify_one();
        while s.1 < i {
            s = done.wait(s).expect("lock");
        }
    }
    let elapsed = start.elapsed();
    worker.join().expect("condvar worker");
    elapsed / iters.max(1)
}
