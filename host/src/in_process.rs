//! Ranks as threads of one process: the harness tests, examples and benchmarks use.
//!
//! [`run`] starts one thread per rank, gives each a [`Communicator`] on its own emulated
//! device (ordinal = rank) with an [`InProcessExchange`], runs the closure on every rank,
//! and returns each rank's result. A rank that fails or panics makes `run` fail naming it.

use crate::communicator::{Communicator, CommunicatorConfig};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::out_of_band::InProcessExchange;
use std::sync::Arc;
use std::time::Duration;

/// Settings of an in-process job.
#[derive(Clone, Debug)]
pub struct InProcessConfig {
    /// Communicator settings of every rank.
    pub communicator: CommunicatorConfig,
    /// Longest the ranks wait for each other's out-of-band messages.
    pub exchange_timeout: Duration,
}

impl Default for InProcessConfig {
    fn default() -> Self {
        InProcessConfig {
            communicator: CommunicatorConfig::default(),
            exchange_timeout: Duration::from_secs(30),
        }
    }
}

/// Runs `body` on `ranks` ranks, each a thread with its own communicator; returns the
/// results by rank.
///
/// # Errors
/// The first rank (lowest number) whose body failed or panicked.
pub fn run<T, F>(ranks: u32, config: InProcessConfig, body: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&mut Communicator) -> Result<T> + Sync,
{
    if ranks == 0 {
        return Err(Error::InvalidUsage(
            "an in-process job needs at least one rank".into(),
        ));
    }
    let exchanges = InProcessExchange::group(ranks, config.exchange_timeout);
    let body = &body;
    let config = &config;
    let results: Vec<Result<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = exchanges
            .into_iter()
            .map(|exchange| {
                let rank = exchange.rank_id();
                std::thread::Builder::new()
                    .name(format!("oxccl-rank{rank}"))
                    .spawn_scoped(scope, move || {
                        let device = Device::cpu(rank as usize);
                        let mut comm = Communicator::new(
                            Arc::new(exchange),
                            device,
                            config.communicator.clone(),
                        )?;
                        body(&mut comm)
                    })
                    .map_err(|e| Error::System {
                        context: format!("starting rank {rank}"),
                        source: e,
                    })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|panic| {
                    Err(Error::Internal(format!(
                        "rank {rank} panicked: {}",
                        crate::error::panic_message(panic.as_ref())
                    )))
                }),
                Err(e) => Err(e),
            })
            .collect()
    });
    let mut out = Vec::with_capacity(results.len());
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                return Err(Error::Rank {
                    rank: rank as u32,
                    source: Box::new(e),
                });
            }
        }
    }
    Ok(out)
}
