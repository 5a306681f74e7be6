//! The collective benchmark harness of `allreduce` and `collectives`: nccl-tests' table for
//! one collective of `oxccl::Communicator` over a sweep of sizes, every result checked
//! against a host reference, with a memory baseline and, with `--mpi`, Open MPI's
//! counterpart timed in the same run.
//!
//! Ranks are threads of one process, each on its own emulated device (CPU backend), or with
//! `--processes` separate processes the program starts itself (with torchrun's variables),
//! mapping each other's device memory. Started by a launcher (torchrun, `mpirun`, `srun`:
//! its variables are found), each process is one rank and rank 0 prints.
//!
//! | file | concept |
//! |---|---|
//! | `options.rs` | the command-line options and the communicator settings they make |
//! | `collective.rs` | the collectives, what a size means for each, bus-bandwidth factors |
//! | `plan.rs` | what a run measures, as every rank derives it |
//! | `case.rs` | one call: buffers, inputs, the call, the reference |
//! | `measure.rs` | one rank's sweep: checked and timed calls |
//! | `soak.rs` | `--soak`: random checked calls for a while |
//! | `memory_bandwidth.rs` | the memory baseline (`c = a + b` on two threads) |
//! | `mpi.rs` | the MPI baseline and its launch variants |
//! | `report.rs` | the results of all ranks, combined |
//! | `table.rs` | the nccl-tests table |
//! | `json.rs` | `--format json` |
//! | `plot.rs` | `--plot` |
//! | `processes.rs` | ranks as processes: started here, or by a launcher |

pub mod case;
pub mod collective;
pub mod json;
pub mod measure;
pub mod memory_bandwidth;
pub mod mpi;
pub mod options;
pub mod plan;
pub mod plot;
pub mod processes;
pub mod report;
pub mod soak;
pub mod table;

use collective::Collective;
use measure::SizeResult;
use memory_bandwidth::MemoryBaseline;
use mpi::MpiBaseline;
use options::{BenchArgs, Format};
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, Result};
use plan::Plan;
use report::{Report, Setup};
use serde::{Deserialize, Serialize};
use soak::SoakReport;

/// What one rank brings back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RankOutcome {
    /// The sweep's sizes.
    Sweep(Vec<SizeResult>),
    /// The soak's totals.
    Soak(SoakReport),
}

impl RankOutcome {
    /// Whether every element this rank checked was right.
    pub fn is_right(&self) -> bool {
        match self {
            RankOutcome::Sweep(sizes) => sizes
                .iter()
                .all(|s| s.out_of_place.wrong == 0 && s.in_place.is_none_or(|t| t.wrong == 0)),
            RankOutcome::Soak(s) => s.wrong == 0,
        }
    }
}

/// The baselines of a run, measured before the ranks start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baselines {
    /// With `--mpi`.
    pub mpi: Option<MpiBaseline>,
    /// The memory baseline (not with `--soak`).
    pub memory: Option<MemoryBaseline>,
}

impl Baselines {
    /// Measures the memory baseline (unless soaking) and, if `with_mpi`, the MPI one.
    ///
    /// # Errors
    /// The MPI baseline could not run at all.
    pub fn measure(plan: &Plan, args: &BenchArgs, with_mpi: bool) -> Result<Baselines> {
        if args.soak.is_some() {
            return Ok(Baselines::default());
        }
        Ok(Baselines {
            mpi: if with_mpi {
                Some(mpi::run_mpi_baseline(plan)?)
            } else {
                None
            },
            memory: Some(memory_bandwidth::add_bandwidth(
                memory_bandwidth::ARRAY_BYTES,
                2,
                5,
            )),
        })
    }
}

