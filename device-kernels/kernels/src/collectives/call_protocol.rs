//! Which protocol the last collective of a communicator's path ran, and how far its sender
//! has heard back: the host keeps a [`CallProtocol`] per path (port channels, memory
//! channels) and passes it to the next collective kernel of that path.
//!
//! Most collectives run in **lockstep**: on the port path every rank signals every peer
//! once a round and waits for each peer's signal once a round (see `port_exchange`), so a
//! peer's signal of a round tells what the peer has finished; on the memory path each call
//! ends at a meeting or once every peer's packets of the call have arrived (see
//! `packet_exchange`). The scratch's sets are reused on that.
//!
//! Broadcast and reduce (through the proxy, and with packets for small messages over
//! load/store paths) run **eager**, as a message library's eager sends do: data flow one
//! way, from the root (broadcast) or to it (reduce), and the receiver answers, once it has
//! read a round out, with a signal alone, a **done**, every [`EagerDepth::done_every`]
//! rounds ([`EagerDepth::done_after`]: a done covers the rounds before it). A packet call
//! is one round. The sender needs a round read out only before it writes that round's set
//! again, [`EagerDepth::sets`] rounds later, and waits for the done that covers it then
//! ([`EagerDepth::covered_before`]); so it runs up to that many rounds ahead of its
//! receivers (each path has its own [`EagerDepth`]), and calls back to back overlap. Ranks
//! that neither send nor receive to each other exchange nothing. The dones of a call's
//! last rounds are left **owed**: waited for by the next call of the same protocol (the
//! same collective with the same root), which goes on where this one stopped, or collected
//! before anything else.
//!
//! Before a call whose protocol differs from the last call's ([`CallProtocol::continues`])
//! the host launches the switch: the path's barrier (`barrier_ports`, `barrier`), which
//! first waits for the dones owed, then meets every peer (no part of the scratch, so no
//! round number): every rank arrives once it has finished every earlier kernel, so after
//! it every rank knows that every peer has read out every earlier round (those no done
//! covers included), which is what each protocol assumes of the rounds before its first.
//! On the memory path the eager calls have slots of their own
//! ([`ScratchLayout::eager_slot`](super::ScratchLayout::eager_slot)), which only they use
//! and which every switch leaves read out, so a switch from lockstep to eager needs no
//! barrier there. The collective kernels themselves carry no code for the switch.

use super::eager_depth::EagerDepth;

/// The protocol of the last collective of a path and how far its sender has heard back
/// (see the module docs). The host keeps it per communicator and path (the same `kind` and
/// `root` on every rank; `covered_until` is this rank's) and computes the next with
/// [`CallProtocol::after`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CallProtocol {
    /// [`CallProtocol::LOCKSTEP`], [`CallProtocol::BROADCAST`] or [`CallProtocol::REDUCE`].
    pub kind: u32,
    /// The root of an eager collective; 0 in lockstep.
    pub root: u32,
    /// On an eager sender: the first round the dones it has waited for do not cover (the
    /// switch that began the protocol covers the rounds before its first); the dones of the
    /// rounds from it up to the last round sent are owed. 0 in lockstep.
    pub covered_until: u64,
}

const _: () = assert!(core::mem::size_of::<CallProtocol>() == 16);

impl CallProtocol {
    /// Every collective but the eager broadcast and reduce (and the state before the first
    /// call).
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

    /// Whether this is protocol `kind` with root `root` (what an eager kernel checks it was
    /// given).
    pub const fn is(self, kind: u32, root: u32) -> bool {
        self.kind == kind && self.root == root
    }

    /// Whether rank `rank` sends rounds (and waits for dones) under protocol `kind` with
    /// `root`.
    pub const fn sender(kind: u32, root: u32, rank: u32) -> bool {
        match kind {
            Self::BROADCAST => rank == root,
            Self::REDUCE => rank != root,
            _ => false,
        }
    }

