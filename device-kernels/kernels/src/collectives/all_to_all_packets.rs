//! All-to-all with packets, for small messages: one pass, no meeting (LL16
//! packets, or data and a signal from a size on; see `packet_exchange.rs`).

use super::collective_args::CollectiveArgs;
use super::packet_exchange::{Sends, copy_out, exchange_packets};
use super::round_views::{typed, typed_mut};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;

/// All-to-all with packets, for small messages: rank `r` sends its `input` elements
/// `p * count..(p + 1) * count` (at most the layout's `packet_limit` bytes, rounded up to
/// 8) to rank `p`, which puts them at `r * count` of its `output` (`n_ranks * count` each;
/// `output` may be `input`). Takes one call number. Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than the call, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_all_to_all_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => all_to_all_packets::<T>(&args))
}

#[inline(always)]
fn all_to_all_packets<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, nr) = (a.count, a.n_ranks);
    let total = c.saturating_mul(nr as u64);
    exchange_packets(a, typed::<T>(a.input, 0, total)?, c, Sends::Block)?;
    let output = typed_mut::<T>(a.output, 0, total)?;
    copy_out(a, output, c)
}
