//! All-reduce benchmark, nccl-tests style: for each size, out-of-place and in-place time,
//! algorithm and bus bandwidth, and the number of wrong elements.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin allreduce -- --ranks 2 --max-bytes 16M
//! ```
//!
//! Ranks are threads of one process, each on its own emulated device (CPU backend); the
//! kernel is `oxccl_device::kernels::all_reduce::ring_all_reduce_sum_f32` over memory
//! channels.

use clap::Parser;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, DeviceBuffer, MemoryChannel, Result, Stream};
use oxccl_device::kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::parse_bytes;
use std::time::Instant;

/// Measures all-reduce (sum of f32) across ranks.
#[derive(Parser, Debug)]
struct Args {
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Smallest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    min_bytes: u64,
    /// Largest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Factor between consecutive sizes.
    #[arg(long, default_value_t = 4)]
    step_factor: u64,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: u32,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Kernel threads per rank.
    #[arg(long, default_value_t = 1)]
    threads: u32,
}

/// Small integers, so every sum is exact in f32 whatever the order of additions.
fn value(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 101) as f32
}

struct Rank {
    work: DeviceBuffer<f32>,
    input: DeviceBuffer<f32>,
    next: MemoryChannel,
    prev: MemoryChannel,
    stream: Stream,
}

impl Rank {
    fn new(comm: &mut Communicator, max_n: usize) -> Result<Rank> {
        let rank = comm.rank();
        let work = comm.alloc::<f32>(2 * max_n)?;
        let input = comm
            .device()
            .alloc_from(&(0..max_n).map(|i| value(rank, i)).collect::<Vec<_>>())?;
        let all = comm.all_gather_memory(&comm.register(&work))?;
        let mine = all[rank as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        Ok(Rank {
            work,
            input,
            next,
            prev,
            stream: comm.device().stream()?,
        })
    }

    fn launch(&self, comm: &Communicator, n: usize, in_place: bool, threads: u32) -> Result<()> {
        let args = RingAllReduceArgs {
            next: self.next.device_handle(),
            prev: self.prev.device_handle(),
            input: if in_place {
                self.work.addr()
            } else {
                self.input.addr()
            },
            work: self.work.addr(),
            n: n as u64,
            rank: comm.rank(),
            n_ranks: comm.size(),
        };
        ring_all_reduce_sum_f32::launch(&self.stream, LaunchConfig::grid(1).block(threads), (args,))
    }

    /// Runs once from fresh inputs and counts wrong elements.
    fn check(
        &mut self,
        comm: &Communicator,
        n: usize,
        in_place: bool,
        threads: u32,
    ) -> Result<u64> {
        let fresh: Vec<f32> = (0..n).map(|i| value(comm.rank(), i)).collect();
        let mut host = self.work.to_vec()?;
        host[..n].copy_from_slice(&fresh);
        self.work.copy_from_host(&host)?;
        comm.barrier()?;
        self.launch(comm, n, in_place, threads)?;
        self.stream.synchronize()?;
        comm.check()?;
        comm.barrier()?;
        let got = self.work.to_vec()?;
        let ranks = comm.size();
        Ok((0..n)
            .filter(|&i| got[i] != (0..ranks).map(|r| value(r, i)).sum::<f32>())
            .count() as u64)
    }

    /// Mean time of one all-reduce over `iters` back-to-back launches, in microseconds.
    fn time(&self, comm: &Communicator, n: usize, in_place: bool, a: &Args) -> Result<f64> {
        for _ in 0..a.warmup {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..a.iters {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        let us = start.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64;
        comm.check()?;
        comm.barrier()?;
        Ok(us)
    }
}

/// One row: (bytes, out-of-place (time, wrong), in-place (time, wrong)).
type Row = (u64, (f64, u64), (f64, u64));

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("allreduce: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<bool> {
    let sizes: Vec<u64> = std::iter::successors(Some(a.min_bytes.max(4)), |&b| {
        b.checked_mul(a.step_factor.max(2))
    })
    .take_while(|&b| b <= a.max_bytes.max(4))
    .collect();
    let max_n = (sizes.last().copied().unwrap_or(4) / 4) as usize;
    println!(
        "# oxccl all-reduce (sum, float): {} ranks as threads of one process, cpu backend, {} kernel thread(s) per rank, ring over memory channels",
        a.ranks, a.threads
    );
    println!("#");
    println!("#{:>77}{:>36}", "out-of-place", "in-place");
    println!(
        "#{:>11} {:>12} {:>7} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "#{:>11} {:>12} {:>7} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    let rows: Vec<Vec<Row>> = in_process::run(a.ranks, InProcessConfig::default(), |comm| {
        let mut rank = Rank::new(comm, max_n)?;
        let mut rows = Vec::new();
        for &bytes in &sizes {
            let n = (bytes / 4) as usize;
            let mut row = (bytes, (0.0, 0), (0.0, 0));
            for in_place in [false, true] {
                let wrong = rank.check(comm, n, in_place, a.threads)?;
                let us = rank.time(comm, n, in_place, a)?;
                *(if in_place { &mut row.2 } else { &mut row.1 }) = (us, wrong);
            }
            rows.push(row);
        }
        Ok(rows)
    })?;
    // Time of a size is the slowest rank's; wrong elements add up over ranks.
    let factor = 2.0 * (a.ranks as f64 - 1.0) / a.ranks as f64;
    let (mut busbw_sum, mut total_wrong) = (0.0, 0u64);
    for (i, &bytes) in sizes.iter().enumerate() {
        let pick = |f: fn(&Row) -> (f64, u64)| {
            rows.iter().fold((0.0f64, 0u64), |(t, w), r| {
                let (tt, ww) = f(&r[i]);
                (t.max(tt), w + ww)
            })
        };
        let (oop, inp) = (pick(|r| r.1), pick(|r| r.2));
        let cols = |(us, wrong): (f64, u64)| {
            let algbw = bytes as f64 / (us * 1e-6) / 1e9;
            (us, algbw, algbw * factor, wrong)
        };
        let (o, p) = (cols(oop), cols(inp));
        busbw_sum += o.2 + p.2;
        total_wrong += o.3 + p.3;
        println!(
            " {:>11} {:>12} {:>7} {:>6} {:>5} {:>9.2} {:>7.2} {:>7.2} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6}",
            bytes,
            bytes / 4,
            "float",
            "sum",
            -1,
            o.0,
            o.1,
            o.2,
            o.3,
            p.0,
            p.1,
            p.2,
            p.3
        );
    }
    println!(
        "# Out of bounds values : {total_wrong} {}",
        if total_wrong == 0 { "OK" } else { "FAILED" }
    );
    println!(
        "# Avg bus bandwidth    : {:.4}",
        busbw_sum / (2 * sizes.len().max(1)) as f64
    );
    Ok(total_wrong == 0)
}
