//! Reduce with LL16 packets, for small messages (see `packet_exchange.rs`): every other
//! rank sends the root its data, the root, once it has them all, sends each a token and
//! reduces. One round trip for the others, no meeting.
//!
//! Why the tokens: a rank that has the root's token knows that every rank has reached
//! the call (so has finished its previous one), what each packet call ends knowing, which
//! the next call's reuse of the packet set of the call before last relies on.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::packet_exchange::{TOKEN_BYTES, padded, receive, send, unpacked};
use super::round_views::{typed, typed_mut};
use oxccl_device::arch;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// Reduce with LL16 packets, for small messages: every rank's `count` elements of `input`
/// (at most the layout's `packet_limit` bytes, rounded up to 8) reduced by `op`, in rank
/// order, into the root's `output` (which may be its `input`); other ranks' `output` is
/// not written. Takes one call number. Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than `count`, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_reduce_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce_packets::<T>(&args, op))
}

#[inline(always)]
fn reduce_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (c, r, nr, root) = (a.count, a.rank, a.n_ranks, a.root);
    let padded = padded::<T>(a, c)?;
    // Our data goes through our own unpacked slot: sent from there (a channel sends from
    // the scratch), and on the root reduced from there, so an in-place `output` cannot
    // overwrite an input it still needs.
    unpacked::<T>(a, r, c)?.copy_from(Grid, typed::<T>(a.input, 0, c)?)?;
    arch::sync_threads();
    if r != root {
        send(a, root, r, padded)?;
        return receive(a, root, TOKEN_BYTES);
    }
    for p in (0..nr).filter(|&p| p != r) {
        receive(a, p, padded)?;
    }
    for p in (0..nr).filter(|&p| p != r) {
        // The token's payload is whatever our own slot holds.
        send(a, p, r, TOKEN_BYTES)?;
    }
    arch::sync_threads();
    let output = typed_mut::<T>(a.output, 0, c)?;
    reduce_ranks(output, nr, op, |p| Ok(unpacked::<T>(a, p, c)?.as_view()))
}
