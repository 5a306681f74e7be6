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
    let system = |context: &str, source: std::io::Error| Error::System {
        context: context.into(),
        source,
    };
    let port = oxccl_bootstrap::free_loopback_port()?;
    let secret = oxccl_bootstrap::Secret::random()?.to_hex();
    let exe = std::env::current_exe().map_err(|e| system("finding this program", e))?;
    let forwarded: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| s != "--processes" && s != "--mpi")
        .collect();
    let encoded = serde_json::to_string(baselines)
        .map_err(|e| Error::Internal(format!("encoding the baselines: {e}")))?;
    let mut children = Vec::new();
    for rank in 0..args.ranks {
        let child = std::process::Command::new(&exe)
            .args(&forwarded)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.ranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", args.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OXCCL_SECRET", &secret)
            .env(oxccl::backend::BACKEND_ENV, args.backend.name())
            .env(BASELINES_ENV, &encoded)
            .stdout(if rank == 0 {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            })
            .spawn()
            .map_err(|e| system(&format!("starting rank {rank}"), e))?;
        children.push(child);
    }
    let deadline = std::time::Instant::now() + JOB_DEADLINE;
    let mut ok = true;
    for (rank, mut child) in children.into_iter().enumerate() {
        match crate::wait_until(&mut child, deadline)
            .map_err(|e| system(&format!("waiting for rank {rank}"), e))?
        {
            Some(status) if status.success() => {}
            Some(status) => {
                eprintln!("rank {rank} failed: {status}");
                ok = false;
            }
            None => {
                eprintln!(
                    "rank {rank} was still running after {} s and was stopped",
                    JOB_DEADLINE.as_secs()
                );
                ok = false;
            }
        }
    }
    Ok(ok)
}
