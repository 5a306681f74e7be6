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
//! Pipelined a little: the next round's first put (our own round) goes out right after this
//! round's last wait, before its last copy. (Before that wait, as the ring all-reduce does,
//! it would need a fourth set: without a reduce-scatter before it, the last wait is what
//! brings the next rank's round, which tells that it is done with the round before.)
//!
//! Round `k` takes set `k % 3`. A rank starts round `k + 1` (set `k - 2`'s) once it has the
//! next rank's round `k`, which that rank sent after it had waited for every put of ours of
//! round `k - 1`: every put of round `k - 2` has landed and every rank has read that
//! round's slots.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to_next, wait_for_prev};
use super::round_views::{window, window_mut};
use oxccl_device::DeviceView;
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
    if nr == 1 || bytes == 0 {
        return Ok(());
    }
    start_round(a, input, 0, per.min(bytes), a.sequence)?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < bytes {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        for t in 0..nr - 1 {
            let slot = l.gather_slot(set, t);
            wait_for_prev(a)?;
            if t + 1 < nr - 1 {
                send_to_next(a, l.gather_slot(set, t + 1), slot, len)?;
            } else if off + len < bytes {
                let next = per.min(bytes - off - len);
                start_round(a, input, off + len, next, seq + 1)?;
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

/// Stages our round of `len` bytes of `input` from `off` on (round number `seq`) and puts it
/// into the next rank's gather slot 0, with a signal. Does not wait.
#[inline(always)]
fn start_round(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, u8>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
    send_to_next(a, a.layout.gather_slot(set, 0), staged_at, len)
}
