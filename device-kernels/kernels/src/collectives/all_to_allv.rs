//! All-to-all with a count and a displacement per peer, direct.

use super::all_to_allv_counts::AllToAllvCounts;
use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::round_views::{my_half, peer_half, per_round, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;

/// All-to-all with a count and a displacement per peer (see [`AllToAllvCounts`]); `count`
/// is the largest count any rank sends any rank (the same on every rank: it sets the
/// number of rounds).
///
/// # Errors
/// Invalid ids, more ranks than [`AllToAllvCounts`] holds, counts and displacements outside
/// the buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_to_allv(
    args: CollectiveArgs<'_>,
    counts: AllToAllvCounts,
) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    if args.n_ranks as usize > AllToAllvCounts::MAX_RANKS {
        return Err(args.invalid([args.n_ranks as u64, AllToAllvCounts::MAX_RANKS as u64, 2]));
    }
    dispatch_element!(dtype, T => all_to_allv::<T>(&args, &counts))
}

#[inline(always)]
fn all_to_allv<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    k: &AllToAllvCounts,
) -> Result<(), DeviceError> {
    let (r, nr) = (a.rank, a.n_ranks);
    let input = a.input.cast::<T>()?;
    let output = a.output.cast::<T>()?;
    let per = per_round::<T>(a, nr as u64)?;
    let (mut off, mut seq) = (0, a.sequence);
    // Of a peer's count, what round `off` moves.
    let share = |count: u64, off: u64| count.saturating_sub(off).min(per);
    while off < a.count {
        let (half_off, half) = my_half::<T>(a, seq)?;
        for p in 0..nr as usize {
            let len = share(k.send_counts[p], off);
            if len == 0 {
                continue;
            }
            let src = window(input, k.send_displs[p].saturating_add(off), len)?;
            window_mut(half, p as u64 * per, len)?.copy_from(Grid, src)?;
        }
        all_peers_meet(a)?;
        for p in 0..nr {
            let len = share(k.recv_counts[p as usize], off);
            if len == 0 {
                continue;
            }
            let src = if p == r {
                window(half.as_view(), r as u64 * per, len)?
            } else {
                peer_half::<T>(a, p, half_off, r as u64 * per, len)?
            };
            let at = k.recv_displs[p as usize].saturating_add(off);
            window_mut(output, at, len)?.copy_from(Grid, src)?;
        }
        off += per;
        seq += 1;
    }
    Ok(())
}
