//! One exchange of a port-channel collective: every block has written its part of the
//! staged round; one thread puts to every peer what that peer gets of it, with a signal,
//! and waits for every peer's signal; then every block proceeds, seeing what arrived.
//!
//! Every exchange of a round signals every peer, data or not. The collectives are
//! pipelined one round ahead: each sends round `k + 1` ([`send_to_peers`]) once round `k`
//! has come ([`wait_for_peers`]) and before it reads round `k` out (the all-reduce, whose
//! rounds have two exchanges, sends a round's first before it waits for the last round's
//! second). So a peer's signal of round `k + 1` comes after it has received every put of
//! round `k` (and of `k - 1`, whose source was our staged round of that set) and after it
//! has read everything of round `k - 1` out. Sets come back every
//! [`PortLayout::SETS`](super::PortLayout::SETS) rounds, which leaves room for that (see
//! `all_gather_ports`, `all_reduce_ports`). Kernels rely on it: no exchange may be skipped,
//! on any rank. An exchange is its two halves, [`send_to_peers`] then [`wait_for_peers`].
//!
//! A ring ([`send_to_next`], [`wait_for_prev`]) signals the next rank only, once a step, and
//! makes its own argument for reusing a set (see `all_reduce_ring`): every rank's data of a
//! round reach every rank through the ring in the next round. Recursive doubling
//! ([`send_to`], [`wait_for`] a partner) likewise signals one peer a step (see
//! `all_reduce_doubling`).
//!
//! All of these are the lockstep protocol; broadcast and reduce are eager, and a switch
//! between protocols is one exchange with nothing in it (see
//! [`call_protocol`](super::call_protocol)).

use super::all_to_allv::share;
use super::all_to_allv_counts::AllToAllvCounts;
use super::port_collective_args::PortCollectiveArgs;
use oxccl_device::arch;
use oxccl_device::block::{block_signal, block_wait};
use oxccl_device::channel_set::ChannelSetDeviceHandle;
use oxccl_device::coop::contiguous_chunk;
use oxccl_device::error::DeviceError;
use oxccl_device::port_channel::{PortChannelDeviceHandle, SrcMemoryId};

/// What of the staged round an exchange puts to each peer: offsets and lengths in bytes
/// from the start of the staged round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part<'k> {
    /// The peer's chunk of a round of `len` elements of `size` bytes (all-reduce: to reduce).
    TheirChunk { len: u64, size: u64 },
    /// Our own chunk of such a round (all-reduce: reduced).
    OurChunk { len: u64, size: u64 },
    /// The first `bytes` bytes, to every peer (all-gather; broadcast from the root; the
    /// one-shot all-reduce).
    Whole { bytes: u64 },
    /// Block `p` of `bytes` bytes to peer `p` (reduce-scatter, all-to-all).
    TheirBlock { bytes: u64 },
    /// Of the `counts[p]` elements of `size` bytes each we send peer `p`, the bytes from
    /// `off` on, at most `per`, from block `p` of `per` bytes (all-to-all-v).
    TheirShare {
        per: u64,
        off: u64,
        size: u64,
        counts: &'k [u64; AllToAllvCounts::MAX_RANKS],
    },
    /// Nothing: a signal alone (a barrier; the switch between protocols; the reduce's
    /// dones).
    Nothing,
}

impl Part<'_> {
    /// Offset and length, in bytes, of what peer `p` gets, `rank` being ours.
    #[inline(always)]
    fn for_peer(self, p: u32, rank: u32, n_ranks: u32) -> (u64, u64) {
        let chunk = |owner: u32, len: u64, size: u64| {
            let c = contiguous_chunk(owner as u64, n_ranks as u64, len);
            (c.start * size, (c.end - c.start) * size)
        };
        match self {
            Part::TheirChunk { len, size } => chunk(p, len, size),
            Part::OurChunk { len, size } => chunk(rank, len, size),
            Part::Whole { bytes } => (0, bytes),
            Part::TheirBlock { bytes } => (p as u64 * bytes, bytes),
            Part::TheirShare {
                per,
                off,
                size,
                counts,
            } => {
                let count = counts.get(p as usize).copied().unwrap_or(0);
                (p as u64 * per, share(count.saturating_mul(size), off, per))
            }
            Part::Nothing => (0, 0),
        }
    }
}

/// The first half of an exchange: once every block has written its part, puts
/// `what` to every peer with a signal, and returns without waiting; [`wait_for_peers`] is
/// the second half.
///
/// # Errors
/// The channels' and the grid barrier's.
#[inline(always)]
pub(crate) fn send_to_peers(
    a: &PortCollectiveArgs<'_>,
    dst: u64,
    staged_at: u64,
    what: Part<'_>,
) -> Result<(), DeviceError> {
    a.barrier.sync_grid()?;
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_signal(move || put_to_peers(peers, rank, n_ranks, dst, staged_at, what))?;
    }
    Ok(())
}

