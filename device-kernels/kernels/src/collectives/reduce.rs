//! Reduce, direct: the root reduces every rank's staged data.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use oxccl_device::DeviceViewMut;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;

/// Reduce: every rank's `count` elements of `input`, reduced by `op`, land in the root's
/// `output` (only the root's `output` is written).
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce::<T>(&args, op))
}

#[inline(always)]
fn reduce<T: ReduceElement>(a: &CollectiveArgs<'_>, op: ReduceOp) -> Result<(), DeviceError> {
    let (c, r, nr, root) = (a.count, a.rank, a.n_ranks, a.root);
    let input = typed::<T>(a.input, 0, c)?;
    let output = if r == root {
        typed_mut::<T>(a.output, 0, c)?
    } else {
        DeviceViewMut::default()
    };
    let per = per_round::<T>(a, 1)?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
        let mine = window_mut(half, 0, len)?;
        mine.copy_from(Grid, window(input, off, len)?)?;
        all_peers_meet(a)?;
        if r == root {
            reduce_ranks(window_mut(output, off, len)?, nr, op, |p| {
                if p == r {
                    Ok(mine.as_view())
                } else {
                    peer_half::<T>(a, p, half_off, 0, len)
                }
            })?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
