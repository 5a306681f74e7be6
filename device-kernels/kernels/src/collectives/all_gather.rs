//! All-gather, direct: in place of the peers' inputs when every rank's is registered.

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

/// All-gather: each rank's `count` elements of `input` land at `rank * count` of every
/// rank's `output` (`n_ranks * count` elements; in place when `input` is that part of it).
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_gather(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => all_gather::<T>(&args))
}

#[inline(always)]
fn all_gather<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, r, nr) = (a.count, a.rank, a.n_ranks);
    let input = typed::<T>(a.input, 0, c)?;
    let output = typed_mut::<T>(a.output, 0, c.saturating_mul(nr as u64))?;
    let per = per_round::<T>(a, 1)?;
    let mine = published_buffers::publish(a, Reads::Inputs, true)?;
    if !mine {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::Inputs, true, mine)?;
    if path == Path::StageFirst {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    if path == Path::InPlace {
        // Every rank's input is registered: copy each straight into place.
        let own = window_mut(output, r as u64 * c, c)?;
        if own.addr() != input.addr() {
            own.copy_from(Grid, input)?;
        }
        for p in (0..nr).filter(|&p| p != r) {
            let src = published_buffers::peer_input::<T>(a, p, a.sequence, 0, c)?;
            window_mut(output, p as u64 * c, c)?.copy_from(Grid, src)?;
        }
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        let half_off = a.layout.half(parity(seq));
        for p in (0..nr).filter(|&p| p != r) {
            let dst = window_mut(output, p as u64 * c + off, len)?;
            dst.copy_from(Grid, peer_half::<T>(a, p, half_off, 0, len)?)?;
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

/// Stages round `off..off + len` of our input into our half of round `seq`, and copies it
/// into our own block of the output (unless in place).
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (_, half) = my_half::<T>(a, seq)?;
    let src = window(input, off, len)?;
    window_mut(half, 0, len)?.copy_from(Grid, src)?;
    let own = window_mut(output, a.rank as u64 * a.count + off, len)?;
    if own.addr() != src.addr() {
        own.copy_from(Grid, src)?;
    }
    Ok(())
}
