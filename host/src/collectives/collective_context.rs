//! What a communicator sets up once for its collectives: the scratch and a channel to every
//! peer (memory channels where every rank can load and store every other's memory, port
//! channels through the proxy otherwise), a grid barrier, and the call counters, created on
//! the first collective call.

use super::collective_config::CollectiveConfig;
use super::port_sources::PortSources;
use super::registered_buffers::RegisteredBuffers;
use super::shape::Shape;
use crate::channel_set::ChannelSet;
use crate::communicator::Communicator;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::grid_barrier::GridBarrier;
use crate::memory_channel::MemoryChannel;
use crate::port_channel::PortChannel;
use oxccl_kernels::collectives::{
    CallProtocol, CollectiveArgs, PortCollectiveArgs, PortLayout, ScratchLayout,
};
use std::collections::HashMap;

/// A communicator's collective state. Every rank creates it at the same call (the first
/// collective), and every call after that runs on it with no allocation and no exchange
/// (but the first call of each shape: see [`super::shape`]).
pub(crate) struct CollectiveContext {
    /// The memory-channel algorithms' state: `None` where some rank cannot load and store
    /// another's memory (ranks on several nodes, or `OXCCL_TRANSPORT=ethernet`).
    pub(crate) memory: Option<MemoryPath>,
    /// The port-channel all-reduce's state, made by the first call that takes it.
    pub(crate) ports: Option<PortPath>,
    /// Where this rank's blocks meet.
    pub(crate) barrier: GridBarrier,
    /// The number of the next round of the memory path (see `CollectiveArgs::sequence`).
    pub(crate) sequence: u64,
    /// The protocol of the memory path's last call and the waits it left owed on this rank
    /// (see `CollectiveArgs::protocol`).
    pub(crate) protocol: CallProtocol,
    /// Shapes every rank has agreed on, with what the agreement found (the largest count
    /// any rank sends any rank, for all-to-all-v).
    pub(crate) agreed: HashMap<Shape, u64>,
    /// The shape of the last call and its entry in `agreed`: a loop of the same call finds
    /// it with a comparison, without hashing the shape (about 2 % of a 1 KiB all-reduce).
    pub(crate) last: Option<(Shape, u64)>,
    /// The settings it was made with.
    pub(crate) config: CollectiveConfig,
}

/// The memory-channel algorithms' state.
pub(crate) struct MemoryPath {
    /// The layout of `scratch`, the same on every rank.
    pub(crate) layout: ScratchLayout,
    /// The memory channel to every peer (remote: the peer's scratch; local and packets:
    /// ours), by peer.
    pub(crate) peers: ChannelSet<'static, MemoryChannel>,
    /// The buffers registered for zero-copy calls.
    pub(crate) buffers: RegisteredBuffers,
    /// Our scratch; kept after `peers`, whose channels reach it.
    pub(crate) scratch: DeviceBuffer<u8>,
    /// The smallest packet message sent as data and a signal (see
    /// [`CollectiveConfig::packet_data_from`]).
    pub(crate) packet_data_from: u64,
}

/// The port-channel all-reduce's state.
pub(crate) struct PortPath {
    /// The layout of `scratch`, the same on every rank.
    pub(crate) layout: PortLayout,
    /// The port channel to every peer (`dst`: the peer's scratch, `src`: ours), by peer.
    pub(crate) peers: ChannelSet<'static, PortChannel>,
    /// Our scratch, registered; kept after `peers`.
    pub(crate) scratch: DeviceBuffer<u8>,
    /// The number of the next round (see `PortCollectiveArgs::sequence`).
    pub(crate) sequence: u64,
    /// The protocol of the last call and the waits it left owed on this rank (see
    /// `PortCollectiveArgs::protocol`).
    pub(crate) protocol: CallProtocol,
    /// The buffers registered for these collectives.
    pub(crate) sources: PortSources,
}

