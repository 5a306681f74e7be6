//! Reduce-scatter with packets, for small messages: one pass, no meeting (LL16
//! packets, or data and a signal from a size on; see `packet_exchange.rs`).

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::packet_exchange::{Sends, Slots, exchange_packets, received};
use super::round_views::{typed, typed_mut};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// Reduce-scatter with packets, for small messages: every rank's `input` of
/// `n_ranks * count` elements is reduced by `op`, and rank `r` gets elements
/// `r * count..(r + 1) * count` of the result (at most the layout's `packet_limit` bytes,
/// rounded up to 8) in `output` (which may be that block of `input`). Each rank sends
/// peer `p` its block `p`; the blocks are combined in rank order. Takes one call number.
/// Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than the call, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_reduce_scatter_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce_scatter_packets::<T>(&args, op))
}

#[inline(always)]
fn reduce_scatter_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (c, nr) = (a.count, a.n_ranks);
    let total = c.saturating_mul(nr as u64);
    exchange_packets(a, typed::<T>(a.input, 0, total)?, c, Sends::Block)?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    reduce_ranks(output, nr, op, |p| received::<T>(a, Slots::Lockstep, p, c))
}
