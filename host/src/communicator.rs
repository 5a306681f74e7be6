//! The communicator: one rank's view of a job. It owns the rank's device, its proxy service
//! and the out-of-band exchange, registers memory, and builds channels to peers.
//!
//! Channel construction is pairwise: when rank A builds a channel to B, B builds one to A
//! (in the same order relative to their other channels to each other), and the two swap
//! semaphore addresses through the exchange. Every failure names rank, peer and channel.

use crate::backend::Backend;
use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::host_ipc::HostIpcMapping;
use crate::host_ipc_connection::HostIpcConnection;
use crate::memory_channel::MemoryChannel;
use crate::out_of_band::{BootstrapExchange, OutOfBand};
use crate::port_channel::PortChannel;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::{Device2DeviceSemaphore, Host2DeviceSemaphore, SemaphoreCells};
use crate::stream::Stream;
use crate::transport::Transport;
use oxccl_device::DeviceError;
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::{MemoryId, MemoryRegion, ProxyConfig, ProxyService};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Sites (abort-flag tags) of memory channels start here; port channels use their proxy id.
pub const MEMORY_CHANNEL_SITE_BASE: u32 = 1 << 16;

/// Tag space of pairwise setup messages: kind in the top byte, sequence below.
const TAG_PORT_CHANNEL: u64 = 1 << 56;
const TAG_MEMORY_CHANNEL: u64 = 2 << 56;

/// Settings of a communicator.
#[derive(Clone, Debug)]
pub struct CommunicatorConfig {
    /// Slots of the proxy's trigger FIFO (a power of two).
    pub fifo_size: u32,
    /// Longest any single device wait may take before the kernel gives up and the host is
    /// told which channel timed out.
    pub wait_timeout: Duration,
    /// Let pushing kernel threads execute proxy work when the proxy thread is not busy
    /// (CPU emulator; see `oxccl_proxy::proxy_service`).
    pub proxy_assist: bool,
}

