//! Reduce-scatter over port channels, through the proxy (ranks without a load/store path
//! to each other), in rounds of
//! [`PortLayout::block_round`](super::PortLayout::block_round) elements of
//! each block: each rank stages the round of every rank's block of its input and puts
//! peer `p`'s into its reduce slot of `p`, with a signal; once every peer's has come, it
//! reduces its own block (its staged copy and the peers' slots, in rank order) into its
//! output.

use super::elementwise::reduce_ranks;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, exchange_with_peers};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// Reduce-scatter over port channels: `input` holds `n_ranks * count` elements; rank
/// `r`'s `output` gets the reduction by `op` of every rank's elements
/// `r * count..(r + 1) * count`.
///
/// # Errors
/// Invalid ids, short buffers, a round too small for one element per rank, channel (a peer
/// that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce_scatter_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
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
    let scratch = a.scratch.cast::<T>()?;
    let per = l.block_round(size);
    if per == 0 {
        return Err(a.invalid([l.round_bytes, nr as u64, size]));
    }
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        // Every block, ours too: in place, our output is our block, and the reduction
        // writes it before it reads our part (on ranks 2 and up).
        for p in 0..nr as u64 {
            window_mut(scratch, staged_at / size + p * len, len)?
                .copy_from(Grid, window(input, p * c + off, len)?)?;
        }
        let bytes = len * size;
        exchange_with_peers(
            a,
            l.reduce_slot(set, r),
            staged_at,
            Part::TheirBlock { bytes },
        )?;
        reduce_ranks(window_mut(output, off, len)?, nr, op, |p| {
            let at = if p == r {
                staged_at / size + r as u64 * len
            } else {
                l.reduce_slot(set, p) / size
            };
            Ok(window_mut(scratch, at, len)?.as_view())
        })?;
        off += len;
        seq += 1;
    }
    Ok(())
}
