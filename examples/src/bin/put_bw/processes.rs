//! `--processes`: this program started twice, as the two ranks of one job on this node
//! (torchrun's variables); rank 0's output is the program's.

use crate::Args;
use oxccl::{Error, Result};
use std::time::Duration;

/// Longest the job may run before the ranks still running are stopped: a last resort, far
/// above a full run's time, for ranks stuck past their own wait limits.
const JOB_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// Starts both ranks and waits for them.
///
/// # Errors
/// A rank could not be started, failed, or ran past the job's deadline.
pub(crate) fn run(args: &Args) -> Result<()> {
    let env = [("OXCCL_TRANSPORT", args.transport.name().to_string())];
    let failed = oxccl_examples::local_job::run_local_job(2, &["--processes"], &env, JOB_DEADLINE)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Internal(failed.join("; ")))
    }
}
