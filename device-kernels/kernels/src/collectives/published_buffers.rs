//! Zero-copy calls: how the ranks of a call learn whether every one of them registered the
//! buffers its peers read, and reach each other's buffers in place.
//!
//! Before its first meeting, each rank writes a **call descriptor** into its scratch
//! ([`ScratchLayout::descriptor`](super::ScratchLayout::descriptor) of the call's parity):
//! the slot of its input and of its output in the table of registered buffers
//! ([`CollectiveArgs::buffers`]) and their offsets there, or [`NO_SLOT`]. After the
//! meeting every rank reads every peer's descriptor. All ranks read the same descriptors,
//! so all choose the same path: in place of the peers' buffers when every rank registered
//! what the collective reads of it (its input; for all-reduce its output too; for broadcast
//! only the root's input), staged through the scratch otherwise (a rank that registered
//! and so staged nothing stages then, and all meet again). A peer's buffer is named by slot
//! and offset, never by address, and every view of it is checked against the table. A call
//! that ran in place ends with a meeting, so that no rank returns (and lets its caller
//! write its buffers) while a peer still reads them.
//!
//! A rank writes a descriptor slot again only after a meeting that every peer reaches after
//! reading it: slots alternate with the parity of the call's first sequence number, so the
//! call in between, or the second round of the same call, holds that meeting.

use super::all_to_allv_counts::AllToAllvCounts;
use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use oxccl_device::arch;
use oxccl_device::error::DeviceError;
use oxccl_device::peer_buffer_table::NO_SLOT;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::{DeviceView, DeviceViewMut};

/// Descriptor word: the input's slot ([`NO_SLOT`] if not registered).
pub const INPUT_SLOT: u64 = 0;
/// Descriptor word: the input's byte offset in its registered buffer.
pub const INPUT_OFFSET: u64 = 1;
/// Descriptor word: the output's slot ([`NO_SLOT`] if not registered).
pub const OUTPUT_SLOT: u64 = 2;
/// Descriptor word: the output's byte offset in its registered buffer.
pub const OUTPUT_OFFSET: u64 = 3;
/// Descriptor words from here on: what a collective adds for its peers (all-to-all-v:
/// where its input holds what it sends each rank, by rank).
pub const EXTRA: u64 = 4;
/// Words of a descriptor: room for an extra word per rank of an all-to-all-v.
pub const DESCRIPTOR_WORDS: u64 = EXTRA + AllToAllvCounts::MAX_RANKS as u64;

/// Which buffers of which ranks a collective's peers read, so must be registered for the
/// call to run in place of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Every rank's input (all-gather, all-to-all).
    Inputs,
    /// Every rank's input and output (all-reduce: the peers write into the outputs).
    InputsAndOutputs,
    /// The root's input alone (broadcast).
    RootInput,
}

/// Whether `rank`, whose input and output are registered or not as said, has registered
/// what the peers read of it; and whether it has anything for them at all.
#[inline(always)]
fn ready(reads: Reads, root: u32, rank: u32, input: bool, output: bool) -> (bool, bool) {
    match reads {
        Reads::Inputs => (input, true),
        Reads::InputsAndOutputs => (input && output, true),
        Reads::RootInput if rank == root => (input, true),
        Reads::RootInput => (true, false),
    }
}

/// The slot and offset of a view of ours, if a slot the host named holds it.
///
/// # Errors
/// [`DeviceError::InvalidArgument`] (recorded) when the slot does not hold the view.
#[inline(always)]
fn own_place(
    a: &CollectiveArgs<'_>,
    slot: u32,
    addr: u64,
    bytes: u64,
) -> Result<(u64, u64), DeviceError> {
    if slot == NO_SLOT {
        return Ok((NO_SLOT as u64, 0));
    }
    match a.buffers.offset_of(slot, a.rank, addr, bytes) {
        Ok(offset) => Ok((slot as u64, offset)),
        Err(_) => Err(a.invalid([slot as u64, addr, bytes])),
    }
}

