//! Broadcast, direct: every rank reads the root's staged data, or the root's input itself
//! when it is registered.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::published_buffers::{self, Path, Reads};
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use super::scratch_layout::parity;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::{DeviceView, DeviceViewMut};

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
    let mine = published_buffers::publish(a, Reads::RootInput, true)?;
    if !mine {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::RootInput, true, mine)?;
    if path == Path::StageFirst {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    if path == Path::InPlace {
        // The root's input is registered: every rank copies it straight into its output.
        if r != root {
            output.copy_from(
                Grid,
                published_buffers::peer_input::<T>(a, root, a.sequence, 0, c)?,
            )?;
        } else if output.addr() != input.addr() {
            output.copy_from(Grid, input)?;
        }
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        if r != root {
            let half_off = a.layout.half(parity(seq));
            let dst = window_mut(output, off, len)?;
            dst.copy_from(Grid, peer_half::<T>(a, root, half_off, 0, len)?)?;
        }
        off += len;
        seq += 1;
        if off >= c {
            return Ok(());
        }
        stage(a, input, output, off, per.min(c - off), seq)?;
        all_peers_meet(a)?;
    }
}

/// The root stages round `off..off + len` of its input into its half of round `seq`, and
/// copies it into its output (unless in place); the other ranks have nothing to stage.
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    if a.rank == a.root {
        let (_, half) = my_half::<T>(a, seq)?;
        let src = window(input, off, len)?;
        window_mut(half, 0, len)?.copy_from(Grid, src)?;
        let dst = window_mut(output, off, len)?;
        if dst.addr() != src.addr() {
            dst.copy_from(Grid, src)?;
        }
    }
    Ok(())
}
