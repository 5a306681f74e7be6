//! Reducing this rank's chunk straight from every peer's registered input: the zero-copy
//! path of all-reduce (which then pushes the result into every peer's output) and of
//! reduce-scatter.

use super::collective_args::CollectiveArgs;
use super::elementwise::{RankSources, reduce_ranks};
use super::published_buffers;
use super::round_views::{my_half, per_round, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Sets `dst` to the reduction by `op`, in rank order, of `ours` (this rank's elements) and
/// of elements `base..base + dst.len()` of every peer's registered input; with `push`, also
/// writes the result into elements `base..` of every peer's registered output.
///
/// Each copy of the result is split among the grid as the reduction was, so a thread
/// writes only elements it has itself reduced: in place, a peer's output is the input the
/// reduction reads, and an element must not be overwritten before it is read. Orders
/// nothing for the peers: the caller meets them after.
///
/// # Errors
/// Views outside their buffers or the peers' registrations; the grid barrier's.
#[inline(always)]
pub(crate) fn reduce_from_peer_inputs<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    dst: DeviceViewMut<'_, T>,
    ours: DeviceView<'_, T>,
    base: u64,
    op: ReduceOp,
    push: bool,
) -> Result<(), DeviceError> {
    let (nr, len) = (a.n_ranks, dst.len());
    // The reduction writes its destination after each pass and reads it as the partial
    // result: our own elements may be that destination only as the first or second source
    // (rank 0 or 1). In place on a later rank, the chunk is reduced piece by piece in our
    // scratch (which no peer reads in this call) and copied out.
    if dst.overlaps(ours) && a.rank >= 2 && len > 0 {
        let per = per_round::<T>(a, 1)?;
        let (_, half) = my_half::<T>(a, a.sequence)?;
        let mut done = 0;
        while done < len {
            let piece = per.min(len - done);
            if piece < per && done > 0 {
                // A shorter piece splits among the threads otherwise than the full ones
                // did: a thread would write elements of `tmp` that another one may still
                // be copying out of the piece before. (Full pieces split alike: each
                // thread reuses only its own elements.)
                a.barrier.sync_grid()?;
            }
            let tmp = window_mut(half, 0, piece)?;
            reduce_ranks(tmp, nr, op, PeerInputs::new(a, ours, base, done, piece))?;
            window_mut(dst, done, piece)?.combine_from(Grid, tmp.as_view(), |_, r| r)?;
            if push {
                push_to_peers(a, tmp.as_view(), base + done)?;
            }
            done += piece;
        }
        Ok(())
    } else {
        reduce_ranks(dst, nr, op, PeerInputs::new(a, ours, base, 0, len))?;
        if push {
            push_to_peers(a, dst.as_view(), base)?;
        }
        Ok(())
    }
}

/// Writes `reduced` (elements `first..` of the result) into every peer's output, each
/// thread the elements it reduced (see [`reduce_from_peer_inputs`]).
#[inline(always)]
fn push_to_peers<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    reduced: DeviceView<'_, T>,
    first: u64,
) -> Result<(), DeviceError> {
    for p in (0..a.n_ranks).filter(|&p| p != a.rank) {
        published_buffers::peer_output_mut::<T>(a, p, a.sequence, first, reduced.len())?
            .combine_from(Grid, reduced, |_, r| r)?;
    }
    Ok(())
}

/// Elements `first..first + len` of every rank's part of a call, which starts at element
/// `base` of its registered input: `ours` for this rank (already at its part), the peer's
/// registered input for a peer.
#[derive(Clone, Copy)]
pub(crate) struct PeerInputs<'a, 'r, T> {
    a: &'r CollectiveArgs<'a>,
    ours: DeviceView<'a, T>,
    base: u64,
    first: u64,
    len: u64,
}

impl<'a, 'r, T: ReduceElement> PeerInputs<'a, 'r, T> {
    /// Elements `first..first + len` of each rank's part (see the type).
    #[inline(always)]
    pub(crate) fn new(
        a: &'r CollectiveArgs<'a>,
        ours: DeviceView<'a, T>,
        base: u64,
        first: u64,
        len: u64,
    ) -> Self {
        Self {
            a,
            ours,
            base,
            first,
            len,
        }
    }
}

impl<'a, T: ReduceElement> RankSources<'a, T> for PeerInputs<'a, '_, T> {
    #[inline(always)]
    fn of_rank(&self, p: u32) -> Result<DeviceView<'a, T>, DeviceError> {
        if p == self.a.rank {
            window(self.ours, self.first, self.len)
        } else {
            let at = self.base + self.first;
            published_buffers::peer_input::<T>(self.a, p, self.a.sequence, at, self.len)
        }
    }
}
