//! All-reduce over port channels in a ring, through the proxy: each rank sends to the next
//! rank only and hears from the previous one only, so every link carries one stream of
//! chunks at a time, however many ranks there are (the all-pairs port algorithm,
//! [`all_reduce_ports`](super::all_reduce_ports), has every rank send to every peer at
//! once). For many ranks across nodes. In rounds that fit the scratch
//! ([`PortLayout`](super::PortLayout)), a round's elements split into `n` chunks
//! ([`contiguous_chunk`]):
//!
//! 1. **reduce-scatter**, `n - 1` steps: at step `s` a rank puts its partial result of chunk
//!    `r - s` (its own input's chunk at step 0) into the next rank's reduce slot `s`, then
//!    waits for the previous rank's put of step `s` (its partial of chunk `r - s - 1`) and
//!    combines its own input's chunk onto it. After the last step it holds chunk `r + 1`
//!    reduced over every rank, and writes it to its output;
//! 2. **all-gather**, `n - 1` steps: at step `t` it puts the reduced chunk it got last (its
//!    own at step 0, else straight from the gather slot it arrived in) into the next rank's
//!    gather slot `t`, then waits for the previous rank's and copies it to its output.
//!
//! Chunk `c` is combined in ring order from rank `c` on (`c, c + 1, .., c - 1`): once, on
//! the way round, so every rank gets the same bits; for floating-point sums and products
//! they may differ from the other algorithms' (which combine in rank order) in the last
//! places.
//!
//! A round takes the set `seq % 3` of the scratch ([`PortLayout::set_of`](super::PortLayout::set_of)),
//! each step a slot of its own (no slot is written twice in a round). A rank writes a set
//! again only rounds later: by the end of the next round's reduce-scatter it has received
//! data that every rank combined after finishing this round (every rank's input reaches
//! every chunk), so every rank has read its slots of this round, and every put of this
//! round, our staged chunks included, has landed. The same holds between calls, and
//! between this and the all-pairs port collectives.

use super::elementwise::{finish_ranks, pass_of_two};
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to_next, wait_for_prev};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// All-reduce over port channels in a ring (see the module docs): `count` elements of
/// `input` reduced by `op` across the ranks into `output` on every rank. Takes the same
/// arguments, scratch and round numbers as
/// [`collective_all_reduce_ports()`](super::all_reduce_ports::collective_all_reduce_ports()).
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce_ring(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => all_reduce::<T>(&args, op))
}

#[inline(always)]
fn all_reduce<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (n, r, nr, l) = (a.count, a.rank, a.n_ranks, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let per = l.all_reduce_round(size);
    if n == 0 || per == 0 {
        return Ok(());
    }
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    if nr == 1 {
        return output.copy_from(Grid, input);
    }
    let scratch = a.scratch.cast::<T>()?;
    // Chunk `back` ranks behind ours, of a round of `len` elements: (first element, length).
    let chunk = |back: u32, len: u64| {
        let c = contiguous_chunk(((r + nr - back % nr) % nr) as u64, nr as u64, len);
        (c.start, c.end - c.start)
    };
    let mut off = 0;
    let mut round = 0;
    while off < n {
        let len = per.min(n - off);
        let set = super::PortLayout::set_of(a.sequence + round);
        let staged_at = l.staged(set);
        let staged = window_mut(scratch, staged_at / size, len)?;
        staged.copy_from(Grid, window(input, off, len)?)?;
        // Reduce-scatter: step `s` sends our partial of chunk `r - s`, receives chunk
        // `r - s - 1` and combines our own elements of it onto what arrived.
        let (first, clen) = chunk(0, len);
        send_to_next(
            a,
            l.reduce_slot(set, 0),
            staged_at + first * size,
            clen * size,
        )?;
        for s in 0..nr - 1 {
            let (first, clen) = chunk(s + 1, len);
            wait_for_prev(a)?;
            let ours = window_mut(staged, first, clen)?;
            let came = window_mut(scratch, l.reduce_slot(set, s) / size, clen)?;
            pass_of_two(ours, came.as_view(), ours.as_view(), op)?;
            if s + 1 < nr - 1 {
                let at = staged_at + first * size;
                send_to_next(a, l.reduce_slot(set, s + 1), at, clen * size)?;
            }
        }
        // Chunk `r + 1` is reduced: finish it, start the all-gather with it, and write it
        // out while it travels.
        let (first, clen) = chunk(nr - 1, len);
        let reduced = window_mut(staged, first, clen)?;
        finish_ranks(reduced, nr, op)?;
        send_to_next(
            a,
            l.gather_slot(set, 0),
            staged_at + first * size,
            clen * size,
        )?;
        window_mut(output, off + first, clen)?.copy_from(Grid, reduced.as_view())?;
        // All-gather: step `t` receives chunk `r - t` (reduced), forwards it from the slot
        // it arrived in, and writes it out.
        for t in 0..nr - 1 {
            let (first, clen) = chunk(t, len);
            let slot = l.gather_slot(set, t);
            wait_for_prev(a)?;
            if t + 1 < nr - 1 {
                send_to_next(a, l.gather_slot(set, t + 1), slot, clen * size)?;
            }
            let came = window_mut(scratch, slot / size, clen)?;
            window_mut(output, off + first, clen)?.copy_from(Grid, came.as_view())?;
        }
        off += len;
        round += 1;
    }
    Ok(())
}
