//! Reduce with packets, for small messages, eager (see
//! [`call_protocol`](super::call_protocol)): every other rank writes its data as packets
//! (or as data and a signal: [`packet_form`](super::packet_form)) into its eager slot of
//! the root and returns; the root waits for every rank's data, reduces them and, every few
//! calls ([`EagerDepth::done_every`]), answers each with a done (a signal alone). A sender
//! waits for the root's done only before it writes a set of eager slots again,
//! [`ScratchLayout::eager_depth`] calls later (up to 64), so it runs that many calls ahead
//! of the root, and back-to-back reduces to one root overlap. The others exchange nothing
//! among themselves.

use super::call_protocol::CallProtocol;
use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::packet_exchange::{Slots, announce, arrival, padded, receive, received, send, unpacked};
use super::round_views::{typed, typed_mut};
#[cfg(doc)]
use super::{EagerDepth, ScratchLayout};
use oxccl_device::arch;
use oxccl_device::block::{block_signal, block_wait};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// Reduce with packets, for small messages: every rank's `count` elements of `input`
/// (at most the layout's `packet_limit` bytes, rounded up to 8) reduced by `op`, in rank
/// order, into the root's `output` (which may be its `input`); other ranks' `output` is
/// not written. Takes one call number; `protocol` must be the eager reduce to `root` (see
/// [`CallProtocol`]). Launch one block.
///
/// # Errors
/// Invalid ids, another protocol, a message over the packet limit, buffers shorter than
/// `count`, channel errors (a peer's packets or dones not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_reduce_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (covered_until, dtype, op) = args.begin_eager(CallProtocol::REDUCE)?;
    dispatch_element!(dtype, T => reduce_packets::<T>(&args, op, covered_until))
}

#[inline(always)]
fn reduce_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
    covered_until: u64,
) -> Result<(), DeviceError> {
    let (c, r, nr, root, seq) = (a.count, a.rank, a.n_ranks, a.root, a.sequence);
    let padded = padded::<T>(a, c)?;
    // Our data goes through our own unpacked slot: sent from there (a channel sends from
    // the scratch), and on the root reduced from there, so an in-place `output` cannot
    // overwrite an input it still needs.
    unpacked::<T>(a, r, c)?.copy_from(Grid, typed::<T>(a.input, 0, c)?)?;
    if r != root {
        // The root's done covering the call a set cycle before this one, which wrote the
        // slot this one writes; the barrier also has our data staged before any thread
        // sends.
        let dones = a.layout.eager_depth().dones_before(covered_until, seq);
        let channel = a.peer(root)?;
        block_wait(move || {
            for _ in 0..dones {
                channel.wait()?;
            }
            Ok(())
        })?;
        send(a, Slots::Eager, root, r, padded)?;
        return announce(a, |p| p == root);
    }
    arrival(a, |p| p != r)?;
    for p in (0..nr).filter(|&p| p != r) {
        receive(a, Slots::Eager, p, padded)?;
    }
    // Every thread has unpacked (and staged our own slot) before any reduces.
    arch::sync_threads();
    let output = typed_mut::<T>(a.output, 0, c)?;
    reduce_ranks(output, nr, op, |p| received::<T>(a, Slots::Eager, p, c))?;
    // Every thread has read the slots out (the barrier) before the dones.
    let (peers, depth) = (a.peers, a.layout.eager_depth());
    block_signal(move || {
        if depth.done_after(seq) {
            for p in (0..nr).filter(|&p| p != r) {
                peers.get(p)?.signal()?;
            }
        }
        Ok(())
    })
}
