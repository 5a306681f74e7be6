//! The CudaIpc connection: on a GPU, the proxy has the device's copy engines move a `put`
//! into the peer's memory (a peer process's allocation opened by CUDA IPC, or memory of this
//! process on the same device), as MSCCL++'s `CudaIpcConnection` does
//! (`src/core/connection.cc`).
//!
//! Everything goes on one stream of the connection's own, in trigger order, and the proxy
//! thread waits for none of it but in `flush`:
//! - `write`: `cuMemcpyAsync` (unified addresses: device memory, a peer's mapped
//!   allocation, mapped host memory alike);
//! - `update_and_sync`: `cuStreamWriteValue64` of the peer's semaphore counter on the same
//!   stream, so it lands after every earlier copy has completed, behind a fence of the
//!   driver's: a peer kernel that acquires the new count sees the data;
//! - `flush`: the stream drained (`cuStreamQuery` polled against a deadline, never an
//!   unbounded `cuStreamSynchronize`).
//!
//! Only for devices whose driver can write 64-bit values from a stream
//! (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`), checked when the connection is made.
//! Copies between overlapping ranges (a rank that puts into its own buffer) are refused:
//! the driver does not define them.

use crate::cuda::cuda_device::CudaDevice;
use crate::cuda::cuda_stream::CudaStream;
use crate::device::DeviceKind;
use crate::{Device, Error, Result};
use oxccl_proxy::{Connection, MemoryRegion, ProxyError};
use std::sync::Arc;
use std::time::Duration;

/// A connection to a peer whose memory this process reaches through a CUDA device.
pub struct CudaIpcConnection {
    peer: u32,
    device: Arc<CudaDevice>,
    stream: CudaStream,
    flush_timeout: Duration,
}

impl std::fmt::Debug for CudaIpcConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaIpcConnection")
            .field("peer", &self.peer)
            .field("stream", &self.stream)
            .finish()
    }
}

impl CudaIpcConnection {
    /// A connection to `peer` through `device` (of the CUDA backend), with a stream of its
    /// own; `flush` gives up after `flush_timeout`.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for a device of another backend;
    /// [`Error::BackendUnavailable`] when the device cannot write semaphores from a stream;
    /// a driver failure creating the stream.
    pub fn new(device: &Device, peer: u32, flush_timeout: Duration) -> Result<Self> {
        let DeviceKind::Cuda(cuda) = device.kind() else {
            return Err(Error::InvalidUsage(format!(
                "a CUDA IPC connection needs a device of the cuda backend, not {device:?}"
            )));
        };
        if !cuda.context.supports_stream_u64_writes()? {
            return Err(Error::BackendUnavailable(format!(
                "{device:?} cannot write 64-bit values from a stream \
                 (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0, or the driver is \
                 older than CUDA 11.7), which a CUDA IPC connection's signals need"
            )));
        }
        Ok(CudaIpcConnection {
            peer,
            device: cuda.clone(),
            stream: CudaStream::new(cuda)?,
            flush_timeout,
        })
    }
}

/// An error of the driver, as the proxy reports a transport's.
fn transport(e: Error) -> ProxyError {
    ProxyError::Transport(e.to_string())
}

impl Connection for CudaIpcConnection {
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), ProxyError> {
        let (to, from) = (dst.address(dst_off)?, src.address(src_off)?);
        if bytes == 0 {
            return Ok(());
        }
        if to < from + bytes && from < to + bytes {
            return Err(ProxyError::InvalidUsage(format!(
                "a put of {bytes} bytes from {from:#x} to {to:#x} copies between overlapping \
                 ranges, which a GPU copy does not define"
            )));
        }
        // SAFETY: the stream is the connection's own, alive; the proxy checked both ranges
        // against the registered sizes, they do not overlap (checked above), and registered
        // memory stays allocated and mapped while the proxy's tables hold its region
        // (freeing device memory waits for the device's work that uses it).
        unsafe {
            self.device
                .context
                .copy_device_async(to, from, bytes as usize, self.stream.raw())
        }
        .map_err(transport)
    }

    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> Result<(), ProxyError> {
        let address = dst.semaphore_address(dst_off)?;
        // SAFETY: the stream is ours; the counter is 8 aligned bytes inside a registered
        // region (checked), device memory or mapped host memory kept allocated by the
        // proxy's tables; the device supports stream writes (checked in `new`).
        unsafe {
            self.device
                .context
                .stream_write_u64(self.stream.raw(), address, value)
        }
        .map_err(transport)
    }

    fn flush(&self) -> Result<(), ProxyError> {
        self.stream
            .synchronize(self.flush_timeout)
            .map_err(transport)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn transport(&self) -> &'static str {
        "cuda-ipc"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the connection's first check: an emulated device has no copy engines to
    /// drive, and asking is an error that says so, not a panic.
    #[test]
    fn a_cuda_ipc_connection_needs_a_cuda_device() {
        let err = CudaIpcConnection::new(&Device::cpu(0), 1, Duration::from_secs(1))
            .expect_err("an emulated device has no CUDA IPC connection");
        assert!(err.to_string().contains("cuda backend"), "{err}");
    }
}
