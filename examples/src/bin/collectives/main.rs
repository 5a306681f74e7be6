//! Benchmark of the other collectives of `Communicator`, nccl-tests style, with the same
//! harness and options as `allreduce`: all-gather, reduce-scatter, broadcast, reduce,
//! all-to-all and all-to-all-v, out of place and in place, every result checked; `--mpi`
//! times the MPI counterpart (`MPI_Allgather`, `MPI_Reduce_scatter_block`, `MPI_Bcast`,
//! `MPI_Reduce`, `MPI_Alltoall`, `MPI_Alltoallv`) in the same run.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin collectives -- --collective allgather --mpi
//! cargo run --release -p oxccl-examples --bin collectives -- --collective alltoallv --dtype u8
//! ```

use clap::Parser;
use oxccl_examples::collective_bench::{self, collective::Collective, options::BenchArgs};

/// Measures one collective across ranks.
#[derive(Parser, Debug)]
struct Cli {
    /// The collective (`allreduce` is also the `allreduce` program's).
    #[arg(long, value_enum)]
    collective: Collective,
    #[command(flatten)]
    bench: BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    collective_bench::main(cli.collective, &cli.bench)
}
