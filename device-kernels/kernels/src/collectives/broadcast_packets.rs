//! Broadcast with LL16 packets, for small messages (see `packet_exchange.rs`): every
//! other rank sends the root a token, the root, once it has every token, sends each its
//! data. One round trip for the others, no meeting.
//!
//! Why the tokens: the root then sends only once every rank has reached the call (so has
//! finished its previous one), and a rank that has the data knows that every rank has:
//! what each packet call ends knowing, which the next call's reuse of the packet set of
//! the call before last relies on. Without them a root could run ahead of ranks still
//! reading an earlier call's packets, and a rank that had its data write into a slot a
//! slower rank still reads.

use super::collective_args::CollectiveArgs;
use super::packet_exchange::{TOKEN_BYTES, padded, receive, send, unpacked};
use super::round_views::{typed, typed_mut};
use oxccl_device::arch;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;

/// Broadcast with LL16 packets, for small messages: the root's `count` elements of
/// `input` (at most the layout's `packet_limit` bytes, rounded up to 8) land in every
/// rank's `output` (the root's too, unless `output` is `input`). Only the root's `input`
/// is read. Takes one call number. Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than `count`, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_broadcast_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => broadcast_packets::<T>(&args))
}

#[inline(always)]
fn broadcast_packets<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, r, nr, root) = (a.count, a.rank, a.n_ranks, a.root);
    let padded = padded::<T>(a, c)?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    if r != root {
        // The token's payload is whatever our own slot holds (this call writes only the
        // root's, into which the data are unpacked).
        send(a, root, r, TOKEN_BYTES)?;
        receive(a, root, padded)?;
        arch::sync_threads();
        return output.copy_from(Grid, unpacked::<T>(a, root, c)?.as_view());
    }
    let input = typed::<T>(a.input, 0, c)?;
    // Sent from our own unpacked slot (a channel sends from the scratch).
    unpacked::<T>(a, r, c)?.copy_from(Grid, input)?;
    for p in (0..nr).filter(|&p| p != r) {
        receive(a, p, TOKEN_BYTES)?;
    }
    arch::sync_threads();
    for p in (0..nr).filter(|&p| p != r) {
        send(a, p, r, padded)?;
    }
    if output.addr() != input.addr() {
        output.copy_from(Grid, input)?;
    }
    Ok(())
}
