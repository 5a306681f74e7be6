//! A job of this program's ranks as processes on this node (`--processes`): the program
//! started once per rank with torchrun's variables, a fresh loopback port and secret, and
//! waited for up to a deadline; rank 0's standard output is the job's.

use oxccl::{Error, Result};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts this program `ranks` times, with its own arguments less those in `dropped`, the
/// rendezvous variables and `env`, and waits for every rank until `limit` has passed (then
/// stops the ranks still running). Returns one line per rank that failed or was stopped,
/// none where every rank succeeded.
///
/// # Errors
/// The program cannot be found, a port or a secret cannot be had, a rank cannot be started
/// (the ranks already started are stopped) or waited for.
pub fn run_local_job(
    ranks: u32,
    dropped: &[&str],
    env: &[(&str, String)],
    limit: Duration,
) -> Result<Vec<String>> {
    let system = |context: &str, source: std::io::Error| Error::System {
        context: context.into(),
        source,
    };
    let port = oxccl_bootstrap::free_loopback_port()?;
    let secret = oxccl_bootstrap::Secret::random()?.to_hex();
    let exe = std::env::current_exe().map_err(|e| system("finding this program", e))?;
    let forwarded: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| !dropped.contains(&s.as_str()))
        .collect();
    let mut children = Vec::new();
    for rank in 0..ranks {
        let spawned = Command::new(&exe)
            .args(&forwarded)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OXCCL_SECRET", &secret)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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
    let deadline = Instant::now() + limit;
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        match crate::wait_until(&mut child, deadline)
            .map_err(|e| system(&format!("waiting for rank {rank}"), e))?
        {
            Some(status) if status.success() => {}
            Some(status) => failed.push(format!("rank {rank} failed: {status}")),
            None => failed.push(format!(
                "rank {rank} was still running after {} s and was stopped",
                limit.as_secs()
            )),
        }
    }
    Ok(failed)
}
