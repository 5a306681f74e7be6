//! Which protocol the last port collective of a communicator ran, and the waits it left
//! owed: the host keeps a [`PortProtocol`] and passes it to the next port collective kernel.
//!
//! Most port collectives run in **lockstep** (see `port_exchange`): every rank signals every
//! peer once a round and waits for each peer's signal once a round, so a peer's signal of a
//! round tells what the peer has finished, and the scratch's sets are reused on that.
//!
//! Broadcast and reduce run **eager**, as a message library's eager sends do: data flow one
//! way, from the root (broadcast) or to it (reduce), and the receiver answers each round,
//! once it has read the round out, with a signal alone ("done"). The sender waits for the
//! done of a round only before it writes that round's set again,
//! [`PortLayout::SETS`](super::PortLayout::SETS) rounds later, so it runs up to that many
//! rounds ahead of its receivers and calls back to back overlap; ranks that neither send
//! nor receive to each other exchange nothing. Its last dones are left **owed**: waited for
//! by the next call of the same protocol (the same collective with the same root), which
//! goes on where this one stopped, or paid before anything else.
//!
//! A kernel whose protocol differs from the last call's ([`PortProtocol::continues`])
//! first waits for the dones owed, then runs one lockstep exchange with every peer, with
//! nothing in it, which takes a round number of its own
//! ([`PortProtocol::switch_rounds`]): every rank signals it once it has finished every
//! earlier kernel, so after it every rank knows that every peer has read out every earlier
//! round, which is what each protocol assumes of the rounds before its first.

use super::port_layout::PortLayout;

/// The protocol of the last port collective and the waits it left owed (see the module
/// docs). The host keeps it per communicator (the same `kind` and `root` on every rank; the
/// waits owed are this rank's) and computes the next with [`PortProtocol::after`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortProtocol {
    /// [`PortProtocol::LOCKSTEP`], [`PortProtocol::BROADCAST`] or [`PortProtocol::REDUCE`].
    pub kind: u32,
    /// The root of an eager collective; 0 in lockstep.
    pub root: u32,
    /// Dones this rank has yet to wait for from each peer it sent rounds to: every peer for
    /// the root of a broadcast, the root for the others of a reduce; at most
    /// [`PortLayout::SETS`].
    pub owed: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<PortProtocol>() == 16);

impl PortProtocol {
    /// Every port collective but broadcast and reduce (and the state before the first call).
    pub const LOCKSTEP: u32 = 0;
    /// The eager broadcast.
    pub const BROADCAST: u32 = 1;
    /// The eager reduce.
    pub const REDUCE: u32 = 2;

    /// Whether a call of protocol `kind` with `root` goes on where this one stopped (the
    /// same protocol, and for an eager one the same root) instead of switching.
    pub const fn continues(self, kind: u32, root: u32) -> bool {
        self.kind == kind && (kind == Self::LOCKSTEP || self.root == root)
    }

    /// Round numbers a call of protocol `kind` with `root` takes before its own rounds: one
    /// for the exchange of a switch, none when it [continues](Self::continues).
    pub const fn switch_rounds(self, kind: u32, root: u32) -> u64 {
        if self.continues(kind, root) { 0 } else { 1 }
    }

    /// Whether rank `rank` sends rounds and is owed dones under protocol `kind` with `root`.
    pub const fn sender(kind: u32, root: u32, rank: u32) -> bool {
        match kind {
            Self::BROADCAST => rank == root,
            Self::REDUCE => rank != root,
            _ => false,
        }
    }

    /// Whether this protocol, on rank `rank`, owes peer `peer` its dones: the receivers of
    /// what `rank` sent.
    pub const fn owed_by(self, rank: u32, peer: u32) -> bool {
        match self.kind {
            Self::BROADCAST => rank == self.root && peer != rank,
            Self::REDUCE => rank != self.root && peer == self.root,
            _ => false,
        }
    }

    /// The state after a call of protocol `kind` with `root`, on rank `rank`, of `rounds`
    /// rounds of its own (not counting [`Self::switch_rounds`]): a sender waits for a
    /// round's done only once it has [`PortLayout::SETS`] rounds unanswered, so it leaves
    /// up to that many owed.
    pub const fn after(self, kind: u32, root: u32, rank: u32, rounds: u64) -> PortProtocol {
        let start = if self.continues(kind, root) {
            self.owed as u64
        } else {
            0
        };
        let owed = if Self::sender(kind, root, rank) {
            let total = start.saturating_add(rounds);
            if total < PortLayout::SETS {
                total
            } else {
                PortLayout::SETS
            }
        } else {
            0
        };
        PortProtocol {
            kind,
            root: if kind == Self::LOCKSTEP { 0 } else { root },
            owed: owed as u32,
            reserved: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u32 = PortProtocol::BROADCAST;
    const R: u32 = PortProtocol::REDUCE;
    const L: u32 = PortProtocol::LOCKSTEP;

    #[test]
    fn the_root_of_a_broadcast_owes_up_to_a_set_of_rounds_and_carries_them_on() {
        let start = PortProtocol::default();
        let one = start.after(B, 1, 1, 1);
        assert_eq!((one.kind, one.root, one.owed), (B, 1, 1));
        assert_eq!(one.after(B, 1, 1, 1).owed, 2);
        assert_eq!(one.after(B, 1, 1, 100).owed, PortLayout::SETS as u32);
        // A receiver owes nothing.
        assert_eq!(start.after(B, 1, 0, 5).owed, 0);
        // An empty call continues with what was owed, or, switching, pays it.
        assert_eq!(one.after(B, 1, 1, 0).owed, 1);
        assert_eq!(one.after(B, 0, 0, 0).owed, 0);
    }

    #[test]
    fn the_others_of_a_reduce_owe_the_root() {
        let p = PortProtocol::default().after(R, 2, 0, 2);
        assert_eq!((p.kind, p.root, p.owed), (R, 2, 2));
        assert!(p.owed_by(0, 2));
        assert!(!p.owed_by(0, 1));
        assert!(!p.owed_by(2, 0), "the root owes nothing");
        assert_eq!(PortProtocol::default().after(R, 2, 2, 7).owed, 0);
    }

    #[test]
    fn a_switch_takes_one_round_and_continuing_none() {
        let lockstep = PortProtocol::default();
        assert_eq!(
            lockstep.switch_rounds(L, 3),
            0,
            "lockstep continues whatever the root"
        );
        assert_eq!(lockstep.switch_rounds(B, 0), 1);
        let bcast = lockstep.after(B, 0, 0, 1);
        assert_eq!(bcast.switch_rounds(B, 0), 0);
        assert_eq!(bcast.switch_rounds(B, 1), 1, "another root switches");
        assert_eq!(bcast.switch_rounds(R, 0), 1);
        assert_eq!(bcast.switch_rounds(L, 0), 1);
        let back = bcast.after(L, 5, 0, 3);
        assert_eq!(back, PortProtocol::default());
    }

    #[test]
    fn the_root_of_a_broadcast_is_owed_by_every_peer() {
        let p = PortProtocol::default().after(B, 1, 1, 1);
        assert!(p.owed_by(1, 0) && p.owed_by(1, 2));
        assert!(!p.owed_by(1, 1));
        assert!(!PortProtocol::default().owed_by(0, 1));
    }
}
