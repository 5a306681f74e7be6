//! All-reduce over port channels by recursive doubling, through the proxy: for small
//! messages among a power of two of ranks that reach each other only through the proxy
//! (another node, Ethernet). `log2 n` steps a round, one put and one wait each, where the
//! all-pairs algorithm ([`all_reduce_ports`](super::all_reduce_ports)) has each rank put
//! to all `n - 1` peers: over a network each put costs both ends a message, so fewer of
//! them win while the bytes are few. In rounds of
//! [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//!
//! - each rank stages its round of the input; at step `k` (bit `b = 2^k`) it puts what it
//!   has reduced so far (the staged round at step 0) into its reduce slot of its partner
//!   `r ^ b`, with a signal, waits for the partner's, and combines the two (the partial of
//!   the ranks whose bit `b` is clear first; every operation is commutative, so both
//!   partners hold the same bits). The result goes over the slot it read (the partner's
//!   put has landed, and no put reads it yet), whence the next step sends it; the last
//!   step writes it to the output.
//!
//! After step `k` a rank holds the reduction over the `2^(k+1)` ranks that share its
//! higher bits; after the last, over every rank, combined as a balanced tree in rank
//! order (`((x0 ⊕ x1) ⊕ (x2 ⊕ x3))`), the same bits on every rank; for floating-point
//! sums and products they may differ from the all-pairs algorithm's (`((x0 ⊕ x1) ⊕ x2) ⊕
//! x3`) in the last places.
//!
//! A round takes set `seq % 3` of the scratch, each step the slot of its partner (no slot
//! is written twice in a round). When a rank has finished round `k`, every rank has
//! finished round `k - 1`: what it holds then includes every rank's round `k`, which each
//! sent only after finishing round `k - 1` (after reading its slots and after its puts of
//! `k - 1` had landed, since each was waited for). The port collectives beside it give at
//! least "every rank has finished round `k - 2`" (see `port_exchange`), so a set is written
//! again, three rounds on, only once every rank is done with it: between the rounds of a
//! call, and between calls of this and the other port collectives.

use super::elementwise::{finish_ranks, pass_of_two};
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to, wait_for};
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::reduce::{ReduceElement, ReduceOp};

/// All-reduce over port channels by recursive doubling (see the module docs): `count`
/// elements of `input` reduced by `op` across the ranks into `output` on every rank. The
/// number of ranks must be a power of two. Takes the same arguments, scratch and round
/// numbers as
/// [`collective_all_reduce_ports()`](super::all_reduce_ports::collective_all_reduce_ports()),
/// one round number per [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes)
/// bytes.
///
/// # Errors
/// A number of ranks that is not a power of two, invalid ids, short buffers, channel (a
/// peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce_doubling(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    if !args.n_ranks.is_power_of_two() {
        return Err(args.invalid([args.n_ranks as u64, 0, 0]));
    }
    dispatch_element!(dtype, T => all_reduce::<T>(&args, op))
}

#[inline(always)]
fn all_reduce<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (n, r, nr, l) = (a.count, a.rank, a.n_ranks, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let per = l.copy_round_bytes() / size;
    if n == 0 || per == 0 {
        return Ok(());
    }
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    if nr == 1 {
        return output.copy_from(Grid, input);
    }
    let scratch = a.scratch.cast::<T>()?;
    let (mut off, mut seq) = (0, a.sequence);
    while off < n {
        let len = per.min(n - off);
        let set = super::PortLayout::set_of(seq);
        // Where what we have reduced so far lies: the staged round, then a slot.
        let mut held = l.staged(set);
        window_mut(scratch, held / size, len)?.copy_from(Grid, window(input, off, len)?)?;
        let mut bit = 1;
        while bit < nr {
            let partner = r ^ bit;
            send_to(a, partner, l.reduce_slot(set, r), held, len * size)?;
            wait_for(a, partner)?;
            let came = l.reduce_slot(set, partner);
            let ours = window_mut(scratch, held / size, len)?.as_view();
            let theirs = window_mut(scratch, came / size, len)?;
            let (low, high) = if r & bit == 0 {
                (ours, theirs.as_view())
            } else {
                (theirs.as_view(), ours)
            };
            let dst = if bit << 1 < nr {
                theirs
            } else {
                window_mut(output, off, len)?
            };
            pass_of_two(dst, low, high, op)?;
            held = came;
            bit <<= 1;
        }
        finish_ranks(window_mut(output, off, len)?, nr, op)?;
        off += len;
        seq += 1;
    }
    Ok(())
}
