//! All-gather over memory channels: every rank's `count` elements end up at `rank * count`
//! of every rank's output, each rank storing its chunk straight into every peer's buffer.
//!
//! | memory | written by | read by |
//! |---|---|---|
//! | `input`: `count` elements, ours | the host, before the launch | this kernel |
//! | `buf`: `n_ranks * count` elements, ours, registered; the `local` of every channel of `peers`, and the `remote` of every peer's channel to us | slot `rank`: this kernel; slot `p`: peer `p`'s kernel, through its channel to us | this kernel (its `put`s read slot `rank`, then the copy to `output` reads all) |
//! | `output`: `n_ranks * count` elements, ours | this kernel | whatever runs next (the host, after `synchronize`) |
//!
//! Signals: in every launch each rank raises each peer's semaphore twice, in this order:
//! **ready** (my `buf` may be written: my previous launch, which read it, is over) and
//! **done** (my chunk is in your `buf`). Each `wait` takes exactly one signal, so a rank's
//! two waits on a peer take that peer's ready, then its done, launch after launch.

use crate::ELEM_BYTES;
use crate::peers::others;
use oxccl_device::block::{block_signal_and_wait, block_wait};
use oxccl_device::channel_set::MemoryChannelSetDeviceHandle;
use oxccl_device::coop::Block;
use oxccl_device::handshake::ready_handshake;
use oxccl_device::{DeviceError, DeviceView, DeviceViewMut, KernelArg, kernel};

/// Arguments of [`memory_all_gather()`]; the same shape on every rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct AllGatherArgs<'a> {
    /// The memory channel to each peer, by peer rank: its `remote` is the peer's `buf`, its
    /// `local` our `buf`.
    pub peers: MemoryChannelSetDeviceHandle<'a>,
    /// This rank's chunk: `count` elements.
    pub input: DeviceView<'a, u32>,
    /// The registered buffer the channels name: `n_ranks * count` elements, chunk `p` at
    /// element `p * count`.
    pub buf: DeviceViewMut<'a, u32>,
    /// Where every rank's chunk lands: `n_ranks * count` elements.
    pub output: DeviceViewMut<'a, u32>,
    /// This rank.
    pub rank: u32,
    /// Ranks taking part.
    pub n_ranks: u32,
}

/// All-gather: `output[p * count..][..count]` receives rank `p`'s `input`, for every rank
/// `p` (`count` being `input.len()`). Every rank launches it with one block (any number of
/// threads); it may be launched again on the same channels right away.
///
/// # Errors
/// [`DeviceError::OutOfRange`] or [`DeviceError::OutOfBounds`] for buffers shorter than
/// `n_ranks * count`; a peer's signal that does not come within the channel's wait limit
/// ([`DeviceError::Timeout`]), or a stopped rank ([`DeviceError::Aborted`]).
#[kernel(max_blocks = 1)]
pub fn memory_all_gather(args: AllGatherArgs<'_>) -> Result<(), DeviceError> {
    let AllGatherArgs {
        peers,
        input,
        buf,
        output,
        rank,
        n_ranks,
    } = args;
    let count = input.len();
    // Our slot, in elements for the views and in bytes for the channels.
    let mine = rank as u64 * count;
    let (off, bytes) = (mine * ELEM_BYTES, count * ELEM_BYTES);

    // 1. Our chunk into our own slot: every thread of the block copies its share. Nobody
    //    else writes this slot, so no handshake is needed first.
    buf.slice(mine..mine + count)?.copy_from(Block, input)?;

    // 2. The ready handshake, on thread 0: tell every peer it may write into our `buf`, then
    //    wait until every peer says the same of its own. Without it, a rank that runs a
    //    launch ahead would overwrite a slow peer's `buf` before that peer copied out the
    //    previous launch's result (step 5). The block barrier at the end also makes step
    //    1's writes visible to every thread of the block before step 3 reads them.
    block_wait(|| {
        ready_handshake(
            || {
                for p in others(rank, n_ranks) {
                    peers.get(p)?.signal()?;
                }
                Ok(())
            },
            || {
                for p in others(rank, n_ranks) {
                    peers.get(p)?.wait()?;
                }
                Ok(())
            },
        )
    })?;

    // 3. Our chunk into every peer's `buf`, at the same offset as ours: plain stores into the
    //    peer's mapped memory, each thread its share.
    for p in others(rank, n_ranks) {
        peers.get(p)?.put(Block, off, off, bytes)?;
    }

    // 4. A block barrier (every thread's stores are done), then thread 0 signals every peer
    //    (a release: the peer's matching wait sees all the block stored) and waits for every
    //    peer's signal (an acquire: its chunk is in our `buf`).
    block_signal_and_wait(
        || {
            for p in others(rank, n_ranks) {
                peers.get(p)?.signal()?;
            }
            Ok(())
        },
        || {
            for p in others(rank, n_ranks) {
                peers.get(p)?.wait()?;
            }
            Ok(())
        },
    )?;

    // 5. Every chunk is in `buf`: the result, copied out by the block.
    output.copy_from(Block, buf.as_view())
}
