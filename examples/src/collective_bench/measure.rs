//! One rank's sweep: for each size, a checked call and the timed calls, out of place and in
//! place.
//!
//! Every rank makes the same calls in the same order. The time of a size is this rank's
//! mean over the timed calls; the report takes the slowest rank's. With
//! [`CheckMode::First`] the timed calls run back to back after one checked call (in place,
//! each works on the previous one's result, as in nccl-tests), each synchronized before the
//! next if the plan is blocking; with [`CheckMode::Every`]
//! each timed call starts from fresh buffers after a host barrier, is synchronized alone
//! and then checked, and only the call and its synchronization are timed.

use super::case::{Buffers, Case, Expected};
use super::options::CheckMode;
use super::plan::Plan;
use oxccl::{Communicator, ReduceElement, Result, Stream};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Least time the first size of a sweep warms up for, on top of its warm-up calls. Threads
/// just started run where the OS put them, often on one core, until its load balancer
/// spreads them some milliseconds later: the first size otherwise came out 1.5-1.8x the
/// next (2 ranks, 8 B, 200 warm-up and 2000 timed calls; 20000 warm-up calls, about 10
/// ms, made it even with the next).
pub const SETTLE: Duration = Duration::from_millis(20);

/// The time and the check of one placement of one size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Mean time of one call, in microseconds.
    pub time_us: f64,
    /// Elements that differed from the reference, over every checked call.
    pub wrong: u64,
}

/// One size on one rank (or, once combined, on all ranks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    /// The size, in bytes (see `Collective::bytes_for`).
    pub bytes: u64,
    /// The call's `count`.
    pub count: u64,
    /// The algorithm the call takes.
    pub algo: String,
    /// Out of place.
    pub out_of_place: Timing,
    /// In place, where the collective has an in-place form.
    pub in_place: Option<Timing>,
}

/// The whole sweep on this rank.
///
/// # Errors
/// A failed allocation, call or synchronization.
pub fn sweep_rank(comm: &mut Communicator, plan: &Plan) -> Result<Vec<SizeResult>> {
    oxccl_device::dispatch_element!(plan.dtype, T => sweep::<T>(comm, plan))
}

fn sweep<T: ReduceElement>(comm: &mut Communicator, plan: &Plan) -> Result<Vec<SizeResult>> {
    let stream = comm.device().stream()?;
    let mut results = Vec::new();
    let mut settle = true;
    for &count in &plan.counts {
        let bytes = plan.bytes_for(count);
        let algo = plan.algorithm(comm, count * plan.dtype.size())?;
        let mut case = Case {
            collective: plan.collective,
            count: count as usize,
            rank: comm.rank(),
            ranks: comm.size(),
            op: plan.op,
            root: plan.root,
            seed: 0,
            in_place: false,
        };
        // Registered on every path: the direct algorithms read the peers' buffers in
        // place, the port all-reduce puts from the registered input.
        let register = plan.registers();
        let out_of_place = time_case::<T>(comm, &case, plan, register, settle, &stream)?;
        settle = false;
        let in_place = if plan.collective.has_in_place() {
            case.in_place = true;
            Some(time_case::<T>(comm, &case, plan, register, false, &stream)?)
        } else {
            None
        };
        results.push(SizeResult {
            bytes,
            count,
            algo,
            out_of_place,
            in_place,
        });
    }
    Ok(results)
}

/// One checked call of `case`: reset, call, synchronize, count wrong elements.
///
/// # Errors
/// A failed copy, call or synchronization.
pub fn checked_call<T: ReduceElement>(
    comm: &mut Communicator,
    case: &Case,
    stream: &Stream,
) -> Result<u64> {
    // The device buffers first: a size beyond the machine's memory is refused there, with
    // a clear error, before the host copies below are made.
    let mut bufs = case.alloc::<T>(comm)?;
    let input = case.input::<T>();
    let want = case.expected::<T>();
    case.reset(&mut bufs, &input)?;
    case.call(comm, &mut bufs, stream)?;
    comm.synchronize(stream)?;
    case.wrong(&bufs, want.as_ref())
}

