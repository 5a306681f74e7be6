//! Reduce-scatter over port channels, through the proxy (ranks without a load/store path
//! to each other), in rounds of
//! [`PortLayout::block_round`](super::PortLayout::block_round) elements of
//! each block: each rank stages the round of every rank's block of its input and puts
//! peer `p`'s into its reduce slot of `p`, with a signal; once every peer's has come, it
//! reduces its own block (its staged copy and the peers' slots, in rank order) into its
//! output.
//!
//! Pipelined as the all-gather is (see `all_gather_ports`): once a round's signals have
//! come, the next round is staged and sent before this one is reduced.

use super::elementwise::reduce_ranks;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to_peers, wait_for_peers};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

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
    if c > 0 {
        stage_and_send(a, input, scratch, 0, per.min(c), seq)?;
    }
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        wait_for_peers(a)?;
        if off + len < c {
            stage_and_send(
                a,
                input,
                scratch,
                off + len,
                per.min(c - off - len),
                seq + 1,
            )?;
        }
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

/// Stages the round of every rank's block from element `off` on, `len` elements each (round
/// number `seq`), and puts peer `p`'s into its reduce slot of `p`, with a signal; does not
/// wait. Every block, ours too: in place, our output is our block, which the reduction of
/// this round writes before it reads our part (on ranks 2 and up), and which a later round's
/// reduction overwrites after this staging. (A function, not a closure: see
/// `all_gather_ports`.)
#[inline(always)]
fn stage_and_send<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let (c, size) = (a.count, core::mem::size_of::<T>() as u64);
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    for p in 0..a.n_ranks as u64 {
        window_mut(scratch, staged_at / size + p * len, len)?
            .copy_from(Grid, window(input, p * c + off, len)?)?;
    }
    let bytes = len * size;
    send_to_peers(
        a,
        a.layout.reduce_slot(set, a.rank),
        staged_at,
        Part::TheirBlock { bytes },
    )
}
