//! All-gather over port channels, through the proxy (ranks without a load/store path to
//! each other), in rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes):
//! each rank stages its round and puts it into its gather slot of every peer, with a
//! signal; once every peer's has come, it copies the peers' rounds into their blocks of
//! its output. The data's type does not matter: rounds are bytes.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, exchange_with_peers};
use super::round_views::{window, window_mut};
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// All-gather over port channels: each rank's `count` elements of `input` land at
/// `rank * count` of every rank's `output` (`n_ranks * count` elements; in place when
/// `input` is that part of it).
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_gather_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    let a = &args;
    let (r, nr, l) = (a.rank, a.n_ranks, a.layout);
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
        let staged_at = l.staged(set);
        window_mut(a.scratch, staged_at, len)?.copy_from(Grid, window(input, off, len)?)?;
        exchange_with_peers(
            a,
            l.gather_slot(set, r),
            staged_at,
            Part::Whole { bytes: len },
        )?;
        for p in (0..nr).filter(|&p| p != r) {
            let src = window_mut(a.scratch, l.gather_slot(set, p), len)?;
            window_mut(output, p as u64 * bytes + off, len)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        seq += 1;
    }
    Ok(())
}
