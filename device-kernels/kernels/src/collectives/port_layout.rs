//! Where the scratch of a port-channel collective keeps what: the layout host and kernels
//! share when ranks reach each other only through the proxy (another node, Ethernet).
//!
//! Each rank owns one scratch buffer, registered: every peer's port channel writes into it
//! (`dst`) and reads from ours (`src`). [`PortLayout::SETS`] sets, round `seq` taking set
//! `seq % SETS` ([`PortLayout::set_of`]), each:
//!
//! | region | size | written by | read by |
//! |---|---|---|---|
//! | staged round | `round_bytes` | this rank (its input round: whole, or by peer blocks for reduce-scatter and all-to-all; all-reduce then writes its reduced chunk in place of its own) | the proxy, for puts to peers |
//! | reduce slots: `n_ranks` senders | `chunk_bytes` each | sender `q`'s proxy (its part of our chunk or block: all-reduce, reduce-scatter, all-to-all; its round: reduce, at the root) | this rank |
//! | gather slots: `n_ranks` senders | `chunk_bytes` each | sender `q`'s proxy (its reduced chunk: all-reduce; its round: all-gather, broadcast) | this rank |
//!
//! Every region starts on a 64-byte boundary.

use super::eager_depth::EagerDepth;
use super::scratch_layout::SCRATCH_ALIGN;

/// The sizes that place every region of a port-channel scratch (see the module docs). The
/// same on every rank of a communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortLayout {
    /// Bytes of one staged round: a multiple of 64.
    pub round_bytes: u64,
    /// Bytes of one slot: room for the largest chunk of a round (a round's elements split
    /// among the ranks), a multiple of 64.
    pub chunk_bytes: u64,
    /// Ranks of the communicator.
    pub n_ranks: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<PortLayout>() == 24);

impl PortLayout {
    /// Sets of the scratch. Three: a round writes a set again three rounds later, so a
    /// collective may put a round before it has read the last one out (and the all-reduce
    /// before it has waited for the last round's gather; see `all_gather_ports` and
    /// `all_reduce_ports`).
    pub const SETS: u64 = 3;

    /// How far the eager broadcast and reduce run ahead on this path: one set of the
    /// scratch a round ([`Self::SETS`]).
    pub const EAGER: EagerDepth = EagerDepth::new(Self::SETS);

    /// The set round `seq` (a communicator's round number) takes.
    pub const fn set_of(seq: u64) -> u64 {
        seq % Self::SETS
    }

    /// The layout for `n_ranks` ranks and rounds of up to `round_bytes` bytes (rounded up
    /// to [`SCRATCH_ALIGN`], at least one unit).
    pub const fn new(n_ranks: u32, round_bytes: u64) -> PortLayout {
        let round = if round_bytes < SCRATCH_ALIGN {
            SCRATCH_ALIGN
        } else {
            round_bytes.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN
        };
        let n = if n_ranks == 0 { 1 } else { n_ranks as u64 };
        // A chunk of a round's elements holds at most one element more than an even
        // share of its bytes; 8 bytes is the widest element.
        let chunk = (round.div_ceil(n) + 8).div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
        PortLayout {
            round_bytes: round,
            chunk_bytes: chunk,
            n_ranks,
            reserved: 0,
        }
    }

    /// Bytes of one set.
    pub const fn set_bytes(&self) -> u64 {
        self.round_bytes + 2 * self.n_ranks as u64 * self.chunk_bytes
    }

    /// Offset of the staged round of set `set` (below [`Self::SETS`]).
    pub const fn staged(&self, set: u64) -> u64 {
        set * self.set_bytes()
    }

    /// Offset of sender `sender`'s reduce slot in set `set`.
    pub const fn reduce_slot(&self, set: u64, sender: u32) -> u64 {
        self.staged(set) + self.round_bytes + sender as u64 * self.chunk_bytes
    }

    /// Offset of sender `sender`'s gather slot in set `set`.
    pub const fn gather_slot(&self, set: u64, sender: u32) -> u64 {
        self.reduce_slot(set, self.n_ranks) + sender as u64 * self.chunk_bytes
    }

    /// Elements of `size` bytes in one round of the all-reduce (the staged round holds
    /// them; each rank's chunk of them fits a slot).
    pub const fn all_reduce_round(&self, size: u64) -> u64 {
        self.round_bytes / if size == 0 { 1 } else { size }
    }

    /// Most bytes a rank sends in all in a port all-reduce of more than two ranks that takes
    /// one exchange (see [`Self::one_shot_all_reduce`]).
    pub const ONE_SHOT_MAX_SENT: u64 = 256 << 10;

