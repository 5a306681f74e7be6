//! Reduce over port channels, through the proxy (ranks without a load/store path to each
//! other), eager (see [`call_protocol`](super::call_protocol)), in rounds of
//! [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes): every rank but
//! the root stages each round and puts it into its reduce slot of the root, with a signal;
//! once every peer's signal of a round has come, the root reduces its own round and the
//! peers' slots, in rank order, into its output and, every other round, answers every peer
//! with a done. The others exchange nothing among themselves.
//!
//! A rank writes a round's set (its staged round, its reduce slot of the root) again
//! [`PortLayout::SETS`](super::PortLayout::SETS) rounds later; before it does, it waits for
//! the root's done covering that earlier round (the root has reduced it, and our proxy has
//! read our staged round, whose put came before it). So the others run two or three rounds
//! ahead of the root, across calls too (the dones a call leaves owed are waited for by the
//! next).

use super::call_protocol::CallProtocol;
use super::elementwise::reduce_ranks;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, send_to, send_to_peers, wait_for, wait_for_peers};
use super::port_layout::PortLayout;
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Reduce over port channels: `count` elements of every rank's `input` reduced by `op`
/// into the root's `output` (which may be its input); other ranks' outputs are not
/// touched.
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (covered_until, dtype, op) = args.begin_eager(CallProtocol::REDUCE)?;
    dispatch_element!(dtype, T => reduce_rounds::<T>(&args, op, covered_until))
}

/// The reduce, round by round (see the module docs); `covered_until`: the first round the
/// root's dones this rank has waited for do not cover.
#[inline(always)]
fn reduce_rounds<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
    mut covered_until: u64,
) -> Result<(), DeviceError> {
    let (c, r, root, l) = (a.count, a.rank, a.root, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let input = typed::<T>(a.input, 0, c)?;
    let output = if r == root {
        typed_mut::<T>(a.output, 0, c)?
    } else {
        DeviceViewMut::default()
    };
    let scratch = a.scratch.cast::<T>()?;
    let per = l.copy_round_bytes() / size;
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let set = PortLayout::set_of(seq);
        let staged_at = l.staged(set);
        if r != root {
            // The root's done covering the round `SETS` before this one (module docs).
            let needed = PortLayout::EAGER.covered_before(covered_until, seq);
            for _ in 0..PortLayout::EAGER.dones_between(covered_until, needed) {
                wait_for(a, root)?;
            }
            covered_until = needed;
        }
        // The root stages its round too: in place, the reduction writes its output (its
        // input) before it reads its own part.
        let staged = window_mut(scratch, staged_at / size, len)?;
        staged.copy_from(Grid, window(input, off, len)?)?;
        if r == root {
            wait_for_peers(a)?;
            let out = window_mut(output, off, len)?;
            reduce_round(a, op, out, staged.as_view(), scratch, set, len)?;
            if PortLayout::EAGER.done_after(seq) {
                // Every block has reduced the round (`send_to_peers` meets the grid first).
                send_to_peers(a, 0, 0, Part::Nothing)?;
            }
        } else {
            send_to(a, root, l.reduce_slot(set, r), staged_at, len * size)?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// Reduces round `set` of `len` elements into `out`, in rank order: our staged round,
/// `staged`, for us, each peer's reduce slot of the set in `scratch` (ours, as `T`s) for the
/// others. The reduce's root does it, and every rank of the one-shot all-reduce
/// (`all_reduce_ports`).
#[inline(always)]
pub(super) fn reduce_round<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
    out: DeviceViewMut<'_, T>,
    staged: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    set: u64,
    len: u64,
) -> Result<(), DeviceError> {
    // Plain values, not `a`: what a closure takes lives in local memory on the GPU once the
    // closure is out of line.
    let (r, l) = (a.rank, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    reduce_ranks(out, a.n_ranks, op, |p| {
        if p == r {
            Ok(staged)
        } else {
            Ok(window_mut(scratch, l.reduce_slot(set, p) / size, len)?.as_view())
        }
    })
}
