//! Channel sets on the host: the device handles of a list of channels, copied once into
//! device memory by peer rank, so a kernel gets a channel to every peer as one 16-byte
//! parameter (see [`oxccl_device::channel_set`]).
//!
//! A set borrows its channels (every handle in it points into memory they hold) and owns the
//! device memory the handles are copied into; [`ChannelSet::device_handle`] borrows the set.

use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::memory_channel::MemoryChannel;
use crate::port_channel::PortChannel;
use crate::{Error, Result};
use oxccl_device::channel_set::{ChannelSetDeviceHandle, ChannelSetMember};
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::port_channel::PortChannelDeviceHandle;
use std::fmt;
use std::marker::PhantomData;

/// A host channel whose device handles a [`ChannelSet`] holds: [`MemoryChannel`] and
/// [`PortChannel`]. Sealed.
pub trait Channel: sealed::Sealed {
    /// Its kernel-side handle.
    type DeviceHandle<'a>: ChannelSetMember
    where
        Self: 'a;

    /// The rank at the other end.
    fn peer(&self) -> u32;

    /// The kernel-side handle, valid while the channel is borrowed.
    fn device_handle(&self) -> Self::DeviceHandle<'_>;
}

mod sealed {
    /// Only the channels of this crate.
    pub trait Sealed {}
    impl Sealed for crate::MemoryChannel {}
    impl Sealed for crate::PortChannel {}
}

impl Channel for MemoryChannel {
    type DeviceHandle<'a> = MemoryChannelDeviceHandle<'a>;

    fn peer(&self) -> u32 {
        MemoryChannel::peer(self)
    }

    fn device_handle(&self) -> MemoryChannelDeviceHandle<'_> {
        MemoryChannel::device_handle(self)
    }
}

impl Channel for PortChannel {
    type DeviceHandle<'a> = PortChannelDeviceHandle<'a>;

    fn peer(&self) -> u32 {
        PortChannel::peer(self)
    }

    fn device_handle(&self) -> PortChannelDeviceHandle<'_> {
        PortChannel::device_handle(self)
    }
}

/// Channels to peers, their device handles in device memory by peer rank: what a kernel
/// that talks to every peer takes instead of an array of handles.
///
/// # Examples
/// ```
/// use oxccl::{ChannelSet, in_process};
/// use oxccl_device::channel_set::MemoryChannelSetDeviceHandle;
/// use oxccl_device::{DeviceError, kernel, launch::LaunchConfig};
///
/// /// Thread 0 signals every peer, then waits for each.
/// #[kernel(max_blocks = 1)]
/// fn meet_everyone(peers: MemoryChannelSetDeviceHandle<'_>, rank: u32) -> Result<(), DeviceError> {
///     if oxccl_device::arch::thread_rank_in_grid() != 0 {
///         return Ok(());
///     }
///     for p in (0..peers.len()).filter(|&p| p != rank) {
///         peers.get(p)?.signal()?;
///     }
///     for p in (0..peers.len()).filter(|&p| p != rank) {
///         peers.get(p)?.wait()?;
///     }
///     Ok(())
/// }
///
/// fn main() {
///     in_process::run(3, Default::default(), |comm| {
///         let buf = comm.alloc_zeroed::<u8>(64)?;
///         let all = comm.all_gather_memory(&comm.register(&buf)?)?;
///         let mine = all[comm.rank() as usize].clone();
///         let mut channels = Vec::new();
///         let (rank, size) = (comm.rank(), comm.size());
///         for peer in (0..size).filter(|&p| p != rank) {
///             channels.push(comm.memory_channel(peer, &all[peer as usize], &mine, None)?);
///         }
///         let set = ChannelSet::new(comm.device(), &channels)?;
///         let stream = comm.device().stream()?;
///         meet_everyone::launch(&stream, LaunchConfig::grid(1), set.device_handle(), comm.rank())?;
///         comm.synchronize(&stream)
///     })
///     .unwrap();
/// }
/// ```
pub struct ChannelSet<'c, C: Channel> {
    /// Zeroed at allocation; slot `p` (`size_of::<C::DeviceHandle>()` bytes at `p` times
    /// that) holds the handle of the channel to peer `p`, written once by `new`.
    slots: DeviceBuffer<u64>,
    /// Slots: one past the highest peer.
    len: u32,
    /// The peers with a channel, ascending.
    peers: Vec<u32>,
    /// The channels, for a set that owns them ([`ChannelSet::from_channels`]); empty for
    /// one that borrows them.
    owned: Vec<C>,
    _channels: PhantomData<&'c C>,
}

