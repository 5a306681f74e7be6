//! Port channels on the host: a semaphore, a registered channel at the proxy, and the ids
//! of the memories it moves data between. [`PortChannel::device_handle`] is what kernels get.
//!
//! Built by [`Communicator::port_channel`](crate::Communicator::port_channel); its puts may
//! also name other registered memories, through ids from
//! [`Communicator::port_dst_memory`](crate::Communicator::port_dst_memory) and
//! [`Communicator::port_src_memory`](crate::Communicator::port_src_memory). A channel
//! holds a share of everything its handles point to (the proxy's FIFO cells, its semaphore
//! counters, its abort record), so a handle borrowed from it is valid as long as the
//! channel; the proxy's tables hold the memories it copies between.

use crate::channel_abort::ChannelAbort;
use crate::error::ChannelRef;
use crate::semaphore::SemaphoreCells;
use crate::transport::Transport;
use oxccl_device::port_channel::{PortChannelDeviceHandle, PortChannelIds};
use oxccl_device::semaphore::Host2DeviceSemaphoreDeviceHandle;
use oxccl_proxy::ProxyWaker;
use oxccl_proxy::fifo::FifoCells;
use std::sync::Arc;

/// A proxy-driven channel to one peer, between one local and one remote memory.
#[derive(Debug)]
pub struct PortChannel {
    pub(crate) channel: ChannelRef,
    pub(crate) ids: PortChannelIds,
    pub(crate) fifo: Arc<FifoCells>,
    pub(crate) semaphore: SemaphoreCells,
    pub(crate) abort: ChannelAbort,
    pub(crate) transport: Transport,
    /// Wakes the rank's proxy when a kernel is about to use the channel (a polling proxy
    /// may be napping).
    pub(crate) waker: ProxyWaker,
}

impl PortChannel {
    /// The channel's id at the proxy.
    pub fn id(&self) -> u32 {
        self.ids.semaphore_id
    }

    /// The peer.
    pub fn peer(&self) -> u32 {
        self.channel.peer
    }

    /// The transport its puts and signals travel over.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The channel as errors name it (kind, peer, index).
    pub fn channel(&self) -> ChannelRef {
        self.channel
    }

    /// The kernel-side handle, valid while the channel is borrowed. Taking it tells the
    /// rank's proxy, if it polls (on a GPU), that triggers are coming: take it right before
    /// the launch.
    pub fn device_handle(&self) -> PortChannelDeviceHandle<'_> {
        // A handle is taken to launch a kernel that pushes on it: a polling proxy should be
        // hot by the kernel's first trigger, not napping.
        self.waker.expect_triggers();
        let wait = self.abort.wait_policy();
        // SAFETY: the counters are the zeroed device memory `self.semaphore` owns, alive for
        // the borrow; `inbound` is raised only by the peer's proxy (through its connection),
        // `expected` only by our waiting thread.
        let semaphore = unsafe {
            Host2DeviceSemaphoreDeviceHandle::from_raw_parts(self.semaphore.raw_parts(0), wait)
        };
        PortChannelDeviceHandle::new(self.fifo.device_handle(wait), semaphore, self.ids)
    }
}
