//! Reduce-scatter, direct.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::round_views::{
    my_half, peer_half, per_round, stage_blocks, typed, typed_mut, window, window_mut,
};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;

/// Reduce-scatter: `input` holds `n_ranks * count` elements; rank `r`'s `output` gets the
/// reduction by `op` of every rank's elements `r * count..(r + 1) * count`.
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce_scatter(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce_scatter::<T>(&args, op))
}

#[inline(always)]
fn reduce_scatter<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (c, r, nr) = (a.count, a.rank, a.n_ranks);
    let input = typed::<T>(a.input, 0, c.saturating_mul(nr as u64))?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    let per = per_round::<T>(a, nr as u64)?;
    // Our own block is reduced straight from the input, unstaged, unless the output is that
    // very block (in place) and we are not among the first two sources: the reduction
    // writes the output from the first pass on, and would read our block after it changed.
    let own_block = window(input, r as u64 * c, c)?;
    let aliased = own_block.addr()
        < output
            .addr()
            .saturating_add(output.len() * size_of::<T>() as u64)
        && output.addr()
            < own_block
                .addr()
                .saturating_add(own_block.len() * size_of::<T>() as u64);
    let own_direct = r < 2 || !aliased;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
        stage_blocks(half, input, nr, c, off, len, own_direct.then_some(r))?;
        all_peers_meet(a)?;
        let mine = r as u64 * len;
        reduce_ranks(window_mut(output, off, len)?, nr, op, |p| {
            if p != r {
                peer_half::<T>(a, p, half_off, mine, len)
            } else if own_direct {
                window(own_block, off, len)
            } else {
                window(half.as_view(), mine, len)
            }
        })?;
        off += len;
        seq += 1;
    }
    Ok(())
}
