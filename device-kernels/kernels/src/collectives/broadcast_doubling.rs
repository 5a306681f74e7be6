//! Broadcast over port channels by recursive doubling, through the proxy: for a power of
//! two of ranks that reach each other only through the proxy. At the step of bit `b` each
//! rank sends its partner `r ^ b` the root's round if it has it (the root's data spread
//! as down a binomial tree), else a signal alone: `log2 n` messages a rank, in lockstep;
//! the root sends its round `log2 n` times, where the eager broadcast
//! ([`broadcast_ports`](super::broadcast_ports), which the library takes unless doubling
//! is asked for at every size) sends it `n - 1` times and runs ahead. In rounds of
//! [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes): the round lands
//! in the root's gather slot of the round's set, written once a round (by the root, or by
//! the partner that brings it), and is copied out from there.
//!
//! The empty signals are what lets the scratch be reused: when a rank has finished round
//! `k`, it has heard, through the steps, from every rank after that rank finished round
//! `k - 1`, as in the recursive-doubling all-reduce. The data's type does not matter:
//! rounds are bytes.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{send_to, wait_for};
use super::round_views::{window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Broadcast over port channels by recursive doubling (see the module docs): `count`
/// elements of the root's `input` into every rank's `output` (`input` and `output` may be
/// one buffer; only the root's input is read). The number of ranks must be a power of two.
/// Takes the same arguments, scratch and round numbers as
/// [`collective_broadcast_ports()`](super::broadcast_ports::collective_broadcast_ports()).
///
/// # Errors
/// A number of ranks that is not a power of two, invalid ids, short buffers, channel (a
/// peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_broadcast_doubling(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, root, nr, l) = (a.rank, a.root, a.n_ranks, a.layout);
    if !nr.is_power_of_two() {
        return Err(a.invalid([nr as u64, 0, 0]));
    }
    let bytes = a.count.saturating_mul(dtype.size());
    let output = window_mut(a.output, 0, bytes)?;
    let input = if r == root {
        let input = window(a.input, 0, bytes)?;
        if output.addr() != input.addr() {
            output.copy_from(Grid, input)?;
        }
        input
    } else {
        a.input
    };
    let per = l.copy_round_bytes();
    let (mut off, mut seq) = (0, a.sequence);
    while off < bytes {
        let len = per.min(bytes - off);
        let slot = l.gather_slot(super::PortLayout::set_of(seq), root);
        if r == root {
            window_mut(a.scratch, slot, len)?.copy_from(Grid, window(input, off, len)?)?;
        }
        let mut bit = 1;
        while bit < nr {
            // Whether the root is among the `bit` ranks whose data we hold.
            let holds = (r ^ root) < bit;
            send_to(a, r ^ bit, slot, slot, if holds { len } else { 0 })?;
            wait_for(a, r ^ bit)?;
            bit <<= 1;
        }
        if r != root {
            let src = window_mut(a.scratch, slot, len)?;
            window_mut(output, off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
