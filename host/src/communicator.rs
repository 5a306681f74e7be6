//! The communicator: one rank's view of a job. It owns the rank's device, its proxy service
//! and the out-of-band exchange, registers memory, builds channels to peers, and reports
//! what failed in them.
//!
//! Channel construction is pairwise: when rank A builds a channel to B, B builds one to A
//! (in the same order relative to their other channels to each other), and the two swap
//! semaphore addresses through the exchange. Every failure names rank, peer and channel.
//!
//! Port channels run over host IPC (CUDA IPC on a GPU), InfiniBand / RoCE (feature `ib`)
//! or Ethernet, as [`CommunicatorConfig::transport`] chooses (logged at creation); both ends
//! of a channel must choose the same, which the setup checks. Over Ethernet a peer's memory
//! is named by the id its owner gave it, and the owner's receiver checks every write
//! against its own table (see [`crate::ethernet`]). Over InfiniBand / RoCE it is written by
//! the owner's address and the remote key its RDMA device gave the registration, and that
//! device refuses anything outside the registration (see `ib_connection.rs`).
//!
//! Memory of another rank reached over host IPC is always reached through a mapping of its
//! shared object, made here after checking the handle (see [`crate::host_ipc`]) and kept as
//! long as anything built on it: ranks that are threads of one process do it too, so a rank
//! that frees its memory (it failed, it finished) never pulls it from under a peer. Memory
//! reached over Ethernet is kept by its owner's table for as long as the owner's
//! communicator.
//!
//! On a GPU, a rank's memory carries a CUDA IPC handle: a rank in another process opens it
//! once per peer allocation (kept as long as anything built on it), a rank of the same
//! process reaches it at its own address, holding a share of the allocation, through the
//! token the registration got in this process (so only what was registered, as
//! registered). The proxy's
//! FIFO is in mapped host memory and polled, abort records and the stop word are in mapped
//! host memory too ([`Device::host_cell`]), semaphores in device memory, and port channels
//! copy through [`CudaIpcConnection`]s on one node. Over Ethernet a GPU's memory is staged
//! through pinned host buffers (`ethernet_staging.rs`, `cuda::cuda_staging`); over
//! InfiniBand / RoCE it is registered with the RDMA device through a dma-buf, or as is
//! (GPUDirect RDMA through `nvidia-peermem`).

use crate::backend::Backend;
use crate::buffer_memory::BufferMemory;
use crate::channel_abort::ChannelAbort;
use crate::collectives::CollectiveConfig;
use crate::collectives::collective_context::CollectiveContext;
use crate::cpu::CpuDevice;
use crate::cpu::memory::PeerMapping;
use crate::cuda::cuda_ipc::CudaIpcMapping;
use crate::cuda::cuda_staging::CudaStaging;
use crate::cuda::registered_shares;
use crate::cuda_ipc_connection::CudaIpcConnection;
use crate::device::Device;
use crate::device::DeviceKind;
use crate::device_buffer::DeviceBuffer;
use crate::error::{ChannelError, ChannelFailure, ChannelKind, ChannelRef, Error, Result};
use crate::ethernet::{EthernetEndpoint, new_token};
use crate::ethernet_connection::EthernetConnection;
use crate::ethernet_registry::EthernetRegistry;
use crate::ethernet_staging::{HostStaging, Staging};
use crate::grid_barrier::{GRID_BARRIER_SITE, GridBarrier};
use crate::host_ipc::node_name;
use crate::host_ipc_connection::HostIpcConnection;
use crate::ib_transport::{IbTransport, reach_over_ib};
use crate::memory_channel::MemoryChannel;
use crate::out_of_band::{BootstrapExchange, OutOfBand};
use crate::peer_watch::PeerWatch;
use crate::port_channel::PortChannel;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::SemaphoreCells;
use crate::semaphore_arena::SemaphoreArena;
use crate::stream::Stream;
use crate::transport::{Transport, TransportChoice};
use oxccl_device::DeviceError;
use oxccl_device::abort::{AbortReason, AbortRecord};
use oxccl_device::error::DeviceOp;
use oxccl_device::port_channel::{DstMemoryId, PortChannelIds, SrcMemoryId};
use oxccl_proxy::{
    Connection, FIFO_SITE, HostCell, INBOUND_SITE, IdlePolicy, MemoryId, MemoryRegion, ProxyConfig,
    ProxyService, RdmaKey,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sites (abort-record numbers) of memory channels start here; port channels use their
/// proxy id.
const MEMORY_CHANNEL_SITE_BASE: u32 = 1 << 16;

/// The site the host raises the rank's stop word under ([`RankStopper::stop`]).
pub const HOST_STOP_SITE: u32 = u32::MAX - 1;

/// Tag space of pairwise setup messages: kind in the top byte, sequence below.
/// Tag of a channel setup's first message (either kind: the message says which).
const TAG_CHANNEL_SETUP: u64 = 1 << 56;
const TAG_SETUP_DONE: u64 = 3 << 56;
/// Tag of an Ethernet connection setup (listener address and token).
const TAG_ETHERNET_SETUP: u64 = 4 << 56;
/// Tag of an InfiniBand / RoCE connection setup (the queue pair's endpoint).
const TAG_IB_SETUP: u64 = 5 << 56;

/// Longest Ethernet setup message a peer may send.
const MAX_ETHERNET_SETUP_BYTES: usize = 256;

/// Settings of a communicator.
#[derive(Clone, Debug)]
pub struct CommunicatorConfig {
    /// Slots of the proxy's trigger FIFO (a power of two).
    pub fifo_size: u32,
    /// Longest any single device wait may take before the kernel gives up and the host is
    /// told which channel timed out; also bounds the communicator's own teardown. Never zero.
    pub wait_timeout: Duration,
    /// Let pushing kernel threads execute proxy work when the proxy thread is not busy
    /// (CPU emulator; see `oxccl_proxy::proxy_service`). Faster on few cores, but a put then
    /// completes before `put` returns, which hides a missing `flush`: tests of kernels
    /// should also run with it off.
    pub proxy_assist: bool,
    /// How the proxy thread waits when its FIFO is empty; `None`: the backend's way (the
    /// CPU emulator parks and is woken by the next push; a GPU cannot wake a host thread,
    /// so there the proxy polls, then naps: `IdlePolicy::Poll` with the default
    /// `PollSchedule`). `Some(IdlePolicy::Poll(..))` on the emulator gives it a GPU's FIFO:
    /// no doorbell, so no assist either.
    pub proxy_idle: Option<IdlePolicy>,
    /// Whether the proxy of this communicator is served by the process's one shared proxy
    /// thread (with the proxies of the other communicators of the process that share it)
    /// instead of a thread of its own. `None`: shared where the machine has fewer than
    /// [`SHARED_PROXY_BELOW_CORES`] cores, where a thread per rank would take cores the
    /// ranks' kernel threads need (the in-process ranks of `oxccl::in_process` on a small
    /// machine); one thread serves every FIFO in turn, so it is the wrong choice for
    /// ranks that move much data through their proxies on a large machine. A GPU's proxy
    /// (which polls) always has its own thread. The default is `OXCCL_PROXY_THREAD`
    /// (`shared`, `own`; unset: `None`; anything else: `None`, with a warning).
    pub shared_proxy_thread: Option<bool>,
    /// How collectives run: scratch sizes, launch shape, algorithm.
    pub collectives: CollectiveConfig,
    /// The transport of port channels. The default is `OXCCL_TRANSPORT` if it names one,
    /// else [`TransportChoice::Auto`] (a misspelt variable is reported by
    /// [`Communicator::new`]). Every rank of a job must choose the same.
    pub transport: TransportChoice,
    /// Over Ethernet, stage the emulator's memory through a host buffer as a GPU's memory
    /// is (copied out before a write is sent, copied in after it is received, signals
    /// stored behind the copies): runs that path, which a GPU takes, without one. One more
    /// copy each way; off by default. (A GPU's memory is always staged.)
    pub ethernet_staging: bool,
}

impl Default for CommunicatorConfig {
    fn default() -> Self {
        CommunicatorConfig {
            fifo_size: 512,
            wait_timeout: Duration::from_secs(30),
            proxy_assist: true,
            proxy_idle: None,
            shared_proxy_thread: match std::env::var("OXCCL_PROXY_THREAD").as_deref() {
                Ok("shared") => Some(true),
                Ok("own") => Some(false),
                Err(_) => None,
                Ok(other) => {
                    tracing::warn!(
                        value = other,
                        "OXCCL_PROXY_THREAD is not shared or own; choosing by the core count"
                    );
                    None
                }
            },
            collectives: CollectiveConfig::default(),
            transport: TransportChoice::from_env()
                .ok()
                .flatten()
                .unwrap_or_default(),
            ethernet_staging: false,
        }
    }
}

/// Cores below which communicators share one proxy thread by default
/// ([`CommunicatorConfig::shared_proxy_thread`]): two ranks need a core each for their
/// kernel threads and one each for their proxies.
pub const SHARED_PROXY_BELOW_CORES: usize = 4;

/// A channel's abort record, as the communicator finds it again by site.
struct ChannelEntry {
    channel: ChannelRef,
    record: HostCell<AbortRecord>,
}

/// Stops one rank's kernels from another thread: raises the rank's stop word, so every
/// device wait of its channels ends at its next check with [`DeviceError::Aborted`], and
/// [`Communicator::check`] reports `why`. For a job whose other rank failed.
#[derive(Clone, Debug)]
pub struct RankStopper {
    stop: HostCell<AtomicU64>,
    why: Arc<Mutex<Option<String>>>,
}

impl RankStopper {
    /// Stops the rank's kernels (unless a failure already did); `why` is what the rank's
    /// next `check` reports.
    pub fn stop(&self, why: String) {
        let word = AbortReason::encode(DeviceError::Aborted, DeviceOp::Unknown, HOST_STOP_SITE);
        // Relaxed: the word carries no data; kernels seeing it late only stop late.
        if self
            .stop
            .compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            *self.why.lock() = Some(why);
        }
    }
}

