//! The exchange that separates a collective's phases: every block of this rank has
//! finished a phase, and so has every peer.

use super::call_protocol::CallProtocol;
use super::collective_args::CollectiveArgs;
use oxccl_device::arch;
use oxccl_device::block::{block_signal_and_wait, block_wait};
use oxccl_device::error::DeviceError;

/// Waits until every block of this rank and every peer have reached the same point, with
/// everything they wrote before it visible here (and what we wrote visible to them).
///
/// A grid barrier (our blocks' writes are done), then thread 0 of block 0 signals every
/// peer and waits for each peer's signal, then a grid barrier again (every block learns).
/// Every thread of every block must call it. A failed wait on block 0 is recorded on its
/// channel, which stops this rank's other waits: the other blocks' barrier wait then ends
/// with [`DeviceError::Aborted`] instead of running into its own limit.
///
/// # Errors
/// A peer that does not signal within the wait limit ([`DeviceError::Timeout`]), a stopped
/// rank ([`DeviceError::Aborted`]), a block that does not arrive at the barrier.
#[inline(always)]
pub(crate) fn all_peers_meet(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    a.barrier.sync_grid()?;
    // The closures take copies of what they need, not `a`: the compiler may keep a closure
    // out of line, and one that takes `a` by reference would make the whole argument
    // struct live in local memory for the rest of the kernel.
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_signal_and_wait(
            move || {
                for p in (0..n_ranks).filter(|&p| p != rank) {
                    peers.get(p)?.signal()?;
                }
                Ok(())
            },
            move || {
                for p in (0..n_ranks).filter(|&p| p != rank) {
                    peers.get(p)?.wait()?;
                }
                Ok(())
            },
        )?;
    }
    a.barrier.sync_grid()
}

/// The barrier, which is also the switch between the memory path's protocols (see
/// [`CallProtocol`]): block 0 first waits for the dones the last call (`a.protocol`, if it
/// ran an eager protocol) left owed, then every block meets as in [`all_peers_meet`].
/// Signals alone: no part of the scratch, no call number.
///
/// # Errors
/// As [`all_peers_meet`].
#[inline(always)]
pub(crate) fn collect_owed_and_meet(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let last = a.protocol;
    let owed = match last.kind {
        CallProtocol::LOCKSTEP => 0,
        _ => (a.layout.eager_depth()).dones_between(last.covered_until, a.sequence),
    };
    // Plain values, not `a` (see `all_peers_meet`).
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if owed > 0 && arch::block_rank() == 0 {
        block_wait(move || {
            for p in (0..n_ranks).filter(|&p| last.owed_by(rank, p)) {
                let channel = peers.get(p)?;
                for _ in 0..owed {
                    channel.wait()?;
                }
            }
            Ok(())
        })?;
    }
    all_peers_meet(a)
}
