//! All-reduce over port channels, through the proxy: for ranks that have no load/store path
//! to each other (another node, or Ethernet asked for). Two-shot, in rounds that fit the
//! scratch ([`PortLayout`]):
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
use super::port_layout::PortLayout;
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::KernelArg;
use oxccl_device::arch;
use oxccl_device::block::block_signal_and_wait;
use oxccl_device::channel_set::ChannelSetDeviceHandle;
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::{DeviceError, DeviceOp};
use oxccl_device::grid_barrier::GridBarrierDeviceHandle;
use oxccl_device::kernel;
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::reduce::{DataType, ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Arguments of [`collective_all_reduce_ports()`]; the host API fills them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct PortCollectiveArgs<'a> {
    /// The port channel to each peer, by peer rank: `dst` the peer's scratch, `src` ours.
    pub peers: ChannelSetDeviceHandle<'a, PortChannelDeviceHandle<'a>>,
    /// This rank's grid barrier.
    pub barrier: GridBarrierDeviceHandle<'a>,
    /// The input.
    pub input: DeviceView<'a, u8>,
    /// The output; may be the input.
    pub output: DeviceViewMut<'a, u8>,
    /// Our scratch, laid out by `layout` (every channel's `src`).
    pub scratch: DeviceViewMut<'a, u8>,
    /// How every rank's scratch is laid out.
    pub layout: PortLayout,
    /// Elements.
    pub count: u64,
    /// The call's first round number (the same on every rank; a call takes one per round).
    pub sequence: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub n_ranks: u32,
    /// Element type ([`DataType`] id).
    pub dtype: u32,
    /// Reduction ([`ReduceOp`] id).
    pub op: u32,
}

/// All-reduce over port channels (see the module docs): `count` elements of `input`
/// reduced by `op` across the ranks into `output` on every rank.
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    match (DataType::from_id(args.dtype), ReduceOp::from_id(args.op)) {
        (Some(dtype), Some(op))
            if args.rank < args.n_ranks && args.layout.n_ranks == args.n_ranks =>
        {
            dispatch_element!(dtype, T => all_reduce::<T>(&args, op))
        }
        _ => Err(args.barrier.wait_policy().raise(
            DeviceError::InvalidArgument,
            DeviceOp::Kernel,
            [args.dtype as u64, args.op as u64, args.rank as u64],
        )),
    }
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
    let per = l.round_bytes / size;
    let (mut off, mut seq) = (0, a.sequence);
    while off < n {
        let len = per.min(n - off);
        let set = seq & 1;
        let staged_at = l.staged(set);
        let staged = window_mut(scratch, staged_at / size, len)?;
        staged.copy_from(Grid, window(input, off, len)?)?;
        // Each peer's chunk of our round into its reduce slot of ours.
        exchange(
            a,
            l.reduce_slot(set, r),
            staged_at,
            len,
            size,
            Chunk::Theirs,
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
        exchange(a, l.gather_slot(set, r), staged_at, len, size, Chunk::Ours)?;
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

/// Which chunk of a round [`exchange`] puts to each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// The peer's own chunk (to reduce).
    Theirs,
    /// Ours (reduced).
    Ours,
}

/// Every block has written; thread 0 of block 0 puts to every peer, at `dst` of its
/// scratch, the `which` chunk of the round of `len` elements of `size` bytes staged at
/// `staged_at` of ours, with a signal, then waits for every peer's signal; then every block
/// proceeds, seeing what arrived. (Plain values, not a closure: what a closure borrows
/// lives in local memory on the GPU once the closure is out of line.)
#[inline(always)]
fn exchange(
    a: &PortCollectiveArgs<'_>,
    dst: u64,
    staged_at: u64,
    len: u64,
    size: u64,
    which: Chunk,
) -> Result<(), DeviceError> {
    a.barrier.sync_grid()?;
    let (peers, rank, n_ranks) = (a.peers, a.rank, a.n_ranks);
    if n_ranks > 1 && arch::block_rank() == 0 {
        block_signal_and_wait(
            move || {
                for p in (0..n_ranks).filter(|&p| p != rank) {
                    let owner = if which == Chunk::Theirs { p } else { rank };
                    let c = contiguous_chunk(owner as u64, n_ranks as u64, len);
                    let bytes = (c.end - c.start) * size;
                    let channel = peers.get(p)?;
                    if bytes == 0 {
                        channel.signal()?;
                    } else {
                        channel.put_with_signal(dst, staged_at + c.start * size, bytes)?;
                    }
                }
                Ok(())
            },
            move || {
                for p in (0..n_ranks).filter(|&p| p != rank) {
                    peers.get(p)?.wait()?;
                }
                Ok(())
            },
        )?;
    }
    a.barrier.sync_grid()
}
