//! How far an eager sender (see [`call_protocol`](super::call_protocol)) runs ahead of its
//! receivers: the sets of slots it writes in turn, and how many rounds a receiver's done
//! covers. Each path fixes its own: the port scratch's [`PortLayout::EAGER`] (three sets of
//! whole rounds), the memory scratch's eager slots
//! ([`ScratchLayout::eager_depth`](super::ScratchLayout::eager_depth): up to
//! [`EagerDepth::MAX_SETS`] sets of packet slots, as many as its budget holds).
//!
//! Round `j` writes set `j % sets`; a receiver sends a done after every
//! [`EagerDepth::done_every`] rounds, covering them; the sender waits for the done that
//! covers round `j` before it writes round `j + sets`, so it runs `sets - done_every + 1`
//! to `sets` rounds ahead of what a receiver has read out. Deep is what lets a rank that
//! shares a core with its peers run many calls in one time slice, as a message library's
//! eager sends do: 4 ranks in one process on 2 cores broadcast 8-512 B in 3.5-5.3 µs a
//! call with three sets and 1.4-1.9 µs with sixty-four (alternated runs).
//!
//! [`PortLayout::EAGER`]: super::PortLayout::EAGER

/// The sets an eager sender cycles through, and the rounds one done covers (see the module
/// docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerDepth {
    sets: u64,
}

impl EagerDepth {
    /// Fewest sets: a done covers two rounds, and the sender must still be a round ahead.
    pub const MIN_SETS: u64 = 3;
    /// Most sets: past this, a deeper run-ahead saved nothing measurable.
    pub const MAX_SETS: u64 = 64;

    /// `sets` sets, kept within [`Self::MIN_SETS`]`..=`[`Self::MAX_SETS`].
    pub const fn new(sets: u64) -> EagerDepth {
        let sets = if sets < Self::MIN_SETS {
            Self::MIN_SETS
        } else if sets > Self::MAX_SETS {
            Self::MAX_SETS
        } else {
            sets
        };
        EagerDepth { sets }
    }

    /// The sets.
    pub const fn sets(self) -> u64 {
        self.sets
    }

    /// Rounds one done covers: a quarter of the sets, at least two (half the signals of a
    /// done a round, and with three sets the sender still a round ahead).
    pub const fn done_every(self) -> u64 {
        let quarter = self.sets / 4;
        if quarter < 2 { 2 } else { quarter }
    }

    /// The set round `round` writes.
    pub const fn set_of(self, round: u64) -> u64 {
        round % self.sets
    }

    /// Whether an eager receiver sends a done once it has read round `round` out.
    pub const fn done_after(self, round: u64) -> bool {
        let every = self.done_every();
        round % every == every - 1
    }

    /// Dones sent after the rounds `from..until` (none where `until <= from`).
    pub const fn dones_between(self, from: u64, until: u64) -> u64 {
        let every = self.done_every();
        if until <= from {
            0
        } else {
            until / every - from / every
        }
    }

    /// Until which round a sender's dones must cover before it writes round `round` (the
    /// round [`Self::sets`] before it took the same set), given they cover the rounds
    /// before `until`: `until` itself where that is enough, else the end of the done that
    /// covers the earlier round, which came after a round already sent. The sender waits
    /// for [`Self::dones_between`] the two.
    pub const fn covered_before(self, until: u64, round: u64) -> u64 {
        let every = self.done_every();
        if round < self.sets || round - self.sets < until {
            until
        } else {
            let earlier = round - self.sets;
            earlier - earlier % every + every
        }
    }

    /// Dones a sender whose dones cover the rounds before `covered_until` waits for before
    /// it writes round `round`: [`Self::dones_between`] that and [`Self::covered_before`].
    pub const fn dones_before(self, covered_until: u64, round: u64) -> u64 {
        self.dones_between(covered_until, self.covered_before(covered_until, round))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round by round, as the kernels go, at every depth: every round written needs the
    /// round `sets` before it covered (when that round is of this protocol), by dones of
    /// this protocol only, each waited for once; and the sender is never held back by a
    /// done it could not have had (one sent after a round it has not written).
    #[test]
    fn a_sender_waits_for_the_done_covering_the_round_a_set_cycle_before_and_no_other() {
        for sets in [3, 4, 5, 8, 16, 17, 64] {
            let d = EagerDepth::new(sets);
            for first in 0..(2 * sets + 3) {
                let mut until = first; // the switch covers what came before
                let mut waited = 0;
                let last = first + 5 * sets;
                for round in first..last {
                    let next = d.covered_before(until, round);
                    if next != until {
                        assert!(d.done_after(next - 1), "sets {sets} round {round}");
                        assert!(next - 1 < round, "sets {sets} round {round}");
                        assert!(round - (next - 1) > sets - d.done_every());
                    }
                    assert_eq!(d.dones_before(until, round), d.dones_between(until, next));
                    waited += d.dones_between(until, next);
                    until = next;
                    if round >= first + sets {
                        assert!(until > round - sets, "sets {sets} round {round}");
                    }
                    assert!(round - until < sets, "sets {sets} round {round}");
                }
                let sent = (first..last).filter(|&j| d.done_after(j)).count();
                let owed = d.dones_between(until, last);
                assert_eq!(waited + owed, sent as u64, "sets {sets} first {first}");
            }
        }
    }

    #[test]
    fn depths_stay_within_their_bounds() {
        assert_eq!(EagerDepth::new(0).sets(), EagerDepth::MIN_SETS);
        assert_eq!(EagerDepth::new(1000).sets(), EagerDepth::MAX_SETS);
        assert_eq!(EagerDepth::new(3).done_every(), 2);
        assert_eq!(EagerDepth::new(64).done_every(), 16);
        assert_eq!(EagerDepth::new(64).set_of(130), 2);
    }
}
