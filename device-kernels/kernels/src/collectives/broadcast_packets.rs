//! Broadcast with packets, for small messages, eager (see
//! [`call_protocol`](super::call_protocol)): the root writes its data as packets (or as
//! data and a signal: [`packet_form`](super::packet_form)) into the eager slot of every
//! other rank and returns; each other rank waits for them, copies them out and, every few
//! calls ([`EagerDepth::done_every`]), answers with a done (a signal alone). The root waits
//! for the dones only before it writes a set of eager slots again,
//! [`ScratchLayout::eager_depth`] calls later (up to 64), so it runs that many calls ahead
//! of its receivers, and back-to-back broadcasts from one root overlap. The others
//! exchange nothing.

use super::call_protocol::CallProtocol;
use super::collective_args::CollectiveArgs;
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
use oxccl_device::reduce::ReduceElement;

/// Broadcast with packets, for small messages: the root's `count` elements of
/// `input` (at most the layout's `packet_limit` bytes, rounded up to 8) land in every
/// rank's `output` (the root's too, unless `output` is `input`). Only the root's `input`
/// is read. Takes one call number; `protocol` must be the eager broadcast from `root`
/// (see [`CallProtocol`]). Launch one block.
///
/// # Errors
/// Invalid ids, another protocol, a message over the packet limit, buffers shorter than
/// `count`, channel errors (a peer's packets or dones not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_broadcast_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (covered_until, dtype, _) = args.begin_eager(CallProtocol::BROADCAST)?;
    dispatch_element!(dtype, T => broadcast_packets::<T>(&args, covered_until))
}

#[inline(always)]
fn broadcast_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    covered_until: u64,
) -> Result<(), DeviceError> {
    let (c, r, nr, root, seq) = (a.count, a.rank, a.n_ranks, a.root, a.sequence);
    let padded = padded::<T>(a, c)?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    let depth = a.layout.eager_depth();
    if r != root {
        arrival(a, |p| p == root)?;
        receive(a, Slots::Eager, root, padded)?;
        // Every thread has unpacked its packets before any copies them out.
        arch::sync_threads();
        output.copy_from(Grid, received::<T>(a, Slots::Eager, root, c)?)?;
        // Every thread has read the slot out (the barrier) before the done.
        let channel = a.peer(root)?;
        return block_signal(move || match depth.done_after(seq) {
            true => channel.signal(),
            false => Ok(()),
        });
    }
    let input = typed::<T>(a.input, 0, c)?;
    // Sent from our own unpacked slot (a channel sends from the scratch).
    unpacked::<T>(a, r, c)?.copy_from(Grid, input)?;
    // Every peer's done covering the call a set cycle before this one, which wrote the set
    // this one writes; the barrier also has the slot staged before any thread sends.
    let dones = depth.dones_before(covered_until, seq);
    let peers = a.peers;
    block_wait(move || {
        for p in (0..nr).filter(|&p| p != r) {
            let channel = peers.get(p)?;
            for _ in 0..dones {
                channel.wait()?;
            }
        }
        Ok(())
    })?;
    for p in (0..nr).filter(|&p| p != r) {
        send(a, Slots::Eager, p, r, padded)?;
    }
    announce(a, |p| p != r)?;
    if output.addr() != input.addr() {
        output.copy_from(Grid, input)?;
    }
    Ok(())
}
