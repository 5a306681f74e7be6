//! All-reduce, direct (two-shot): each rank reduces one chunk of every round and gathers the
//! others; in place of the peers' buffers when every rank's are registered.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::peer_input_reduction::reduce_from_peer_inputs;
use super::published_buffers::{self, Path, Reads};
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;
use oxccl_device::{DeviceView, DeviceViewMut};

/// All-reduce, direct (two-shot): `count` elements of `input` reduced by `op` across the
/// ranks into `output` on every rank (`output` may be `input`).
///
/// # Errors
/// Invalid ids, buffers shorter than `count`, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => all_reduce::<T>(&args, op))
}

#[inline(always)]
fn all_reduce<T: ReduceElement>(a: &CollectiveArgs<'_>, op: ReduceOp) -> Result<(), DeviceError> {
    let n = a.count;
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    let per = per_round::<T>(a, 1)?;
    let first = a.sequence;
    let mine = published_buffers::publish(a, Reads::InputsAndOutputs, true)?;
    if !mine {
        stage_peer_chunks(a, input, 0, per.min(n), first)?;
    }
    let path = published_buffers::survey(a, Reads::InputsAndOutputs, true, mine)?;
    if path == Path::StageFirst {
        stage_peer_chunks(a, input, 0, per.min(n), first)?;
    }
    if path == Path::InPlace {
        return all_reduce_in_place_of_peers(a, input, output, op);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, first);
    loop {
        let len = per.min(n - off);
        reduce_and_gather_round(a, input, output, op, off, len, seq)?;
        off += len;
        seq += 1;
        if off >= n {
            return Ok(());
        }
        stage_peer_chunks(a, input, off, per.min(n - off), seq)?;
        all_peers_meet(a)?;
    }
}

/// Stages each peer's chunk of round `off..off + len` of our input into our half of round
/// `seq`: only what the peers read. Our own chunk is read straight from the input, and its
/// place in the half takes the reduced chunk.
#[inline(always)]
fn stage_peer_chunks<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (_, half) = my_half::<T>(a, seq)?;
    let round = window(input, off, len)?;
    for p in (0..a.n_ranks).filter(|&p| p != a.rank) {
        let cp = contiguous_chunk(p as u64, a.n_ranks as u64, len);
        window_mut(half, cp.start, cp.end - cp.start)?
            .copy_from(Grid, window(round, cp.start, cp.end - cp.start)?)?;
    }
    Ok(())
}

/// One staged round, after the meeting that follows its staging: reduce our chunk from
/// every rank's staged data into our half and our output, meet, gather the other chunks.
#[inline(always)]
fn reduce_and_gather_round<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    op: ReduceOp,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (r, nr) = (a.rank, a.n_ranks);
    let (half_off, half) = my_half::<T>(a, seq)?;
    let round = window(input, off, len)?;
    let c = contiguous_chunk(r as u64, nr as u64, len);
    let reduced = window_mut(half, c.start, c.end - c.start)?;
    reduce_ranks(reduced, nr, op, |p| {
        if p == r {
            window(round, c.start, c.end - c.start)
        } else {
            peer_half::<T>(a, p, half_off, c.start, c.end - c.start)
        }
    })?;
    // Our chunk of the output. An element-wise pass split as the reduction was, so each
    // thread copies the elements it reduced itself (a `copy_from` splits by words, which
    // would read elements other threads may not have written yet). The output is written
    // only now: in place, it is the input the reduction read.
    window_mut(output, off + c.start, c.end - c.start)?.combine_from(
        Grid,
        reduced.as_view(),
        |_, r| r,
    )?;
    all_peers_meet(a)?;
    for p in (0..nr).filter(|&p| p != r) {
        let cp = contiguous_chunk(p as u64, nr as u64, len);
        let src = peer_half::<T>(a, p, half_off, cp.start, cp.end - cp.start)?;
        window_mut(output, off + cp.start, cp.end - cp.start)?.copy_from(Grid, src)?;
    }
    Ok(())
}

/// Every rank's input and output are registered: each rank reduces its chunk of the whole
/// count reading the peers' inputs in place and writes the result into its own output and
/// into every peer's output (rank `r` alone reads and writes chunk `r` of every buffer);
/// then the ranks meet, so that no rank returns (and lets its caller read or write its
/// buffers) while a peer still reads or writes them. No scratch, no rounds, one meeting:
/// each byte is read once from each input and written once into each output.
///
/// The result is pushed, not pulled: had each rank copied the other chunks out of the
/// peers' outputs after a meeting (as staged rounds do), the lines a rank reduces would
/// move to the core (or GPU) that gathers them at every call, and in place they would move
/// back at the next call's reduction; pushed, chunk `r` of every buffer stays with rank `r`
/// from call to call, and the meeting in the middle is gone. On a GPU the writes to a peer
/// are NVLink or PCIe stores, which need no reply, where reads wait for one.
#[inline(always)]
fn all_reduce_in_place_of_peers<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let c = contiguous_chunk(a.rank as u64, a.n_ranks as u64, a.count);
    let (start, len) = (c.start, c.end - c.start);
    let dst = window_mut(output, start, len)?;
    reduce_from_peer_inputs(a, dst, window(input, start, len)?, start, op, true)?;
    all_peers_meet(a)
}
