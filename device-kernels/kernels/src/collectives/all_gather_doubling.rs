//! All-gather over port channels by recursive doubling, through the proxy: for small
//! messages among a power of two of ranks that reach each other only through the proxy
//! (see [`all_reduce_doubling`](super::all_reduce_doubling), whose pattern this is).
//! `log2 n` steps a round, one put and one wait each, where the all-pairs algorithm
//! ([`all_gather_ports`](super::all_gather_ports)) has each rank put to all `n - 1`
//! peers. In rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes)
//! of each rank's data:
//!
//! - the gather slots of the round's set hold the ranks' rounds packed, rank `q`'s at
//!   `q * len` from the first slot (`n * len` bytes fit the `n` slots);
//! - each rank stages its round at its place there; at step `k` (bit `b = 2^k`) it holds
//!   the rounds of the `b` ranks that share its bits above `k`, side by side, and puts them
//!   in one piece at the same place of its partner `r ^ b`, with a signal, then waits for
//!   the partner's (the other `b`);
//! - after the last step it holds every rank's round and copies the peers' into their
//!   blocks of its output.
//!
//! The data's type does not matter: rounds are bytes. Sets of the scratch come back as in
//! the recursive-doubling all-reduce: when a rank has finished round `k`, every rank has
//! finished round `k - 1` (what it holds includes every rank's round `k`, sent after that).

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to, wait_for};
use super::round_views::{window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-gather over port channels by recursive doubling (see the module docs): each rank's
/// `count` elements of `input` land at `rank * count` of every rank's `output`
/// (`n_ranks * count` elements; in place when `input` is that part of it). The number of
/// ranks must be a power of two. Takes the same arguments, scratch and round numbers as
/// [`collective_all_gather_ports()`](super::all_gather_ports::collective_all_gather_ports()).
///
/// # Errors
/// A number of ranks that is not a power of two, invalid ids, short buffers, channel (a
/// peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_gather_doubling(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, nr, l) = (a.rank, a.n_ranks, a.layout);
    if !nr.is_power_of_two() {
        return Err(a.invalid([nr as u64, 0, 0]));
    }
    let bytes = a.count.saturating_mul(dtype.size());
    let input = window(a.input, 0, bytes)?;
    let output = window_mut(a.output, 0, bytes.saturating_mul(nr as u64))?;
    let own = window_mut(output, r as u64 * bytes, bytes)?;
    if own.addr() != input.addr() {
        own.copy_from(Grid, input)?;
    }
    let per = l.copy_round_bytes();
    let (mut off, mut seq) = (0, a.sequence);
    while off < bytes {
        let len = per.min(bytes - off);
        let set = super::PortLayout::set_of(seq);
        // Rank `q`'s round of this set, packed.
        let at = |q: u32| l.gather_slot(set, 0) + q as u64 * len;
        window_mut(a.scratch, at(r), len)?.copy_from(Grid, window(input, off, len)?)?;
        let mut bit = 1;
        while bit < nr {
            // The first of the `bit` ranks whose rounds we hold.
            let first = r & !(bit - 1);
            send_to(a, r ^ bit, at(first), at(first), bit as u64 * len)?;
            wait_for(a, r ^ bit)?;
            bit <<= 1;
        }
        for p in (0..nr).filter(|&p| p != r) {
            let src = window_mut(a.scratch, at(p), len)?;
            window_mut(output, p as u64 * bytes + off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
