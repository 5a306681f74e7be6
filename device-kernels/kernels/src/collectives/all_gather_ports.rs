//! All-gather over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//! each rank stages its round and puts it into its gather slot of every peer, with a
//! signal; once every peer's has come, it copies the peers' rounds into their blocks of
//! its output. The data's type does not matter: rounds are bytes.
//!
//! Pipelined: once a round's signals have come, a rank stages and sends the next round
//! before it copies this one out, so the next round travels during the copy. Round `k`
//! takes set `k % 3`: the next round's staging overwrites our staged round of `k - 2`,
//! whose puts have landed (every peer's signal of `k` comes after it has waited for ours
//! of `k - 1`, which follows our puts of `k - 2` on its channel); and a peer puts round
//! `k + 1` into our slots of set `k - 2` only after our signal of `k`, which we send after
//! copying round `k - 2` out.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to_peers, wait_for_peers};
use super::round_views::{window, window_mut};
use oxccl_device::DeviceView;
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-gather over port channels: each rank's `count` elements of `input` land at
/// `rank * count` of every rank's `output` (`n_ranks * count` elements; in place when
/// `input` is that part of it).
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_gather_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
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
    if bytes > 0 {
        stage_and_send(a, window(input, 0, per.min(bytes))?, seq)?;
    }
    while off < bytes {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        wait_for_peers(a)?;
        if off + len < bytes {
            let next = window(input, off + len, per.min(bytes - off - len))?;
            stage_and_send(a, next, seq + 1)?;
        }
        for p in (0..nr).filter(|&p| p != r) {
            let src = window_mut(a.scratch, l.gather_slot(set, p), len)?;
            window_mut(output, p as u64 * bytes + off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// Stages `round` (round number `seq`) and puts it into our gather slot of every peer, with
/// a signal; does not wait. (A function, not a closure: called from two places, a closure
/// stays out of line on the GPU and what it borrows lives in local memory.)
#[inline(always)]
fn stage_and_send(
    a: &PortCollectiveArgs<'_>,
    round: DeviceView<'_, u8>,
    seq: u64,
) -> Result<(), DeviceError> {
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    window_mut(a.scratch, staged_at, round.len())?.copy_from(Grid, round)?;
    let dst = a.layout.gather_slot(set, a.rank);
    send_to_peers(a, dst, staged_at, Part::Whole { bytes: round.len() })
}
