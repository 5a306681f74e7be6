//! Collectives over the bootstrap: all-gather, its ring baseline, barrier and broadcast.
//!
//! All-gather and barrier use recursive doubling with a fold, for any `N`. With `p` the
//! largest power of two `<= N`:
//! - pre (only if `N != p`): rank `r >= p` sends its block to `r - p`;
//! - rounds `k = 0 .. log2 p`: rank `r < p` swaps everything it holds with `r ^ 2^k`;
//! - post (only if `N != p`): rank `r < N - p` sends the full result to `r + p`.
//!
//! That is `floor(log2 N)` rounds, plus 2 when `N` is not a power of two, and each rank
//! talks to at most `log2 p + 1` peers — the same ones for all-gather and barrier, so the
//! connections are shared. (Bruck's algorithm has `ceil(log2 N)` rounds but talks to
//! `2 log2 N` peers per rank, which at 1024 ranks in one process is twice the sockets.)
//!
//! `all_gather_ring` is the `N - 1`-step ring of MSCCL++'s `TcpBootstrap::allGather`, kept
//! as the baseline the benchmark compares against. Broadcast is a binomial tree from the
//! root, `ceil(log2 N)` rounds.
//!
//! Every rank must call the collectives in the same order: each call takes the next
//! sequence number, and messages are matched by it.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Peer, Result};
use crate::frame::{Block, Body, Tag};

