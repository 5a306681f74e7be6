//! All-to-all over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::block_round`](super::PortLayout::block_round)
//! bytes of each block: each rank stages the round of every peer's block of its input and
//! puts peer `p`'s into its reduce slot of `p`, with a signal; once every peer's has come,
//! it copies each peer's into that peer's block of its output. The data's type does not
//! matter: rounds are bytes.
//!
//! Pipelined as the all-gather is (see `all_gather_ports`): once a round's signals have
//! come, the next round is staged and sent before this one is copied out (in place, the
//! copy writes this round's part of each block, the staging read the next round's).

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to_peers, wait_for_peers};
use super::round_views::{window, window_mut};
use oxccl_device::DeviceView;
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-to-all over port channels: block `p` (`count` elements) of each rank's `input` lands
/// in block `rank` of rank `p`'s `output` (`n_ranks * count` elements each; `input` and
/// `output` may be one buffer).
///
/// # Errors
/// Invalid ids, short buffers, a round too small for one byte per rank, channel (a peer
/// that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_to_all_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, nr, l) = (a.rank, a.n_ranks as u64, a.layout);
    let block = a.count.saturating_mul(dtype.size());
    let input = window(a.input, 0, block.saturating_mul(nr))?;
    let output = window_mut(a.output, 0, block.saturating_mul(nr))?;
    let own = r as u64 * block;
    if output.addr() != input.addr() {
        window_mut(output, own, block)?.copy_from(Grid, window(input, own, block)?)?;
    }
    let per = l.block_round(1);
    if per == 0 {
        return Err(a.invalid([l.round_bytes, nr, 1]));
    }
    let (mut off, mut seq) = (0, a.sequence);
    if block > 0 {
        stage_and_send(a, input, 0, per.min(block), seq)?;
    }
    while off < block {
        let len = per.min(block - off);
        let set = super::PortLayout::set_of(seq);
        wait_for_peers(a)?;
        if off + len < block {
            stage_and_send(a, input, off + len, per.min(block - off - len), seq + 1)?;
        }
        for p in (0..nr).filter(|&p| p != r as u64) {
            let src = window_mut(a.scratch, l.reduce_slot(set, p as u32), len)?;
            window_mut(output, p * block + off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// Stages the `len` bytes from `off` on of every peer's block of `input` (round number
/// `seq`) and puts peer `p`'s into its reduce slot of `p`, with a signal; does not wait.
/// Staged before any arrives: in place, what arrives overwrites the input. (A function,
/// not a closure: see `all_gather_ports`.)
#[inline(always)]
fn stage_and_send(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, u8>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (r, nr) = (a.rank as u64, a.n_ranks as u64);
    let block = input.len() / nr.max(1);
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    for p in (0..nr).filter(|&p| p != r) {
        window_mut(a.scratch, staged_at + p * len, len)?
            .copy_from(Grid, window(input, p * block + off, len)?)?;
    }
    let dst = a.layout.reduce_slot(set, a.rank);
    send_to_peers(a, dst, staged_at, Part::TheirBlock { bytes: len })
}
