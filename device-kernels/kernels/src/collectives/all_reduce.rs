//! All-reduce, direct (two-shot): each rank reduces one chunk of every round and gathers the others.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::peer_handshake::all_peers_meet;
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;

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
    let (n, r, nr) = (a.count, a.rank, a.n_ranks);
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    let per = per_round::<T>(a, 1)?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < n {
        let len = per.min(n - off);
        let (half_off, half) = my_half::<T>(a, seq)?;
        let round = window(input, off, len)?;
        // Stage only what the peers read: each peer's chunk of our input. Our own chunk is
        // read straight from the input, and its place in the half takes the reduced chunk.
        for p in (0..nr).filter(|&p| p != r) {
            let cp = contiguous_chunk(p as u64, nr as u64, len);
            window_mut(half, cp.start, cp.end - cp.start)?
                .copy_from(Grid, window(round, cp.start, cp.end - cp.start)?)?;
        }
        all_peers_meet(a)?;
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
        // thread copies the elements it reduced itself (a `copy_from` splits by words,
        // which would read elements other threads may not have written yet). The output
        // is written only now: in place, it is the input the reduction read.
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
        off += len;
        seq += 1;
    }
    Ok(())
}