impl<'c, C: Channel> ChannelSet<'c, C> {
    /// Copies the device handles of `channels` into device memory on `device`, each at its
    /// peer's slot; slots of peers with no channel (this rank's own) stay empty.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if two channels go to the same peer (build one set per channel
    /// index instead); the allocation failed.
    pub fn new(device: &Device, channels: impl IntoIterator<Item = &'c C>) -> Result<Self> {
        let channels: Vec<&'c C> = channels.into_iter().collect();
        let (slots, len, peers) = Self::write_slots(device, &channels)?;
        Ok(ChannelSet {
            slots,
            len,
            peers,
            owned: Vec::new(),
            _channels: PhantomData,
        })
    }

    /// Slots holding the device handles of `channels` at their peers, the slot count and the
    /// peers, ascending.
    fn write_slots(device: &Device, channels: &[&C]) -> Result<(DeviceBuffer<u64>, u32, Vec<u32>)> {
        let mut peers: Vec<u32> = channels.iter().map(|c| c.peer()).collect();
        peers.sort_unstable();
        if let Some(pair) = peers.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::InvalidUsage(format!(
                "channel set: two channels to peer {}; a set holds one channel per peer (build \
                 one set per channel index)",
                pair[0]
            )));
        }
        let len = match peers.last() {
            None => 0,
            Some(&last) => last.checked_add(1).ok_or_else(|| {
                Error::InvalidUsage(format!("channel set: peer {last} is not a rank"))
            })?,
        };
        let handle_bytes = size_of::<C::DeviceHandle<'_>>();
        let words = (len as usize * handle_bytes).div_ceil(8);
        let slots = device.alloc_zeroed::<u64>(words.max(1))?;
        let base = slots.addr() as usize as *mut C::DeviceHandle<'_>;
        for channel in channels {
            // SAFETY: `peer < len`, so the slot lies inside the `len * handle_bytes` bytes of
            // the fresh buffer, which nothing else uses yet; page-aligned, so every slot is
            // aligned for the handle (its size a multiple of its alignment).
            unsafe {
                base.add(channel.peer() as usize)
                    .write(channel.device_handle())
            };
        }
        Ok((slots, len, peers))
    }

    /// Slots of the set: one past the highest peer.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the set holds no channel.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The peers the set holds a channel to, ascending.
    pub fn peers(&self) -> &[u32] {
        &self.peers
    }

    /// The kernel-side handle, valid while the set is borrowed.
    pub fn device_handle(&self) -> ChannelSetDeviceHandle<'_, C::DeviceHandle<'_>> {
        // SAFETY: `slots` holds `len` handles (or zeroed slots), aligned, written before any
        // launch could get this handle and never again; each handle is valid for 'c, which
        // outlives this borrow (the set borrows the channels for 'c), and the buffer lives
        // as long as the set (its last drop waits for the device while kernels run).
        unsafe { ChannelSetDeviceHandle::from_raw_parts(self.slots.addr(), self.len) }
    }
}

impl<C: Channel> ChannelSet<'static, C> {
    /// A set that owns its channels: what a long-lived object (a communicator's collectives)
    /// keeps, instead of a set borrowing channels it keeps beside it.
    ///
    /// # Errors
    /// As [`ChannelSet::new`].
    pub fn from_channels(device: &Device, channels: Vec<C>) -> Result<Self> {
        let refs: Vec<&C> = channels.iter().collect();
        let (slots, len, peers) = Self::write_slots(device, &refs)?;
        // The handles in `slots` stay valid while the channels live: moving a channel into
        // the set moves no memory the handles name (channels hold shares of their memory).
        Ok(ChannelSet {
            slots,
            len,
            peers,
            owned: channels,
            _channels: PhantomData,
        })
    }

    /// The channels the set owns, in the order they were given.
    pub fn channels(&self) -> &[C] {
        &self.owned
    }
}

impl<C: Channel> fmt::Debug for ChannelSet<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelSet")
            .field("peers", &self.peers)
            .field("slots", &self.slots)
            .finish()
    }
}