/// The program: runs the benchmark of `collective` as `args` say and exits with success
/// only if every result was right.
pub fn main(collective: Collective, args: &BenchArgs) -> std::process::ExitCode {
    crate::init_logging();
    match run(collective, args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{}: {e}", collective.name());
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark and prints it; returns whether every result was right.
///
/// # Errors
/// Bad options, a failed set-up, call, exchange or baseline.
pub fn run(collective: Collective, args: &BenchArgs) -> Result<bool> {
    if oxccl_bootstrap::LaunchEnv::detect().is_ok() {
        return processes::run_launched_rank(collective, args);
    }
    let plan = Plan::new(collective, args, args.ranks)?;
    let baselines = Baselines::measure(&plan, args, args.mpi)?;
    if args.processes {
        return processes::launch_processes(args, &baselines);
    }
    let outcomes = run_in_process(&plan, args)?;
    finish(&plan, args, "threads of one process", outcomes, baselines)
}

/// Runs every rank of `plan` as a thread of this process; returns each rank's outcome.
///
/// # Errors
/// Every failing rank's error (see `oxccl::in_process::run`).
pub fn run_in_process(plan: &Plan, args: &BenchArgs) -> Result<Vec<RankOutcome>> {
    let config = InProcessConfig {
        communicator: args.communicator_config(),
        backend: args.backend,
        ..InProcessConfig::default()
    };
    in_process::run(plan.ranks, config, |comm| rank_body(comm, plan, args))
}

/// What every rank runs: the sweep, or the soak.
///
/// # Errors
/// A failed call, synchronization or exchange.
pub fn rank_body(comm: &mut Communicator, plan: &Plan, args: &BenchArgs) -> Result<RankOutcome> {
    match args.soak {
        Some(seconds) => Ok(RankOutcome::Soak(soak::soak_rank(
            comm,
            plan,
            seconds,
            args.seed,
            (args.min_bytes, args.max_bytes),
        )?)),
        None => Ok(RankOutcome::Sweep(measure::sweep_rank(comm, plan)?)),
    }
}

/// The report of a sweep's outcomes (`None` for a soak's).
pub fn report(
    plan: &Plan,
    args: &BenchArgs,
    ranks_are: &str,
    outcomes: &[RankOutcome],
    baselines: Baselines,
) -> Option<Report> {
    let sweeps: Vec<Vec<SizeResult>> = outcomes
        .iter()
        .filter_map(|o| match o {
            RankOutcome::Sweep(s) => Some(s.clone()),
            RankOutcome::Soak(_) => None,
        })
        .collect();
    if sweeps.is_empty() {
        return None;
    }
    let config = args.communicator_config().collectives;
    Some(Report {
        setup: Setup {
            plan: plan.clone(),
            ranks_are: ranks_are.into(),
            launch: config.launch,
            algo: config.algorithm,
            packet_limit: config.packet_limit,
            packet_data_from: config.packet_data_from_on(args.backend),
        },
        sizes: Report::combine(&sweeps),
        mpi: baselines.mpi,
        memory: baselines.memory,
    })
}

/// Prints the outcomes as `args` ask (table or JSON, and the plot); returns whether every
/// result was right.
///
/// # Errors
/// The plot cannot be written.
pub fn finish(
    plan: &Plan,
    args: &BenchArgs,
    ranks_are: &str,
    outcomes: Vec<RankOutcome>,
    baselines: Baselines,
) -> Result<bool> {
    let right = outcomes.iter().all(RankOutcome::is_right);
    let Some(report) = report(plan, args, ranks_are, &outcomes, baselines) else {
        print_soak(plan, args, ranks_are, &outcomes);
        return Ok(right);
    };
    match args.format {
        Format::Table => print!("{}", table::table(&report)),
        Format::Json => {
            for line in json::json_lines(&report) {
                println!("{line}");
            }
        }
    }
    if let Some(path) = &args.plot {
        plot::plot(&report, path)?;
        if args.format == Format::Table {
            println!("# plot: {}", path.display());
        }
    }
    Ok(right)
}

/// The soak's closing lines: calls made, wrong elements, the first failures.
fn print_soak(plan: &Plan, args: &BenchArgs, ranks_are: &str, outcomes: &[RankOutcome]) {
    let soaks: Vec<&SoakReport> = outcomes
        .iter()
        .filter_map(|o| match o {
            RankOutcome::Soak(s) => Some(s),
            RankOutcome::Sweep(_) => None,
        })
        .collect();
    let calls = soaks.first().map_or(0, |s| s.calls);
    let wrong: u64 = soaks.iter().map(|s| s.wrong).sum();
    let seconds = soaks.iter().map(|s| s.seconds).fold(0.0, f64::max);
    match args.format {
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "collective": plan.collective.name(), "ranks": plan.ranks, "soak_seconds": seconds,
                "seed": args.seed, "calls": calls, "wrong": wrong,
            })
        ),
        Format::Table => {
            println!(
                "# oxccl {} soak: {} ranks as {ranks_are}, seed {}, sizes {} to {} B, every type, \
                 operation, root and placement at random, every result checked",
                plan.collective.title(),
                plan.ranks,
                args.seed,
                args.min_bytes,
                args.max_bytes
            );
            for failure in soaks.iter().flat_map(|s| &s.failures) {
                println!("# wrong: {failure}");
            }
            println!("# soak: {calls} calls in {seconds:.1} s, {wrong} wrong elements");
            println!(
                "# Out of bounds values : {wrong} {}",
                if wrong == 0 { "OK" } else { "FAILED" }
            );
        }
    }
}
