//! All-to-all, direct: out of place, in place of the peers' inputs when every rank's is
//! registered.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::published_buffers::{self, Path, Reads};
use super::round_views::{
    my_half, peer_half, per_round, stage_blocks, typed, typed_mut, window, window_mut,
};
use super::scratch_layout::parity;
use oxccl_device::DeviceView;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;

/// All-to-all: rank `r` sends its `input` elements `p * count..(p + 1) * count` to rank
/// `p`, which puts them at `r * count` of its `output` (`n_ranks * count` each; `output`
/// may be `input`).
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_to_all(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => all_to_all::<T>(&args))
}

#[inline(always)]
fn all_to_all<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, r, nr) = (a.count, a.rank, a.n_ranks);
    let total = c.saturating_mul(nr as u64);
    let input = typed::<T>(a.input, 0, total)?;
    let output = typed_mut::<T>(a.output, 0, total)?;
    let per = per_round::<T>(a, nr as u64)?;
    // In place, the blocks we write are what the peers read of our input: that call
    // stages, whatever is registered.
    let offer = output.addr() != input.addr();
    let mine = published_buffers::publish(a, Reads::Inputs, offer)?;
    if !mine {
        stage(a, input, 0, per.min(c), a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::Inputs, offer, mine)?;
    if path == Path::StageFirst {
        stage(a, input, 0, per.min(c), a.sequence)?;
    }
    if path == Path::InPlace {
        // Every rank's input is registered: block `r` of each peer's input lands straight
        // in its place in our output.
        for p in 0..nr {
            let dst = window_mut(output, p as u64 * c, c)?;
            let src = if p == r {
                window(input, r as u64 * c, c)?
            } else {
                published_buffers::peer_input::<T>(a, p, a.sequence, r as u64 * c, c)?
            };
            dst.copy_from(Grid, src)?;
        }
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        let half_off = a.layout.half(parity(seq));
        // Our own block goes straight from input to output (nobody else reads it), after
        // the meeting: in place, the other blocks' outputs are their inputs, staged by then.
        for p in 0..nr {
            let at = p as u64 * c + off;
            let dst = window_mut(output, at, len)?;
            let src = if p == r {
                window(input, at, len)?
            } else {
                peer_half::<T>(a, p, half_off, r as u64 * len, len)?
            };
            if dst.addr() != src.addr() {
                dst.copy_from(Grid, src)?;
            }
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

/// Stages round `off..off + len` of every peer's block of our input into our half of round
/// `seq` (our own block goes straight from input to output).
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (_, half) = my_half::<T>(a, seq)?;
    stage_blocks(half, input, a.n_ranks, a.count, off, len, Some(a.rank))
}
