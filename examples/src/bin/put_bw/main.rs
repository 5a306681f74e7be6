//! One-way bandwidth of a port channel between two ranks, against a plain copy over the
//! same path measured in the same run.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin put_bw -- --transport host-ipc
//! put_bw transport=host-ipc bytes=4096 gbps=<x> baseline=memcpy baseline_gbps=<y> ratio=<x/y>
//! ...
//! cargo run --release -p oxccl-examples --bin put_bw -- --transport ethernet
//! put_bw transport=ethernet bytes=4096 gbps=<x> baseline=tcp baseline_gbps=<y> ratio=<x/y>
//! ```
//!
//! For each size from `--min-bytes` to `--max-bytes` (times 4 each step), rank 0 runs a
//! kernel that puts the size `iters` times over one port channel, each put with a signal,
//! then flushes and waits for rank 1's acknowledgement (`oxccl_kernels::put_bandwidth`);
//! `gbps` is bytes delivered per second, in GB/s (10^9 bytes), the best of `--runs`.
//!
//! The baseline: for `host-ipc`, one thread copying the same bytes between two shared
//! memory mappings (what the proxy does for a put on one node); for `ethernet`, one plain
//! TCP stream from rank 0 to rank 1 on the addresses the transport uses (loopback between
//! threads of one process, the node's address between processes), writing the same bytes
//! and waiting for a one-byte acknowledgement.
//!
//! The ranks are threads of this process, or with `--processes` two processes this program
//! starts; started by a launcher (torchrun's variables, as `cargo xtask netns-test` does),
//! each process is one rank and rank 0 prints.

mod measure;
mod memcpy_baseline;
mod processes;
mod tcp_baseline;

use clap::Parser;
use oxccl::TransportChoice;
use oxccl_examples::parse_bytes;

/// Measures a port channel's one-way bandwidth between two ranks.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Transport of the port channel: `host-ipc` or `ethernet` (`auto`: what the
    /// communicator picks; the baseline then follows whether the peer is on this node).
    #[arg(long, default_value = "host-ipc", value_parser = parse_transport)]
    transport: TransportChoice,
    /// Smallest put, in bytes (`K`, `M`, `G` suffixes).
    #[arg(long, default_value = "4K", value_parser = parse_bytes)]
    min_bytes: u64,
    /// Largest put, in bytes.
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Bytes each timed run moves per size (the puts per run are this over the size,
    /// between 4 and `--max-iters`).
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    total_bytes: u64,
    /// Most puts per timed run.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 2000)]
    max_iters: u32,
    /// Timed runs per size; the best is reported.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    runs: u32,
    /// Run the two ranks as processes this program starts.
    #[arg(long)]
    processes: bool,
    /// Longest any single wait of a rank may take, in seconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), default_value_t = 60)]
    timeout_s: u64,
}

impl Args {
    /// The sizes to measure: `min_bytes` times powers of 4, up to `max_bytes`.
    fn sizes(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        let mut bytes = self.min_bytes.max(1);
        while bytes <= self.max_bytes {
            sizes.push(bytes);
            match bytes.checked_mul(4) {
                Some(next) => bytes = next,
                None => break,
            }
        }
        sizes
    }

    /// Puts per timed run for `bytes`.
    fn iters(&self, bytes: u64) -> u32 {
        let want = self.total_bytes / bytes.max(1);
        want.clamp(4, u64::from(self.max_iters.max(4))) as u32
    }

    /// Longest any single wait may take.
    fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_s.max(1))
    }

    /// The communicator settings of every rank.
    fn communicator_config(&self) -> oxccl::CommunicatorConfig {
        oxccl::CommunicatorConfig {
            transport: self.transport,
            wait_timeout: self.timeout(),
            ..Default::default()
        }
    }
}

/// A transport named on the command line.
fn parse_transport(name: &str) -> Result<TransportChoice, String> {
    TransportChoice::parse(name)
        .map_err(|_| format!("`{name}` is not a transport: use host-ipc, ethernet or auto"))
}

fn main() -> std::process::ExitCode {
    oxccl_examples::init_logging();
    let args = Args::parse();
    let outcome = if oxccl_bootstrap::LaunchEnv::detect().is_ok() {
        measure::run_launched(&args)
    } else if args.processes {
        processes::run(&args)
    } else {
        measure::run_in_process(&args)
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("put_bw: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
