//! The one step of the packet collectives: every rank sends every peer its part straight
//! into the peer's scratch, as LL16 packets or as data and one signal (see
//! [`packet_form`](super::packet_form)), and reads what every peer sent it. No meeting: a
//! packet's flag, or the sender's signal, says it has arrived.
//!
//! A rank reuses a lockstep packet set two calls later (sets alternate with the call
//! number), by which time every peer has read it: a packet call ends only once every
//! peer's part of that call has arrived, which each peer sends after it finished its
//! previous call (its reads of the set included), and every other lockstep call of the
//! memory path ends the same way or at a meeting. The eager broadcast and reduce
//! (`broadcast_packets`, `reduce_packets`) end knowing less; their parts land in slots of
//! their own ([`Slots::Eager`]), and before the next lockstep call the host launches the
//! barrier, which meets every peer once it has finished them (see
//! [`call_protocol`](super::call_protocol)). So calls follow each other with no barrier on
//! the host, whatever the collectives.
//!
//! In the data form every signal of a call is matched by one wait of the same call on the
//! peer, so the semaphores stay balanced for the meetings and dones of other calls.

use super::collective_args::CollectiveArgs;
use super::packet_form::PacketForm;
use super::round_views::{window, window_mut};
use super::scratch_layout::{packet_flag, parity};
use oxccl_device::arch;
use oxccl_device::block::{block_signal, block_signal_and_wait, block_wait};
use oxccl_device::coop::{Block, Grid};
use oxccl_device::error::DeviceError;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
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

/// Sends `count` elements of `input` to every peer as [`Sends`] says and receives what
/// every peer sent. Afterwards [`received`]`(a, Slots::Lockstep, p, count)` holds what peer
/// `p` sent, and for this rank what it sent (with [`Sends::Block`], its own block `r`), all
/// in scratch: an `output` that is (or overlaps) `input` may then be written. The block's
/// threads have met after it (launch one block).
///
/// # Errors
/// A message over the packet limit ([`DeviceError::InvalidArgument`]), an `input` shorter
/// than what is sent, channel errors (a peer's packets or signal not arriving within the
/// wait limit).
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
    // Every thread has sent before any reads (with one block per peer, into the slot it
    // sent from), and in the data form before the signals. Unconditional: a barrier under a
    // condition the compiler can see through is one the PTX rules cannot match to its
    // source.
    block_signal_and_wait(
        signal_each(a, move |p| p != r),
        wait_each(a, move |p| p != r),
    )?;
    for p in (0..nr).filter(|&p| p != r) {
        receive(a, Slots::Lockstep, p, padded)?;
    }
    arch::sync_threads();
    Ok(())
}

/// Whether this call's messages go as data and a signal ([`PacketForm::DATA`]).
#[inline(always)]
fn is_data(a: &CollectiveArgs<'_>) -> bool {
    a.packet_form == PacketForm::DATA
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
    /// The offset, in a receiver's scratch, of the slot of `sender`'s message of this call:
    /// a packet slot, or in the data form a data slot (never a packet slot, whose stale
    /// packets must carry only flags).
    #[inline(always)]
    fn of(self, a: &CollectiveArgs<'_>, sender: u32) -> u64 {
        let l = &a.layout;
        match (self, is_data(a)) {
            (Slots::Lockstep, false) => l.packet_slot(parity(a.sequence), sender),
            (Slots::Lockstep, true) => l.data_slot(parity(a.sequence), sender),
            (Slots::Eager, false) => l.eager_slot(l.eager_depth().set_of(a.sequence), sender),
            (Slots::Eager, true) => l.eager_data_slot(l.eager_depth().set_of(a.sequence), sender),
        }
    }
}

/// Sends peer `to` the `padded` bytes of our unpacked slot of rank `from`, as this call's
/// packets or data, into its slot of our rank among `slots` (the block's threads share the
/// work). In the data form the peer learns of it from [`announce`], after it.
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
    let channel = a.peer(to)?;
    let (dst, src) = (slots.of(a, a.rank), a.layout.unpacked_slot(from));
    match is_data(a) {
        true => channel.put(Block, dst, src, padded),
        false => {
            channel.put_packets::<Ll16Packet>(Block, dst, src, padded, packet_flag(a.sequence))
        }
    }
}

