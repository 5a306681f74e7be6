//! All-reduce with packets, for small messages: one pass, no meeting (LL16 packets, or
//! data and a signal from a size on; see `packet_exchange.rs`).

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::packet_exchange::{Sends, Slots, exchange_packets, received};
use super::round_views::{typed, typed_mut};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;

/// All-reduce with packets, for small messages: `count` elements (at most the layout's
/// `packet_limit` bytes, rounded up to 8) reduced by `op` into `output` on every rank.
/// Takes one call number. Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than `count`, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_all_reduce_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => all_reduce_packets::<T>(&args, op))
}

#[inline(always)]
fn all_reduce_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let n = a.count;
    // The reduction then reads scratch only, so an in-place `output` cannot overwrite an
    // input it still needs.
    exchange_packets(a, typed::<T>(a.input, 0, n)?, n, Sends::Same)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    reduce_ranks(output, a.n_ranks, op, |p| {
        received::<T>(a, Slots::Lockstep, p, n)
    })
}
