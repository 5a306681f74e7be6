//! `custom-collective`: an all-gather over memory channels and a broadcast over port
//! channels, from a kernel crate of the example's own, on ranks that are threads of one
//! process (the CPU emulator); each kernel launched several times back to back, every
//! element of every launch checked. Prints what it ran, one line per collective, then `OK`;
//! or the wrong elements and `FAILED`, and exits non-zero.
//!
//! ```text
//! cargo run --release -p oxccl-custom-collective
//! cargo run --release -p oxccl-custom-collective -- --build-ptx --arch sm_90 --check
//! ```

use clap::Parser;
use oxccl_custom_collective::data::Outcome;
use oxccl_custom_collective::ptx::{KERNEL_CRATE, build_ptx};
use oxccl_custom_collective::{Options, run};
use std::process::ExitCode;
use std::time::Duration;

/// Wrong elements printed per collective, at most.
const SHOWN: usize = 20;

#[derive(Parser)]
#[command(
    name = "custom-collective",
    about = "A custom all-gather (memory channels) and broadcast (port channels) on the CPU emulator, every element checked"
)]
struct Cli {
    /// Ranks (threads of this process, each with its own emulated device).
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Elements (u32) per rank in the all-gather, and broadcast by the root.
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// Launches of each kernel, back to back with no host barrier.
    #[arg(long, default_value_t = 5)]
    launches: u32,
    /// Threads of the one block per launch.
    #[arg(long, default_value_t = 8)]
    threads: u32,
    /// Root of the broadcast.
    #[arg(long, default_value_t = 1)]
    root: u32,
    /// Every port channel request through the proxy thread, as on a GPU (by default a
    /// kernel thread carries out its own when the proxy thread is idle).
    #[arg(long)]
    no_proxy_assist: bool,
    /// Longest one device wait may take, in seconds.
    #[arg(long, default_value_t = 30)]
    wait_timeout_secs: u64,
    /// Backend of every rank's device: `auto`, `cpu` (the emulator) or `cuda`.
    #[arg(long, default_value = "cpu", value_parser = |s: &str| s.parse::<oxccl::Backend>().map_err(|e| e.to_string()))]
    backend: oxccl::Backend,
    /// Build the kernel crate to PTX instead of running (needs the rustup components
    /// rust-src, llvm-tools and llvm-bitcode-linker).
    #[arg(long)]
    build_ptx: bool,
    /// With --build-ptx: GPU architecture.
    #[arg(long, default_value = "sm_90", requires = "build_ptx")]
    arch: String,
    /// With --build-ptx: assemble the module with ptxas and print registers and spills per
    /// kernel (ptxas: OXCCL_PTXAS, or installed from PyPI into target/ptxas-venv).
    #[arg(long, requires = "build_ptx")]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.build_ptx {
        return ptx(&cli);
    }
    let opts = Options {
        ranks: cli.ranks,
        count: cli.count,
        launches: cli.launches,
        threads: cli.threads,
        root: cli.root,
        proxy_assist: !cli.no_proxy_assist,
        wait_timeout: Duration::from_secs(cli.wait_timeout_secs),
        backend: cli.backend,
    };
    println!(
        "# custom collectives: {} ranks as threads of one process (CPU emulator), 1 block of {} \
         threads per launch, {} launches of each kernel back to back, no host barrier between them",
        opts.ranks, opts.threads, opts.launches
    );
    let report = match run(&opts) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let n = opts.ranks as usize;
    print_outcome(
        &format!(
            "all-gather over memory channels: {} u32 per rank, {} per output",
            opts.count,
            opts.count * n
        ),
        &report.all_gather,
    );
    print_outcome(
        &format!(
            "broadcast over port channels: {} u32 from rank {}",
            opts.count, opts.root
        ),
        &report.broadcast,
    );
    if report.ok() {
        println!("OK");
        ExitCode::SUCCESS
    } else {
        println!("FAILED");
        ExitCode::FAILURE
    }
}

/// One line per collective: what ran and how many elements were checked and wrong, then
/// the first wrong elements.
fn print_outcome(what: &str, outcome: &Outcome) {
    println!(
        "{what}: {} elements checked, {} wrong",
        outcome.checked,
        outcome.wrong.len()
    );
    for w in outcome.wrong.iter().take(SHOWN) {
        println!("  {w}");
    }
    if outcome.wrong.len() > SHOWN {
        println!("  ... and {} more", outcome.wrong.len() - SHOWN);
    }
}

/// `--build-ptx`.
fn ptx(cli: &Cli) -> ExitCode {
    println!("# building {KERNEL_CRATE} to PTX for {}", cli.arch);
    match build_ptx(&cli.arch, cli.check) {
        Ok((path, table)) => {
            println!("wrote {}", path.display());
            if let Some(table) = table {
                print!("{table}");
            }
            println!("OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", oxccl_build::error::with_causes(&e));
            ExitCode::FAILURE
        }
    }
}
