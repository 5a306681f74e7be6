//! Broadcast over port channels: the root's `count` elements end up in every rank's output,
//! copied by the host proxy from the root's registered buffer into every peer's.
//!
//! | memory | written by | read by |
//! |---|---|---|
//! | `input`: `count` elements, ours | the host, before the launch | this kernel, on the root only |
//! | `buf`: `count` elements, ours, registered; the source of every channel of `peers` and the destination of every peer's channel to us | on the root: this kernel; elsewhere: the root's proxy, through the root's channel to us | on the root: its proxy's copies; elsewhere: this kernel (the copy to `output`) |
//! | `output`: `count` elements, ours | this kernel | whatever runs next (the host, after `synchronize`) |
//!
//! Signals, in every launch, on the channel between the root and each peer: the peer raises
//! the root's semaphore once (**ready**: my `buf` may be written), the root's proxy raises
//! the peer's once, after the copy (**data**: your `buf` holds my data). A port channel's
//! triggers run in the order they were pushed, so the signal of `put_with_signal` arrives
//! after its data.

use crate::ELEM_BYTES;
use crate::peers::others;
use oxccl_device::block::{block_signal, block_wait};
use oxccl_device::channel_set::PortChannelSetDeviceHandle;
use oxccl_device::coop::Block;
use oxccl_device::{DeviceError, DeviceView, DeviceViewMut, KernelArg, kernel};

/// Arguments of [`port_broadcast()`]; the same shape on every rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct BroadcastArgs<'a> {
    /// The port channel to each peer, by peer rank: it copies from our `buf` into the
    /// peer's. A rank other than the root uses only its channel to the root.
    pub peers: PortChannelSetDeviceHandle<'a>,
    /// What the root sends: `count` elements (read on the root only).
    pub input: DeviceView<'a, u32>,
    /// The registered buffer the channels name: `count` elements.
    pub buf: DeviceViewMut<'a, u32>,
    /// Where the root's data lands: `count` elements.
    pub output: DeviceViewMut<'a, u32>,
    /// This rank.
    pub rank: u32,
    /// The rank whose `input` is sent.
    pub root: u32,
    /// Ranks taking part.
    pub n_ranks: u32,
    /// Zero: fills the struct to a multiple of 8 bytes (a kernel argument has no padding).
    pub reserved: u32,
}

/// Broadcast: every rank's `output` receives the root's `input` (`count` being
/// `buf.len()`). Every rank launches it with one block (any number of threads); it may be
/// launched again on the same channels right away.
///
/// # Errors
/// [`DeviceError::OutOfRange`] for buffers shorter than `count`; a signal that does not come
/// within the channel's wait limit ([`DeviceError::Timeout`]), a stopped rank or a failed
/// channel ([`DeviceError::Aborted`]).
#[kernel(max_blocks = 1)]
pub fn port_broadcast(args: BroadcastArgs<'_>) -> Result<(), DeviceError> {
    let BroadcastArgs {
        peers,
        input,
        buf,
        output,
        rank,
        root,
        n_ranks,
        reserved: _,
    } = args;
    let bytes = buf.len() * ELEM_BYTES;
    if rank == root {
        // 1. The data into `buf`, the memory the proxy copies from (it copies between
        //    registered memories only), and into our own output; the block shares the work.
        //    The previous launch flushed its copies (step 2), so `buf` is ours to change.
        buf.copy_from(Block, input)?;
        output.copy_from(Block, input)?;
        // 2. A block barrier (the block has written `buf`), then thread 0, for each peer:
        //    wait for its ready signal (it has copied out the previous launch's data), then
        //    push one trigger that copies `buf` into the peer's and then signals it. The
        //    flushes wait until the proxy has carried out every copy: only then may the next
        //    launch change `buf`.
        block_signal(|| {
            for p in others(rank, n_ranks) {
                let to_peer = peers.get(p)?;
                to_peer.wait()?;
                to_peer.put_with_signal(0, 0, bytes)?;
            }
            for p in others(rank, n_ranks) {
                peers.get(p)?.flush()?;
            }
            Ok(())
        })
    } else {
        let to_root = peers.get(root)?;
        // 1. Thread 0 tells the root our `buf` may be written (our previous launch, which
        //    read it, is over), then waits for the root's data signal; the block barrier
        //    after it lets every thread read what arrived.
        block_wait(|| {
            to_root.signal()?;
            to_root.wait()
        })?;
        // 2. The root's data, copied out by the block.
        output.copy_from(Block, buf.as_view())
    }
}
