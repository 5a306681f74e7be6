//! Bootstrap benchmark: N ranks as threads on loopback.
//!
//! Prints one line:
//! `bootstrap ranks=<N> init_ms=<a> all_gather_us=<b> ring_all_gather_us=<c> ratio=<b/c> barrier_us=<d>`
//!
//! - `init_ms`: from starting the rank threads to the last rank's `Bootstrap` being ready;
//! - `all_gather_us`: `Bootstrap::all_gather` (recursive doubling, `O(log N)` rounds);
//! - `ring_all_gather_us`: `Bootstrap::all_gather_ring`, the `N - 1`-step ring MSCCL++
//!   uses, over the same connections in the same run;
//! - `barrier_us`: `Bootstrap::barrier`.
//!
//! Each timed figure is the median over iterations of (last rank done − first rank
//! started), after one untimed warm-up call of each operation (which also opens the lazy
//! connections and checks the results).
//!
//! `cargo run --release -p oxccl-examples --bin bootstrap_bench -- --ranks 1024`

use std::process::ExitCode;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use oxccl_bootstrap::{
    Bootstrap, Config, UniqueId, open_files_for_ranks_in_process, raise_open_file_limit,
};

#[derive(Parser, Debug)]
#[command(
    about = "Time bootstrap init, all-gather (log N vs ring) and barrier with N ranks as threads"
)]
struct Args {
    /// Number of ranks (threads of this process), at most 1024: each is a thread with
    /// sockets to its peers, and many more would exhaust the process's memory mappings
    /// (which aborts it) or its open files.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024), default_value_t = 8)]
    ranks: usize,
    /// Bytes each rank contributes to the all-gathers.
    #[arg(long, default_value_t = 64)]
    bytes: usize,
    /// Timed iterations of each operation (default: more at small N, fewer at large N,
    /// where one ring all-gather is a million messages).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    iters: Option<usize>,
    /// Deadline of every bootstrap call, in seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), default_value_t = 300)]
    timeout_s: u64,
}

/// What one rank measured: when it was ready, and (start, end) of each timed call.
struct RankTimes {
    ready: Instant,
    ops: [Vec<(Instant, Instant)>; 3],
}

const ALL_GATHER: usize = 0;
const RING: usize = 1;
const BARRIER: usize = 2;

fn main() -> ExitCode {
    oxccl_examples::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bootstrap_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<String, String> {
    let n = args.ranks;
    let iters = args.iters.unwrap_or((4096 / n).clamp(3, 50)).max(1);
    let wanted = open_files_for_ranks_in_process(n);
    let limit = raise_open_file_limit(wanted).map_err(|e| e.to_string())?;
    if limit < wanted {
        return Err(format!(
            "{n} ranks need some {wanted} open files, above this process's limit of {limit} \
             (raise it with `ulimit -n`, or run fewer ranks)"
        ));
    }
    let config = Config::default().with_timeout(Duration::from_secs(args.timeout_s));
    let (id, listener) = UniqueId::listen("127.0.0.1:0".parse().expect("literal address"))
        .map_err(|e| e.to_string())?;
    let listener = Mutex::new(Some(listener));
    let start_line = Barrier::new(n);
    let t0 = Instant::now();

    let per_rank: Vec<Result<RankTimes, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, config, listener, start_line) = (&id, &config, &listener, &start_line);
                std::thread::Builder::new()
                    .name(format!("rank-{r}"))
                    .stack_size(1 << 20)
                    .spawn_scoped(s, move || {
                        let root_listener = if r == 0 {
                            listener.lock().map_err(|e| e.to_string())?.take()
                        } else {
                            None
                        };
                        let bs = match root_listener {
                            Some(l) => Bootstrap::init_root(id, l, n, config),
                            None => Bootstrap::init_with_config(id, r, n, config),
                        }
                        .map_err(|e| format!("rank {r}: init: {e}"))?;
                        let ready = Instant::now();
                        rank_main(&bs, args.bytes, iters, start_line)
                            .map(|ops| RankTimes { ready, ops })
                    })
                    .map_err(|e| format!("spawning rank {r}: {e}"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h?.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    });
    let per_rank: Vec<RankTimes> = per_rank.into_iter().collect::<Result<_, _>>()?;

    let init_ms = per_rank
        .iter()
        .map(|t| t.ready.duration_since(t0))
        .max()
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    let median_us = |op: usize| -> f64 {
        let mut spans: Vec<f64> = (0..iters)
            .map(|i| {
                let first = per_rank.iter().map(|t| t.ops[op][i].0).min().unwrap_or(t0);
                let last = per_rank.iter().map(|t| t.ops[op][i].1).max().unwrap_or(t0);
                last.duration_since(first).as_secs_f64() * 1e6
            })
            .collect();
        spans.sort_by(f64::total_cmp);
        spans[spans.len() / 2]
    };
    let (b, c, d) = (median_us(ALL_GATHER), median_us(RING), median_us(BARRIER));
    let ratio = if c > 0.0 { b / c } else { f64::NAN };
    Ok(format!(
        "bootstrap ranks={n} init_ms={init_ms:.1} all_gather_us={b:.1} ring_all_gather_us={c:.1} ratio={ratio:.3} barrier_us={d:.1}"
    ))
}

/// One rank: warm up and check each operation, then time `iters` calls of each, every
/// call started together with the other ranks.
fn rank_main(
    bs: &Bootstrap,
    bytes: usize,
    iters: usize,
    start_line: &Barrier,
) -> Result<[Vec<(Instant, Instant)>; 3], String> {
    let (me, n) = (bs.rank(), bs.size());
    let block = |r: usize| -> Vec<u8> { (0..bytes).map(|i| (r * 31 + i) as u8).collect() };
    let mine = block(me);
    let expected: Vec<Vec<u8>> = (0..n).map(block).collect();
    let err = |what: &str, e: oxccl_bootstrap::Error| format!("rank {me}: {what}: {e}");

    // Warm-up: opens the connections each algorithm needs and checks the results.
    if bs.all_gather(&mine).map_err(|e| err("all_gather", e))? != expected {
        return Err(format!("rank {me}: all_gather returned wrong data"));
    }
    if bs
        .all_gather_ring(&mine)
        .map_err(|e| err("all_gather_ring", e))?
        != expected
    {
        return Err(format!("rank {me}: all_gather_ring returned wrong data"));
    }
    bs.barrier().map_err(|e| err("barrier", e))?;

    let mut ops: [Vec<(Instant, Instant)>; 3] = Default::default();
    for (op, times) in ops.iter_mut().enumerate() {
        for _ in 0..iters {
            start_line.wait();
            let start = Instant::now();
            match op {
                ALL_GATHER => drop(bs.all_gather(&mine).map_err(|e| err("all_gather", e))?),
                RING => drop(
                    bs.all_gather_ring(&mine)
                        .map_err(|e| err("all_gather_ring", e))?,
                ),
                _ => bs.barrier().map_err(|e| err("barrier", e))?,
            }
            times.push((start, Instant::now()));
        }
    }
    // No rank drops its bootstrap (closing its connections) while others still use it.
    bs.barrier().map_err(|e| err("final barrier", e))?;
    Ok(ops)
}
