//! Reduce-scatter over port channels in a ring, through the proxy: each rank sends to the
//! next rank only and hears from the previous one only (see
//! [`all_reduce_ring`](super::all_reduce_ring), whose first half this is, shifted so that
//! each rank ends with its own block). In rounds of
//! [`PortLayout::block_round`](super::PortLayout::block_round) elements of each block,
//! `n - 1` steps each: at step `s` a rank puts its partial result of block `r - s - 1` (its
//! own input's part at step 0) into the next rank's reduce slot `s`, then waits for the
//! previous rank's put of step `s` (its partial of block `r - s - 2`) and combines its own
//! input's part onto it; after the last step that is block `r`, reduced over every rank,
//! which goes to its output.
//!
//! Block `b` is combined in ring order from rank `b + 1` on (`b + 1, .., b`), once, so the
//! result's bits are the same wherever it is computed; for floating-point sums and products
//! they may differ from the rank-order algorithms' in the last places.
//!
//! Pipelined a little, as the ring all-gather is, and for the same reason: the next round's
//! first put goes out right after this round's last wait, before its last combination.
//! Round `k` takes set `k % 3`; a rank starts round `k + 1` (set `k - 2`'s) once its last
//! wait of round `k` brought the next rank's part of block `r`, sent after that rank had
//! waited for every put of ours of round `k - 1`.

use super::elementwise::{finish_ranks, pass_of_two};
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to_next, wait_for_prev};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Reduce-scatter over port channels in a ring (see the module docs): `input` holds
/// `n_ranks * count` elements; rank `r`'s `output` gets the reduction by `op` of every
/// rank's elements `r * count..(r + 1) * count` (in place when `output` is that part of
/// `input`). Takes the same arguments, scratch and round numbers as
/// [`collective_reduce_scatter_ports()`](super::reduce_scatter_ports::collective_reduce_scatter_ports()).
///
/// # Errors
/// Invalid ids, short buffers, a round too small for one element per rank, channel (a peer
/// that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce_scatter_ring(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce_scatter::<T>(&args, op))
}

#[inline(always)]
fn reduce_scatter<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (c, r, nr, l) = (a.count, a.rank, a.n_ranks, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let input = typed::<T>(a.input, 0, c.saturating_mul(nr as u64))?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    if nr == 1 {
        return output.copy_from(Grid, input);
    }
    let scratch = a.scratch.cast::<T>()?;
    let per = l.block_round(size);
    if per == 0 {
        return Err(a.invalid([l.round_bytes, nr as u64, size]));
    }
    let block = |back: u32| block_behind(r, nr, back);
    start_round(a, input, scratch, 0, per.min(c), a.sequence)?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        // Our partial of block `b` goes out from its place in the staged round (step 0
        // went out with `start_round`).
        for s in 0..nr - 1 {
            let b = block(s + 2);
            let came = window_mut(scratch, l.reduce_slot(set, s) / size, len)?.as_view();
            let ours = window(input, b * c + off, len)?;
            wait_for_prev(a)?;
            if s + 1 < nr - 1 {
                let partial = window_mut(scratch, staged_at / size + b * len, len)?;
                pass_of_two(partial, came, ours, op)?;
                let at = staged_at + b * len * size;
                send_to_next(a, l.reduce_slot(set, s + 1), at, len * size)?;
            } else {
                if off + len < c {
                    let next = per.min(c - off - len);
                    start_round(a, input, scratch, off + len, next, seq + 1)?;
                }
                // Block `r`: in place, `ours` is this very window of the output, each
                // element read before it is written, by the same thread.
                let dst = window_mut(output, off, len)?;
                pass_of_two(dst, came, ours, op)?;
                finish_ranks(dst, nr, op)?;
            }
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// The block `back` ranks behind rank `r`'s (of `nr`).
#[inline(always)]
fn block_behind(r: u32, nr: u32, back: u32) -> u64 {
    ((r + nr - back % nr) % nr) as u64
}

/// Stages our part of block `r - 1` for the round of `len` elements a block from `off` on
/// (round number `seq`), in its place in the staged round, and puts it into the next
/// rank's reduce slot 0, with a signal. Does not wait.
#[inline(always)]
fn start_round<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let size = core::mem::size_of::<T>() as u64;
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    let b = block_behind(a.rank, a.n_ranks, 1);
    window_mut(scratch, staged_at / size + b * len, len)?
        .copy_from(Grid, window(input, b * a.count + off, len)?)?;
    let slot = a.layout.reduce_slot(set, 0);
    send_to_next(a, slot, staged_at + b * len * size, len * size)
}
