//! All-reduce benchmark, nccl-tests style: for each size, out-of-place and in-place time,
//! algorithm and bus bandwidth, and the number of wrong elements.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin allreduce -- --ranks 2 --max-bytes 16M
//! ```
//!
//! Ranks are threads of one process, each on its own emulated device (CPU backend), or
//! with `--processes` separate processes this program starts itself (with torchrun's
//! variables), mapping each other's device memory. Started by a launcher (torchrun,
//! `mpirun`, `srun`: its variables are found), each process is one rank and rank 0 prints
//! the table. Messages up to `--packet-max-bytes` go through
//! `oxccl_kernels::packet_all_reduce::packet_all_reduce_sum_f32` (LL packets, no
//! semaphore round trips), larger ones through
//! `oxccl_kernels::all_reduce::ring_all_reduce_sum_f32`; both over memory channels.
//!
//! | file | concept |
//! |---|---|
//! | `main.rs` | options, and which way the ranks run |
//! | `bench.rs` | one rank's buffers, channels, launches, checks and timings |
//! | `table.rs` | the nccl-tests table |
//! | `mpi.rs` | Open MPI's `MPI_Allreduce`, timed as the baseline |
//! | `processes.rs` | ranks as processes: started here, or by a launcher |

mod bench;
mod mpi;
mod processes;
mod table;

use clap::Parser;
use oxccl::Result;
use oxccl::in_process::{self, InProcessConfig};
use oxccl_examples::parse_bytes;

/// Measures all-reduce (sum of f32) across ranks.
#[derive(Parser, Debug)]
pub(crate) struct Args {
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    pub(crate) ranks: u32,
    /// Smallest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    pub(crate) min_bytes: u64,
    /// Largest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    pub(crate) max_bytes: u64,
    /// Factor between consecutive sizes.
    #[arg(long, default_value_t = 4)]
    pub(crate) step_factor: u64,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    pub(crate) iters: u32,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: u32,
    /// Kernel threads per rank.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: u32,
    /// Largest message sent as LL packets; larger ones take the semaphore ring (0: never
    /// packets). On the CPU emulator the two take the same time up to about 512 B, and
    /// packets are slower above: each carries half its bytes, and the receiver polls
    /// lines the sender is still writing.
    #[arg(long, default_value = "512", value_parser = parse_bytes)]
    pub(crate) packet_max_bytes: u64,
    /// Run each rank as its own process (this program, started `--ranks` times) instead
    /// of as threads of one process.
    #[arg(long)]
    pub(crate) processes: bool,
    /// Also time Open MPI's `MPI_Allreduce` with the same ranks, sizes and iterations in
    /// the same run, and print oxccl's time relative to it (needs mpicc and mpirun).
    #[arg(long)]
    pub(crate) mpi: bool,
}

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
    if oxccl_bootstrap::LaunchEnv::detect().is_ok() {
        return processes::run_launched_rank(a, &sizes);
    }
    let mpi = if a.mpi {
        Some(mpi::run_mpi_baseline(a, &sizes)?)
    } else {
        None
    };
    if a.processes {
        return processes::launch_processes(a, mpi.as_deref());
    }
    let rows = in_process::run(a.ranks, InProcessConfig::default(), |comm| {
        bench::bench_rank(comm, a, &sizes)
    })?;
    Ok(table::print_table(
        a,
        "threads of one process",
        &sizes,
        &rows,
        mpi.as_deref(),
    ))
}
