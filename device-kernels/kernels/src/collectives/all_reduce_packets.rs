//! All-reduce with LL16 packets, for small messages: one pass, no meeting.

use super::collective_args::CollectiveArgs;
use super::elementwise::reduce_ranks;
use super::round_views::{typed, typed_mut};
use super::scratch_layout::{packet_flag, parity};
use oxccl_device::DeviceViewMut;
use oxccl_device::arch;
use oxccl_device::coop::{Block, Grid};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::packet::{Ll16Packet, Packet};
use oxccl_device::reduce::ReduceElement;
use oxccl_device::reduce::ReduceOp;

/// All-reduce with LL16 packets, for small messages: `count` elements (at most the layout's
/// `packet_limit` bytes, rounded up to 8) reduced by `op` into `output` on every rank.
/// Takes one call number. Launch one block.
///
/// # Errors
/// Invalid ids, a message over the packet limit, buffers shorter than `count`, channel
/// errors (a peer's packets not arriving within the wait limit).
#[kernel(max_blocks = 1)]
pub fn collective_all_reduce_packets(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => all_reduce_packets::<T>(&args, op))
}

#[inline(always)]
fn all_reduce_packets<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let (n, r, nr, l) = (a.count, a.rank, a.n_ranks, &a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let bytes = n.saturating_mul(size);
    let padded = bytes.div_ceil(Ll16Packet::PAYLOAD_BYTES) * Ll16Packet::PAYLOAD_BYTES;
    if padded > l.packet_limit {
        return Err(a.invalid([bytes, l.packet_limit, 1]));
    }
    let (flag, set) = (packet_flag(a.sequence), parity(a.sequence));
    let unpacked = |p: u32| -> Result<DeviceViewMut<'_, T>, DeviceError> {
        let off = l.unpacked_slot(p);
        a.scratch.slice(off..off + bytes)?.cast::<T>()
    };
    // Our own data goes through our unpacked slot: the packets are sent from there (a
    // channel sends from its `local` buffer), and the reduction then reads scratch only,
    // so an in-place `output` cannot overwrite an input it still needs.
    let own = unpacked(r)?;
    own.copy_from(Grid, typed::<T>(a.input, 0, n)?)?;
    arch::sync_threads();
    for p in (0..nr).filter(|&p| p != r) {
        let ch = a.peer(p)?;
        ch.put_packets::<Ll16Packet>(
            Block,
            l.packet_slot(set, r),
            l.unpacked_slot(r),
            padded,
            flag,
        )?;
    }
    for p in (0..nr).filter(|&p| p != r) {
        let ch = a.peer(p)?;
        ch.unpack_packets::<Ll16Packet>(
            Block,
            l.unpacked_slot(p),
            l.packet_slot(set, p),
            padded,
            flag,
        )?;
    }
    arch::sync_threads();
    let output = typed_mut::<T>(a.output, 0, n)?;
    reduce_ranks(output, nr, op, |p| Ok(unpacked(p)?.as_view()))
}
