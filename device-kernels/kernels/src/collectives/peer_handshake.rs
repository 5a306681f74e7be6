//! The exchange that separates a collective's phases: every block of this rank has
//! finished a phase, and so has every peer.

use super::collective_args::CollectiveArgs;
use oxccl_device::arch;
use oxccl_device::block::block_signal_and_wait;
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
