//! Broadcast, direct: every rank reads the root's staged data, or the root's input itself
//! when it is registered.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::published_buffers::{
    self, INPUT_OFFSET, INPUT_SLOT, OUTPUT_OFFSET, OUTPUT_SLOT, Path, Reads,
};
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use super::scratch_layout::parity;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::peer_buffer_table::NO_SLOT;
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
        // The root's input is registered: every rank copies it straight into its output,
        // but for the last `pushed` elements, which the root stores into each peer's
        // output (see `pushed`).
        let pushed = pushed::<T>(a, input, output)?;
        let loaded = c - pushed;
        if r != root {
            window_mut(output, 0, loaded)?.copy_from(
                Grid,
                published_buffers::peer_input::<T>(a, root, a.sequence, 0, loaded)?,
            )?;
        } else {
            if output.addr() != input.addr() {
                output.copy_from(Grid, input)?;
            }
            for p in (0..a.n_ranks).filter(|&p| p != root && pushed > 0) {
                published_buffers::peer_output_mut::<T>(a, p, a.sequence, loaded, pushed)?
                    .copy_from(Grid, window(input, loaded, pushed)?)?;
            }
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

/// Elements of a broadcast run in place of the root's registered input that the root
/// stores into each other rank's output, at its end (the others load the rest from the
/// root's input): `count / n_ranks` where every other rank registered its output and the
/// call is in place on the root, else none. Every rank reads the same descriptors, so all
/// agree.
///
/// Why: one core copying the whole message is what bounds a large broadcast on the
/// emulator (2 ranks, 16 MiB in place: 694 µs, one `memmove` of about 24 GB/s, while
/// the root waited at the meeting); shared out, every rank stores or loads about the
/// same. Out of place the root already copies the whole message into its own output, as
/// much as a peer loads: it takes no share then.
#[inline(always)]
fn pushed<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
) -> Result<u64, DeviceError> {
    let (r, root, seq) = (a.rank, a.root, a.sequence);
    let none = NO_SLOT as u64;
    let root_in_place = if r == root {
        output.addr() == input.addr()
    } else {
        let word = |w| published_buffers::peer_word(a, root, seq, w);
        word(INPUT_SLOT)? == word(OUTPUT_SLOT)? && word(INPUT_OFFSET)? == word(OUTPUT_OFFSET)?
    };
    if !root_in_place {
        return Ok(0);
    }
    for p in (0..a.n_ranks).filter(|&p| p != root) {
        let registered = if p == r {
            a.output_slot != NO_SLOT
        } else {
            published_buffers::peer_word(a, p, seq, OUTPUT_SLOT)? != none
        };
        if !registered {
            return Ok(0);
        }
    }
    Ok(a.count / a.n_ranks as u64)
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
