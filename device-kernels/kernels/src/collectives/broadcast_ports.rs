//! Broadcast over port channels, through the proxy (ranks without a load/store path to
//! each other), eager (see [`call_protocol`](super::call_protocol)), in rounds of
//! [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes): the root stages
//! each round and puts it into its gather slot of every peer, with a signal; each peer
//! waits for the root's signal, copies the round into its output and, every other round,
//! answers with a done. The others exchange nothing among themselves.
//!
//! The root writes a round's set (its staged round, its gather slot of each peer) again
//! [`PortLayout::SETS`](super::PortLayout::SETS) rounds later; before it does, it waits for
//! every peer's done covering that earlier round (the peer has read it out, and our proxy
//! has read our staged round, whose put came before it). So it runs two or three rounds
//! ahead, across calls too (the dones a call leaves owed are waited for by the next). The
//! data's type does not matter: rounds are bytes.

use super::call_protocol::CallProtocol;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to, send_to_peers, wait_for, wait_for_peers};
use super::port_layout::PortLayout;
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
    let (mut covered_until, dtype, _) = args.begin_eager(CallProtocol::BROADCAST)?;
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
        let set = PortLayout::set_of(seq);
        if r == root {
            // Every peer's done covering the round `SETS` before this one (module docs).
            let needed = PortLayout::EAGER.covered_before(covered_until, seq);
            for _ in 0..PortLayout::EAGER.dones_between(covered_until, needed) {
                wait_for_peers(a)?;
            }
            covered_until = needed;
            let staged_at = l.staged(set);
            window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
            send_to_peers(
                a,
                l.gather_slot(set, root),
                staged_at,
                Part::Whole { bytes: len },
            )?;
        } else {
            wait_for(a, root)?;
            let src = window_mut(a.scratch, l.gather_slot(set, root), len)?;
            window_mut(output, off, len)?.copy_from(Grid, src.as_view())?;
            if PortLayout::EAGER.done_after(seq) {
                // Every block has copied the round out (`send_to` meets the grid first).
                send_to(a, root, 0, 0, 0)?;
            }
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
