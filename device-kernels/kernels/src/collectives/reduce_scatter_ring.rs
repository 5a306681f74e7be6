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
//! they may differ from the rank-order algorithms' in the last places. Sets of the scratch
//! come back as in the ring all-reduce.

use super::elementwise::{finish_ranks, pass_of_two};
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to_next, wait_for_prev};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

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
    // Block `back` ranks behind ours.
    let block = |back: u32| ((r + nr - back % nr) % nr) as u64;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        // Our partial of block `b` goes out from its place in the staged round.
        let b = block(1);
        window_mut(scratch, staged_at / size + b * len, len)?
            .copy_from(Grid, window(input, b * c + off, len)?)?;
        send_to_next(
            a,
            l.reduce_slot(set, 0),
            staged_at + b * len * size,
            len * size,
        )?;
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
