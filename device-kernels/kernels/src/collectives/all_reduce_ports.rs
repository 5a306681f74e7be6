//! All-reduce over port channels, through the proxy: for ranks that have no load/store path
//! to each other (another node, or Ethernet asked for). Two-shot, in rounds that fit the
//! scratch ([`PortLayout`](super::PortLayout)):
//!
//! 1. each rank stages the round of its input in its scratch and puts peer `p`'s chunk of
//!    it into `p`'s reduce slot of this rank, with a signal;
//! 2. once every peer's signal has come, it reduces its own chunk (its staged part and the
//!    peers' slots, in rank order) into its output and over its own staged part, and puts
//!    that into every peer's gather slot of this rank, with a signal;
//! 3. once every peer's has come, it copies the peers' reduced chunks into its output.
//!
//! Rounds alternate between two sets of the scratch. A rank writes into a peer's set again
//! (two rounds later) only after the peer's gather signal of the round in between, which
//! the peer sends after it has read everything of that set; and its own staged round,
//! which its proxy reads for the puts, only after every put of that set has been carried
//! out (the peers' signals of the round in between come after them on each channel).

use super::elementwise::reduce_ranks;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, exchange_with_peers};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// All-reduce over port channels (see the module docs): `count` elements of `input`
/// reduced by `op` across the ranks into `output` on every rank.
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
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
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    let scratch = a.scratch.cast::<T>()?;
    let per = l.all_reduce_round(size);
    let (mut off, mut seq) = (0, a.sequence);
    while off < n {
        let len = per.min(n - off);
        let set = seq & 1;
        let staged_at = l.staged(set);
        let staged = window_mut(scratch, staged_at / size, len)?;
        staged.copy_from(Grid, window(input, off, len)?)?;
        // Each peer's chunk of our round into its reduce slot of ours.
        exchange_with_peers(
            a,
            l.reduce_slot(set, r),
            staged_at,
            Part::TheirChunk { len, size },
        )?;
        let mine = contiguous_chunk(r as u64, nr as u64, len);
        let mine_len = mine.end - mine.start;
        let dst = window_mut(output, off + mine.start, mine_len)?;
        reduce_ranks(dst, nr, op, |p| {
            if p == r {
                window(staged.as_view(), mine.start, mine_len)
            } else {
                Ok(window_mut(scratch, l.reduce_slot(set, p) / size, mine_len)?.as_view())
            }
        })?;
        // Our reduced chunk, in place of our part of the staged round, for the puts: an
        // element-wise pass split as the reduction was, so each thread copies what it
        // reduced itself.
        window_mut(staged, mine.start, mine_len)?.combine_from(Grid, dst.as_view(), |_, x| x)?;
        exchange_with_peers(
            a,
            l.gather_slot(set, r),
            staged_at,
            Part::OurChunk { len, size },
        )?;
        for p in (0..nr).filter(|&p| p != r) {
            let c = contiguous_chunk(p as u64, nr as u64, len);
            let src = window_mut(scratch, l.gather_slot(set, p) / size, c.end - c.start)?;
            window_mut(output, off + c.start, c.end - c.start)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
