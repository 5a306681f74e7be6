//! The one step of the packet collectives: every rank sends every peer its part as LL16
//! packets, straight into the peer's scratch, and unpacks what every peer sent it. No
//! signal and no meeting: a packet's flag says it has arrived.
//!
//! A rank reuses a lockstep packet set two calls later (sets alternate with the call
//! number), by which time every peer has read it: a packet call ends only once every
//! peer's packets of that call have arrived, which each peer sends after it finished its
//! previous call, and every other lockstep call of the memory path ends the same way or at
//! a meeting. The eager broadcast and reduce (`broadcast_packets`, `reduce_packets`) end
//! knowing less; their packets land in slots of their own ([`Slots::Eager`]), and before
//! the next lockstep call the host launches the barrier, which meets every peer once it
//! has finished them (see [`call_protocol`](super::call_protocol)). So calls follow each
//! other with no barrier on the host, whatever the collectives.

use super::collective_args::CollectiveArgs;
use super::round_views::{window, window_mut};
use super::scratch_layout::{packet_flag, parity};
use oxccl_device::arch;
use oxccl_device::coop::{Block, Grid};
use oxccl_device::error::DeviceError;
use oxccl_device::packet::{Ll16Packet, Packet};
use oxccl_device::reduce::ReduceElement;
use oxccl_device::{DeviceView, DeviceViewMut};

/// What a rank sends each peer in a packet exchange.
#[derive(Clone, Copy)]
pub(crate) enum Sends {
    /// The same `count` elements to every peer (all-reduce, all-gather).
    Same,
    /// Block `p` of `n_ranks` blocks of `count` elements to peer `p` (reduce-scatter,
    /// all-to-all).
    Block,
}

/// Sends `count` elements of `input` to every peer as [`Sends`] says and unpacks what
/// every peer sent. Afterwards [`unpacked`]`(a, p, count)` holds what peer `p` sent, and
/// for this rank what it sent (with [`Sends::Block`], its own block `r`), all in scratch:
/// an `output` that is (or overlaps) `input` may then be written. The block's threads have
/// met after it (launch one block).
///
/// # Errors
/// A message over the packet limit ([`DeviceError::InvalidArgument`]), an `input` shorter
/// than what is sent, channel errors (a peer's packets not arriving within the wait limit).
#[inline(always)]
pub(crate) fn exchange_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    count: u64,
    sends: Sends,
) -> Result<(), DeviceError> {
    let (r, nr) = (a.rank, a.n_ranks);
    let padded = padded::<T>(a, count)?;
    // What we send goes through our unpacked slots: a channel sends from its `local`
    // buffer (the scratch). With one block per peer, peer `p`'s block waits in slot `p`,
    // which its packets replace below, once every thread has sent.
    match sends {
        Sends::Same => unpacked::<T>(a, r, count)?.copy_from(Grid, input)?,
        Sends::Block => {
            for p in 0..nr {
                let block = window(input, p as u64 * count, count)?;
                unpacked::<T>(a, p, count)?.copy_from(Grid, block)?;
            }
        }
    }
    arch::sync_threads();
    for p in (0..nr).filter(|&p| p != r) {
        let from = match sends {
            Sends::Same => r,
            Sends::Block => p,
        };
        send(a, Slots::Lockstep, p, from, padded)?;
    }
    // Every thread has sent before any unpacks (with one block per peer, into the slot it
    // sent from). Unconditional: a barrier under a condition the compiler can see through
    // is one the PTX rules cannot match to its source.
    arch::sync_threads();
    for p in (0..nr).filter(|&p| p != r) {
        receive(a, Slots::Lockstep, p, padded)?;
    }
    arch::sync_threads();
    Ok(())
}