/// Writes our descriptor of the call numbered `sequence` (one thread does); says whether
/// we registered what the peers read of us and have anything for them (so stage nothing
/// until the survey says). Call it before the call's first meeting, on every thread.
///
/// # Errors
/// A slot that does not hold the view; a scratch too short for the layout.
#[inline(always)]
fn publish_descriptor(
    a: &CollectiveArgs<'_>,
    sequence: u64,
    reads: Reads,
    offer: bool,
) -> Result<bool, DeviceError> {
    let (input_slot, output_slot) = match offer {
        true => (a.input_slot, a.output_slot),
        false => (NO_SLOT, NO_SLOT),
    };
    let (input_slot, input) = own_place(a, input_slot, a.input.addr(), a.input.len())?;
    let (output_slot, output) = own_place(a, output_slot, a.output.addr(), a.output.len())?;
    if arch::block_rank() == 0 && arch::thread_rank_in_block() == 0 {
        let at = a.layout.descriptor(sequence & 1);
        let slot = a
            .scratch
            .slice(at..at + DESCRIPTOR_WORDS * 8)?
            .cast::<u64>()?;
        // One store each: a loop over an array of the words would put the array in local
        // memory on the GPU.
        slot.set(INPUT_SLOT, input_slot)?;
        slot.set(INPUT_OFFSET, input)?;
        slot.set(OUTPUT_SLOT, output_slot)?;
        slot.set(OUTPUT_OFFSET, output)?;
    }
    let none = NO_SLOT as u64;
    let (registered, has) = ready(
        reads,
        a.root,
        a.rank,
        input_slot != none,
        output_slot != none,
    );
    Ok(registered && has)
}

/// Writes `words` into our descriptor of the call numbered `sequence` from word [`EXTRA`]
/// on (one thread does; the rest of the call's words are [`publish`]'s). Call it before
/// [`survey`], on every thread.
///
/// # Errors
/// More words than the descriptor holds; a scratch too short for the layout.
#[inline(always)]
pub(crate) fn publish_extra(
    a: &CollectiveArgs<'_>,
    words: impl Iterator<Item = u64>,
) -> Result<(), DeviceError> {
    if arch::block_rank() == 0 && arch::thread_rank_in_block() == 0 {
        let at = a.layout.descriptor(a.sequence & 1);
        let slot = a
            .scratch
            .slice(at..at + DESCRIPTOR_WORDS * 8)?
            .cast::<u64>()?;
        for (i, w) in (EXTRA..).zip(words) {
            slot.set(i, w)?;
        }
    }
    Ok(())
}

/// Word `word` of peer `p`'s descriptor of the call numbered `sequence` (after the call's
/// first meeting).
///
/// # Errors
/// A peer outside the channel set, a word outside the descriptor.
#[inline(always)]
pub(crate) fn peer_word(
    a: &CollectiveArgs<'_>,
    p: u32,
    sequence: u64,
    word: u64,
) -> Result<u64, DeviceError> {
    if word >= DESCRIPTOR_WORDS {
        return Err(DeviceError::OutOfRange);
    }
    let at = a.layout.descriptor(sequence & 1) + word * 8;
    a.peer(p)?.remote_view::<u64>(at, 1)?.get(0)
}

/// How a call goes on after [`survey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Every rank registered what the peers read of it: the call runs in place of the
    /// peers' buffers, and ends with [`all_peers_meet`], so that no rank returns (and lets
    /// its caller write its buffers) while a peer still reads them.
    InPlace,
    /// Staged: the first round is staged everywhere and met.
    Staged,
    /// Staged, but this rank registered and so did not stage its first round: stage it
    /// now, then [`all_peers_meet`].
    StageFirst,
    /// Staged: this rank staged its first round, but some rank did not: meet once more
    /// ([`all_peers_meet`]) after those stage.
    MeetAgain,
}

/// Starts a call that runs in place of the peers' buffers when every rank registered what
/// the peers read of it (`reads`) and offers it (`offer`: a rank whose call cannot let
/// peers read its buffers in place, an in-place all-to-all say, publishes them as not
/// registered): writes our descriptor, and says whether we registered what the peers
/// read of us. If not, stage the first round, then call [`survey`].
///
/// The two halves are separate calls, not one taking the staging as a closure: a closure
/// called from two places stays out of line on the GPU, and the kernel's arguments it
/// borrows then live in local memory (2 KiB of stack for every collective kernel).
///
/// # Errors
/// A slot that does not hold the view; a scratch too short for the layout.
#[inline(always)]
pub(crate) fn publish(
    a: &CollectiveArgs<'_>,
    reads: Reads,
    offer: bool,
) -> Result<bool, DeviceError> {
    publish_descriptor(a, a.sequence, reads, offer)
}

