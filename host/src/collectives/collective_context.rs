//! What a communicator sets up once for its collectives: the scratch, a memory channel to
//! every peer, a grid barrier, and the call counter, created on the first collective call.

use super::collective_config::CollectiveConfig;
use super::registered_buffers::RegisteredBuffers;
use super::shape::Shape;
use crate::channel_set::ChannelSet;
use crate::communicator::Communicator;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::grid_barrier::GridBarrier;
use crate::memory_channel::MemoryChannel;
use oxccl_device::DeviceViewMut;
use oxccl_kernels::collectives::{CollectiveArgs, ScratchLayout};
use std::collections::HashMap;

/// A communicator's collective state. Every rank creates it at the same call (the first
/// collective), and every call after that runs on it with no allocation and no exchange
/// (but the first call of each shape: see [`super::shape`]).
pub(crate) struct CollectiveContext {
    /// The layout of `scratch`, the same on every rank.
    pub(crate) layout: ScratchLayout,
    /// The memory channel to every peer (remote: the peer's scratch; local and packets:
    /// ours), by peer.
    pub(crate) peers: ChannelSet<'static, MemoryChannel>,
    /// Our scratch; kept after `peers`, whose channels reach it.
    pub(crate) scratch: DeviceBuffer<u8>,
    /// Where this rank's blocks meet.
    pub(crate) barrier: GridBarrier,
    /// The buffers registered for zero-copy calls.
    pub(crate) buffers: RegisteredBuffers,
    /// The number of the next call (see `CollectiveArgs::sequence`).
    pub(crate) sequence: u64,
    /// Shapes every rank has agreed on, with what the agreement found (the largest count
    /// any rank sends any rank, for all-to-all-v).
    pub(crate) agreed: HashMap<Shape, u64>,
    /// The shape of the last call and its entry in `agreed`: a loop of the same call finds
    /// it with a comparison, without hashing the shape (about 2 % of a 1 KiB all-reduce).
    pub(crate) last: Option<(Shape, u64)>,
    /// The settings it was made with.
    pub(crate) config: CollectiveConfig,
}

impl CollectiveContext {
    /// Sets up the collectives of `comm`: allocates and registers the scratch, exchanges it
    /// with every rank and builds a memory channel to each peer. A collective call: every
    /// rank must make it at the same point.
    ///
    /// # Errors
    /// Settings too small for the ranks, an allocation or an exchange failed.
    pub(crate) fn new(comm: &mut Communicator) -> Result<CollectiveContext> {
        let config = comm.config().collectives;
        let (rank, size) = (comm.rank(), comm.size());
        let layout = ScratchLayout::new(size, config.packet_limit, config.round_bytes);
        // A round must hold at least one element of the widest type from every rank.
        if layout.half_bytes < 8 * size as u64 {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: collectives: round_bytes {} is too small for {size} ranks (at \
                 least {})",
                config.round_bytes,
                8 * size
            )));
        }
        let bytes = usize::try_from(layout.total_bytes()).map_err(|_| {
            Error::InvalidUsage(format!(
                "rank {rank}: collectives: a scratch of {} bytes does not fit this host",
                layout.total_bytes()
            ))
        })?;
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
        let barrier = comm.grid_barrier()?;
        let buffers = RegisteredBuffers::new(comm, config.registered_buffers)?;
        tracing::debug!(
            rank,
            scratch_bytes = bytes,
            packet_limit = layout.packet_limit,
            round_bytes = layout.half_bytes,
            "collectives set up"
        );
        Ok(CollectiveContext {
            layout,
            peers,
            scratch,
            barrier,
            buffers,
            sequence: 0,
            agreed: HashMap::new(),
            last: None,
            config,
        })
    }

    /// The arguments every collective kernel shares, for the call numbered `sequence`
    /// (buffers, count, types and root filled in by the caller).
    pub(crate) fn args(&self, rank: u32, n_ranks: u32) -> CollectiveArgs<'_> {
        CollectiveArgs {
            peers: self.peers.device_handle(),
            barrier: self.barrier.device_handle(),
            scratch: scratch_view(&self.scratch),
            buffers: self.buffers.device_handle(),
            layout: self.layout,
            sequence: self.sequence,
            rank,
            n_ranks,
            ..CollectiveArgs::default()
        }
    }
}

fn scratch_view(scratch: &DeviceBuffer<u8>) -> DeviceViewMut<'_, u8> {
    scratch.view_mut()
}