/// [`send_to_peers`] from `src` (our memory at the proxy: the input, where it is registered;
/// see [`PortSource`](super::PortSource)) at `at`, instead of from the staged
/// round. A loop of its own rather than an optional source in [`put_to_peers`]: that cost
/// every staged port collective registers on the GPU (2-14 at sm_90).
///
/// # Errors
/// As [`send_to_peers`].
#[inline(always)]
pub(crate) fn send_to_peers_from(
    a: &PortCollectiveArgs<'_>,
    src: SrcMemoryId,
    dst: u64,
    at: u64,
    what: Part<'_>,
) -> Result<(), DeviceError> {
    a.barrier.sync_grid()?;
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_signal(move || {
            for p in (0..n_ranks).filter(|&p| p != rank) {
                let (off, bytes) = what.for_peer(p, rank, n_ranks);
                let channel = peers.get(p)?.with_src_memory(src);
                put_or_signal(&channel, dst, at + off, bytes)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Where the port channels' FIFO stands: the position our next push will take
/// ([`FifoDeviceHandle::pushed`](oxccl_device::fifo::FifoDeviceHandle::pushed)), for
/// [`release_before`]. Meaningful on the thread that puts (thread 0 of block 0), which is
/// the one that waits in [`release_before`].
///
/// # Errors
/// None in practice (the channel to the next rank exists).
#[inline(always)]
pub(crate) fn pushed(a: &PortCollectiveArgs<'_>) -> Result<u64, DeviceError> {
    if a.n_ranks < 2 {
        return Ok(0);
    }
    Ok(a.peers.get((a.rank + 1) % a.n_ranks)?.fifo().pushed())
}

/// Waits until the proxy has executed every put pushed before `position` (what
/// [`pushed`] returned on the thread that puts); then every block proceeds and may write
/// what those puts read (see [`PortSource`](super::PortSource)). Every thread
/// calls it.
///
/// # Errors
/// The FIFO's wait (a proxy that does not get there), the grid barrier's.
#[inline(always)]
pub(crate) fn release_before(a: &PortCollectiveArgs<'_>, position: u64) -> Result<(), DeviceError> {
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_wait(move || {
            let channel = peers.get((rank + 1) % n_ranks)?;
            channel.fifo().sync_before(position)
        })?;
    }
    a.barrier.sync_grid()
}

/// The second half of an exchange ([`send_to_peers`]): waits for every peer's next signal; then
/// every block sees what the peers put before it.
///
/// # Errors
/// The channels' (a peer that does not answer) and the grid barrier's.
#[inline(always)]
pub(crate) fn wait_for_peers(a: &PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_wait(move || wait_on_peers(peers, rank, n_ranks))?;
    }
    a.barrier.sync_grid()
}

/// A ring's send (the first half of its step): [`send_to`] the next rank;
/// [`wait_for_prev`] is the second half.
///
/// # Errors
/// The channel's and the grid barrier's.
#[inline(always)]
pub(crate) fn send_to_next(
    a: &PortCollectiveArgs<'_>,
    dst: u64,
    src: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    send_to(a, (a.rank + 1) % a.n_ranks.max(1), dst, src, bytes)
}

/// A ring's wait (the second half of its step): [`wait_for`] the previous rank.
///
/// # Errors
/// The channel's (a peer that does not answer) and the grid barrier's.
#[inline(always)]
pub(crate) fn wait_for_prev(a: &PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let n = a.n_ranks.max(1);
    wait_for(a, (a.rank + n - 1) % n)
}

/// A step with one peer (a ring's, recursive doubling's), its first half: once every block
/// has written its part, puts `bytes` bytes at `src` of our scratch into peer `to`'s
/// scratch at `dst`, with a signal (a signal alone for none), and returns without waiting;
/// [`wait_for`] is the second half.
///
/// # Errors
/// The channel's and the grid barrier's.
#[inline(always)]
pub(crate) fn send_to(
    a: &PortCollectiveArgs<'_>,
    to: u32,
    dst: u64,
    src: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    a.barrier.sync_grid()?;
    let peers = a.peers;
    if a.n_ranks > 1 && arch::block_rank() == 0 {
        block_signal(move || put_or_signal(peers.get(to)?, dst, src, bytes))?;
    }
    Ok(())
}

/// The second half of a step with one peer ([`send_to`]): waits for peer `from`'s next
/// signal; then every block sees what it put before it.
///
/// # Errors
/// The channel's (a peer that does not answer) and the grid barrier's.
#[inline(always)]
pub(crate) fn wait_for(a: &PortCollectiveArgs<'_>, from: u32) -> Result<(), DeviceError> {
    let peers = a.peers;
    if a.n_ranks > 1 && arch::block_rank() == 0 {
        block_wait(move || peers.get(from)?.wait())?;
    }
    a.barrier.sync_grid()
}

/// Thread 0 of block 0: puts what each peer gets of the staged round, with a signal (a
/// signal alone where it gets nothing). Plain values: what a closure borrows lives in local
/// memory on the GPU once the closure is out of line.
#[inline(always)]
fn put_to_peers(
    peers: ChannelSetDeviceHandle<'_, PortChannelDeviceHandle<'_>>,
    rank: u32,
    n_ranks: u32,
    dst: u64,
    staged_at: u64,
    what: Part<'_>,
) -> Result<(), DeviceError> {
    for p in (0..n_ranks).filter(|&p| p != rank) {
        let (at, bytes) = what.for_peer(p, rank, n_ranks);
        put_or_signal(peers.get(p)?, dst, staged_at + at, bytes)?;
    }
    Ok(())
}

/// Puts `bytes` bytes at `src` of our scratch into the peer's at `dst` with a signal, or,
/// for none, signals alone.
#[inline(always)]
fn put_or_signal(
    channel: &PortChannelDeviceHandle<'_>,
    dst: u64,
    src: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    if bytes == 0 {
        channel.signal()
    } else {
        channel.put_with_signal(dst, src, bytes)
    }
}

/// Thread 0 of block 0: waits for every peer's next signal. Plain values, as
/// [`put_to_peers`]'s.
#[inline(always)]
fn wait_on_peers(
    peers: ChannelSetDeviceHandle<'_, PortChannelDeviceHandle<'_>>,
    rank: u32,
    n_ranks: u32,
) -> Result<(), DeviceError> {
    for p in (0..n_ranks).filter(|&p| p != rank) {
        peers.get(p)?.wait()?;
    }
    Ok(())
}