/// After [`send`]s to every peer `to` for which `to_peer(to)` holds: in the data form, the
/// block has written and thread 0 signals each of them (release); a block barrier
/// either way.
///
/// # Errors
/// Channel errors.
#[inline(always)]
pub(crate) fn announce(
    a: &CollectiveArgs<'_>,
    to_peer: impl Fn(u32) -> bool,
) -> Result<(), DeviceError> {
    block_signal(signal_each(a, to_peer))
}

/// Before [`receive`]s from every peer `from` for which `from_peer(from)` holds: in the
/// data form, thread 0 waits for each one's signal (acquire) and the block then sees what
/// they sent; a block barrier either way.
///
/// # Errors
/// Channel errors (a signal not arriving within the wait limit).
#[inline(always)]
pub(crate) fn arrival(
    a: &CollectiveArgs<'_>,
    from_peer: impl Fn(u32) -> bool,
) -> Result<(), DeviceError> {
    block_wait(wait_each(a, from_peer))
}

/// Thread 0's step of [`announce`]: in the data form, signal every peer `p` for which
/// `to_peer(p)` holds; else nothing.
#[inline(always)]
fn signal_each(
    a: &CollectiveArgs<'_>,
    to_peer: impl Fn(u32) -> bool,
) -> impl FnOnce() -> Result<(), DeviceError> {
    on_each(a, to_peer, |c| c.signal())
}

/// Thread 0's step of [`arrival`]: in the data form, wait for one signal of every peer
/// `p` for which `from_peer(p)` holds; else nothing.
#[inline(always)]
fn wait_each(
    a: &CollectiveArgs<'_>,
    from_peer: impl Fn(u32) -> bool,
) -> impl FnOnce() -> Result<(), DeviceError> {
    on_each(a, from_peer, |c| c.wait())
}

/// In the data form, `step` on the channel to every peer `p` for which `peer(p)` holds;
/// else nothing. Plain values, not `a` (what a closure takes lives in local memory on the
/// GPU once the closure is out of line).
#[inline(always)]
fn on_each(
    a: &CollectiveArgs<'_>,
    peer: impl Fn(u32) -> bool,
    step: impl Fn(&MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError>,
) -> impl FnOnce() -> Result<(), DeviceError> {
    let (peers, data, nr) = (a.peers, is_data(a), a.n_ranks);
    move || match data {
        true => (0..nr)
            .filter(|&p| peer(p))
            .try_for_each(|p| step(peers.get(p)?)),
        false => Ok(()),
    }
}

/// In the packet form, waits for this call's `padded` bytes of packets from peer `from` in
/// its slot among `slots` and unpacks them into our unpacked slot of `from` (the block's
/// threads share the packets); in the data form, nothing: the data stay in the slot, read
/// through [`received`] once [`arrival`] has seen the signal.
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
    if is_data(a) {
        return Ok(());
    }
    a.peer(from)?.unpack_packets::<Ll16Packet>(
        Block,
        a.layout.unpacked_slot(from),
        slots.of(a, from),
        padded,
        packet_flag(a.sequence),
    )
}

/// The `count` elements peer `p` sent this call among `slots` once [`receive`]d (for our
/// own rank, what we sent: our unpacked slot): in the packet form our unpacked slot of
/// `p`, in the data form its slot itself, to be read before the set is reused.
///
/// # Errors
/// A slot outside the scratch ([`DeviceError::OutOfRange`]).
#[inline(always)]
pub(crate) fn received<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    slots: Slots,
    p: u32,
    count: u64,
) -> Result<DeviceView<'a, T>, DeviceError> {
    let off = match is_data(a) && p != a.rank {
        true => slots.of(a, p),
        false => a.layout.unpacked_slot(p),
    };
    let bytes = count.saturating_mul(core::mem::size_of::<T>() as u64);
    a.scratch
        .as_view()
        .slice(off..off.saturating_add(bytes))?
        .cast::<T>()
}

/// Copies what every rank sent in the exchange (`count` elements each, see
/// [`exchange_packets`] and [`received`]) into its block of `output`: rank `p`'s at
/// `p * count`.
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
            .copy_from(Grid, received::<T>(a, Slots::Lockstep, p, count)?)?;
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
