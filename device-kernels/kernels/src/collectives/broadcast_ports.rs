//! Broadcast over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//! the root stages its round and puts it into its gather slot of every peer, with a
//! signal; every other rank signals the root (and each other) with nothing, which tells
//! the root that the rank is done with the set of two rounds before; each copies the
//! root's round into its output. The data's type does not matter: rounds are bytes.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, exchange_with_peers};
use super::round_views::{window, window_mut};
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
    while off < bytes {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        let what = if r == root {
            window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
            Part::Whole { bytes: len }
        } else {
            Part::Nothing
        };
        exchange_with_peers(a, l.gather_slot(set, r), staged_at, what)?;
        if r != root {
            let src = window_mut(a.scratch, l.gather_slot(set, root), len)?;
            window_mut(output, off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
