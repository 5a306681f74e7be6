//! Reduce, direct: the root reduces every rank's staged data, or every input in place
//! when all are registered.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::peer_input_reduction::PeerInputs;
use super::published_buffers::{self, Path, Reads};
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;
use oxccl_device::{DeviceView, DeviceViewMut};

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
    // The root reduces into its output reading every input in place. Its own input may be
    // that output only as the first or second source (root 0 or 1): an in-place reduce on
    // a later root stages.
    let offer = !(r == root && r >= 2 && output.addr() == input.addr());
    let mine = published_buffers::publish(a, Reads::Inputs, offer)?;
    if !mine {
        stage(a, input, 0, per.min(c), a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::Inputs, offer, mine)?;
    if path == Path::StageFirst {
        stage(a, input, 0, per.min(c), a.sequence)?;
    }
    if path == Path::InPlace {
        if r == root {
            reduce_ranks(output, nr, op, PeerInputs::new(a, input, 0, 0, c))?;
        }
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
        let staged = window_mut(half, 0, len)?;
        if r == root {
            reduce_ranks(window_mut(output, off, len)?, nr, op, |p| {
                if p == r {
                    Ok(staged.as_view())
                } else {
                    peer_half::<T>(a, p, half_off, 0, len)
                }
            })?;
        }
        off += len;
        seq += 1;
        if off >= c {
            return Ok(());
        }
        stage(a, input, off, per.min(c - off), seq)?;
        all_peers_meet(a)?;
    }
}

/// Stages round `off..off + len` of our input into our half of round `seq`.
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (_, half) = my_half::<T>(a, seq)?;
    window_mut(half, 0, len)?.copy_from(Grid, window(input, off, len)?)
}
