//! The InfiniBand / RoCE transport as a communicator uses it: the rank's RDMA device,
//! registering memory with it, one connection per peer, and peers' memory as the proxy
//! names it.
//!
//! Built with the `ib` feature it drives an `IbDevice` (`ib_device.rs`) and
//! `IbConnection`s (`ib_connection.rs`). Without it, [`IbTransport`]
//! cannot exist: [`IbTransport::open`] fails with an error that says how to build oxccl
//! with it, which is what choosing `OXCCL_TRANSPORT=ib` then reports.

use crate::error::{Error, Result};
use crate::registered_memory::RegisteredMemory;
use oxccl_proxy::{Connection, MemoryRegion, RdmaKey};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "ib")]
use crate::ib_connection::IbConnection;
#[cfg(feature = "ib")]
use crate::ib_device::IbDevice;
#[cfg(feature = "ib")]
use std::collections::HashMap;

/// A rank's InfiniBand / RoCE transport: its opened RDMA device and connections.
pub(crate) struct IbTransport {
    #[cfg(feature = "ib")]
    device: Arc<IbDevice>,
    #[cfg(feature = "ib")]
    connections: HashMap<u32, Arc<IbConnection>>,
    #[cfg(not(feature = "ib"))]
    never: std::convert::Infallible,
}

impl IbTransport {
    /// Opens rank `rank`'s RDMA device.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`]: oxccl is built without the `ib` feature, or no RDMA
    /// device with an active port is present; [`Error::Verbs`]: the device refused.
    pub(crate) fn open(rank: u32) -> Result<Self> {
        #[cfg(feature = "ib")]
        {
            Ok(IbTransport {
                device: Arc::new(IbDevice::open(rank)?),
                connections: HashMap::new(),
            })
        }
        #[cfg(not(feature = "ib"))]
        {
            Err(Error::BackendUnavailable(format!(
                "rank {rank}: the ib transport needs oxccl built with the `ib` feature \
                 (cargo build --features oxccl/ib; building it needs cmake and libclang)"
            )))
        }
    }

    /// The device's index, as [`Transport::Ib`](crate::Transport::Ib) names it.
    pub(crate) fn device_index(&self) -> u8 {
        #[cfg(feature = "ib")]
        {
            self.device.index()
        }
        #[cfg(not(feature = "ib"))]
        match self.never {}
    }

    /// Registers a local registration's memory with the device (for peers' atomics too, if
    /// `atomics`: semaphores) and records the remote key in it.
    ///
    /// # Errors
    /// Memory not registered here; the device refused it.
    pub(crate) fn register(&self, memory: &mut RegisteredMemory, atomics: bool) -> Result<()> {
        #[cfg(feature = "ib")]
        {
            let Some(owner) = memory.owner() else {
                return Err(Error::Internal(
                    "only a registration made here can be registered with an RDMA device".into(),
                ));
            };
            let (addr, size) = (memory.addr(), memory.size());
            let rkey = match owner {
                crate::buffer_memory::BufferMemory::Cuda(gpu) => {
                    register_gpu_memory(&self.device, gpu, addr, size, atomics, owner.share())?
                }
                crate::buffer_memory::BufferMemory::Cpu(_) => {
                    self.device
                        .register(addr, size, atomics, owner.share())?
                        .remote
                }
            };
            memory.set_ib_rkey(self.device.index(), rkey);
            Ok(())
        }
        #[cfg(not(feature = "ib"))]
        {
            let _ = (memory, atomics);
            match self.never {}
        }
    }

    /// The connection this rank's proxy writes `peer`'s memory over, made on first use:
    /// `exchange` sends this end's encoded endpoint to the peer and returns the peer's bytes
    /// (the peer does the same at the same point).
    ///
    /// # Errors
    /// The peer's endpoint is malformed; the device refused a step; `exchange` failed.
    pub(crate) fn connection(
        &mut self,
        peer: u32,
        timeout: Duration,
        exchange: impl FnOnce(Vec<u8>) -> Result<Vec<u8>>,
    ) -> Result<Arc<dyn Connection>> {
        #[cfg(feature = "ib")]
        {
            if let Some(connection) = self.connections.get(&peer) {
                return Ok(connection.clone());
            }
            let connection = Arc::new(crate::ib_connection::connect(
                self.device.clone(),
                peer,
                timeout,
                |mine| crate::ib_wire::IbEndpoint::from_bytes(&exchange(mine.to_bytes()?)?),
            )?);
            self.connections.insert(peer, connection.clone());
            Ok(connection)
        }
        #[cfg(not(feature = "ib"))]
        {
            let _ = (peer, timeout, exchange);
            match self.never {}
        }
    }
}

/// A peer's `memory` as the proxy names it over InfiniBand / RoCE: no address here, the
/// owner's address and remote key to write it by.
///
/// # Errors
/// Memory of this rank (`rank`), or memory its owner did not register with its RDMA device.
pub(crate) fn reach_over_ib(rank: u32, memory: &RegisteredMemory) -> Result<MemoryRegion> {
    match memory.ib_rkey() {
        Some(_) if memory.rank() == rank => Err(Error::InvalidUsage(format!(
            "rank {rank}: its own memory is not reached over InfiniBand / RoCE"
        ))),
        Some(rkey) => Ok(
            MemoryRegion::new(memory.rank(), 0, memory.size()).with_rdma_key(RdmaKey {
                addr: memory.addr(),
                rkey,
            }),
        ),
        None => Err(Error::InvalidUsage(format!(
            "rank {rank}: memory of rank {} is not reachable over InfiniBand / RoCE (registered \
             with another transport choice?): every rank must choose the same transport",
            memory.rank()
        ))),
    }
}

/// Registers GPU memory with the RDMA device: through a dma-buf of the pages holding it
/// where the GPU's driver exports one (page-aligned around the range, as NCCL does), else
/// as is, which needs NVIDIA's peer-memory kernel module (`nvidia-peermem`).
///
/// # Errors
/// Neither way worked: the error of the last, with the dma-buf's if it was tried.
#[cfg(feature = "ib")]
fn register_gpu_memory(
    device: &IbDevice,
    gpu: &crate::cuda::cuda_memory::CudaMemory,
    addr: u64,
    size: u64,
    atomics: bool,
    keep_alive: Arc<dyn std::any::Any + Send + Sync>,
) -> Result<u32> {
    let page = rustix::param::page_size() as u64;
    let start = addr - addr % page;
    let end = addr.saturating_add(size).next_multiple_of(page);
    let exported = usize::try_from(end - start)
        .map_err(|_| Error::InvalidUsage(format!("{size} bytes at {addr:#x} do not fit")))
        .and_then(|bytes| gpu.device().context.dma_buf(start, bytes));
    let dma_buf_failure = match exported {
        Ok(Some(fd)) => {
            use std::os::fd::AsFd;
            match device.register_dma_buf(
                fd.as_fd(),
                addr - start,
                addr,
                size,
                atomics,
                keep_alive.clone(),
            ) {
                Ok(keys) => return Ok(keys.remote),
                Err(e) => Some(e.to_string()),
            }
        }
        Ok(None) => None,
        Err(e) => Some(e.to_string()),
    };
    device
        .register(addr, size, atomics, keep_alive)
        .map(|keys| keys.remote)
        .map_err(|e| match dma_buf_failure {
            Some(first) => Error::BackendUnavailable(format!(
                "rank {}: GPU memory cannot be registered with RDMA device {}: as a dma-buf: \
                 {first}; as is (GPUDirect RDMA through nvidia-peermem): {e}",
                device.rank(),
                device.name()
            )),
            None => e,
        })
}
