//! Where the collectives' scratch keeps what: the one layout host and kernels share.
//!
//! Each rank owns one scratch buffer; every peer's memory channel to it has that buffer as
//! its `remote` (the peer writes and reads it) and as its `packets` (we unpack from it), and
//! ours has our own as `local`. In order:
//!
//! | region | size | written by | read by |
//! |---|---|---|---|
//! | packet slots: 2 sets (call parities) × `n_ranks` senders | `2 * packet_limit` each | the sending peer (LL16 packets) | this rank |
//! | eager slots: [`ScratchLayout::eager_depth`] sets × `n_ranks` senders | as a packet slot | the sending peer of an eager call (LL16 packets) | this rank |
//! | data slots: 2 sets × `n_ranks` senders | `packet_limit` each | the sending peer (a packet call's message as data, see [`super::packet_form`]) | this rank |
//! | eager data slots: [`ScratchLayout::eager_depth`] sets × `n_ranks` senders | as a data slot | the sending peer of an eager call (as data) | this rank |
//! | unpacked: `n_ranks` slots | `packet_limit` each | this rank | this rank (slot of its own rank: the packets it sends) |
//! | direct halves: 2 (round parities) | `half_bytes` each | this rank (staging) | every peer (loads) |
//! | call descriptors: 2 (call parities) | [`DESCRIPTOR_BYTES`] each | this rank (where its registered buffers are) | every peer |
//!
//! Every region starts on a 64-byte boundary, so each holds any element type and a peer's
//! loads of one rank's writes share no cache line with another region.
//!
//! Messages sent as data have slots apart from the packets': a packet slot holds only
//! packets, whose flags are those of earlier calls, so a stale packet never reads as
//! arrived; a message sent as data holds the user's bytes, which may equal a later call's
//! flag.

use super::eager_depth::EagerDepth;
use oxccl_device::packet::{Ll16Packet, Packet};

/// The sizes that place every region of a scratch buffer (see the module docs). The same
/// on every rank of a communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ScratchLayout {
    /// Most payload bytes one packet call sends each peer: a multiple of 64.
    pub packet_limit: u64,
    /// Bytes of one direct half: a multiple of 64.
    pub half_bytes: u64,
    /// Ranks of the communicator.
    pub n_ranks: u32,
    /// Sets of eager slots (see [`Self::eager_depth`]).
    pub eager_sets: u32,
}

const _: () = assert!(core::mem::size_of::<ScratchLayout>() == 24);

/// Bytes that keep regions apart: a multiple of every element size and of a cache line.
pub const SCRATCH_ALIGN: u64 = 64;

/// Bytes of one call descriptor (see [`super::published_buffers`]): its words, rounded up
/// to [`SCRATCH_ALIGN`].
pub const DESCRIPTOR_BYTES: u64 =
    (super::published_buffers::DESCRIPTOR_WORDS * 8).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;

impl ScratchLayout {
    /// The layout for `n_ranks` ranks with packet calls of up to `packet_limit` bytes and
    /// direct rounds of up to `half_bytes` bytes, each rounded up to [`SCRATCH_ALIGN`] (a
    /// half of at least one alignment unit), and as many sets of eager slots as
    /// `eager_bytes` hold, within [`EagerDepth`]'s bounds.
    pub const fn new(
        n_ranks: u32,
        packet_limit: u64,
        half_bytes: u64,
        eager_bytes: u64,
    ) -> ScratchLayout {
        let half = if half_bytes < SCRATCH_ALIGN {
            SCRATCH_ALIGN
        } else {
            half_bytes
        };
        let mut layout = ScratchLayout {
            packet_limit: packet_limit.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN,
            half_bytes: half.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN,
            n_ranks,
            eager_sets: 0,
        };
        // An eager set: a packet slot and a data slot per sender.
        let per_sender = layout.packet_slot_bytes() + layout.packet_limit;
        let set_bytes = per_sender * if n_ranks == 0 { 1 } else { n_ranks as u64 };
        let sets = eager_bytes / if set_bytes == 0 { 1 } else { set_bytes };
        layout.eager_sets = EagerDepth::new(sets).sets() as u32;
        layout
    }

    /// How far the eager broadcast and reduce of packets run ahead of their receivers: the
    /// sets of eager slots ([`Self::eager_sets`], within [`EagerDepth`]'s bounds, so every
    /// value of the field places the regions as the kernels use them).
    pub const fn eager_depth(&self) -> EagerDepth {
        EagerDepth::new(self.eager_sets as u64)
    }

    /// Bytes of one sender's packet slot: the packets of `packet_limit` payload bytes.
    pub const fn packet_slot_bytes(&self) -> u64 {
        self.packet_limit / Ll16Packet::PAYLOAD_BYTES * Ll16Packet::PACKET_BYTES
    }

    /// Offset of the slot where `sender`'s packets of call set `set` (0 or 1) land.
    pub const fn packet_slot(&self, set: u64, sender: u32) -> u64 {
        (set * self.n_ranks as u64 + sender as u64) * self.packet_slot_bytes()
    }

    /// Offset of the slot where `sender`'s packets of an eager call (see
    /// [`super::call_protocol`]) of set `set` (below [`Self::eager_depth`]'s sets) land.
    pub const fn eager_slot(&self, set: u64, sender: u32) -> u64 {
        self.packet_slot(2 + set, sender)
    }

