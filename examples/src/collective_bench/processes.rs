//! Ranks as processes: started by the program itself (`--processes`), or by a launcher
//! (torchrun, `mpirun`, `srun`), each process one rank; rank 0 gathers every rank's
//! results and prints the report.

use super::options::BenchArgs;
use super::plan::Plan;
use super::{Baselines, RankOutcome, finish, rank_body};
use crate::collective_bench::collective::Collective;
use oxccl::{Communicator, Error, Result};

/// Where a run hands its baselines to the processes it starts, as JSON.
pub const BASELINES_ENV: &str = "OXCCL_BENCH_BASELINES";

/// Longest a job of rank processes may run before the ranks still running are stopped: a
/// last resort, far above a full run's time, for ranks stuck past their own wait limits.
const JOB_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// One rank of a job a launcher started: measures, gathers every rank's results, and rank
/// 0 prints them. Returns whether every result was right.
///
/// # Errors
/// A failed set-up, call or exchange.
pub fn run_launched_rank(collective: Collective, args: &BenchArgs) -> Result<bool> {
    let mut comm = Communicator::from_env(args.communicator_config())?;
    let plan = Plan::new(collective, args, comm.size())?;
    let mine = rank_body(&mut comm, &plan, args)?;
    let encoded = serde_json::to_vec(&mine)
        .map_err(|e| Error::Internal(format!("encoding rank results: {e}")))?;
    let outcomes = comm
        .out_of_band()
        .all_gather(encoded)?
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            serde_json::from_slice::<RankOutcome>(bytes).map_err(|e| {
                Error::Internal(format!("rank {rank} sent results that cannot be read: {e}"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if comm.rank() != 0 {
        return Ok(outcomes.iter().all(RankOutcome::is_right));
    }
    let baselines = match std::env::var(BASELINES_ENV) {
        Ok(text) if !text.is_empty() => serde_json::from_str(&text)
            .map_err(|e| Error::InvalidUsage(format!("{BASELINES_ENV}: {e}")))?,
        // Started by a launcher: the other ranks are done, so the memory baseline has the
        // machine to itself.
        _ => Baselines::measure(&plan, args, false)?,
    };
    finish(&plan, args, "processes", outcomes, baselines)
}

/// Starts this program once per rank, as one job with torchrun's variables on this node,
/// handing it `baselines`; rank 0's output is the program's.
///
/// # Errors
/// The job cannot be started or waited for.
pub fn launch_processes(args: &BenchArgs, baselines: &Baselines) -> Result<bool> {
    let encoded = serde_json::to_string(baselines)
        .map_err(|e| Error::Internal(format!("encoding the baselines: {e}")))?;
    let env = [
        (oxccl::backend::BACKEND_ENV, args.backend.name().to_string()),
        (BASELINES_ENV, encoded),
    ];
    let failed =
        crate::local_job::run_local_job(args.ranks, &["--processes", "--mpi"], &env, JOB_DEADLINE)?;
    for line in &failed {
        eprintln!("{line}");
    }
    Ok(failed.is_empty())
}