impl Default for CommunicatorConfig {
    fn default() -> Self {
        CommunicatorConfig {
            fifo_size: 512,
            wait_timeout: Duration::from_secs(30),
            proxy_assist: true,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum ChannelKind {
    Port,
    Memory,
}

/// One rank of a job.
pub struct Communicator {
    oob: Arc<dyn OutOfBand>,
    device: Device,
    proxy: ProxyService,
    config: CommunicatorConfig,
    /// Proxy memory ids by (owner rank, address, size).
    memory_ids: HashMap<(u32, u64, u64), MemoryId>,
    /// Setups done with each peer, so both sides pair their messages.
    setups: HashMap<u32, u64>,
    /// Peer of each memory channel, by site - MEMORY_CHANNEL_SITE_BASE.
    memory_channel_peers: Vec<u32>,
    /// Memory of ranks in other processes of this node, mapped here, by (node, pid, inode).
    mappings: HashMap<(String, u32, u64), HostIpcMapping>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("device", &self.device)
            .finish()
    }
}

impl Communicator {
    /// A communicator for rank `oob.rank()` on `device`, its proxy started.
    ///
    /// # Errors
    /// The proxy could not be created or started.
    pub fn new(
        oob: Arc<dyn OutOfBand>,
        device: Device,
        config: CommunicatorConfig,
    ) -> Result<Self> {
        let mut proxy = ProxyService::new(ProxyConfig {
            rank: oob.rank(),
            fifo_size: config.fifo_size,
            wait_timeout: config.wait_timeout,
            assist: config.proxy_assist,
        })?;
        proxy.start()?;
        Ok(Communicator {
            oob,
            device,
            proxy,
            config,
            memory_ids: HashMap::new(),
            setups: HashMap::new(),
            memory_channel_peers: Vec::new(),
            mappings: HashMap::new(),
        })
    }

    /// Joins the job the launcher started (torchrun, Open MPI, Slurm, PMI, or
    /// `OXCCL_UNIQUE_ID`; see `oxccl_bootstrap::Bootstrap::from_env`) and creates this
    /// rank's communicator on the device given by `OXCCL_BACKEND` (default: the CPU
    /// emulator), numbered by the local rank.
    ///
    /// # Errors
    /// No launcher environment, the bootstrap failed, or the device or proxy could not be
    /// created.
    pub fn from_env(config: CommunicatorConfig) -> Result<Self> {
        let bootstrap = oxccl_bootstrap::Bootstrap::from_env()?;
        let device = Device::new(Backend::from_env()?, bootstrap.local_rank())?;
        Self::new(Arc::new(BootstrapExchange::new(bootstrap)), device, config)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.oob.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.oob.size()
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The out-of-band exchange.
    pub fn out_of_band(&self) -> &dyn OutOfBand {
        &*self.oob
    }

    /// The rank's proxy service.
    pub fn proxy(&self) -> &ProxyService {
        &self.proxy
    }

    /// Zeroed device memory for `len` elements.
    ///
    /// # Errors
    /// The allocation failed.
    pub fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.device.alloc(len)
    }

    /// Registers `buffer` so peers can reach it; hand the result to them (see
    /// [`Self::all_gather_memory`]). The buffer must stay alive while channels use it.
    pub fn register<T: bytemuck::Pod>(&self, buffer: &DeviceBuffer<T>) -> RegisteredMemory {
        RegisteredMemory::new(
            self.rank(),
            buffer.addr(),
            buffer.size_bytes() as u64,
            vec![Transport::HostIpc],
            buffer.ipc_handle().map(|h| (h, 0)),
        )
    }

    /// Every rank's registered memory, indexed by rank (a collective call).
    ///
    /// # Errors
    /// The exchange failed or a peer sent something that is not a registered memory.
    pub fn all_gather_memory(&self, mine: &RegisteredMemory) -> Result<Vec<RegisteredMemory>> {
        self.oob
            .all_gather(mine.to_bytes()?)?
            .iter()
            .map(|b| RegisteredMemory::from_bytes(b))
            .collect()
    }

    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// The exchange failed or timed out.
    pub fn barrier(&self) -> Result<()> {
        self.oob.barrier()
    }

    fn next_tag(&mut self, peer: u32, kind: u64) -> u64 {
        let seq = self.setups.entry(peer).or_insert(0);
        *seq += 1;
        kind | *seq
    }

    fn check_peer(&self, peer: u32, what: &str) -> Result<()> {
        if peer >= self.size() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: {what} to peer {peer}, but there are {} ranks",
                self.rank(),
                self.size()
            )));
        }
        Ok(())
    }

    /// Swaps inbound semaphore counters with `peer`: sends ours, returns theirs (checked).
    fn swap_inbound(
        &mut self,
        peer: u32,
        kind: u64,
        cells: &SemaphoreCells,
    ) -> Result<RegisteredMemory> {
        let tag = self.next_tag(peer, kind);
        let mine = cells.inbound_memory(self.rank(), vec![Transport::HostIpc]);
        self.oob.send(peer, tag, mine.to_bytes()?)?;
        let theirs = RegisteredMemory::from_bytes(&self.oob.recv(peer, tag)?)?;
        if theirs.rank() != peer || theirs.size() < 8 {
            return Err(Error::InvalidUsage(format!(
                "rank {}: peer {peer} answered channel setup with a semaphore of rank {} ({} bytes)",
                self.rank(),
                theirs.rank(),
                theirs.size()
            )));
        }
        Ok(theirs)
    }

    /// `memory` as reachable from this process: its own address for memory of this
    /// process, else a mapping of the owner's shared object (made once, kept as long as
    /// the communicator).
    ///
    /// # Errors
    /// Memory of another process that has no host IPC handle, lives on another node, or
    /// cannot be mapped (see [`HostIpcHandle::map`](crate::host_ipc::HostIpcHandle::map)).
    pub fn reach(&mut self, memory: &RegisteredMemory) -> Result<MemoryRegion> {
        if memory.is_local() {
            return memory.region();
        }
        let Some((handle, offset)) = memory.host_ipc() else {
            return Err(Error::InvalidUsage(format!(
                "rank {}: memory of rank {} is in another process and carries no host IPC handle",
                self.rank(),
                memory.rank()
            )));
        };
        let rank = self.rank();
        let key = (handle.node.clone(), handle.pid, handle.inode);
        let mapping = match self.mappings.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(handle.map()?),
        };
        let fits = offset
            .checked_add(memory.size())
            .is_some_and(|end| end <= mapping.len());
        if !fits {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} ({} bytes at offset {offset}) lies outside its {}-byte object",
                memory.rank(),
                memory.size(),
                mapping.len()
            )));
        }
        Ok(MemoryRegion::new(
            memory.rank(),
            mapping.addr() + offset,
            memory.size(),
        ))
    }

    fn memory_id(&mut self, region: MemoryRegion) -> Result<MemoryId> {
        let key = (region.owner_rank, region.addr, region.size);
        if let Some(&id) = self.memory_ids.get(&key) {
            return Ok(id);
        }
        let id = self.proxy.add_memory(region)?;
        self.memory_ids.insert(key, id);
        Ok(id)
    }

    /// A port channel to `peer` that copies from `src` (ours) into `dst` (the peer's).
    /// Pairwise: `peer` must build its channel to us at the same point.
    ///
    /// # Errors
    /// A peer out of range, memories of the wrong ranks, or a failed exchange.
    pub fn port_channel(
        &mut self,
        peer: u32,
        dst: &RegisteredMemory,
        src: &RegisteredMemory,
    ) -> Result<PortChannel> {
        self.check_peer(peer, "port channel")?;
        if dst.rank() != peer || src.rank() != self.rank() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: port channel to peer {peer} needs the peer's destination (got rank {}) and our \
                 source (got rank {})",
                self.rank(),
                dst.rank(),
                src.rank()
            )));
        }
        let cells = SemaphoreCells::new(&self.device)?;
        let remote_inbound = self.swap_inbound(peer, TAG_PORT_CHANNEL, &cells)?;
        let connection = Arc::new(HostIpcConnection::new(peer));
        let remote_inbound = self.reach(&remote_inbound)?;
        let id = self.proxy.add_channel(connection, remote_inbound)?;
        let dst = self.reach(dst)?;
        let dst = self.memory_id(dst)?;
        let src = self.memory_id(src.region()?)?;
        Ok(PortChannel {
            semaphore: Host2DeviceSemaphore::new(cells, peer),
            id,
            dst,
            src,
            fifo: self.proxy.fifo_device_handle(id.0),
            wait: self.proxy.wait_policy(id.0),
        })
    }

    /// A memory channel to `peer`: kernels write `remote` (the peer's) from `local` (ours),
    /// and unpack LL packets the peer sends into `packets` (ours), if given.
    /// Pairwise: `peer` must build its channel to us at the same point.
    ///
    /// # Errors
    /// A peer out of range, memories of the wrong ranks, or a failed exchange.
    pub fn memory_channel(
        &mut self,
        peer: u32,
        remote: &RegisteredMemory,
        local: &RegisteredMemory,
        packets: Option<&RegisteredMemory>,
    ) -> Result<MemoryChannel> {
        self.check_peer(peer, "memory channel")?;
        let ours = |m: Option<&RegisteredMemory>| m.is_none_or(|m| m.rank() == self.rank());
        if remote.rank() != peer || !ours(Some(local)) || !ours(packets) {
            return Err(Error::InvalidUsage(format!(
                "rank {}: memory channel to peer {peer} needs the peer's remote memory (got rank {}) and our \
                 local and packet memories",
                self.rank(),
                remote.rank()
            )));
        }
        let cells = SemaphoreCells::new(&self.device)?;
        let remote_inbound = self.swap_inbound(peer, TAG_MEMORY_CHANNEL, &cells)?;
        let remote_inbound = self.reach(&remote_inbound)?;
        let remote = self.reach(remote)?;
        let site = MEMORY_CHANNEL_SITE_BASE + self.memory_channel_peers.len() as u32;
        self.memory_channel_peers.push(peer);
        Ok(MemoryChannel {
            semaphore: Device2DeviceSemaphore::new(cells, peer, remote_inbound.addr),
            remote,
            local: local.region()?,
            packets: packets.map(RegisteredMemory::region).transpose()?,
            wait: self.proxy.wait_policy(site),
        })
    }

    /// Port channels to the next and the previous rank of the ring `0, 1, .., size-1`:
    /// `to_next` copies from `local` into the next rank's memory, `to_prev` into the
    /// previous rank's, and what this rank signals on `to_next` arrives on the next rank's
    /// `to_prev` (so `to_prev.wait()` waits for the previous rank). `remotes` is every
    /// rank's memory, by rank (as [`Self::all_gather_memory`] returns it). Every rank must
    /// call this at the same point.
    ///
    /// # Errors
    /// Fewer than two ranks, `remotes` of the wrong length, or as [`Self::port_channel`].
    pub fn ring_port_channels(
        &mut self,
        remotes: &[RegisteredMemory],
        local: &RegisteredMemory,
    ) -> Result<(PortChannel, PortChannel)> {
        self.check_ring(remotes)?;
        self.ring_pair(|c, peer| c.port_channel(peer, &remotes[peer as usize], local))
    }

    /// Memory channels to the next and the previous rank of the ring, paired as in
    /// [`Self::ring_port_channels`]: kernels write `remotes[next]` / `remotes[prev]` from
    /// `local`, and unpack packets the neighbours send into `packets`, if given.
    ///
    /// # Errors
    /// Fewer than two ranks, `remotes` of the wrong length, or as [`Self::memory_channel`].
    pub fn ring_memory_channels(
        &mut self,
        remotes: &[RegisteredMemory],
        local: &RegisteredMemory,
        packets: Option<&RegisteredMemory>,
    ) -> Result<(MemoryChannel, MemoryChannel)> {
        self.check_ring(remotes)?;
        self.ring_pair(|c, peer| c.memory_channel(peer, &remotes[peer as usize], local, packets))
    }

    fn check_ring(&self, remotes: &[RegisteredMemory]) -> Result<()> {
        if self.size() < 2 || remotes.len() != self.size() as usize {
            return Err(Error::InvalidUsage(format!(
                "rank {}: a ring needs at least two ranks and one memory per rank (got {} ranks, {} memories)",
                self.rank(),
                self.size(),
                remotes.len()
            )));
        }
        Ok(())
    }

    /// Builds the channel to the next rank and the one to the previous rank with `make`.
    /// Setups with one peer pair up in order (the exchange tags count per peer), so the
    /// order only matters when next and previous are the same rank (two ranks): then even
    /// ranks start with "next" and odd ranks with "previous", so that each rank's `to_next`
    /// meets the other's `to_prev`.
    fn ring_pair<C>(
        &mut self,
        mut make: impl FnMut(&mut Self, u32) -> Result<C>,
    ) -> Result<(C, C)> {
        let (rank, size) = (self.rank(), self.size());
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        if rank % 2 == 0 {
            let to_next = make(self, next)?;
            Ok((to_next, make(self, prev)?))
        } else {
            let to_prev = make(self, prev)?;
            Ok((make(self, next)?, to_prev))
        }
    }

    /// Waits for everything enqueued on `stream`, then reports what went wrong in its
    /// kernels or this rank's proxy ([`Stream::synchronize`] then [`Self::check`]).
    ///
    /// # Errors
    /// A stuck or failed kernel, or a channel failure named by rank, channel and peer.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        stream.synchronize()?;
        self.check()
    }

    /// Reports what went wrong in kernels or the proxy since the last call: a refused
    /// trigger, a failed connection, or a device wait that timed out or was refused, each
    /// naming rank, channel and peer. Clears the abort flag once reported.
    ///
    /// # Errors
    /// The first failure found.
    pub fn check(&self) -> Result<()> {
        if let Err(e) = self.proxy.check() {
            // The proxy raised the flag for this very error; it is reported now.
            self.proxy.clear_abort();
            return Err(e.into());
        }
        let Some(reason) = self.proxy.abort_reason() else {
            return Ok(());
        };
        self.proxy.clear_abort();
        let (kind, peer) = self.describe_site(reason.site);
        let channel = format!(
            "rank {}: {kind:?} channel {} to peer {}",
            self.rank(),
            reason.site,
            peer.map_or("?".into(), |p| p.to_string())
        );
        Err(match reason.error {
            Some(DeviceError::Timeout) => Error::Timeout {
                what: format!("{channel}: a device wait"),
                after: self.config.wait_timeout,
            },
            Some(e) => Error::Aborted(format!("{channel}: {e}")),
            None => Error::Aborted(format!("{channel}: unknown abort code")),
        })
    }

    fn describe_site(&self, site: u32) -> (ChannelKind, Option<u32>) {
        if site >= MEMORY_CHANNEL_SITE_BASE {
            let peer = self
                .memory_channel_peers
                .get((site - MEMORY_CHANNEL_SITE_BASE) as usize)
                .copied();
            (ChannelKind::Memory, peer)
        } else {
            (
                ChannelKind::Port,
                self.proxy.channel_peer(oxccl_proxy::SemaphoreId(site)),
            )
        }
    }

    /// The wait policy device handles of this communicator use, tagged with `site`.
    pub fn wait_policy(&self, site: u32) -> WaitPolicy {
        self.proxy.wait_policy(site)
    }
}
