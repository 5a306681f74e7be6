//! Host side of oxccl's trigger FIFO, and the proxy service that executes kernels'
//! requests.
//!
//! - [`fifo`]: the ring's cells and its single consumer.
//! - [`idle_policy`]: how the proxy thread waits when the ring is empty.
//! - [`host_cell`]: values in host memory that kernels reach too (abort records, stop words).
//! - [`consumer_pacing`]: how the consumer leaves the ring alone after draining a stream.
//! - [`connection`]: the [`Connection`] trait a transport implements.
//! - [`memory_region`]: what the proxy knows of registered memory.
//! - [`proxy_service`]: the id tables, and the checks on every trigger.
//! - [`proxy_thread`]: the thread that drains one or several services' FIFOs.
#![warn(missing_docs)]

pub mod connection;
pub mod consumer_pacing;
pub mod error;
pub mod fifo;
pub mod host_cell;
pub mod idle_policy;
pub mod memory_region;
#[cfg(not(oxccl_loom))]
pub mod proxy_service;
#[cfg(not(oxccl_loom))]
pub mod proxy_thread;

pub use connection::Connection;
pub use error::{ProxyError, Refusal, Side};
pub use fifo::{Fifo, MappedFifoCells};
pub use host_cell::HostCell;
pub use idle_policy::{IdlePolicy, PollSchedule};
pub use memory_region::{MemoryRegion, RdmaKey};
#[cfg(not(oxccl_loom))]
pub use proxy_service::{
    FIFO_SITE, FailureSink, INBOUND_SITE, MemoryId, ProxyConfig, ProxyService, ProxyWaker,
    SemaphoreId,
};
