//! All-reduce benchmark, nccl-tests style, on `Communicator::all_reduce` and
//! `all_reduce_in_place`: for each size, the algorithm, out-of-place and in-place time,
//! algorithm and bus bandwidth, and the number of wrong elements.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin allreduce -- --ranks 2 --max-bytes 16M
//! cargo run --release -p oxccl-examples --bin allreduce -- --dtype bf16 --op max --check every
//! cargo run --release -p oxccl-examples --bin allreduce -- --mpi --max-bytes 64M --plot allreduce.svg
//! ```
//!
//! The harness is `oxccl_examples::collective_bench`, shared with the `collectives`
//! program; its docs list the options and what the output holds.

use clap::Parser;
use oxccl_examples::collective_bench::{self, collective::Collective, options::BenchArgs};

/// Measures all-reduce across ranks.
#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn main() -> std::process::ExitCode {
    collective_bench::main(Collective::AllReduce, &Cli::parse().bench)
}