    /// Whether the port all-reduce of `bytes` bytes takes one exchange a round: each rank
    /// puts its whole round into its reduce slot of every peer and reduces every rank's
    /// round itself, instead of a reduce-scatter of the round and an all-gather of the
    /// reduced chunks.
    ///
    /// Always with two ranks: both send the same bytes, and one exchange saves a wait on the
    /// network (a round trip over Ethernet) and two copies a round (the reduced chunk into
    /// the gather's source, the gathered chunk out). With more, where the message is one
    /// round and each rank sends at most [`Self::ONE_SHOT_MAX_SENT`] bytes in all: there the
    /// waits, not the bytes, bound the call (4 ranks over loopback Ethernet on 2 cores:
    /// 1-64 KiB in 140-300 µs instead of 325-400 µs; from 1 MiB on, twice as long), while a
    /// rank sends each byte to `n - 1` peers instead of `2 (n - 1) / n` of it, which costs a
    /// slow network more than the wait it saves.
    pub const fn one_shot_all_reduce(&self, bytes: u64) -> bool {
        let peers = (self.n_ranks as u64).saturating_sub(1);
        self.n_ranks == 2
            || (bytes <= self.copy_round_bytes()
                && bytes.saturating_mul(peers) <= Self::ONE_SHOT_MAX_SENT)
    }

    /// Elements of `size` bytes in one round of the port all-reduce of `count` elements: a
    /// round that lands whole in one slot ([`Self::copy_round_bytes`]) where it takes one
    /// exchange ([`Self::one_shot_all_reduce`]), else [`Self::all_reduce_round`].
    pub const fn all_reduce_ports_round(&self, size: u64, count: u64) -> u64 {
        if self.one_shot_all_reduce(count.saturating_mul(size)) {
            self.copy_round_bytes() / if size == 0 { 1 } else { size }
        } else {
            self.all_reduce_round(size)
        }
    }

    /// Bytes in one round of an all-gather or a broadcast: each rank's round is staged
    /// whole and lands whole in one slot of every peer.
    pub const fn copy_round_bytes(&self) -> u64 {
        if self.chunk_bytes < self.round_bytes {
            self.chunk_bytes
        } else {
            self.round_bytes
        }
    }

    /// Elements of `size` bytes of each rank's block in one round of a reduce-scatter or
    /// an all-to-all (whose elements are bytes): the staged round holds one block per
    /// rank, and each block fits a slot. Zero where a round is too small for one element
    /// per rank.
    pub const fn block_round(&self, size: u64) -> u64 {
        let n = if self.n_ranks == 0 {
            1
        } else {
            self.n_ranks as u64
        };
        self.round_bytes / n / if size == 0 { 1 } else { size }
    }

    /// Bytes of the whole scratch.
    pub const fn total_bytes(&self) -> u64 {
        Self::SETS * self.set_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_device::coop::contiguous_chunk;

    /// Guards against regions that overlap, leave the alignment, or a slot too small for
    /// the largest chunk of a round of any element type.
    #[test]
    fn regions_are_disjoint_aligned_and_hold_every_chunk() {
        let l = PortLayout::new(3, 1000);
        assert_eq!(l.round_bytes, 1024);
        assert_eq!(l.reduce_slot(0, 0), 1024);
        assert_eq!(l.gather_slot(0, 0), 1024 + 3 * l.chunk_bytes);
        assert_eq!(l.staged(1), l.gather_slot(0, 3));
        assert_eq!(l.total_bytes(), 3 * l.staged(1));
        assert_eq!(l.staged(2), l.gather_slot(1, 3));
        assert_eq!(l.total_bytes(), l.gather_slot(2, 3));
        for (seq, set) in [(0, 0), (1, 1), (2, 2), (3, 0), (7, 1), (u64::MAX, 0)] {
            assert_eq!(PortLayout::set_of(seq), set, "round {seq}");
        }
        for off in [l.reduce_slot(1, 2), l.gather_slot(2, 1), l.staged(2)] {
            assert_eq!(off % SCRATCH_ALIGN, 0);
        }
        for n in 1..9u32 {
            for round in [64u64, 100, 1000, 4096, 65536] {
                let l = PortLayout::new(n, round);
                for size in [1u64, 2, 4, 8] {
                    let per = l.round_bytes / size;
                    let widest = (0..n as u64)
                        .map(|p| contiguous_chunk(p, n as u64, per))
                        .map(|c| (c.end - c.start) * size)
                        .max()
                        .unwrap_or(0);
                    assert!(widest <= l.chunk_bytes, "n={n} round={round} size={size}");
                    // Every collective's round fits the staged round and a slot.
                    assert_eq!(l.all_reduce_round(size), per);
                    for count in [1, per / 2, per, 10 * per] {
                        let bytes = l.all_reduce_ports_round(size, count) * size;
                        assert!(bytes > 0 && bytes <= l.round_bytes);
                        if l.one_shot_all_reduce(count * size) {
                            assert!(bytes <= l.chunk_bytes, "n={n} round={round}");
                        }
                    }
                    // Two ranks always take one exchange; more only for one round.
                    assert_eq!(l.one_shot_all_reduce(10 * per * size), n == 2);
                    let copy = l.copy_round_bytes();
                    assert!(copy > 0 && copy <= l.round_bytes && copy <= l.chunk_bytes);
                    let block = l.block_round(size) * size;
                    assert!(n as u64 * block <= l.round_bytes && block <= l.chunk_bytes);
                    assert!(block + size > l.round_bytes / n as u64);
                }
            }
        }
    }
}