/// What names a memory for the proxy: owner rank, address here, size, Ethernet id, RDMA key
/// (the fields [`MemoryRegion`]'s equality compares).
type MemoryKey = (u32, u64, u64, Option<u32>, Option<RdmaKey>);

/// One rank of a job.
pub struct Communicator {
    oob: Arc<dyn OutOfBand>,
    device: Device,
    proxy: ProxyService,
    config: CommunicatorConfig,
    /// Proxy memory ids by (owner rank, address, size, Ethernet id, RDMA key): a peer's
    /// memories reached over Ethernet or InfiniBand all have address 0 here.
    memory_ids: HashMap<MemoryKey, MemoryId>,
    /// Setups done with each peer, so both sides pair their messages.
    setups: HashMap<u32, u64>,
    /// Every channel's abort record, by site.
    channels: HashMap<u32, ChannelEntry>,
    /// Channels built so far, by kind and peer (the next one's index).
    channel_counts: HashMap<(ChannelKind, u32), u32>,
    /// Memory channels built so far (the next one's site).
    memory_channels: u32,
    /// This rank's memories reachable over Ethernet, by the id peers name them with.
    ethernet_registry: Arc<EthernetRegistry>,
    /// The Ethernet listener, bound by the first Ethernet channel.
    ethernet: Option<EthernetEndpoint>,
    /// The connection this rank's proxy writes each peer's memory over, by peer.
    ethernet_connections: HashMap<u32, Arc<EthernetConnection>>,
    /// How the Ethernet transport reaches this rank's memory where the host cannot at its
    /// address (a GPU's), made by the first Ethernet connection or endpoint.
    ethernet_staging: Option<Option<Arc<dyn Staging>>>,
    /// The RDMA device and its connections, where port channels may run over InfiniBand /
    /// RoCE (opened at creation).
    ib: Option<IbTransport>,
    /// The processes of peers whose memory is mapped here, watched for a death mid-run.
    peer_watch: PeerWatch,
    /// Memory of other ranks mapped here, by (node, pid, inode): shared with every region
    /// built on it, so a mapping lives as long as its last user, and is unmapped only when
    /// no kernel of this rank's device runs.
    mappings: HashMap<(String, u32, u64), Arc<PeerMapping>>,
    /// Allocations of ranks in other processes opened here through CUDA IPC, by (node,
    /// pid, handle): one mapping per peer allocation, shared by every region built on it.
    cuda_mappings: HashMap<(String, u32, [u8; 64]), Arc<CudaIpcMapping>>,
    /// Where the channels' semaphores come from: a few allocations, each mapped once by a
    /// peer, not one per channel.
    semaphores: SemaphoreArena,
    /// What the host said when it stopped the rank ([`RankStopper`]).
    stop_why: Arc<Mutex<Option<String>>>,
    /// The collectives' scratch and channels, set up by the first collective call.
    pub(crate) collectives: Option<Box<CollectiveContext>>,
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
    /// A zero `wait_timeout` ("no limit": every wait has one), the proxy could not be
    /// created or started, or (on a GPU) the driver refused the FIFO's memory.
    pub fn new(
        oob: Arc<dyn OutOfBand>,
        device: Device,
        config: CommunicatorConfig,
    ) -> Result<Self> {
        if config.wait_timeout.is_zero() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: CommunicatorConfig::wait_timeout is zero, which would let device \
                 waits wait forever; every wait needs a limit (the default is 30 s)",
                oob.rank()
            )));
        }
        if let Err(why) = TransportChoice::from_env() {
            return Err(Error::InvalidUsage(format!("rank {}: {why}", oob.rank())));
        }
        device.allow_corun();
        let mut proxy = device.proxy_service(ProxyConfig {
            rank: oob.rank(),
            fifo_size: config.fifo_size,
            wait_timeout: config.wait_timeout,
            assist: config.proxy_assist,
            idle: config.proxy_idle.unwrap_or_default(),
            share_thread: config.shared_proxy_thread.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .is_ok_and(|n| n.get() < SHARED_PROXY_BELOW_CORES)
            }),
            cpus: None,
        })?;
        proxy.start()?;
        let ib = match config.transport {
            TransportChoice::Ib => Some(IbTransport::open(oob.rank())?),
            TransportChoice::Auto if !oob.single_node() && cfg!(feature = "ib") => {
                match IbTransport::open(oob.rank()) {
                    Ok(ib) => Some(ib),
                    Err(why) => {
                        tracing::info!(rank = oob.rank(), %why, "no InfiniBand / RoCE");
                        None
                    }
                }
            }
            _ => None,
        };
        tracing::info!(
            rank = oob.rank(),
            transport = %config.transport,
            single_node = oob.single_node(),
            "port channels: {}",
            match config.transport {
                TransportChoice::Auto if oob.single_node() => "host IPC (auto, one node)",
                TransportChoice::Auto if ib.is_some() => {
                    "host IPC on this node, InfiniBand / RoCE to other nodes (auto)"
                }
                TransportChoice::Auto => "host IPC on this node, Ethernet to other nodes (auto)",
                TransportChoice::HostIpc => "host IPC",
                TransportChoice::Ethernet => "Ethernet",
                TransportChoice::Ib => "InfiniBand / RoCE",
            }
        );
        let peer_watch = PeerWatch::new(oob.rank(), oob.clone(), proxy.failure_sink());
        Ok(Communicator {
            oob,
            device,
            proxy,
            config,
            memory_ids: HashMap::new(),
            setups: HashMap::new(),
            channels: HashMap::new(),
            channel_counts: HashMap::new(),
            memory_channels: 0,
            ethernet_registry: Arc::new(EthernetRegistry::new()),
            ethernet: None,
            ethernet_connections: HashMap::new(),
            ethernet_staging: None,
            ib,
            peer_watch,
            mappings: HashMap::new(),
            cuda_mappings: HashMap::new(),
            semaphores: SemaphoreArena::default(),
            stop_why: Arc::new(Mutex::new(None)),
            collectives: None,
        })
    }

    /// Joins the job the launcher started (torchrun, Open MPI, Slurm, PMI, or
    /// `OXCCL_UNIQUE_ID` with `RANK`/`WORLD_SIZE`; see `oxccl_bootstrap::Bootstrap::from_env`)
    /// and creates this rank's communicator on the device given by `OXCCL_BACKEND`
    /// (default: the CPU emulator), the local rank's ([`Device::for_local_rank`]).
    ///
    /// # Errors
    /// No launcher environment, the bootstrap failed, or the device or proxy could not be
    /// created.
    pub fn from_env(config: CommunicatorConfig) -> Result<Self> {
        let bootstrap = oxccl_bootstrap::Bootstrap::from_env()?;
        let device = Device::for_local_rank(Backend::from_env()?, bootstrap.local_rank())?;
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

    /// The settings.
    pub fn config(&self) -> &CommunicatorConfig {
        &self.config
    }

    /// The out-of-band exchange.
    pub fn out_of_band(&self) -> &dyn OutOfBand {
        &*self.oob
    }

    /// The rank's proxy service.
    pub fn proxy(&self) -> &ProxyService {
        &self.proxy
    }

    /// A handle that stops this rank's kernels from any thread (see [`RankStopper`]).
    pub fn stopper(&self) -> RankStopper {
        RankStopper {
            stop: self.proxy.stop_word(),
            why: self.stop_why.clone(),
        }
    }

    /// Device memory for `len` elements, not initialized (see [`Device::alloc`]).
    ///
    /// # Errors
    /// The allocation failed.
    pub fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.device.alloc(len)
    }

    /// Zeroed device memory for `len` elements.
    ///
    /// # Errors
    /// The allocation failed.
    pub fn alloc_zeroed<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.device.alloc_zeroed(len)
    }

    /// Registers `buffer` so peers can reach it; hand the result to them (see
    /// [`Self::all_gather_memory`]). The registration, and every channel built from it,
    /// keeps the buffer's memory allocated.
    ///
    /// When port channels may run over Ethernet (see [`CommunicatorConfig::transport`]),
    /// the registration also gets an id in this rank's Ethernet table, which then keeps the
    /// memory allocated as long as the communicator. When they may run over InfiniBand /
    /// RoCE, the memory is registered with the RDMA device (which keeps it as long as the
    /// communicator too) and carries its remote key.
    ///
    /// A buffer of a CUDA device is registered with its CUDA IPC handle (for ranks in
    /// other processes; ranks of this process reach it at its own address).
    ///
    /// # Errors
    /// A buffer of another device's backend than the communicator's; the driver refused to
    /// export a CUDA buffer; too many Ethernet registrations; the RDMA device refused the
    /// memory.
    pub fn register<T: bytemuck::Pod>(&self, buffer: &DeviceBuffer<T>) -> Result<RegisteredMemory> {
        let memory = buffer.memory().clone();
        let rank = self.rank();
        if matches!(memory, BufferMemory::Cuda(_)) != self.emulator().is_none() {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: a buffer of {:?} cannot be registered with a communicator of {:?}",
                buffer.device(),
                self.device
            )));
        }
        let mut registered = RegisteredMemory::new_local(
            rank,
            memory,
            0,
            buffer.size_bytes() as u64,
            vec![self.node_transport()],
        )?;
        if self.ethernet_possible() {
            self.make_ethernet_reachable(&mut registered)?;
        }
        if let Some(ib) = &self.ib {
            ib.register(&mut registered, false)?;
        }
        Ok(registered)
    }

    /// The transport between ranks of one node: host IPC on the emulator, CUDA IPC on a GPU.
    fn node_transport(&self) -> Transport {
        match self.emulator() {
            Some(_) => Transport::HostIpc,
            None => Transport::CudaIpc,
        }
    }

    /// The device's emulator (CPU backend), which maps peers' host IPC memory; `None` on a
    /// GPU.
    fn emulator(&self) -> Option<&Arc<CpuDevice>> {
        match self.device.kind() {
            DeviceKind::Cpu(cpu) => Some(cpu),
            DeviceKind::Cuda(_) => None,
        }
    }

    /// Whether port channels of this communicator may run over Ethernet.
    fn ethernet_possible(&self) -> bool {
        match self.config.transport {
            TransportChoice::Auto => !self.oob.single_node() && self.ib.is_none(),
            TransportChoice::HostIpc | TransportChoice::Ib => false,
            TransportChoice::Ethernet => true,
        }
    }

    /// Gives a local registration an id in this rank's Ethernet table (memory of a GPU
    /// too: its receivers then stage it, see `ethernet_staging.rs`).
    fn make_ethernet_reachable(&self, memory: &mut RegisteredMemory) -> Result<()> {
        let Some(owner) = memory.owner() else {
            return Err(Error::Internal(
                "only a registration made here can be made reachable over Ethernet".into(),
            ));
        };
        let id = self
            .ethernet_registry
            .add(memory.addr(), memory.size(), owner.share())
            .map_err(|e| Error::InvalidUsage(format!("rank {}: {e}", self.rank())))?;
        memory.set_ethernet_id(id);
        Ok(())
    }

    /// How the Ethernet transport reaches this rank's memory, if not at its address: a
    /// GPU's through pinned buffers and the device's copies; the emulator's through plain
    /// copies where [`CommunicatorConfig::ethernet_staging`] asks. Made once.
    ///
    /// # Errors
    /// The GPU cannot write counters from a stream.
    fn ethernet_staging(&mut self) -> Result<Option<Arc<dyn Staging>>> {
        if let Some(staging) = &self.ethernet_staging {
            return Ok(staging.clone());
        }
        let staging: Option<Arc<dyn Staging>> = match self.device.kind() {
            DeviceKind::Cuda(device) => Some(Arc::new(CudaStaging::new(
                device,
                self.config.wait_timeout,
            )?)),
            DeviceKind::Cpu(_) if self.config.ethernet_staging => Some(Arc::new(HostStaging)),
            DeviceKind::Cpu(_) => None,
        };
        if let Some(staging) = &staging {
            tracing::info!(
                rank = self.rank(),
                staging = staging.name(),
                "Ethernet stages memory"
            );
        }
        self.ethernet_staging = Some(staging.clone());
        Ok(staging)
    }

    /// Every rank's registered memory, indexed by rank (a collective call). Our own entry is
    /// `mine` itself (with its share of the memory). Keep `mine` (or the buffer) until the
    /// channels built on it exist: a peer maps it while building them.
    ///
    /// # Errors
    /// The exchange failed, or a peer sent something that is not a valid registered memory
    /// of its own rank.
    pub fn all_gather_memory(&self, mine: &RegisteredMemory) -> Result<Vec<RegisteredMemory>> {
        let all = self.oob.all_gather(mine.to_bytes()?)?;
        all.iter()
            .enumerate()
            .map(|(rank, bytes)| {
                if rank as u32 == self.rank() {
                    return Ok(mine.clone());
                }
                let theirs = RegisteredMemory::from_bytes(bytes)?;
                if theirs.rank() != rank as u32 {
                    return Err(Error::InvalidUsage(format!(
                        "rank {}: rank {rank} sent a registered memory of rank {}",
                        self.rank(),
                        theirs.rank()
                    )));
                }
                Ok(theirs)
            })
            .collect()
    }

    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// The exchange failed or timed out.
    pub fn barrier(&self) -> Result<()> {
        // A kernel this thread launched and left for its `synchronize` may be what the
        // other ranks wait for before they reach the barrier.
        crate::cpu::deferral::start_own(None);
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
        if peer == self.rank() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: {what} to itself: a channel connects two ranks (its buffers would \
                 alias each other)",
                self.rank()
            )));
        }
        Ok(())
    }

    /// Swaps inbound semaphore counters with `peer` for a channel of `kind` with `key`:
    /// sends ours, returns theirs (checked). The message also says what channel each side
    /// builds, so that two ranks building their channels to each other in different orders
    /// (or with different keys) get an error instead of each other's semaphores.
    fn swap_inbound(
        &mut self,
        peer: u32,
        kind: ChannelKind,
        key: u64,
        transport: Transport,
        cells: &SemaphoreCells,
    ) -> Result<RegisteredMemory> {
        let tag = self.next_tag(peer, TAG_CHANNEL_SETUP);
        let mut mine = cells.inbound_memory(self.rank(), vec![self.node_transport()])?;
        if transport == Transport::Ethernet {
            self.make_ethernet_reachable(&mut mine)?;
        }
        if let (Transport::Ib(_), Some(ib)) = (transport, &self.ib) {
            ib.register(&mut mine, true)?;
        }
        let code = channel_kind_code(kind) | transport_code(transport) << 8;
        let mut message = Vec::with_capacity(64);
        message.extend_from_slice(&code.to_le_bytes());
        message.extend_from_slice(&key.to_le_bytes());
        message.extend_from_slice(&mine.to_bytes()?);
        self.oob.send(peer, tag, message)?;
        let answer = self.oob.recv(peer, tag)?;
        let rank = self.rank();
        if answer.len() < 16 {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: peer {peer} answered a channel setup with {} bytes",
                answer.len()
            )));
        }
        let word = |at: usize| u64::from_le_bytes(answer[at..at + 8].try_into().unwrap_or([0; 8]));
        let (their_code, their_key) = (word(0), word(8));
        let their_kind = their_code & 0xff;
        if their_kind != channel_kind_code(kind) || their_key != key {
            let theirs = match their_kind {
                0 => "port".to_string(),
                1 => "memory".to_string(),
                other => format!("unknown ({other})"),
            };
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: channel setup with peer {peer}: this rank builds a {kind} channel \
                 with key {key}, peer {peer} a {theirs} channel with key {their_key}; two ranks \
                 must build their channels to each other in the same order, with the same keys"
            )));
        }
        if their_code != code {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: {kind} channel setup with peer {peer} (key {key}): this rank uses \
                 {transport}, peer {peer} {}; every rank of a job must choose the same transport \
                 (CommunicatorConfig::transport, OXCCL_TRANSPORT)",
                transport_name(their_code >> 8)
            )));
        }
        let theirs = RegisteredMemory::from_bytes(&answer[16..])?;
        if theirs.rank() != peer
            || theirs.size() < 8
            || (transport == Transport::Ethernet) != theirs.ethernet_id().is_some()
            || matches!(transport, Transport::Ib(_)) != theirs.ib_rkey().is_some()
        {
            return Err(Error::InvalidUsage(format!(
                "rank {}: peer {peer} answered a {transport} channel setup with a semaphore of \
                 rank {} ({} bytes, Ethernet id {:?}, RDMA key {:?})",
                self.rank(),
                theirs.rank(),
                theirs.size(),
                theirs.ethernet_id(),
                theirs.ib_rkey()
            )));
        }
        Ok(theirs)
    }

    /// Tells `peer` that this side of a channel setup is done (everything of the peer's
    /// that it needs is mapped here) and waits until the peer says the same. Without it a
    /// rank could finish, and free its memory, before the peer had mapped it.
    fn setup_done(&mut self, peer: u32) -> Result<()> {
        let tag = self.next_tag(peer, TAG_SETUP_DONE);
        self.oob.send(peer, tag, Vec::new())?;
        self.oob.recv(peer, tag).map(drop)
    }

    /// `memory` as reachable here, holding a share of what keeps it there: our own memory
    /// (a registration made by this rank), or a mapping of another rank's shared object,
    /// made once after checking its handle and kept as long as anything uses it.
    ///
    /// # Errors
    /// Memory of this rank that is not a registration made here; memory of another rank
    /// that carries no host IPC handle, lives on another node, or whose handle fails the
    /// checks of [`HostIpcHandle::map`](crate::host_ipc::HostIpcHandle::map): each refused
    /// before anything is mapped.
    pub fn reach(&mut self, memory: &RegisteredMemory) -> Result<MemoryRegion> {
        let rank = self.rank();
        if memory.rank() == rank {
            let Some(owner) = memory.owner() else {
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: memory of this rank must be a registration made here (the \
                     one `register` returned, which holds the buffer), not a copy of it"
                )));
            };
            let region = MemoryRegion::new(rank, memory.addr(), memory.size());
            return Ok(region.with_keep_alive(owner.share()));
        }
        if memory.cuda_ipc().is_some() {
            return self.reach_cuda(memory);
        }
        let Some((handle, offset)) = memory.host_ipc() else {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} carries no host IPC handle, so it cannot be \
                 mapped here",
                memory.rank()
            )));
        };
        if !memory.transports().contains(&Transport::HostIpc) {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} is not reachable over host IPC",
                memory.rank()
            )));
        }
        let Some(cpu) = self.emulator().cloned() else {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} is emulator memory, and this rank runs on {:?}",
                memory.rank(),
                self.device
            )));
        };
        let key = (handle.node.clone(), handle.pid, handle.inode);
        let pid = handle.pid;
        let mapping = match self.mappings.entry(key) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => e
                .insert(Arc::new(PeerMapping::new(
                    handle.map()?,
                    cpu,
                    self.config.wait_timeout,
                )))
                .clone(),
        };
        let fits = offset
            .checked_add(memory.size())
            .is_some_and(|end| end <= mapping.len());
        if !fits {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} ({} bytes at offset {offset}) lies outside \
                 its {}-byte object",
                memory.rank(),
                memory.size(),
                mapping.len()
            )));
        }
        // Mapped: the peer is alive now, so its process can be watched from here on.
        self.peer_watch.watch(memory.rank(), pid);
        let region = MemoryRegion::new(memory.rank(), mapping.addr() + offset, memory.size());
        Ok(region.with_keep_alive(mapping))
    }

    /// [`Self::reach`] for memory of a CUDA device: at its own address when it belongs to a
    /// rank of this process (holding a share of the allocation), else through a mapping of
    /// its CUDA IPC handle, opened once per peer allocation and kept as long as anything
    /// uses it.
    ///
    /// A peer's memory on another GPU of this process is reached at its address too, after
    /// enabling this GPU's access to that one (an error where the two have no peer access).
    fn reach_cuda(&mut self, memory: &RegisteredMemory) -> Result<MemoryRegion> {
        let rank = self.rank();
        let (peer, size) = (memory.rank(), memory.size());
        let (DeviceKind::Cuda(device), Some(handle)) = (self.device.kind(), memory.cuda_ipc())
        else {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {peer} is on a CUDA device, and this rank runs on \
                 {:?}",
                self.device
            )));
        };
        if memory.node() != node_name() {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {peer} is on node {:?}, and CUDA IPC reaches only \
                 this node",
                memory.node()
            )));
        }
        if memory.process_id() == std::process::id() {
            let owner = memory
                .cuda_share()
                .and_then(|token| registered_shares::find(token, memory.addr(), size))
                .ok_or_else(|| {
                    Error::InvalidUsage(format!(
                        "rank {rank}: memory of rank {peer} ({size} bytes at {:#x}) is not a \
                         live registration of this process",
                        memory.addr()
                    ))
                })?;
            // Kernels and copies of this rank's GPU reach the peer's: peer access, if the
            // peer's memory is on another GPU.
            device.context.enable_peer_access(&owner.device().context)?;
            let region = MemoryRegion::new(peer, memory.addr(), size);
            return Ok(region.with_keep_alive(owner));
        }
        let key = (memory.node().to_owned(), memory.process_id(), handle.handle);
        let mapping = match self.cuda_mappings.entry(key) {
            Entry::Occupied(e) => e.get().clone(),
            Entry::Vacant(e) => e
                .insert(Arc::new(CudaIpcMapping::open(device, handle)?))
                .clone(),
        };
        self.peer_watch.watch(peer, memory.process_id());
        let region = MemoryRegion::new(peer, mapping.addr_of(handle), size);
        Ok(region.with_keep_alive(mapping))
    }

    /// The transport of a port channel writing `dst` (a peer's memory), as the configured
    /// choice has it. Both ends decide the same: `auto` looks at whether the other's memory
    /// is on this node, which is true from both sides or from neither.
    fn port_transport(&self, dst: &RegisteredMemory) -> Transport {
        match self.config.transport {
            TransportChoice::HostIpc => self.node_transport(),
            TransportChoice::Ethernet => Transport::Ethernet,
            TransportChoice::Auto if dst.node() == node_name() => self.node_transport(),
            TransportChoice::Auto | TransportChoice::Ib => self.network_transport(),
        }
    }

    /// The transport to other nodes: InfiniBand / RoCE where this rank opened an RDMA
    /// device, else Ethernet.
    fn network_transport(&self) -> Transport {
        match &self.ib {
            Some(ib) => Transport::Ib(ib.device_index()),
            None => Transport::Ethernet,
        }
    }

    /// The connection this rank's proxy writes `peer`'s memory over through the RDMA
    /// device, made on first use. Pairwise: the peer makes its own to us at the same point,
    /// through the exchange.
    fn ib_connection(&mut self, peer: u32) -> Result<Arc<dyn Connection>> {
        let Some(mut ib) = self.ib.take() else {
            return Err(Error::Internal(format!(
                "rank {}: an InfiniBand / RoCE channel without an RDMA device",
                self.rank()
            )));
        };
        let timeout = self.config.wait_timeout;
        let connection = ib.connection(peer, timeout, |mine| {
            let tag = self.next_tag(peer, TAG_IB_SETUP);
            self.oob.send(peer, tag, mine)?;
            self.oob.recv(peer, tag)
        });
        self.ib = Some(ib);
        connection
    }

    /// A peer's `memory` as the proxy names it over Ethernet: its owner's id, no address.
    ///
    /// # Errors
    /// Memory of this rank, or memory its owner did not make reachable over Ethernet.
    pub fn reach_over_ethernet(&self, memory: &RegisteredMemory) -> Result<MemoryRegion> {
        let rank = self.rank();
        match memory.ethernet_id() {
            Some(id) if memory.rank() != rank => {
                Ok(MemoryRegion::new(memory.rank(), 0, memory.size()).with_registration_id(id))
            }
            Some(_) => Err(Error::InvalidUsage(format!(
                "rank {rank}: its own memory is not reached over Ethernet"
            ))),
            None => Err(Error::InvalidUsage(format!(
                "rank {rank}: memory of rank {} is not reachable over Ethernet (registered with \
                 the transport choice {}?): every rank must choose the same transport",
                memory.rank(),
                TransportChoice::HostIpc
            ))),
        }
    }

    /// This rank's Ethernet endpoint, bound on first use: its listener, and the receivers of
    /// the connections it admitted. Channels set it up themselves; this is for programs that
    /// speak the wire format ([`crate::ethernet_wire`]) on their own.
    ///
    /// # Errors
    /// The listener could not be bound.
    pub fn ethernet_endpoint(&mut self) -> Result<&EthernetEndpoint> {
        if self.ethernet.is_none() {
            let ip = self
                .oob
                .local_ip()
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            let staging = self.ethernet_staging()?;
            self.ethernet = Some(
                EthernetEndpoint::bind(
                    self.rank(),
                    ip,
                    self.ethernet_registry.clone(),
                    self.proxy.failure_sink(),
                    self.config.wait_timeout,
                )?
                .staged(staging),
            );
        }
        self.ethernet
            .as_ref()
            .ok_or_else(|| Error::Internal("Ethernet endpoint missing".into()))
    }

    /// The connection this rank's proxy writes `peer`'s memory over, opened on first use.
    /// Pairwise: the peer opens its own to us at the same point, through the exchange.
    fn ethernet_connection(&mut self, peer: u32) -> Result<Arc<EthernetConnection>> {
        if let Some(connection) = self.ethernet_connections.get(&peer) {
            return Ok(connection.clone());
        }
        let rank = self.rank();
        let addr = self.ethernet_endpoint()?.local_addr();
        let token = new_token()?;
        let tag = self.next_tag(peer, TAG_ETHERNET_SETUP);
        let mine = postcard::to_stdvec(&EthernetSetup { addr, token })
            .map_err(|e| Error::Internal(format!("encoding an Ethernet setup: {e}")))?;
        self.oob.send(peer, tag, mine)?;
        let answer = self.oob.recv(peer, tag)?;
        let theirs = (answer.len() <= MAX_ETHERNET_SETUP_BYTES)
            .then(|| postcard::from_bytes::<EthernetSetup>(&answer).ok())
            .flatten()
            .ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "rank {rank}: peer {peer} answered an Ethernet setup with {} bytes that are \
                     not one",
                    answer.len()
                ))
            })?;
        // Connecting does not wait for the peer to accept (the listener's backlog does), so
        // both ranks connect first and then admit each other's connection.
        let stager = self.ethernet_staging()?.map(|s| s.stager()).transpose()?;
        let connection = EthernetConnection::connect(
            rank,
            peer,
            theirs.addr,
            theirs.token,
            self.config.wait_timeout,
        )?
        .staged(stager);
        self.ethernet_endpoint()?.accept(peer, &token)?;
        connection.wait_welcome()?;
        tracing::info!(rank, peer, to = %theirs.addr, "Ethernet connection up");
        let connection = Arc::new(connection);
        self.ethernet_connections.insert(peer, connection.clone());
        Ok(connection)
    }

    fn memory_id(&mut self, region: MemoryRegion) -> Result<MemoryId> {
        let key = (
            region.owner_rank,
            region.addr,
            region.size,
            region.registration_id,
            region.rdma,
        );
        if let Some(&id) = self.memory_ids.get(&key) {
            return Ok(id);
        }
        let id = self.proxy.add_memory(region)?;
        self.memory_ids.insert(key, id);
        Ok(id)
    }

    /// The next channel of `kind` to `peer`, as errors will name it, and its abort record.
    fn new_channel(
        &mut self,
        kind: ChannelKind,
        peer: u32,
    ) -> Result<(ChannelRef, HostCell<AbortRecord>)> {
        let count = self.channel_counts.entry((kind, peer)).or_insert(0);
        let channel = ChannelRef {
            kind,
            peer,
            index: *count,
        };
        *count += 1;
        Ok((channel, self.device.host_cell(AbortRecord::new())?))
    }

    fn channel_abort(
        &mut self,
        channel: ChannelRef,
        record: HostCell<AbortRecord>,
        site: u32,
    ) -> ChannelAbort {
        self.channels.insert(
            site,
            ChannelEntry {
                channel,
                record: record.clone(),
            },
        );
        ChannelAbort {
            record,
            stop: self.proxy.stop_word(),
            timeout: self.config.wait_timeout,
            site,
        }
    }

    /// A peer's `memory` as a port channel's proxy writes it over `transport`: by its
    /// owner's id over the network transports, mapped here over the others.
    ///
    /// # Errors
    /// Memory of this rank, or memory its owner did not make reachable over `transport`.
    fn reach_over(
        &mut self,
        transport: Transport,
        memory: &RegisteredMemory,
    ) -> Result<MemoryRegion> {
        match transport {
            Transport::Ethernet => self.reach_over_ethernet(memory),
            Transport::Ib(_) => reach_over_ib(self.rank(), memory),
            _ => self.reach(memory),
        }
    }

    /// `memory` of `channel`'s peer as a destination the channel's puts may name
    /// ([`DstMemoryId`], through
    /// [`with_memories`](oxccl_device::port_channel::PortChannelDeviceHandle::with_memories))
    /// besides the one it was built with: MSCCL++'s `ProxyService::addMemory`. One channel
    /// to a peer can so move data into any of the peer's registered memories, without a
    /// semaphore and a channel for each. Local: no exchange with the peer; asking again for the same
    /// memory gives the same id. The id is valid for the channels to that peer over the
    /// same transport; the proxy refuses it on any other (a reported channel failure).
    ///
    /// # Errors
    /// A channel of another communicator, memory of a rank other than the channel's peer,
    /// memory the peer did not make reachable over the channel's transport, or more
    /// memories than the proxy can name.
    pub fn port_dst_memory(
        &mut self,
        channel: &PortChannel,
        memory: &RegisteredMemory,
    ) -> Result<DstMemoryId> {
        let rank = self.rank();
        let known = self.channels.get(&channel.id()).map(|e| e.channel);
        if known != Some(channel.channel()) {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: {} is not a port channel of this communicator",
                channel.channel()
            )));
        }
        if memory.rank() != channel.peer() {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: the destination of a put on {} must be memory of its peer {}, \
                 not of rank {}",
                channel.channel(),
                channel.peer(),
                memory.rank()
            )));
        }
        let region = self.reach_over(channel.transport(), memory)?;
        Ok(DstMemoryId::from_raw(self.memory_id(region)?.0))
    }

    /// `memory` of this rank as a source the puts of any of its port channels may name
    /// ([`SrcMemoryId`], through
    /// [`with_memories`](oxccl_device::port_channel::PortChannelDeviceHandle::with_memories))
    /// besides the one each was built with; see [`Self::port_dst_memory`].
    ///
    /// # Errors
    /// Memory of another rank, a copy of a registration instead of the one `register`
    /// returned, or more memories than the proxy can name.
    pub fn port_src_memory(&mut self, memory: &RegisteredMemory) -> Result<SrcMemoryId> {
        let region = self.own_source(memory)?;
        Ok(SrcMemoryId::from_raw(self.memory_id(region)?.0))
    }

    /// `memory` as a put's source at this rank: memory of this rank, reached here.
    fn own_source(&mut self, memory: &RegisteredMemory) -> Result<MemoryRegion> {
        if memory.rank() != self.rank() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: the source of a put must be memory of this rank, not of rank {}",
                self.rank(),
                memory.rank()
            )));
        }
        self.reach(memory)
    }

    /// `memory` of this rank as a put source with an id of its own at the proxy (not shared
    /// with [`Self::port_src_memory`]'s), for memory that comes and goes: the collectives'
    /// registered buffers. [`Self::release_port_source`] gives the id back.
    ///
    /// # Errors
    /// As [`Self::port_src_memory`].
    pub(crate) fn port_source(&mut self, memory: &RegisteredMemory) -> Result<SrcMemoryId> {
        let region = self.own_source(memory)?;
        Ok(SrcMemoryId::from_raw(self.proxy.add_memory(region)?.0))
    }

    /// Gives back an id of [`Self::port_source`]: triggers naming it are refused from now on,
    /// and the proxy drops its share of the memory. Only once no trigger naming it is
    /// queued (the kernels that pushed them have completed, having waited for them).
    ///
    /// # Errors
    /// An id the proxy does not know.
    pub(crate) fn release_port_source(&mut self, id: SrcMemoryId) -> Result<()> {
        Ok(self.proxy.remove_memory(MemoryId(id.raw()))?)
    }

    /// A port channel to `peer` that copies from `src` (ours) into `dst` (the peer's).
    /// Pairwise: `peer` must build its channel to us at the same point.
    ///
    /// # Errors
    /// A peer out of range or this rank itself, memories of the wrong ranks, memory that
    /// cannot be reached, or a failed exchange.
    pub fn port_channel(
        &mut self,
        peer: u32,
        dst: &RegisteredMemory,
        src: &RegisteredMemory,
    ) -> Result<PortChannel> {
        self.port_channel_keyed(peer, 0, dst, src)
    }

    /// [`Self::port_channel`] with a key the peer's matching setup must name too: a rank
    /// that builds its channels to a peer in another order than the peer gets an error
    /// naming both keys, instead of the peer's semaphore of another channel. (Unkeyed
    /// setups have key 0.)
    ///
    /// # Errors
    /// As [`Self::port_channel`]; the peer's setup at this point is of another kind or key.
    pub fn port_channel_keyed(
        &mut self,
        peer: u32,
        key: u64,
        dst: &RegisteredMemory,
        src: &RegisteredMemory,
    ) -> Result<PortChannel> {
        self.check_peer(peer, "port channel")?;
        if dst.rank() != peer || src.rank() != self.rank() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: port channel to peer {peer} needs the peer's destination (got rank {}) \
                 and our source (got rank {})",
                self.rank(),
                dst.rank(),
                src.rank()
            )));
        }
        let transport = self.port_transport(dst);
        tracing::debug!(rank = self.rank(), peer, key, %transport, "port channel");
        let cells = self.semaphores.cells(&self.device)?;
        let remote_inbound = self.swap_inbound(peer, ChannelKind::Port, key, transport, &cells)?;
        let connection: Arc<dyn Connection> = match transport {
            Transport::Ethernet => self.ethernet_connection(peer)?,
            Transport::Ib(_) => self.ib_connection(peer)?,
            Transport::CudaIpc => Arc::new(CudaIpcConnection::new(
                &self.device,
                peer,
                self.config.wait_timeout,
            )?),
            _ => Arc::new(HostIpcConnection::new(peer)),
        };
        let remote_inbound = self.reach_over(transport, &remote_inbound)?;
        let dst = self.reach_over(transport, dst)?;
        let src = self.reach(src)?;
        let (channel, record) = self.new_channel(ChannelKind::Port, peer)?;
        let id = self
            .proxy
            .add_channel(connection, remote_inbound, record.clone())?;
        let ids = PortChannelIds {
            semaphore_id: id.0,
            dst_memory_id: self.memory_id(dst)?.0,
            src_memory_id: self.memory_id(src)?.0,
            reserved: 0,
        };
        let abort = self.channel_abort(channel, record, id.0);
        self.setup_done(peer)?;
        Ok(PortChannel {
            channel,
            ids,
            fifo: self.proxy.fifo_cells(),
            semaphore: cells,
            abort,
            transport,
            waker: self.proxy.waker(),
        })
    }

    /// A memory channel to `peer`: kernels write `remote` (the peer's) from `local` (ours),
    /// and unpack LL packets the peer sends into `packets` (ours), if given.
    /// Pairwise: `peer` must build its channel to us at the same point.
    ///
    /// # Errors
    /// A peer out of range or this rank itself, memories of the wrong ranks, memory that
    /// cannot be reached, or a failed exchange.
    pub fn memory_channel(
        &mut self,
        peer: u32,
        remote: &RegisteredMemory,
        local: &RegisteredMemory,
        packets: Option<&RegisteredMemory>,
    ) -> Result<MemoryChannel> {
        self.memory_channel_keyed(peer, 0, remote, local, packets)
    }

    /// [`Self::memory_channel`] with a key the peer's matching setup must name too (see
    /// [`Self::port_channel_keyed`]).
    ///
    /// # Errors
    /// As [`Self::memory_channel`]; the peer's setup at this point is of another kind or
    /// key.
    pub fn memory_channel_keyed(
        &mut self,
        peer: u32,
        key: u64,
        remote: &RegisteredMemory,
        local: &RegisteredMemory,
        packets: Option<&RegisteredMemory>,
    ) -> Result<MemoryChannel> {
        self.check_peer(peer, "memory channel")?;
        let ours = |m: Option<&RegisteredMemory>| m.is_none_or(|m| m.rank() == self.rank());
        if remote.rank() != peer || !ours(Some(local)) || !ours(packets) {
            return Err(Error::InvalidUsage(format!(
                "rank {}: memory channel to peer {peer} needs the peer's remote memory (got rank \
                 {}) and our local and packet memories",
                self.rank(),
                remote.rank()
            )));
        }
        if self.config.transport.network_only()
            || (self.config.transport == TransportChoice::Auto && remote.node() != node_name())
        {
            return Err(Error::InvalidUsage(format!(
                "rank {}: a memory channel to peer {peer} needs load/store access to its memory, \
                 which a network transport does not give (transport {}, peer on node {:?}): use \
                 a port channel, or the host-ipc transport between ranks of one node",
                self.rank(),
                self.config.transport,
                remote.node()
            )));
        }
        let cells = self.semaphores.cells(&self.device)?;
        let transport = self.node_transport();
        let remote_inbound =
            self.swap_inbound(peer, ChannelKind::Memory, key, transport, &cells)?;
        let remote_inbound = self.reach(&remote_inbound)?;
        let remote = self.reach(remote)?;
        let local = self.reach(local)?;
        let packets = packets.map(|p| self.reach(p)).transpose()?;
        let (channel, record) = self.new_channel(ChannelKind::Memory, peer)?;
        let site = MEMORY_CHANNEL_SITE_BASE + self.memory_channels;
        self.memory_channels += 1;
        let abort = self.channel_abort(channel, record, site);
        self.setup_done(peer)?;
        Ok(MemoryChannel {
            channel,
            semaphore: cells,
            remote_inbound,
            remote,
            local,
            packets,
            abort,
        })
    }

    /// A grid barrier on this rank's device (see [`GridBarrier`]): its waits give up after
    /// the communicator's `wait_timeout` and stop when the rank is stopped, and a timeout
    /// stops the rank's other waits and is reported by [`Self::check`], as a channel's is.
    ///
    /// # Errors
    /// The allocation failed.
    pub fn grid_barrier(&self) -> Result<GridBarrier> {
        GridBarrier::new(
            &self.device,
            self.config.wait_timeout,
            Some(self.proxy.stop_word()),
        )
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
                "rank {}: a ring needs at least two ranks and one memory per rank (got {} ranks, \
                 {} memories)",
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
    /// kernels or this rank's channels and proxy. When a kernel returned an error because a
    /// channel failed, the channel's failure (what, where, with which counts and offsets) is
    /// reported, naming the kernel.
    ///
    /// # Errors
    /// A stuck or failed kernel, or a channel failure named by rank, channel and peer.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let launched = stream.synchronize();
        let checked = self.check();
        match (launched, checked) {
            (Ok(()), checked) => checked,
            (Err(Error::KernelError { kernel, .. }), Err(Error::Channel(mut channel))) => {
                channel.kernel = Some(kernel);
                Err(Error::Channel(channel))
            }
            // The kernel returned an error because something failed first: report that.
            (Err(launch @ Error::KernelError { .. }), Err(cause)) => {
                tracing::error!(error = %launch, "rank {}: kernel stopped", self.rank());
                Err(cause)
            }
            (Err(launch), Err(checked)) => {
                tracing::error!(error = %checked, "also failed on rank {}", self.rank());
                Err(launch)
            }
            (Err(launch), Ok(())) => Err(launch),
        }
    }

    /// Reports what went wrong in kernels or the proxy since the last call: a refused
    /// trigger, a failed connection, a stalled FIFO, a device call that timed out or was
    /// refused, the host stopping the rank; the first cause, naming rank, channel and peer
    /// (later failures are logged). Lowers every record once reported, so the rank's next
    /// kernels can run (a channel the proxy stopped stays stopped).
    ///
    /// # Errors
    /// The first failure found.
    pub fn check(&self) -> Result<()> {
        let proxy = self.proxy.check();
        let stop = self.proxy.stop_reason();
        let mut failed: Vec<(u32, ChannelRef, AbortReason)> = self
            .channels
            .iter()
            .filter_map(|(&site, e)| e.record.read().map(|r| (site, e.channel, r)))
            .collect();
        failed.sort_by_key(|f| f.0);
        for e in self.channels.values() {
            e.record.clear();
        }
        self.proxy.clear_stop();
        let why = self.stop_why.lock().take();
        if let Err(e) = proxy {
            return Err(e.into());
        }
        // The root cause: the channel that raised the stop word, else any failed channel.
        let root = stop
            .and_then(|s| failed.iter().position(|f| f.0 == s.site))
            .or_else(|| (!failed.is_empty()).then_some(0));
        for (i, (_, channel, reason)) in failed.iter().enumerate() {
            if Some(i) != root {
                tracing::error!(%channel, ?reason, "rank {}: also failed", self.rank());
            }
        }
        if let Some(i) = root {
            let (_, channel, reason) = failed[i];
            return Err(self.channel_error(channel, reason));
        }
        match stop {
            None => Ok(()),
            Some(s) if s.site == HOST_STOP_SITE => Err(Error::Aborted(format!(
                "rank {}: stopped by the host: {}",
                self.rank(),
                why.unwrap_or_else(|| "no reason given".into())
            ))),
            Some(s) if s.site == GRID_BARRIER_SITE => Err(match s.error {
                Some(DeviceError::Timeout) => Error::Timeout {
                    what: format!(
                        "rank {}: a grid barrier: not every block of the kernel reached it \
                         (`GridBarrier::check` has the counts)",
                        self.rank()
                    ),
                    after: self.config.wait_timeout,
                },
                error => Error::InvalidUsage(format!(
                    "rank {}: a grid barrier refused a call ({error:?} in {}; \
                     `GridBarrier::check` has the details)",
                    self.rank(),
                    s.op
                )),
            }),
            Some(s) if s.site == INBOUND_SITE => Err(Error::Aborted(format!(
                "rank {}: a peer's connection to this rank was refused and closed",
                self.rank()
            ))),
            Some(s) if s.site == FIFO_SITE => Err(Error::Aborted(format!(
                "rank {}: the proxy's FIFO stalled; every port channel is stopped",
                self.rank()
            ))),
            Some(s) => Err(Error::Aborted(format!(
                "rank {}: a device call failed on an unknown channel (site {}): {:?} in {}",
                self.rank(),
                s.site,
                s.error,
                s.op
            ))),
        }
    }

    /// The channel failure an abort record describes.
    fn channel_error(&self, channel: ChannelRef, reason: AbortReason) -> Error {
        let after = self.config.wait_timeout;
        let op = reason.op;
        let cause = match (reason.error, op, reason.detail) {
            (Some(DeviceError::Timeout), DeviceOp::SemaphoreWait, Some([expected, arrived, _])) => {
                ChannelFailure::WaitTimedOut {
                    expected,
                    arrived,
                    after,
                }
            }
            (
                Some(DeviceError::Timeout),
                DeviceOp::ReadPacket | DeviceOp::UnpackPackets,
                Some([offset, flag, seen]),
            ) => ChannelFailure::PacketTimedOut {
                op,
                offset,
                flag: flag as u32,
                seen: seen as u32,
                after,
            },
            (
                Some(DeviceError::Timeout),
                DeviceOp::FifoPush | DeviceOp::FifoSync,
                Some([position, executed, _]),
            ) => ChannelFailure::FifoFull {
                op,
                position,
                executed,
                after,
            },
            (Some(DeviceError::OutOfBounds), op, Some([offset, size, registered]))
                if op != DeviceOp::PortPut =>
            {
                ChannelFailure::OutOfBounds {
                    op,
                    offset,
                    size,
                    registered,
                }
            }
            (Some(DeviceError::InvalidArgument), op, Some(detail)) => {
                ChannelFailure::InvalidArgument { op, detail }
            }
            (Some(DeviceError::Aborted), op, _) => ChannelFailure::Stopped { op },
            (error, op, detail) => ChannelFailure::Other {
                error: error.unwrap_or(DeviceError::Aborted),
                op,
                detail,
            },
        };
        Error::Channel(Box::new(ChannelError {
            rank: self.rank(),
            channel,
            cause,
            kernel: None,
        }))
    }
}

