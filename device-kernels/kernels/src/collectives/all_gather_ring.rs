//! All-gather over port channels in a ring, through the proxy: each rank sends to the next
//! rank only and hears from the previous one only (see
//! [`all_reduce_ring`](super::all_reduce_ring), whose second half this is). In rounds of
//! [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes) of each rank's
//! data, `n - 1` steps each: at step `t` a rank puts the round of rank `r - t` (its own,
//! staged, at step 0; else straight from the gather slot it arrived in) into the next
//! rank's gather slot `t`, then waits for the previous rank's put of step `t` (rank
//! `r - t - 1`'s round) and copies it into that rank's block of its output. The data's type
//! does not matter: rounds are bytes.
//!
//! Sets of the scratch come back as in the ring all-reduce: by the end of a round a rank
//! has received the round of every other rank, each sent after that rank finished the
//! round before.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to_next, wait_for_prev};
use super::round_views::{window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-gather over port channels in a ring (see the module docs): each rank's `count`
/// elements of `input` land at `rank * count` of every rank's `output` (`n_ranks * count`
/// elements; in place when `input` is that part of it). Takes the same arguments, scratch
/// and round numbers as
/// [`collective_all_gather_ports()`](super::all_gather_ports::collective_all_gather_ports()).
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_gather_ring(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, nr, l) = (a.rank, a.n_ranks, a.layout);
    let bytes = a.count.saturating_mul(dtype.size());
    let input = window(a.input, 0, bytes)?;
    let output = window_mut(a.output, 0, bytes.saturating_mul(nr as u64))?;
    let own = window_mut(output, r as u64 * bytes, bytes)?;
    if own.addr() != input.addr() {
        own.copy_from(Grid, input)?;
    }
    let per = l.copy_round_bytes();
    let (mut off, mut seq) = (0, a.sequence);
    while off < bytes && nr > 1 {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
        send_to_next(a, l.gather_slot(set, 0), staged_at, len)?;
        for t in 0..nr - 1 {
            let slot = l.gather_slot(set, t);
            wait_for_prev(a)?;
            if t + 1 < nr - 1 {
                send_to_next(a, l.gather_slot(set, t + 1), slot, len)?;
            }
            let from = ((r + nr - 1 - t) % nr) as u64;
            let came = window_mut(a.scratch, slot, len)?;
            window_mut(output, from * bytes + off, len)?.copy_from(Grid, came.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