    /// Offset of the slot where `sender`'s message of call set `set` (0 or 1) lands when it
    /// goes as data.
    pub const fn data_slot(&self, set: u64, sender: u32) -> u64 {
        self.packet_slot(2 + self.eager_depth().sets(), 0)
            + (set * self.n_ranks as u64 + sender as u64) * self.packet_limit
    }

    /// Offset of the slot where `sender`'s message of an eager call of set `set` lands when
    /// it goes as data.
    pub const fn eager_data_slot(&self, set: u64, sender: u32) -> u64 {
        self.data_slot(2 + set, sender)
    }

    /// Offset of the unpacked data of `sender`'s packets (for our own rank: what we send).
    pub const fn unpacked_slot(&self, sender: u32) -> u64 {
        self.data_slot(2 + self.eager_depth().sets(), 0) + sender as u64 * self.packet_limit
    }

    /// Offset of direct half `parity` (0 or 1).
    pub const fn half(&self, parity: u64) -> u64 {
        self.unpacked_slot(self.n_ranks) + parity * self.half_bytes
    }

    /// Offset of call descriptor `parity` (0 or 1): where a call says which registered
    /// buffers it uses (see [`super::published_buffers`]).
    pub const fn descriptor(&self, parity: u64) -> u64 {
        self.half(2) + parity * DESCRIPTOR_BYTES
    }

    /// Bytes of the whole scratch buffer.
    pub const fn total_bytes(&self) -> u64 {
        self.descriptor(2)
    }
}

/// The LL16 flag of packet call `sequence`: never 0 (a zeroed or stale slot never reads as
/// arrived), and different from the flag of the call two before, which used the same set.
pub const fn packet_flag(sequence: u64) -> u32 {
    (sequence % u32::MAX as u64) as u32 + 1
}

/// The packet set (0 or 1) of call `sequence`, or the direct half of round `sequence`.
pub const fn parity(sequence: u64) -> u64 {
    sequence & 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against regions that overlap or leave the alignment.
    #[test]
    fn regions_are_disjoint_and_aligned() {
        let l = ScratchLayout::new(3, 1000, 100, 0);
        assert_eq!((l.packet_limit, l.half_bytes), (1024, 128));
        assert_eq!(l.packet_slot_bytes(), 2048);
        assert_eq!(l.packet_slot(1, 2), 5 * 2048);
        assert_eq!(l.eager_slot(0, 0), 6 * 2048);
        assert_eq!(l.eager_slot(2, 2), 14 * 2048);
        assert_eq!(l.data_slot(0, 0), 15 * 2048);
        assert_eq!(l.data_slot(1, 2), 15 * 2048 + 5 * 1024);
        assert_eq!(l.eager_data_slot(0, 0), 15 * 2048 + 6 * 1024);
        assert_eq!(l.eager_data_slot(2, 2), 15 * 2048 + 14 * 1024);
        assert_eq!(l.unpacked_slot(0), 15 * 2048 + 15 * 1024);
        assert_eq!(l.half(0), 15 * 2048 + 18 * 1024);
        assert_eq!(l.descriptor(0), l.half(0) + 256);
        assert_eq!(l.total_bytes(), l.descriptor(0) + 2 * DESCRIPTOR_BYTES);
        assert_eq!(DESCRIPTOR_BYTES, 320);
        for off in [
            l.packet_slot(1, 1),
            l.eager_slot(1, 2),
            l.data_slot(1, 1),
            l.eager_data_slot(1, 2),
            l.unpacked_slot(2),
            l.half(1),
            l.descriptor(1),
        ] {
            assert_eq!(off % SCRATCH_ALIGN, 0);
        }
    }

    /// Guards the eager slots' depth: as many sets as the budget holds, never fewer than
    /// three nor more than 64, and the regions after them placed by the same count.
    #[test]
    fn eager_sets_fill_their_budget_within_bounds() {
        // 4 ranks, 2 KiB packet slots and 1 KiB data slots: 12 KiB a set.
        let at = |bytes| ScratchLayout::new(4, 1024, 4096, bytes);
        assert_eq!(at(0).eager_sets, 3);
        assert_eq!(at(10 * 12288 + 100).eager_sets, 10);
        assert_eq!(at(1 << 20).eager_sets, 64);
        let deep = at(1 << 20);
        assert_eq!(deep.eager_depth().sets(), 64);
        assert_eq!(deep.eager_slot(63, 3) + 2048, deep.data_slot(0, 0));
        assert_eq!(deep.eager_data_slot(63, 3) + 1024, deep.unpacked_slot(0));
        // A field out of bounds places the regions as the depth the kernels use.
        let zero = ScratchLayout {
            eager_sets: 0,
            ..at(0)
        };
        assert_eq!(zero.unpacked_slot(0), at(0).unpacked_slot(0));
    }

    /// Guards against a flag of 0 after the wrap, and two calls in a row with one parity.
    #[test]
    fn flags_skip_zero_and_parities_alternate() {
        assert_eq!(packet_flag(u32::MAX as u64 - 1), u32::MAX);
        assert_eq!(packet_flag(u32::MAX as u64), 1);
        assert_ne!(parity(u32::MAX as u64), parity(u32::MAX as u64 + 1));
    }
}
