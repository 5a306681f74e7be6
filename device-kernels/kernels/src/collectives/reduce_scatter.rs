//! Reduce-scatter, direct: in place of the peers' inputs when every rank's is registered.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::peer_input_reduction::reduce_from_peer_inputs;
use super::published_buffers::{self, Path, Reads};
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
    let own_direct = r < 2 || !output.overlaps(own_block);
    let skip = own_direct.then_some(r);
    let mine = published_buffers::publish(a, Reads::Inputs, true)?;
    if !mine {
        let (_, first_half) = my_half::<T>(a, a.sequence)?;
        stage_blocks(first_half, input, nr, c, 0, per.min(c), skip)?;
    }
    let path = published_buffers::survey(a, Reads::Inputs, true, mine)?;
    if path == Path::StageFirst {
        let (_, first_half) = my_half::<T>(a, a.sequence)?;
        stage_blocks(first_half, input, nr, c, 0, per.min(c), skip)?;
    }
    if path == Path::InPlace {
        // Every rank's input is registered: reduce our block straight from theirs, then
        // meet, so that no rank returns while a peer still reads its input.
        reduce_from_peer_inputs(a, output, own_block, r as u64 * c, op, false)?;
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
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
        if off >= c {
            return Ok(());
        }
        let (_, next) = my_half::<T>(a, seq)?;
        stage_blocks(next, input, nr, c, off, per.min(c - off), skip)?;
        all_peers_meet(a)?;
    }
}
