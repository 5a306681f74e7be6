//! All-to-all-v over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::block_round`](super::PortLayout::block_round)
//! bytes of what each rank sends each peer: as [`all_to_all_ports`](super::all_to_all_ports),
//! each rank stages the round of every peer's part of its input (its count and displacement
//! for that peer), puts peer `p`'s into its reduce slot of `p` with a signal, and once every
//! peer's has come copies each into place in its output. Every rank takes as many rounds as
//! the largest part any rank sends (`count`), exchanging with every peer in each, data or
//! not, as the exchange requires. Rounds are bytes: the type does not matter. Pipelined as
//! the all-gather is (see `all_gather_ports`): the next round is staged and sent before
//! this one is copied out.

use super::all_to_allv::share;
use super::all_to_allv_counts::AllToAllvCounts;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to_peers, wait_for_peers};
use super::round_views::{window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-to-all-v over port channels (see [`AllToAllvCounts`] for the counts and
/// displacements, in elements; `count` is the largest count any rank sends any rank, the
/// same on every rank). `input` and `output` are distinct buffers.
///
/// # Errors
/// Invalid ids, more ranks than [`AllToAllvCounts`] holds, counts and displacements outside
/// the buffers, a round too small for one byte per rank, channel (a peer that does not
/// answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_to_allv_ports(
    args: PortCollectiveArgs<'_>,
    counts: AllToAllvCounts,
) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let (a, k) = (&args, &counts);
    let (r, nr, l) = (a.rank, a.n_ranks, a.layout);
    if nr as usize > AllToAllvCounts::MAX_RANKS {
        return Err(a.invalid([nr as u64, AllToAllvCounts::MAX_RANKS as u64, 2]));
    }
    let size = dtype.size();
    let bytes = |elements: u64| elements.saturating_mul(size);
    let (input, output) = (a.input, a.output);
    let (own_from, own_len) = (
        bytes(k.send_displs[r as usize]),
        bytes(k.send_counts[r as usize]),
    );
    window_mut(output, bytes(k.recv_displs[r as usize]), own_len)?
        .copy_from(Grid, window(input, own_from, own_len)?)?;
    let per = l.block_round(1);
    if per == 0 {
        return Err(a.invalid([l.round_bytes, nr as u64, 1]));
    }
    let (total, mut off, mut seq) = (bytes(a.count), 0, a.sequence);
    if total > 0 {
        stage_and_send(a, k, size, 0, seq)?;
    }
    while off < total {
        let set = super::PortLayout::set_of(seq);
        wait_for_peers(a)?;
        if off + per < total {
            stage_and_send(a, k, size, off + per, seq + 1)?;
        }
        for p in (0..nr as usize).filter(|&p| p != r as usize) {
            let len = share(bytes(k.recv_counts[p]), off, per);
            if len > 0 {
                let src = window_mut(a.scratch, l.reduce_slot(set, p as u32), len)?;
                let at = bytes(k.recv_displs[p]).saturating_add(off);
                window_mut(output, at, len)?.copy_from(Grid, src.as_view())?;
            }
        }
        off += per;
        seq += 1;
    }
    Ok(())
}

/// Stages the round from byte `off` on (round number `seq`) of every peer's part of our
/// input, elements of `size` bytes, and puts peer `p`'s into its reduce slot of `p`, with a
/// signal (a signal alone where the part has no bytes left); does not wait. (A function,
/// not a closure: see `all_gather_ports`.)
#[inline(always)]
fn stage_and_send(
    a: &PortCollectiveArgs<'_>,
    k: &AllToAllvCounts,
    size: u64,
    off: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (r, per) = (a.rank as usize, a.layout.block_round(1));
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    for p in (0..a.n_ranks as usize).filter(|&p| p != r) {
        let len = share(k.send_counts[p].saturating_mul(size), off, per);
        if len > 0 {
            let from = k.send_displs[p].saturating_mul(size).saturating_add(off);
            window_mut(a.scratch, staged_at + p as u64 * per, len)?
                .copy_from(Grid, window(a.input, from, len)?)?;
        }
    }
    let ours = Part::TheirShare {
        per,
        off,
        size,
        counts: &k.send_counts,
    };
    send_to_peers(a, a.layout.reduce_slot(set, a.rank), staged_at, ours)
}