impl CollectiveContext {
    /// Sets up the collectives of `comm`: finds out whether every rank can load and store
    /// every other's memory (their node names, one exchange), and if so allocates and
    /// registers the scratch, exchanges it with every rank and builds a memory channel to
    /// each peer. A collective call: every rank must make it at the same point.
    ///
    /// # Errors
    /// Settings too small for the ranks, an allocation or an exchange failed.
    pub(crate) fn new(comm: &mut Communicator) -> Result<CollectiveContext> {
        let config = comm.config().collectives;
        // One exchange: the settings every rank must share, then the node's name.
        let data_from = config.packet_data_from(comm.device());
        let shared = config.shared_bytes(data_from);
        let mut mine = shared.clone();
        mine.extend_from_slice(crate::host_ipc::node_name().as_bytes());
        let all = comm.out_of_band().all_gather(mine)?;
        for (peer, theirs) in all.iter().enumerate() {
            let Some((name, ours, other)) = config.differs_from(data_from, theirs) else {
                continue;
            };
            let other = other.map_or_else(|| "missing".to_string(), |v| v.to_string());
            return Err(Error::InvalidUsage(format!(
                "rank {}: collectives: {name} is {ours} here but {other} on rank {peer}; \
                 every rank must use the same CollectiveConfig",
                comm.rank()
            )));
        }
        let nodes: Vec<&[u8]> = all.iter().map(|m| &m[shared.len()..]).collect();
        let load_store =
            !comm.config().transport.network_only() && nodes.iter().all(|n| *n == nodes[0]);
        let memory = match load_store {
            true => Some(MemoryPath::new(comm, &config, data_from)?),
            false => None,
        };
        let barrier = comm.grid_barrier()?;
        tracing::debug!(rank = comm.rank(), load_store, "collectives set up");
        Ok(CollectiveContext {
            memory,
            ports: None,
            barrier,
            sequence: 0,
            protocol: CallProtocol::default(),
            agreed: HashMap::new(),
            last: None,
            config,
        })
    }

    /// The memory path, or why there is none.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] naming `what` where ranks reach each other only through the
    /// proxy.
    pub(crate) fn memory(&self, rank: u32, what: &str) -> Result<&MemoryPath> {
        self.memory
            .as_ref()
            .ok_or_else(|| no_load_store(rank, what))
    }

    /// As [`Self::memory`], to change.
    ///
    /// # Errors
    /// As [`Self::memory`].
    pub(crate) fn memory_mut(&mut self, rank: u32, what: &str) -> Result<&mut MemoryPath> {
        self.memory
            .as_mut()
            .ok_or_else(|| no_load_store(rank, what))
    }

    /// The arguments every memory-path collective kernel shares, for its next round
    /// (buffers, count, types and root filled in by the caller).
    pub(crate) fn args<'c>(
        &'c self,
        m: &'c MemoryPath,
        rank: u32,
        n_ranks: u32,
    ) -> CollectiveArgs<'c> {
        CollectiveArgs {
            peers: m.peers.device_handle(),
            barrier: self.barrier.device_handle(),
            scratch: m.scratch.view_mut(),
            buffers: m.buffers.device_handle(),
            layout: m.layout,
            sequence: self.sequence,
            protocol: self.protocol,
            rank,
            n_ranks,
            ..CollectiveArgs::default()
        }
    }

    /// The port path, once set up.
    ///
    /// # Errors
    /// It is not set up.
    pub(crate) fn port_path(&self, rank: u32) -> Result<&PortPath> {
        self.ports
            .as_ref()
            .ok_or_else(|| Error::Internal(format!("rank {rank}: port collectives not set up")))
    }

    /// As [`Self::port_path`], to change.
    ///
    /// # Errors
    /// As [`Self::port_path`].
    pub(crate) fn port_path_mut(&mut self, rank: u32) -> Result<&mut PortPath> {
        self.ports
            .as_mut()
            .ok_or_else(|| Error::Internal(format!("rank {rank}: port collectives not set up")))
    }

    /// Sets up the port path (a collective call: the first call that takes it, on every
    /// rank), unless done.
    ///
    /// # Errors
    /// Settings too small, an allocation, exchange or channel setup failed.
    pub(crate) fn ports_set_up(&mut self, comm: &mut Communicator) -> Result<()> {
        if self.ports.is_none() {
            self.ports = Some(PortPath::new(comm, &self.config)?);
        }
        Ok(())
    }

    /// The arguments of the port all-reduce for its next round (buffers, count and types
    /// filled in by the caller).
    ///
    /// # Errors
    /// The port path is not set up.
    pub(crate) fn port_args(&self, rank: u32, n_ranks: u32) -> Result<PortCollectiveArgs<'_>> {
        let p = self
            .ports
            .as_ref()
            .ok_or_else(|| Error::Internal("port collectives not set up".into()))?;
        Ok(PortCollectiveArgs {
            peers: p.peers.device_handle(),
            barrier: self.barrier.device_handle(),
            scratch: p.scratch.view_mut(),
            layout: p.layout,
            sequence: p.sequence,
            protocol: p.protocol,
            rank,
            n_ranks,
            ..PortCollectiveArgs::default()
        })
    }
}

