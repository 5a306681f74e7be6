//! Ranks as threads of one process: the harness tests, examples and benchmarks use.
//!
//! [`run`] starts one thread per rank, gives each a [`Communicator`] on its own emulated
//! device (ordinal = rank) with an [`InProcessExchange`], runs the closure on every rank,
//! and returns each rank's result.
//!
//! When a rank fails (its closure returns an error or panics), the job stops the others at
//! once: their kernels' waits end (the ranks' stop words are raised) and their out-of-band
//! receives end, instead of each waiting out its own deadline for a rank that will never
//! answer. `run` then reports every failing rank's error, the root cause first: the first
//! rank to fail, then ranks that failed on their own, then ranks that were stopped.

use crate::backend::Backend;
use crate::communicator::{Communicator, CommunicatorConfig, RankStopper};
use crate::device::Device;
use crate::error::{Error, ErrorKind, RankFailure, Result};
use crate::out_of_band::InProcessExchange;
use parking_lot::Mutex;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

/// Most ranks [`run`] starts in one process. Each rank is a thread with a proxy thread of
/// its own and maps every peer's registered memory, so a job of more would run out of the
/// process's memory mappings (65530 by default on Linux) while starting its threads, which
/// the standard library cannot report as an error (the process aborts); a job near this
/// limit gets a clear error from its first mapping that does not fit instead.
pub const MAX_RANKS: u32 = 1024;

/// Settings of an in-process job.
#[derive(Clone, Debug)]
pub struct InProcessConfig {
    /// Communicator settings of every rank.
    pub communicator: CommunicatorConfig,
    /// Longest the ranks wait for each other's out-of-band messages.
    pub exchange_timeout: Duration,
    /// The backend of every rank's device (rank `r` opens [`Device::for_local_rank`]`(r)`).
    pub backend: Backend,
}

impl Default for InProcessConfig {
    fn default() -> Self {
        InProcessConfig {
            communicator: CommunicatorConfig::default(),
            exchange_timeout: Duration::from_secs(30),
            backend: Backend::Cpu,
        }
    }
}

/// What the ranks of one job share to stop each other.
struct Job {
    /// Each rank's stopper, once its communicator exists.
    stoppers: Mutex<Vec<Option<RankStopper>>>,
    /// The first rank that failed, if any.
    first: Mutex<Option<u32>>,
    /// Any rank's exchange (they share one mailbox): aborting it aborts them all.
    exchange: InProcessExchange,
}

impl Job {
    /// Records that `rank` failed; the first failure stops every rank. Returns whether the
    /// job had already failed (this failure may be a consequence).
    fn fail(&self, rank: u32) -> bool {
        let mut first = self.first.lock();
        if first.is_some() {
            return true;
        }
        *first = Some(rank);
        let why = format!("rank {rank} of the job failed");
        for stopper in self.stoppers.lock().iter().flatten() {
            stopper.stop(why.clone());
        }
        self.exchange.abort(why);
        false
    }
}

/// Runs `body` on `ranks` ranks, each a thread with its own communicator; returns the
/// results by rank.
///
/// # Errors
/// [`Error::InvalidUsage`] for no rank or more than [`MAX_RANKS`]; [`Error::Ranks`] with
/// every failing rank's error (a panic counts, with its message), the root cause first.
pub fn run<T, F>(ranks: u32, config: InProcessConfig, body: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&mut Communicator) -> Result<T> + Sync,
{
    if ranks == 0 || ranks > MAX_RANKS {
        return Err(Error::InvalidUsage(format!(
            "an in-process job of {ranks} ranks: it needs at least one and at most {MAX_RANKS}"
        )));
    }
    let exchanges = InProcessExchange::group(ranks, config.exchange_timeout);
    let job = Arc::new(Job {
        stoppers: Mutex::new(vec![None; ranks as usize]),
        first: Mutex::new(None),
        exchange: exchanges[0].clone(),
    });
    let body = &body;
    let config = &config;
    let outcomes: Vec<(u32, Result<T>, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = exchanges
            .into_iter()
            .map(|exchange| {
                let rank = exchange.rank_id();
                let job = job.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("oxccl-rank{rank}"))
                    .spawn_scoped(scope, move || {
                        let outcome = catch_unwind(AssertUnwindSafe(|| {
                            let mut consequence = false;
                            let result = Device::for_local_rank(config.backend, rank as usize)
                                .and_then(|device| {
                                    Communicator::new(
                                        Arc::new(exchange),
                                        device,
                                        config.communicator.clone(),
                                    )
                                })
                                .and_then(|mut comm| {
                                    job.stoppers.lock()[rank as usize] = Some(comm.stopper());
                                    let result = body(&mut comm);
                                    // Stop the others while this rank's communicator still
                                    // exists: its drop waits for its own kernels, which the
                                    // stop ends too.
                                    if result.is_err() {
                                        consequence = job.fail(rank);
                                    }
                                    result
                                });
                            if result.is_err() && job.first.lock().is_none() {
                                // Failed before its communicator existed.
                                consequence = job.fail(rank);
                            }
                            (result, consequence)
                        }));
                        match outcome {
                            Ok((result, consequence)) => (rank, result, consequence),
                            Err(panic) => {
                                let consequence = job.fail(rank);
                                let message = crate::error::panic_message(panic.as_ref());
                                let error =
                                    Error::Internal(format!("rank {rank} panicked: {message}"));
                                (rank, Err(error), consequence)
                            }
                        }
                    });
                (rank, spawned)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, spawned)| match spawned {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    let error = Error::Internal(format!("rank {rank}'s thread failed"));
                    (rank, Err(error), false)
                }),
                Err(e) => {
                    let error = Error::System {
                        context: format!("starting rank {rank}"),
                        source: e,
                    };
                    (rank, Err(error), false)
                }
            })
            .collect()
    });
    let root = *job.first.lock();
    let mut values = Vec::with_capacity(outcomes.len());
    let mut failures = Vec::new();
    for (rank, result, consequence) in outcomes {
        match result {
            Ok(v) => values.push(v),
            Err(error) => {
                // A rank whose error is an abort was stopped, whatever the order it ended in.
                let consequence =
                    consequence || (Some(rank) != root && error.kind() == ErrorKind::Aborted);
                failures.push(RankFailure {
                    rank,
                    error,
                    consequence,
                })
            }
        }
    }
    if failures.is_empty() {
        return Ok(values);
    }
    failures.sort_by_key(|f| (Some(f.rank) != root, f.consequence, f.rank));
    Err(Error::Ranks(failures))
}
