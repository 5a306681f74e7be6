//! Broadcast, direct: every rank reads the root's staged data.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use oxccl_device::DeviceView;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;

/// Broadcast: the root's `count` elements of `input` land in every rank's `output` (the
/// root's too, unless `output` is `input`). Only the root's `input` is read.
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_broadcast(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => broadcast::<T>(&args))
}

#[inline(always)]
fn broadcast<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, r, root) = (a.count, a.rank, a.root);
    let output = typed_mut::<T>(a.output, 0, c)?;
    let input = if r == root {
        typed::<T>(a.input, 0, c)?
    } else {
        DeviceView::default()
    };
    let per = per_round::<T>(a, 1)?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
        let dst = window_mut(output, off, len)?;
        if r == root {
            let src = window(input, off, len)?;
            window_mut(half, 0, len)?.copy_from(Grid, src)?;
            if dst.addr() != src.addr() {
                dst.copy_from(Grid, src)?;
            }
        }
        all_peers_meet(a)?;
        if r != root {
            dst.copy_from(Grid, peer_half::<T>(a, root, half_off, 0, len)?)?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