/// Why a collective that needs load/store access cannot run.
fn no_load_store(rank: u32, what: &str) -> Error {
    Error::InvalidUsage(format!(
        "rank {rank}: {what} needs every rank to load and store every other's memory (ranks \
         of one node, transport not ethernet); these ranks reach each other only through the \
         proxy (port channels, where every collective runs)"
    ))
}

/// Refuses a scratch size that does not fit this host.
fn scratch_bytes(rank: u32, total: u64) -> Result<usize> {
    usize::try_from(total).map_err(|_| {
        Error::InvalidUsage(format!(
            "rank {rank}: collectives: a scratch of {total} bytes does not fit this host"
        ))
    })
}

impl MemoryPath {
    /// Allocates and registers the scratch, exchanges it with every rank and builds a
    /// memory channel to each peer (a collective call).
    fn new(
        comm: &mut Communicator,
        config: &CollectiveConfig,
        packet_data_from: u64,
    ) -> Result<MemoryPath> {
        let (rank, size) = (comm.rank(), comm.size());
        let layout = ScratchLayout::new(
            size,
            config.packet_limit,
            config.round_bytes,
            config.eager_bytes,
        );
        // A round must hold at least one element of the widest type from every rank.
        if layout.half_bytes < 8 * size as u64 {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: collectives: round_bytes {} is too small for {size} ranks (at \
                 least {})",
                config.round_bytes,
                8 * size
            )));
        }
        let bytes = scratch_bytes(rank, layout.total_bytes())?;
        // Zeroed: a packet slot must never read as arrived before its first packet (flags
        // are never 0).
        let scratch = comm.alloc_zeroed::<u8>(bytes)?;
        let mine = comm.register(&scratch)?;
        let all = comm.all_gather_memory(&mine)?;
        let mut channels = Vec::with_capacity(size as usize);
        for peer in (0..size).filter(|&p| p != rank) {
            channels.push(comm.memory_channel(peer, &all[peer as usize], &mine, Some(&mine))?);
        }
        let peers = ChannelSet::from_channels(comm.device(), channels)?;
        let buffers = RegisteredBuffers::new(comm, config.registered_buffers)?;
        tracing::debug!(
            rank,
            scratch_bytes = bytes,
            packet_limit = layout.packet_limit,
            round_bytes = layout.half_bytes,
            eager_sets = layout.eager_sets,
            "memory-channel collectives set up"
        );
        Ok(MemoryPath {
            layout,
            peers,
            buffers,
            scratch,
            packet_data_from,
        })
    }
}

impl PortPath {
    /// Allocates and registers the port scratch, exchanges it with every rank and builds a
    /// port channel to each peer (a collective call).
    fn new(comm: &mut Communicator, config: &CollectiveConfig) -> Result<PortPath> {
        let (rank, size) = (comm.rank(), comm.size());
        let layout = PortLayout::new(size, config.port_round_bytes);
        let bytes = scratch_bytes(rank, layout.total_bytes())?;
        let scratch = comm.alloc_zeroed::<u8>(bytes)?;
        let mine = comm.register(&scratch)?;
        let all = comm.all_gather_memory(&mine)?;
        let mut channels = Vec::with_capacity(size as usize);
        for peer in (0..size).filter(|&p| p != rank) {
            channels.push(comm.port_channel(peer, &all[peer as usize], &mine)?);
        }
        let peers = ChannelSet::from_channels(comm.device(), channels)?;
        tracing::debug!(
            rank,
            scratch_bytes = bytes,
            "port-channel collectives set up"
        );
        Ok(PortPath {
            layout,
            peers,
            scratch,
            sequence: 0,
            protocol: CallProtocol::default(),
            sources: PortSources::default(),
        })
    }
}
