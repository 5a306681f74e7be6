//! All-to-all with a count and a displacement per peer, direct: in place of the peers'
//! inputs when every rank's is registered.

use super::all_to_allv_counts::AllToAllvCounts;
use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::published_buffers::{self, EXTRA, Path, Reads};
use super::round_views::{my_half, peer_half, per_round, window, window_mut};
use super::scratch_layout::parity;
use oxccl_device::DeviceView;
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
    // Where our input holds what we send each rank: a peer reading our input in place
    // finds its part there.
    published_buffers::publish_extra(a, k.send_displs.iter().take(nr as usize).copied())?;
    let offer = !output.overlaps(input);
    let mine = published_buffers::publish(a, Reads::Inputs, offer)?;
    if !mine {
        stage(a, k, input, per, 0, a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::Inputs, offer, mine)?;
    if path == Path::StageFirst {
        stage(a, k, input, per, 0, a.sequence)?;
    }
    if path == Path::InPlace {
        // Every rank's input is registered: each peer's part for us lands straight in
        // place (the host checked counts and displacements; the table bounds each read).
        for p in 0..nr {
            let len = k.recv_counts[p as usize];
            if len == 0 {
                continue;
            }
            let src = if p == r {
                window(input, k.send_displs[r as usize], len)?
            } else {
                let at = published_buffers::peer_word(a, p, a.sequence, EXTRA + r as u64)?;
                published_buffers::peer_input::<T>(a, p, a.sequence, at, len)?
            };
            window_mut(output, k.recv_displs[p as usize], len)?.copy_from(Grid, src)?;
        }
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let half_off = a.layout.half(parity(seq));
        for p in 0..nr {
            let len = share(k.recv_counts[p as usize], off, per);
            if len == 0 {
                continue;
            }
            let src = if p == r {
                window(my_half::<T>(a, seq)?.1.as_view(), r as u64 * per, len)?
            } else {
                peer_half::<T>(a, p, half_off, r as u64 * per, len)?
            };
            let at = k.recv_displs[p as usize].saturating_add(off);
            window_mut(output, at, len)?.copy_from(Grid, src)?;
        }
        off += per;
        seq += 1;
        if off >= a.count {
            return Ok(());
        }
        stage(a, k, input, per, off, seq)?;
        all_peers_meet(a)?;
    }
}

/// Of a peer's `count`, what the round from `off` on moves, at `per` elements (or bytes) a
/// round.
#[inline(always)]
pub(super) fn share(count: u64, off: u64, per: u64) -> u64 {
    count.saturating_sub(off).min(per)
}

/// Stages the round from `off` on of what we send each rank into our half of round
/// `seq`, rank `p`'s part at `p * per`.
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    k: &AllToAllvCounts,
    input: DeviceView<'_, T>,
    per: u64,
    off: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (_, half) = my_half::<T>(a, seq)?;
    for p in 0..a.n_ranks as usize {
        let len = share(k.send_counts[p], off, per);
        if len == 0 {
            continue;
        }
        let src = window(input, k.send_displs[p].saturating_add(off), len)?;
        window_mut(half, p as u64 * per, len)?.copy_from(Grid, src)?;
    }
    Ok(())
}
