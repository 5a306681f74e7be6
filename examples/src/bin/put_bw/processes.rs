//! `--processes`: this program started twice, as the two ranks of one job on this node
//! (torchrun's variables); rank 0's output is the program's.

use crate::Args;
use oxccl::{Error, Result};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Longest the job may run before the ranks still running are stopped: a last resort, far
/// above a full run's time, for ranks stuck past their own wait limits.
const JOB_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// Starts both ranks and waits for them.
///
/// # Errors
/// A rank could not be started, failed, or ran past the job's deadline.
pub(crate) fn run(args: &Args) -> Result<()> {
    let system = |context: &str, source: std::io::Error| Error::System {
        context: context.into(),
        source,
    };
    let port = oxccl_bootstrap::free_loopback_port()?;
    let secret = oxccl_bootstrap::Secret::random()?.to_hex();
    let exe = std::env::current_exe().map_err(|e| system("finding this program", e))?;
    let forwarded: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| s != "--processes")
        .collect();
    let mut children = Vec::new();
    for rank in 0..2 {
        let spawned = std::process::Command::new(&exe)
            .args(&forwarded)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OXCCL_SECRET", &secret)
            .env("OXCCL_TRANSPORT", args.transport.name())
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(e) => {
                for mut child in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(system(&format!("starting rank {rank}"), e));
            }
        }
    }
    let deadline = Instant::now() + JOB_DEADLINE;
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        match oxccl_examples::wait_until(&mut child, deadline)
            .map_err(|e| system(&format!("waiting for rank {rank}"), e))?
        {
            Some(status) if status.success() => {}
            Some(status) => failed.push(format!("rank {rank} failed: {status}")),
            None => failed.push(format!(
                "rank {rank} was still running after {} s and was stopped",
                JOB_DEADLINE.as_secs()
            )),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Internal(failed.join("; ")))
    }
}