/// Meets the peers and reads their descriptors of the call, after [`publish`] (which
/// returned `mine`) and the staging it asked for: every rank reads the same descriptors,
/// so every rank takes the same [`Path`].
///
/// # Errors
/// The meeting's; a peer outside the channel set.
#[inline(always)]
pub(crate) fn survey(
    a: &CollectiveArgs<'_>,
    reads: Reads,
    offer: bool,
    mine: bool,
) -> Result<Path, DeviceError> {
    let sequence = a.sequence;
    all_peers_meet(a)?;
    let (mut all, mut any) = (true, mine);
    for p in 0..a.n_ranks {
        let (input, output) = if p == a.rank {
            (
                offer && a.input_slot != NO_SLOT,
                offer && a.output_slot != NO_SLOT,
            )
        } else {
            let none = NO_SLOT as u64;
            (
                peer_word(a, p, sequence, INPUT_SLOT)? != none,
                peer_word(a, p, sequence, OUTPUT_SLOT)? != none,
            )
        };
        let (ok, has) = ready(reads, a.root, p, input, output);
        all &= ok;
        any |= ok && has;
    }
    Ok(match (all, any, mine) {
        (true, _, _) => Path::InPlace,
        (false, false, _) => Path::Staged,
        (false, true, true) => Path::StageFirst,
        (false, true, false) => Path::MeetAgain,
    })
}

/// The meeting a staged [`Path`] still needs before its first round is read:
/// [`Path::StageFirst`] (after this rank staged) and [`Path::MeetAgain`] meet the peers.
///
/// # Errors
/// The meeting's.
#[inline(always)]
pub(crate) fn meet_again(a: &CollectiveArgs<'_>, path: Path) -> Result<(), DeviceError> {
    match path {
        Path::StageFirst | Path::MeetAgain => all_peers_meet(a),
        Path::InPlace | Path::Staged => Ok(()),
    }
}

/// Elements `first..first + len` of rank `p`'s registered input (as its descriptor of the
/// call numbered `sequence` names it), to read.
///
/// # Errors
/// A descriptor whose slot or range the table does not hold (recorded).
#[inline(always)]
pub(crate) fn peer_input<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    p: u32,
    sequence: u64,
    first: u64,
    len: u64,
) -> Result<DeviceView<'a, T>, DeviceError> {
    let (slot, offset) = peer_place::<T>(a, p, sequence, INPUT_SLOT, first)?;
    a.buffers
        .view::<T>(slot, p, offset, len)
        .map_err(|_| a.invalid([p as u64, offset, len]))
}

/// Elements `first..first + len` of rank `p`'s registered output (as its descriptor of the
/// call numbered `sequence` names it), to write: the part of it that the collective's
/// protocol gives this rank to write, and no other.
///
/// # Errors
/// A descriptor whose slot or range the table does not hold (recorded).
#[inline(always)]
pub(crate) fn peer_output_mut<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    p: u32,
    sequence: u64,
    first: u64,
    len: u64,
) -> Result<DeviceViewMut<'a, T>, DeviceError> {
    let (slot, offset) = peer_place::<T>(a, p, sequence, OUTPUT_SLOT, first)?;
    a.buffers
        .view_mut::<T>(slot, p, offset, len)
        .map_err(|_| a.invalid([p as u64, offset, len]))
}

/// Slot and byte offset of element `first` of the buffer whose slot is descriptor word
/// `slot_word` of rank `p` (the offset is the next word).
#[inline(always)]
fn peer_place<T>(
    a: &CollectiveArgs<'_>,
    p: u32,
    sequence: u64,
    slot_word: u64,
    first: u64,
) -> Result<(u32, u64), DeviceError> {
    let slot = peer_word(a, p, sequence, slot_word)?;
    let base = peer_word(a, p, sequence, slot_word + 1)?;
    let at = first
        .checked_mul(core::mem::size_of::<T>() as u64)
        .and_then(|b| b.checked_add(base));
    match (u32::try_from(slot), at) {
        (Ok(slot), Some(at)) => Ok((slot, at)),
        _ => Err(a.invalid([p as u64, slot, base])),
    }
}
