//! Reduce-scatter over port channels by recursive halving, through the proxy: for ranks
//! that reach each other only through the proxy, a power of two of them (the mirror of
//! [`all_gather_doubling`](super::all_gather_doubling)). `log2 n` steps a round, one put
//! and one wait each, where the all-pairs algorithm
//! ([`reduce_scatter_ports`](super::reduce_scatter_ports)) has each rank put to all
//! `n - 1` peers; each rank sends `n - 1` blocks in all either way. In rounds of
//! [`PortLayout::block_round`](super::PortLayout::block_round) elements of each block:
//!
//! - each rank stages the round of every rank's block of its input, packed in bit-reversed
//!   order of the ranks (block `q` at `reverse(q) * len`, `reverse` reversing the
//!   `log2 n` bits of `q`), and holds partials of all `n` blocks;
//! - at the step of bit `b` (1 first, up to `n / 2`) it holds partials of the `n / b`
//!   blocks of the ranks that agree with it in the bits below `b` (side by side in that
//!   order); it puts the half whose bit `b` differs from its own, which its partner
//!   `r ^ b` keeps, into the partner's area of the step, with a signal, waits for the
//!   partner's put of the half it keeps, and combines the two (the partial of the ranks
//!   whose bit `b` is clear first) into that area, whence the next step sends;
//! - after the last step it holds its own block reduced over every rank (written straight
//!   to its output), combined as a balanced tree in rank order (`(x0 ⊕ x1) ⊕ (x2 ⊕ x3)`),
//!   as [`all_reduce_doubling`](super::all_reduce_doubling) combines: the same bits as
//!   its all-reduce.
//!
//! Each step has an area of its own in the reduce slots of the round's set (step of bit
//! `b` at `(n - n / b) * len`, `n / 2b` blocks; `n - 1` blocks in all), written only by
//! that step's partner, once a round: a partner a step ahead (its earlier partners were
//! quick) writes where nothing is read yet. Sets of the scratch come back as in the
//! recursive-doubling all-reduce: when a rank has finished round `k`, every rank has
//! finished round `k - 1` (its block includes every rank's round `k`, sent after that).

use super::elementwise::{finish_ranks, pass_of_two};
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to, wait_for};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// Reduce-scatter over port channels by recursive halving (see the module docs): `input`
/// holds `n_ranks * count` elements; rank `r`'s `output` gets the reduction by `op` of
/// every rank's elements `r * count..(r + 1) * count`. The number of ranks must be a power
/// of two. Takes the same arguments, scratch and round numbers as
/// [`collective_reduce_scatter_ports()`](super::reduce_scatter_ports::collective_reduce_scatter_ports()).
///
/// # Errors
/// A number of ranks that is not a power of two, invalid ids, short buffers, a round too
/// small for one element per rank, channel (a peer that does not answer) and barrier
/// errors.
#[kernel(cooperative)]
pub fn collective_reduce_scatter_halving(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    if !args.n_ranks.is_power_of_two() {
        return Err(args.invalid([args.n_ranks as u64, 0, 0]));
    }
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
    // Where block `q` is staged, in blocks: its rank with the `log2 n` bits reversed.
    let bits = nr.trailing_zeros();
    let place = |q: u32| {
        if bits == 0 {
            0
        } else {
            (q.reverse_bits() >> (32 - bits)) as u64
        }
    };
    let (mut off, mut seq) = (0, a.sequence);
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        let staged = l.staged(set) / size;
        for p in 0..nr {
            window_mut(scratch, staged + place(p) * len, len)?
                .copy_from(Grid, window(input, p as u64 * c + off, len)?)?;
        }
        let out = window_mut(output, off, len)?;
        if nr == 1 {
            out.copy_from(Grid, window_mut(scratch, staged, len)?.as_view())?;
        }
        // Where our partials lie (in elements), `n / bit` blocks of them.
        let mut held = staged;
        let mut bit = 1;
        while bit < nr {
            let half = (nr / (2 * bit)) as u64 * len;
            let (keep, give) = if r & bit == 0 {
                (held, held + half)
            } else {
                (held + half, held)
            };
            let area = l.reduce_slot(set, 0) / size + (nr - nr / bit) as u64 * len;
            send_to(a, r ^ bit, area * size, give * size, half * size)?;
            wait_for(a, r ^ bit)?;
            let ours = window_mut(scratch, keep, half)?;
            let theirs = window_mut(scratch, area, half)?;
            let (low, high) = if r & bit == 0 {
                (ours.as_view(), theirs.as_view())
            } else {
                (theirs.as_view(), ours.as_view())
            };
            pass_of_two(if 2 * bit < nr { theirs } else { out }, low, high, op)?;
            held = area;
            bit *= 2;
        }
        finish_ranks(out, nr, op)?;
        off += len;
        seq += 1;
    }
    Ok(())
}
