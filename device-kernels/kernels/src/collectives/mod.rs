//! The collective kernels' entry points: one per collective, for every element type and
//! operation (dispatched once per call, outside the loops).
//!
//! **Direct algorithms** (every collective): in each round, every rank stages its share of
//! the input into one half of its own scratch; the ranks meet (a grid barrier, then a signal
//! to and a wait for every peer); each
//! reads what it needs straight from its peers' scratch through the memory channels'
//! [`remote_view`](oxccl_device::memory_channel::MemoryChannelDeviceHandle::remote_view)s
//! and writes its output. All-reduce is two-shot: each rank reduces one chunk of the round
//! from every rank's staged data, publishes it in its own scratch, the ranks meet again, and
//! each gathers the other chunks. Rounds alternate between the two halves: a rank writes a
//! half again two rounds later, after the meeting of the round in between, which each peer
//! reaches only once it has finished reading the half. So calls follow each other with no
//! host barrier, whatever their sizes.
//!
//! **Ports** (ranks without a load/store path to each other): [`all_reduce_ports`] puts each
//! peer's chunk into its scratch through the proxy, reduces, and puts the reduced chunk to
//! every peer, round after round ([`PortLayout`]), or [`all_reduce_ring`] passes chunks
//! round a ring of the ranks (for many ranks), as [`all_gather_ring`] and
//! [`reduce_scatter_ring`] do its two halves, or [`all_reduce_doubling`] exchanges
//! partial reductions with one partner a step (small messages, a power of two of ranks),
//! as [`all_gather_doubling`] does the rounds gathered so far and
//! [`reduce_scatter_halving`] the halves of the partials still to reduce and
//! [`broadcast_doubling`] the root's round; [`all_gather_ports`],
//! [`reduce_scatter_ports`], [`all_to_all_ports`] and [`all_to_allv_ports`] take one
//! exchange a round, each sending the next round before reading this one out, and
//! [`barrier_ports`] one exchange with nothing in it. [`broadcast_ports`] and
//! [`reduce_ports`] are eager: data flow one way and the sender runs ahead of its receivers
//! by up to three rounds, across calls ([`call_protocol`]).
//!
//! **Packets** (small messages): [`all_reduce_packets`] and [`all_gather_packets`] send
//! the input to every peer as LL16 packets (or, from a size on, as data and one signal:
//! [`packet_form`]), [`reduce_scatter_packets`] and [`all_to_all_packets`] each peer its
//! block; each rank reduces or copies what it received (`packet_exchange.rs`). One pass,
//! no meeting. [`broadcast_packets`] and
//! [`reduce_packets`] are eager, as the port broadcast and reduce are: the data flow one
//! way, and the sender runs ahead of its receivers by up to 64 calls ([`call_protocol`],
//! [`eager_depth`]; the host launches [`barrier`] between them and any other call).
//!
//! Reductions combine the ranks' data in rank order (`0, 1, .., n - 1`) on every path but
//! the ring and recursive doubling, so every rank gets the same bits, and so do the
//! all-reduce algorithms; the ring combines each chunk once, in ring order, and recursive
//! doubling as a balanced tree in rank order, so their ranks too agree on every bit.
//!
//! The direct kernels are cooperative (their blocks meet at a grid barrier): launch them
//! with any grid the device holds at once and any block size. Every rank must launch the
//! same call with the same `sequence`; see [`CollectiveArgs`].

pub mod all_gather;
pub mod all_gather_doubling;
pub mod all_gather_packets;
pub mod all_gather_ports;
pub mod all_gather_ring;
pub mod all_reduce;
pub mod all_reduce_doubling;
pub mod all_reduce_packets;
pub mod all_reduce_ports;
pub mod all_reduce_ring;
pub mod all_to_all;
pub mod all_to_all_packets;
pub mod all_to_all_ports;
pub mod all_to_allv;
pub mod all_to_allv_counts;
pub mod all_to_allv_ports;
pub mod barrier;
pub mod barrier_ports;
pub mod broadcast;
pub mod broadcast_doubling;
pub mod broadcast_packets;
pub mod broadcast_ports;
pub mod call_protocol;
pub mod collective_args;
pub mod eager_depth;
mod elementwise;
mod packet_exchange;
pub mod packet_form;
mod peer_handshake;
mod peer_input_reduction;
pub mod port_collective_args;
mod port_exchange;
pub mod port_layout;
pub mod port_source;
pub mod published_buffers;
pub mod reduce;
pub mod reduce_packets;
pub mod reduce_ports;
pub mod reduce_scatter;
pub mod reduce_scatter_halving;
pub mod reduce_scatter_packets;
pub mod reduce_scatter_ports;
pub mod reduce_scatter_ring;
mod round_views;
pub mod rounds;
pub mod scratch_layout;

pub use all_to_allv_counts::AllToAllvCounts;
pub use call_protocol::CallProtocol;
pub use collective_args::CollectiveArgs;
pub use eager_depth::EagerDepth;
pub use packet_form::PacketForm;
pub use port_collective_args::PortCollectiveArgs;
pub use port_layout::PortLayout;
pub use port_source::PortSource;
pub use scratch_layout::ScratchLayout;