impl Bootstrap {
    /// Gathers every rank's `mine`; element `i` of the result is rank `i`'s bytes.
    /// Contributions may differ in length. Runs in `O(log N)` rounds.
    ///
    /// # Errors
    /// `Timeout` naming the rank that did not answer; `PeerClosed`; `MalformedFrame` if a
    /// peer sends blocks of the wrong ranks; `MessageTooLarge` if a round's message exceeds
    /// the frame limit (up to `N * len` bytes, in the last round).
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank(), self.size());
        if n == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let op = "all_gather";
        let seq = self.next_seq();
        let deadline = self.deadline();
        let fold = Fold::new(n);
        let post = fold.rounds() + 1;
        let tag = |round| Tag::Coll { seq, round };

        if let Some(host) = fold.host_of(me) {
            let block = vec![Block {
                rank: me as u32,
                data: mine.to_vec(),
            }];
            self.send_body(host, tag(0), Body::Blocks(block), deadline, op, me < host)?;
            let mut have = vec![None; n];
            let body = self.recv_body(host, tag(post), deadline, op)?;
            self.store_blocks(host, body, 0..n, &mut have)?;
            return self.complete(have);
        }

        let mut have: Vec<Option<Vec<u8>>> = vec![None; n];
        have[me] = Some(mine.to_vec());
        if let Some(extra) = fold.extra_of(me) {
            self.link(extra, deadline, op)?;
            let body = self.recv_body(extra, tag(0), deadline, op)?;
            self.store_blocks(extra, body, [extra], &mut have)?;
        }
        for k in 0..fold.rounds() {
            let partner = me ^ (1 << k);
            let blocks = fold.held(me, k).map(|q| Block {
                rank: q as u32,
                data: have[q].clone().unwrap_or_default(),
            });
            let body = self.exchange(
                partner,
                partner,
                tag(k + 1),
                Body::Blocks(blocks.collect()),
                deadline,
                op,
            )?;
            self.store_blocks(partner, body, fold.held(partner, k), &mut have)?;
        }
        if let Some(extra) = fold.extra_of(me) {
            let all = have
                .iter()
                .enumerate()
                .map(|(q, d)| Block {
                    rank: q as u32,
                    data: d.clone().unwrap_or_default(),
                })
                .collect();
            self.send_body(
                extra,
                tag(post),
                Body::Blocks(all),
                deadline,
                op,
                me < extra,
            )?;
        }
        self.complete(have)
    }

    /// All-gather along a ring in `N - 1` steps, as MSCCL++ does it; same result as
    /// [`Bootstrap::all_gather`]. Kept as the baseline for benchmarks.
    ///
    /// # Errors
    /// As [`Bootstrap::all_gather`].
    pub fn all_gather_ring(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank(), self.size());
        if n == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let op = "all_gather_ring";
        let seq = self.next_seq();
        let deadline = self.deadline();
        let right = (me + 1) % n;
        let left = (me + n - 1) % n;
        let mut out: Vec<Option<Vec<u8>>> = vec![None; n];
        out[me] = Some(mine.to_vec());
        let mut cur = me;
        for step in 0..n - 1 {
            let data = out[cur].clone().unwrap_or_default();
            let tag = Tag::Coll {
                seq,
                round: step as u32,
            };
            let got = match self.exchange(right, left, tag, Body::Bytes(data), deadline, op)? {
                Body::Bytes(b) => b,
                other => return Err(self.unexpected(left, "bytes", &other)),
            };
            cur = (me + n - step - 1) % n;
            out[cur] = Some(got);
        }
        self.complete(out)
    }

    /// All-gathers a serializable value (postcard-encoded on the wire).
    ///
    /// # Errors
    /// As [`Bootstrap::all_gather`]; `InvalidUsage` if `value` does not serialize;
    /// `MalformedFrame` naming the rank whose bytes do not decode as `T`.
    pub fn all_gather_value<T: Serialize + DeserializeOwned>(&self, value: &T) -> Result<Vec<T>> {
        let bytes = self.encode_value(value)?;
        self.all_gather(&bytes)?
            .iter()
            .enumerate()
            .map(|(rank, b)| self.decode_value(rank, b))
            .collect()
    }

    /// Returns once every rank has called `barrier`. `O(log N)` rounds.
    ///
    /// # Errors
    /// `Timeout` naming the rank that did not arrive; `PeerClosed`.
    pub fn barrier(&self) -> Result<()> {
        let (me, n) = (self.rank(), self.size());
        if n == 1 {
            return Ok(());
        }
        let op = "barrier";
        let seq = self.next_seq();
        let deadline = self.deadline();
        let fold = Fold::new(n);
        let post = fold.rounds() + 1;
        let tag = |round| Tag::Coll { seq, round };
        if let Some(host) = fold.host_of(me) {
            self.send_body(
                host,
                tag(0),
                Body::Bytes(Vec::new()),
                deadline,
                op,
                me < host,
            )?;
            self.recv_body(host, tag(post), deadline, op)?;
            return Ok(());
        }
        if let Some(extra) = fold.extra_of(me) {
            self.link(extra, deadline, op)?;
            self.recv_body(extra, tag(0), deadline, op)?;
        }
        for k in 0..fold.rounds() {
            let partner = me ^ (1 << k);
            self.exchange(
                partner,
                partner,
                tag(k + 1),
                Body::Bytes(Vec::new()),
                deadline,
                op,
            )?;
        }
        if let Some(extra) = fold.extra_of(me) {
            self.send_body(
                extra,
                tag(post),
                Body::Bytes(Vec::new()),
                deadline,
                op,
                me < extra,
            )?;
        }
        Ok(())
    }

    /// Sends `root`'s `data` to every rank and returns it; the `data` of other ranks is
    /// ignored. Binomial tree, `ceil(log2 N)` rounds.
    ///
    /// # Errors
    /// `InvalidUsage` if `root` is out of range; `Timeout` naming this rank's parent in the
    /// tree (or a child a send to which stalled); `PeerClosed`; `MessageTooLarge`.
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        let (me, n) = (self.rank(), self.size());
        if root >= n {
            return Err(Error::InvalidUsage(format!(
                "rank {me}: broadcast root {root} out of range (size {n})"
            )));
        }
        if n == 1 {
            return Ok(data.to_vec());
        }
        let op = "broadcast";
        let seq = self.next_seq();
        let deadline = self.deadline();
        let tag = Tag::Coll { seq, round: 0 };
        let real = |v: usize| (v + root) % n;
        let v = (me + n - root) % n;
        let mut value = (v == 0).then(|| data.to_vec());
        let mut mask = 1usize;
        while mask < n {
            if v & mask != 0 {
                let parent = real(v - mask);
                self.link(parent, deadline, op)?;
                match self.recv_body(parent, tag, deadline, op)? {
                    Body::Bytes(b) => value = Some(b),
                    other => return Err(self.unexpected(parent, "bytes", &other)),
                }
                break;
            }
            mask <<= 1;
        }
        let value = value.ok_or_else(|| Error::Internal("broadcast tree gave no value".into()))?;
        mask >>= 1;
        while mask > 0 {
            if v + mask < n {
                let child = real(v + mask);
                self.send_body(
                    child,
                    tag,
                    Body::Bytes(value.clone()),
                    deadline,
                    op,
                    me < child,
                )?;
            }
            mask >>= 1;
        }
        Ok(value)
    }

    /// Stores the blocks of `body` into `have`, checking they are exactly `expected`, in
    /// that order (both sides compute the same order).
    fn store_blocks(
        &self,
        peer: usize,
        body: Body,
        expected: impl IntoIterator<Item = usize>,
        have: &mut [Option<Vec<u8>>],
    ) -> Result<()> {
        let Body::Blocks(blocks) = body else {
            return Err(self.unexpected(peer, "all-gather blocks", &body));
        };
        let mut blocks = blocks.into_iter();
        for want in expected {
            match blocks.next() {
                Some(b) if b.rank as usize == want && want < have.len() && have[want].is_none() => {
                    have[want] = Some(b.data);
                }
                got => {
                    return Err(self.bad_blocks(
                        peer,
                        format!(
                            "expected the block of rank {want}, got {:?}",
                            got.map(|b| b.rank)
                        ),
                    ));
                }
            }
        }
        if blocks.next().is_some() {
            return Err(self.bad_blocks(peer, "more blocks than this round carries".into()));
        }
        Ok(())
    }

    fn bad_blocks(&self, peer: usize, reason: String) -> Error {
        Error::MalformedFrame {
            rank: self.rank(),
            peer: Peer::Rank(peer),
            reason: format!("all_gather: {reason}"),
        }
    }

    fn complete(&self, have: Vec<Option<Vec<u8>>>) -> Result<Vec<Vec<u8>>> {
        have.into_iter()
            .enumerate()
            .map(|(q, d)| {
                d.ok_or_else(|| {
                    Error::Internal(format!("all_gather finished without rank {q}'s block"))
                })
            })
            .collect()
    }
}