/// The bytes of packets that carry `count` elements: their bytes rounded up to whole
/// packets.
///
/// # Errors
/// More than the packet limit ([`DeviceError::InvalidArgument`], recorded).
#[inline(always)]
pub(crate) fn padded<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    count: u64,
) -> Result<u64, DeviceError> {
    let bytes = count.saturating_mul(core::mem::size_of::<T>() as u64);
    let padded = bytes.div_ceil(Ll16Packet::PAYLOAD_BYTES) * Ll16Packet::PAYLOAD_BYTES;
    if padded > a.layout.packet_limit {
        return Err(a.invalid([bytes, a.layout.packet_limit, 1]));
    }
    Ok(padded)
}

/// Which slots a packet call's packets land in.
#[derive(Clone, Copy)]
pub(crate) enum Slots {
    /// The lockstep calls' ([`exchange_packets`]): two sets, alternating with the call
    /// number.
    Lockstep,
    /// The eager broadcast's and reduce's (see [`call_protocol`](super::call_protocol)):
    /// [`ScratchLayout::eager_depth`](super::ScratchLayout::eager_depth) sets, in turn.
    Eager,
}

impl Slots {
    /// The offset, in a receiver's scratch, of the slot of `sender`'s packets of this call.
    #[inline(always)]
    fn of(self, a: &CollectiveArgs<'_>, sender: u32) -> u64 {
        match self {
            Slots::Lockstep => a.layout.packet_slot(parity(a.sequence), sender),
            Slots::Eager => {
                let set = a.layout.eager_depth().set_of(a.sequence);
                a.layout.eager_slot(set, sender)
            }
        }
    }
}

/// Sends peer `to` the `padded` bytes of our unpacked slot of rank `from`, as this call's
/// packets, into its slot of our rank among `slots` (the block's threads share the
/// packets).
///
/// # Errors
/// Channel errors.
#[inline(always)]
pub(crate) fn send(
    a: &CollectiveArgs<'_>,
    slots: Slots,
    to: u32,
    from: u32,
    padded: u64,
) -> Result<(), DeviceError> {
    a.peer(to)?.put_packets::<Ll16Packet>(
        Block,
        slots.of(a, a.rank),
        a.layout.unpacked_slot(from),
        padded,
        packet_flag(a.sequence),
    )
}

/// Waits for this call's `padded` bytes of packets from peer `from` in its slot among
/// `slots` and unpacks them into our unpacked slot of `from` (the block's threads share
/// the packets).
///
/// # Errors
/// Channel errors (the packets not arriving within the wait limit).
#[inline(always)]
pub(crate) fn receive(
    a: &CollectiveArgs<'_>,
    slots: Slots,
    from: u32,
    padded: u64,
) -> Result<(), DeviceError> {
    a.peer(from)?.unpack_packets::<Ll16Packet>(
        Block,
        a.layout.unpacked_slot(from),
        slots.of(a, from),
        padded,
        packet_flag(a.sequence),
    )
}

/// Copies every rank's unpacked slot (`count` elements each, see [`exchange_packets`])
/// into its block of `output`: rank `p`'s at `p * count`.
///
/// # Errors
/// An `output` shorter than `n_ranks * count` elements ([`DeviceError::OutOfRange`]).
#[inline(always)]
pub(crate) fn copy_out<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    output: DeviceViewMut<'_, T>,
    count: u64,
) -> Result<(), DeviceError> {
    for p in 0..a.n_ranks {
        window_mut(output, p as u64 * count, count)?
            .copy_from(Grid, unpacked::<T>(a, p, count)?.as_view())?;
    }
    Ok(())
}

/// The `count` elements in rank `p`'s unpacked slot of our scratch (see
/// [`exchange_packets`]).
///
/// # Errors
/// A slot outside the scratch ([`DeviceError::OutOfRange`]).
#[inline(always)]
pub(crate) fn unpacked<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    p: u32,
    count: u64,
) -> Result<DeviceViewMut<'a, T>, DeviceError> {
    let off = a.layout.unpacked_slot(p);
    let bytes = count.saturating_mul(core::mem::size_of::<T>() as u64);
    a.scratch.slice(off..off.saturating_add(bytes))?.cast::<T>()
}
