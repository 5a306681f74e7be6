//! Reduce over port channels, through the proxy (ranks without a load/store path to each
//! other), in rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//! each rank stages its round; every rank but the root puts it into its reduce slot of the
//! root, with a signal, and signals the others with nothing (which tells the root that
//! the rank is done with the set of two rounds before); once every peer's signal has come,
//! the root reduces its staged round and the peers' slots, in rank order, into its output.
//!
//! Pipelined as the all-gather is (see `all_gather_ports`): once a round's signals have
//! come, the next round is staged and sent before the root reduces this one.
//!
//! The all-reduce of two ranks is this reduce with every rank its root
//! (`Receivers::Every`): each rank puts its round into its reduce slot of every peer and
//! reduces them all.

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

/// Reduce over port channels: `count` elements of every rank's `input` reduced by `op`
/// into the root's `output` (which may be its input); other ranks' outputs are not
/// touched.
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_reduce_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => reduce_rounds::<T>(&args, op, Receivers::Root(args.root)))
}

/// Who gets the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Receivers {
    /// The root alone (reduce): the others put to it and signal the rest with nothing.
    Root(u32),
    /// Every rank (the all-reduce of two ranks in one exchange a round, see
    /// `all_reduce_ports`): each puts its round to every peer and reduces them all.
    Every,
}

impl Receivers {
    /// Whether rank `r` gets the reduction.
    #[inline(always)]
    fn include(self, r: u32) -> bool {
        match self {
            Receivers::Root(root) => root == r,
            Receivers::Every => true,
        }
    }
}

/// The reduction of every rank's `input` into the `output` of `to`, in rounds of
/// [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes) (see the module
/// docs).
#[inline(always)]
pub(super) fn reduce_rounds<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
    to: Receivers,
) -> Result<(), DeviceError> {
    let (c, r, nr, l) = (a.count, a.rank, a.n_ranks, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let input = typed::<T>(a.input, 0, c)?;
    let output = if to.include(r) {
        typed_mut::<T>(a.output, 0, c)?
    } else {
        DeviceViewMut::default()
    };
    let scratch = a.scratch.cast::<T>()?;
    let per = l.copy_round_bytes() / size;
    let (mut off, mut seq) = (0, a.sequence);
    if c > 0 {
        stage_and_send(a, input, scratch, 0, per.min(c), seq, to)?;
    }
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged = window_mut(scratch, l.staged(set) / size, len)?;
        wait_for_peers(a)?;
        if off + len < c {
            let next = per.min(c - off - len);
            stage_and_send(a, input, scratch, off + len, next, seq + 1, to)?;
        }
        if to.include(r) {
            reduce_ranks(window_mut(output, off, len)?, nr, op, |p| {
                if p == r {
                    Ok(staged.as_view())
                } else {
                    Ok(window_mut(scratch, l.reduce_slot(set, p) / size, len)?.as_view())
                }
            })?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}

/// Stages the `len` elements of `input` from `off` on (round number `seq`) and puts them
/// into our reduce slot of every rank of `to` but us, with a signal, and signals the other
/// peers with nothing; does not wait. A rank that gets the reduction stages its own round
/// too: in place, the reduction writes its output (its input) before it reads its own part.
/// (A function, not a closure: see `all_gather_ports`.)
#[inline(always)]
fn stage_and_send<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
    to: Receivers,
) -> Result<(), DeviceError> {
    let size = core::mem::size_of::<T>() as u64;
    let set = super::PortLayout::set_of(seq);
    let staged_at = a.layout.staged(set);
    window_mut(scratch, staged_at / size, len)?.copy_from(Grid, window(input, off, len)?)?;
    let bytes = len * size;
    let what = match to {
        Receivers::Root(root) => Part::WholeTo { bytes, to: root },
        Receivers::Every => Part::Whole { bytes },
    };
    send_to_peers(a, a.layout.reduce_slot(set, a.rank), staged_at, what)
}
