//! Which ranks a rank talks to.

/// Every rank of `0..n_ranks` but `rank`, ascending: the peers a channel set holds a
/// channel to.
#[inline(always)]
pub fn others(rank: u32, n_ranks: u32) -> impl Iterator<Item = u32> {
    (0..n_ranks).filter(move |&p| p != rank)
}