/// Times `case` (see [`timed_calls`]) on buffers of its own, registered if `register`;
/// warms up for at least [`SETTLE`] first if `settle`.
fn time_case<T: ReduceElement>(
    comm: &mut Communicator,
    case: &Case,
    plan: &Plan,
    register: bool,
    settle: bool,
    stream: &Stream,
) -> Result<Timing> {
    // The device buffers first, as in `checked_call`.
    let mut bufs = case.alloc::<T>(comm)?;
    let input = case.input::<T>();
    let want: Option<Expected<T>> = case.expected::<T>();
    if register {
        comm.register_collective_buffer(&bufs.input)?;
        if let Some(out) = &bufs.output {
            comm.register_collective_buffer(out)?;
        }
    }
    let settled = match settle {
        true => settle_calls(comm, case, stream, &mut bufs),
        false => Ok(()),
    };
    let timing = settled
        .and_then(|()| timed_calls(comm, case, plan, stream, &mut bufs, &input, want.as_ref()));
    if register {
        comm.deregister_collective_buffer(&bufs.input, stream)?;
        if let Some(out) = &bufs.output {
            comm.deregister_collective_buffer(out, stream)?;
        }
    }
    timing
}

/// Calls `case` on `bufs` until [`SETTLE`] has passed on rank 0's clock, in batches that
/// double from one call (so a large first size makes at most about twice the calls that
/// fill the time); after each batch the ranks agree, through the out-of-band exchange, on
/// rank 0's word, so every rank makes the same calls.
///
/// # Errors
/// A failed call, synchronization or exchange.
fn settle_calls<T: ReduceElement>(
    comm: &mut Communicator,
    case: &Case,
    stream: &Stream,
    bufs: &mut Buffers<T>,
) -> Result<()> {
    let start = Instant::now();
    let mut batch: u32 = 1;
    loop {
        for _ in 0..batch {
            case.call(comm, bufs, stream)?;
        }
        comm.synchronize(stream)?;
        let done = u8::from(start.elapsed() >= SETTLE);
        let words = comm.out_of_band().all_gather(vec![done])?;
        if words.first().and_then(|w| w.first()) != Some(&0) {
            return Ok(());
        }
        batch = batch.saturating_mul(2);
    }
}

/// The checked and timed calls of [`time_case`] on `bufs`.
fn timed_calls<T: ReduceElement>(
    comm: &mut Communicator,
    case: &Case,
    plan: &Plan,
    stream: &Stream,
    bufs: &mut Buffers<T>,
    input: &[T],
    want: Option<&Expected<T>>,
) -> Result<Timing> {
    let mut wrong = 0;
    if plan.check == CheckMode::First {
        case.reset(bufs, input)?;
        case.call(comm, bufs, stream)?;
        comm.synchronize(stream)?;
        wrong += case.wrong(bufs, want)?;
    }
    for _ in 0..plan.warmup {
        case.call(comm, bufs, stream)?;
    }
    comm.synchronize(stream)?;
    comm.barrier()?;
    let iters = plan.iters.max(1);
    let seconds = match plan.check {
        CheckMode::First => {
            let start = Instant::now();
            for _ in 0..iters {
                case.call(comm, bufs, stream)?;
                if plan.blocking {
                    comm.synchronize(stream)?;
                }
            }
            comm.synchronize(stream)?;
            start.elapsed().as_secs_f64()
        }
        CheckMode::Every => {
            let mut total = 0.0;
            for _ in 0..iters {
                case.reset(bufs, input)?;
                // Ranks start each call together: a rank still resetting would otherwise
                // count in its peers' times.
                comm.barrier()?;
                let start = Instant::now();
                case.call(comm, bufs, stream)?;
                comm.synchronize(stream)?;
                total += start.elapsed().as_secs_f64();
                wrong += case.wrong(bufs, want)?;
            }
            total
        }
    };
    comm.barrier()?;
    Ok(Timing {
        time_us: seconds * 1e6 / f64::from(iters),
        wrong,
    })
}
