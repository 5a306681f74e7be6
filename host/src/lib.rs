//! oxccl: one-sided, GPU-initiated communication primitives.
#![warn(missing_docs)]

pub mod backend;
mod buffer_memory;
mod channel_abort;
pub mod channel_set;
pub mod collectives;
pub mod communicator;
mod cpu;
mod cuda;
pub mod cuda_ipc_connection;
pub mod device;
pub mod device_buffer;
mod device_proxy;
pub mod embedded_ptx;
pub mod error;
pub mod ethernet;
pub mod ethernet_connection;
mod ethernet_frame_reader;
mod ethernet_ready_set;
mod ethernet_receive_assist;
mod ethernet_receiver;
pub mod ethernet_registry;
mod ethernet_staging;
mod ethernet_whole_payload;
pub mod ethernet_wire;
pub mod grid_barrier;
pub mod host_ipc;
pub mod host_ipc_connection;
#[cfg(feature = "ib")]
pub mod ib_connection;
#[cfg(feature = "ib")]
pub mod ib_device;
mod ib_transport;
pub mod ib_wire;
pub mod in_process;
pub mod memory_channel;
pub mod out_of_band;
mod peer_watch;
pub mod port_channel;
pub mod ptx;
mod ptx_files;
pub mod rdma_connection;
pub mod registered_memory;
pub mod semaphore;
mod semaphore_arena;
pub mod stream;
pub mod transport;

pub use backend::Backend;
pub use channel_set::ChannelSet;
pub use collectives::{Algorithm, AlgorithmChoice, CollectiveConfig};
pub use communicator::{Communicator, CommunicatorConfig, RankStopper};
pub use cpu::memory::UNINITIALIZED_BYTE;
pub use device::Device;
pub use device_buffer::DeviceBuffer;
pub use error::{
    ChannelError, ChannelFailure, ChannelKind, ChannelRef, Error, ErrorKind, RankFailure, Result,
};
pub use grid_barrier::GridBarrier;
pub use memory_channel::MemoryChannel;
pub use out_of_band::{BootstrapExchange, InProcessExchange, OutOfBand};
/// Element types and reductions of collectives (from `oxccl-device`).
pub use oxccl_device::reduce::{DataType, ReduceElement, ReduceOp, bf16, f16};
/// How a proxy thread waits when its FIFO is empty (from `oxccl-proxy`).
pub use oxccl_proxy::{IdlePolicy, PollSchedule};
pub use port_channel::PortChannel;
pub use registered_memory::RegisteredMemory;
pub use stream::Stream;
pub use transport::{Transport, TransportChoice};