    /// Whether this protocol, on rank `rank`, waits for dones from peer `peer`: the
    /// receivers of what `rank` sends.
    pub const fn owed_by(self, rank: u32, peer: u32) -> bool {
        match self.kind {
            Self::BROADCAST => rank == self.root && peer != rank,
            Self::REDUCE => rank != self.root && peer == self.root,
            _ => false,
        }
    }

    /// The state right after the switch to protocol `kind` with `root`, before round
    /// `first`: the switch covers every round before it.
    pub const fn switched(kind: u32, root: u32, first: u64) -> Self {
        match kind {
            Self::LOCKSTEP => CallProtocol {
                kind,
                root: 0,
                covered_until: 0,
            },
            _ => CallProtocol {
                kind,
                root,
                covered_until: first,
            },
        }
    }

    /// The state after a call of protocol `kind` with `root`, on rank `rank`, of `rounds`
    /// rounds from round `first` on (from [`Self::switched`] where it does not continue),
    /// on a path of eager depth `depth`.
    pub const fn after(
        self,
        kind: u32,
        root: u32,
        rank: u32,
        first: u64,
        rounds: u64,
        depth: EagerDepth,
    ) -> Self {
        let start = if self.continues(kind, root) {
            self
        } else {
            Self::switched(kind, root, first)
        };
        if kind == Self::LOCKSTEP {
            return start;
        }
        let mut covered_until = start.covered_until;
        if Self::sender(kind, root, rank) && rounds > 0 {
            covered_until = depth.covered_before(covered_until, first + rounds - 1);
        }
        CallProtocol {
            kind,
            root,
            covered_until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u32 = CallProtocol::BROADCAST;
    const R: u32 = CallProtocol::REDUCE;
    const L: u32 = CallProtocol::LOCKSTEP;
    const D: EagerDepth = EagerDepth::new(3);

    #[test]
    fn the_host_follows_the_kernels_and_continues_or_switches() {
        let start = CallProtocol::default();
        // Broadcast from 1, rounds 1..=10 (the switch covers round 0): the root has waited
        // for the done covering round 7 (sent after it).
        let root = start.after(B, 1, 1, 1, 10, D);
        assert_eq!((root.kind, root.root, root.covered_until), (B, 1, 8));
        assert_eq!(D.dones_between(root.covered_until, 11), 1, "round 9's owed");
        // A receiver keeps the switch's mark; an empty call keeps the state.
        assert_eq!(start.after(B, 1, 0, 1, 10, D).covered_until, 1);
        assert_eq!(root.after(B, 1, 1, 11, 0, D), root);
        // Continuing goes on from what was covered; another root starts again.
        assert_eq!(root.after(B, 1, 1, 11, 2, D).covered_until, 10);
        assert_eq!(root.after(B, 2, 1, 11, 2, D).covered_until, 11);
        // Reduce: the others send.
        let other = start.after(R, 2, 0, 1, 6, D);
        assert_eq!((other.kind, other.root, other.covered_until), (R, 2, 4));
        assert!(other.owed_by(0, 2) && !other.owed_by(0, 1) && !other.owed_by(2, 0));
        assert_eq!(start.after(R, 2, 2, 1, 6, D).covered_until, 1);
        assert_eq!(other.after(L, 5, 0, 8, 3, D), CallProtocol::default());
    }

    #[test]
    fn the_same_protocol_continues_and_any_other_switches() {
        let lockstep = CallProtocol::default();
        assert!(
            lockstep.continues(L, 3),
            "lockstep continues whatever the root"
        );
        assert!(!lockstep.continues(B, 0));
        let bcast = lockstep.after(B, 0, 0, 0, 1, D);
        assert!(bcast.continues(B, 0));
        assert!(!bcast.continues(B, 1), "another root switches");
        assert!(!bcast.continues(R, 0));
        assert!(!bcast.continues(L, 0));
    }

    #[test]
    fn the_root_of_a_broadcast_hears_from_every_peer() {
        let p = CallProtocol::default().after(B, 1, 1, 0, 1, D);
        assert!(p.owed_by(1, 0) && p.owed_by(1, 2));
        assert!(!p.owed_by(1, 1));
        assert!(!CallProtocol::default().owed_by(0, 1));
    }
}
