//! Every rank, both collectives: the whole example as one call.

use crate::data::Outcome;
use crate::options::Options;
use crate::{all_gather, broadcast};
use oxccl::{Result, in_process};

/// What the example found, over every rank.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The all-gather's elements checked and wrong.
    pub all_gather: Outcome,
    /// The broadcast's elements checked and wrong.
    pub broadcast: Outcome,
}

impl Report {
    /// Whether every element checked was right.
    pub fn ok(&self) -> bool {
        self.all_gather.wrong.is_empty() && self.broadcast.wrong.is_empty()
    }
}

/// Runs `opts.ranks` ranks as threads of this process (each with its own emulated device),
/// each running the all-gather and then the broadcast, and gathers what their checks found.
/// Wrong elements are reported, not an error.
///
/// # Errors
/// Options out of range; any rank's failure (a failed setup, a kernel or channel that
/// failed), every failing rank's error, the cause first.
pub fn run(opts: &Options) -> Result<Report> {
    opts.validate()?;
    let by_rank = in_process::run(opts.ranks, opts.job_config(), |comm| {
        let gathered = all_gather::run_rank(comm, opts)?;
        let broadcast = broadcast::run_rank(comm, opts)?;
        Ok((gathered, broadcast))
    })?;
    let mut report = Report::default();
    for (gathered, broadcast) in by_rank {
        report.all_gather.merge(gathered);
        report.broadcast.merge(broadcast);
    }
    Ok(report)
}