/// The fold layout of recursive doubling for `n` ranks: `p` core ranks (the largest power
/// of two `<= n`) and `n - p` extra ranks, extra `r` attached to core `r - p`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fold {
    n: usize,
    p: usize,
}

impl Fold {
    pub(crate) fn new(n: usize) -> Self {
        let p = if n == 0 { 1 } else { 1 << n.ilog2() };
        Fold { n, p }
    }

    /// Doubling rounds among the core ranks.
    pub(crate) fn rounds(&self) -> u32 {
        self.p.trailing_zeros()
    }

    /// The extra rank attached to core rank `r`, if any.
    pub(crate) fn extra_of(&self, r: usize) -> Option<usize> {
        (r < self.p && r + self.p < self.n).then_some(r + self.p)
    }

    /// The core rank an extra rank `r` is attached to (`None` for core ranks).
    pub(crate) fn host_of(&self, r: usize) -> Option<usize> {
        (r >= self.p).then(|| r - self.p)
    }

    /// Ranks whose blocks core rank `r` holds before round `k`: its group of `2^k` core
    /// ranks and their extras, in ascending core order, each core followed by its extra.
    pub(crate) fn held(&self, r: usize, k: u32) -> impl Iterator<Item = usize> + '_ {
        let width = 1usize << k;
        let base = r & !(width - 1);
        (base..base + width).flat_map(move |q| std::iter::once(q).chain(self.extra_of(q)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    // Guards against the fold plan missing a block or sending the wrong set for some N
    // that is not a power of two (the threaded tests only cover a few N).
    #[test]
    fn fold_plan_gathers_everything_for_every_n() {
        // Every size up to 70, and the edges around larger powers of two.
        for n in (1..=70usize).chain([127, 128, 129, 255, 256, 257]) {
            let f = Fold::new(n);
            let p = f.p;
            assert!(p <= n && n < 2 * p);
            let mut have: Vec<BTreeSet<usize>> = (0..n).map(|r| BTreeSet::from([r])).collect();
            for r in p..n {
                let host = f.host_of(r).unwrap();
                assert_eq!(f.extra_of(host), Some(r));
                have[host].insert(r);
            }
            for k in 0..f.rounds() {
                let before = have.clone();
                for r in 0..p {
                    let held: BTreeSet<usize> = f.held(r, k).collect();
                    assert_eq!(before[r], held, "n={n} r={r} k={k}");
                    let partner = r ^ (1 << k);
                    let got: BTreeSet<usize> = f.held(partner, k).collect();
                    assert_eq!(before[partner], got);
                    assert!(held.is_disjoint(&got));
                    have[r].extend(got);
                }
            }
            let all: BTreeSet<usize> = (0..n).collect();
            for (r, h) in have.iter().enumerate().take(p) {
                assert_eq!(h, &all, "n={n} r={r}");
            }
            // O(log N): floor(log2 N) rounds, + 2 for the fold.
            let total = f.rounds() + if n == p { 0 } else { 2 };
            assert!(total <= n.ilog2() + 2);
        }
    }

    // Guards against a rank talking to more peers than the fd budget assumes.
    #[test]
    fn fold_peers_per_rank_are_logarithmic() {
        let n = 1000;
        let f = Fold::new(n);
        for r in 0..n {
            let mut peers = BTreeSet::new();
            if let Some(h) = f.host_of(r) {
                peers.insert(h);
            } else {
                peers.extend(f.extra_of(r));
                for k in 0..f.rounds() {
                    peers.insert(r ^ (1 << k));
                }
            }
            assert!(peers.len() as u32 <= f.rounds() + 1);
        }
    }
}
