//! Broadcast over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//! the root stages its round and puts it into its gather slot of every peer, with a
//! signal; every other rank signals the root (and each other) with nothing, which tells
//! the root that the rank is done with the set of two rounds before; each copies the
//! root's round into its output. The data's type does not matter: rounds are bytes.
//!
//! Pipelined as the all-gather is (see `all_gather_ports`): once a round's signals have
//! come, the next round is staged and sent (by the root; a signal by the others) before this
//! one is copied out.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to_peers, wait_for_peers};
use super::round_views::{window, window_mut};
use oxccl_device::DeviceView;
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Broadcast over port channels: `count` elements of the root's `input` into every rank's
/// `output` (`input` and `output` may be one buffer; only the root's input is read).
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_broadcast_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, root, l) = (a.rank, a.root, a.layout);
    let bytes = a.count.saturating_mul(dtype.size());
    let output = window_mut(a.output, 0, bytes)?;
    let input = if r == root {
        let input = window(a.input, 0, bytes)?;
        if output.addr() != input.addr() {
            output.copy_from(Grid, input)?;
        }
        input
    } else {
        a.input
    };
    let per = l.copy_round_bytes();
    let (mut off, mut seq) = (0, a.sequence);
    if bytes > 0 {
        stage_and_send(a, input, 0, per.min(bytes), seq)?;
    }
    while off < bytes {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        wait_for_peers(a)?;
        if off + len < bytes {
            stage_and_send(a, input, off + len, per.min(bytes - off - len), seq + 1)?;
        }
        if r != root {
            let src = window_mut(a.scratch, l.gather_slot(set, root), len)?;
            window_mut(output, off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// The root stages the `len` bytes of its `input` from `off` on (round number `seq`) and
/// puts them into its gather slot of every peer, with a signal; the others signal every
/// peer with nothing (see the module docs). Does not wait. (A function, not a closure: see
/// `all_gather_ports`.)
#[inline(always)]
fn stage_and_send(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, u8>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    let what = if a.rank == a.root {
        window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
        Part::Whole { bytes: len }
    } else {
        Part::Nothing
    };
    send_to_peers(a, a.layout.gather_slot(set, a.rank), staged_at, what)
}