/// How a channel setup message names its transport (shifted above the kind).
fn transport_code(transport: Transport) -> u64 {
    match transport {
        Transport::Ethernet => 1,
        Transport::Ib(_) => 2,
        _ => 0,
    }
}

/// The transport a channel setup message names, for messages.
fn transport_name(code: u64) -> String {
    match code {
        0 => "host-ipc".into(),
        1 => "ethernet".into(),
        2 => "ib".into(),
        other => format!("an unknown transport ({other})"),
    }
}

/// What ranks swap to open an Ethernet connection: where to connect, and the token to
/// present there.
#[derive(Serialize, Deserialize)]
struct EthernetSetup {
    addr: SocketAddr,
    token: [u8; crate::ethernet_wire::TOKEN_BYTES],
}

/// How a channel setup message names its kind.
fn channel_kind_code(kind: ChannelKind) -> u64 {
    match kind {
        ChannelKind::Port => 0,
        ChannelKind::Memory => 1,
    }
}

impl Drop for Communicator {
    /// Waits (bounded by the wait limit) for the device's queued and running launches (on
    /// a GPU: all work of its context, other ranks' in this process too), then stops the
    /// proxy (bounded too). Memory that channels or registrations still hold stays
    /// allocated until they go.
    fn drop(&mut self) {
        // First: peers that watch this process take its end as a death without it.
        self.peer_watch.say_goodbye();
        let limit = self.config.wait_timeout;
        let idle = match self.device.kind() {
            DeviceKind::Cpu(cpu) => cpu.wait_idle(limit),
            DeviceKind::Cuda(gpu) => gpu.wait_idle(limit),
        };
        if !idle {
            tracing::warn!(
                rank = self.rank(),
                "communicator dropped while kernels of its device still run after {limit:?}"
            );
        }
        if let Err(e) = self.proxy.stop() {
            tracing::warn!(rank = self.rank(), error = %e, "stopping the proxy");
        }
    }
}
