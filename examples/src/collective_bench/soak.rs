//! `--soak`: calls of random sizes, types, operations, roots and placements for a while,
//! every result checked.
//!
//! Every rank draws from the same seeded generator, so all make the same calls; rank 0's
//! clock decides when to stop, and it tells the others before each call (an out-of-band
//! exchange per call: ranks whose clocks disagree would otherwise make different numbers of
//! calls and wait for each other until a timeout).

use super::case::Case;
use super::measure::checked_call;
use super::plan::Plan;
use oxccl::{Communicator, DataType, ReduceOp, Result};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What a soak did on one rank (or, combined, on all).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakReport {
    /// Calls made.
    pub calls: u64,
    /// Elements that differed from the reference, over every call.
    pub wrong: u64,
    /// Seconds the soak ran.
    pub seconds: f64,
    /// The first few calls that went wrong, described.
    pub failures: Vec<String>,
}

/// Calls described in [`SoakReport::failures`] at most.
const FAILURES_KEPT: usize = 10;

/// Runs random checked calls on this rank for `seconds` (rank 0's clock), sizes up to
/// `max_bytes` (at least `min_bytes`).
///
/// # Errors
/// A call or a synchronization that failed, or the out-of-band exchange.
pub fn soak_rank(
    comm: &mut Communicator,
    plan: &Plan,
    seconds: f64,
    seed: u64,
    (min_bytes, max_bytes): (u64, u64),
) -> Result<SoakReport> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let stream = comm.device().stream()?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
    let started = Instant::now();
    let mut report = SoakReport::default();
    loop {
        let go = u8::from(Instant::now() < deadline);
        let votes = comm.out_of_band().all_gather(vec![go])?;
        if votes.first().and_then(|v| v.first()) != Some(&1) {
            break;
        }
        let dtype = DataType::ALL[rng.random_range(0..DataType::ALL.len())];
        let op = ReduceOp::ALL[rng.random_range(0..ReduceOp::ALL.len())];
        // Log-uniform sizes: small and large calls come up about as often.
        let (lo, hi) = (
            min_bytes.max(1) as f64,
            max_bytes.max(min_bytes.max(1)) as f64,
        );
        let bytes = (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp() as u64;
        let count = plan
            .collective
            .count_for(bytes, dtype.size(), plan.ranks)
            .max(1);
        let case = Case {
            collective: plan.collective,
            count: count as usize,
            rank: comm.rank(),
            ranks: plan.ranks,
            op,
            root: rng.random_range(0..plan.ranks),
            seed: (report.calls % 1000) as u32,
            in_place: plan.collective.has_in_place() && rng.random::<bool>(),
        };
        let wrong = oxccl_device::dispatch_element!(dtype, T => {
            checked_call::<T>(comm, &case, &stream)?
        });
        if wrong > 0 && report.failures.len() < FAILURES_KEPT {
            let op = if plan.collective.reduces() {
                format!(", {}", op.name())
            } else {
                String::new()
            };
            report.failures.push(format!(
                "call {}: {} of {count} {} elements{op}, root {}, {}: {wrong} wrong on rank {}",
                report.calls,
                plan.collective.title(),
                dtype.name(),
                case.root,
                if case.in_place {
                    "in place"
                } else {
                    "out of place"
                },
                comm.rank()
            ));
        }
        report.calls += 1;
        report.wrong += wrong;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
