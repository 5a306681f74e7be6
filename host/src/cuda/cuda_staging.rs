//! Staging of a GPU's memory for the Ethernet transport (see `ethernet_staging.rs`): each
//! stager has a chunk of pinned host memory and a stream of its own; copies out of and
//! into the device are the device's DMA on that stream (`cuMemcpyAsync`, which takes the
//! pinned buffer's host address under unified addressing), waited for, bounded, before the
//! buffer is sent or reused; a counter is written by `cuStreamWriteValue64` on the same
//! stream, so it lands after the copies before it, behind the driver's fence (as the CUDA
//! IPC connection's signals), and waited for too, so a flush the receiver acknowledges
//! afterwards covers it.

use super::cuda_device::CudaDevice;
use super::cuda_stream::CudaStream;
use super::mapped_host_memory::MappedHostMemory;
use crate::error::{Error, Result};
use crate::ethernet_staging::{Stager, Staging};
use crate::ethernet_wire::MAX_CHUNK_BYTES;
use std::sync::Arc;
use std::time::Duration;

/// A GPU's staging: stagers with pinned buffers and streams of their own.
#[derive(Debug)]
pub(crate) struct CudaStaging {
    device: Arc<CudaDevice>,
    timeout: Duration,
}

impl CudaStaging {
    /// Staging of `device`'s memory; every wait for a copy gives up after `timeout`.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] where the device cannot write counters from a stream.
    pub(crate) fn new(device: &Arc<CudaDevice>, timeout: Duration) -> Result<Self> {
        if !device.context.supports_stream_u64_writes()? {
            return Err(Error::BackendUnavailable(
                "the GPU cannot write 64-bit values from a stream, which the Ethernet \
                 transport's signals into its memory need"
                    .into(),
            ));
        }
        Ok(CudaStaging {
            device: device.clone(),
            timeout,
        })
    }
}

impl Staging for CudaStaging {
    fn stager(&self) -> Result<Box<dyn Stager>> {
        Ok(Box::new(CudaStager {
            buffer: MappedHostMemory::new(&self.device, MAX_CHUNK_BYTES as usize)?,
            stream: CudaStream::new(&self.device)?,
            device: self.device.clone(),
            timeout: self.timeout,
        }))
    }

    fn name(&self) -> &'static str {
        "cuda"
    }
}

/// One user's pinned chunk and stream.
struct CudaStager {
    buffer: MappedHostMemory,
    stream: CudaStream,
    device: Arc<CudaDevice>,
    timeout: Duration,
}

impl CudaStager {
    /// Copies `len` bytes from `src` to `dst` on the stager's stream, one of them our pinned
    /// buffer, and waits for the copy.
    ///
    /// # Safety
    /// The other is device memory of this rank that stays allocated for the call.
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> std::result::Result<(), String> {
        if len > MAX_CHUNK_BYTES as usize {
            return Err("longer than a chunk".into());
        }
        // SAFETY: the stream is ours; one range lies in our pinned buffer (`len` fits it,
        // checked above), the other in device memory kept allocated for the call (the
        // caller's contract), so they do not overlap; we wait for the copy before
        // returning, so the buffer is neither reused nor freed under it.
        unsafe {
            self.device
                .context
                .copy_device_async(dst, src, len, self.stream.raw())
        }
        .map_err(|e| e.to_string())?;
        self.wait()
    }

    /// Waits, bounded, for everything enqueued on the stager's stream.
    fn wait(&self) -> std::result::Result<(), String> {
        self.stream
            .synchronize(self.timeout)
            .map_err(|e| e.to_string())
    }
}

impl Stager for CudaStager {
    fn buffer(&mut self) -> &mut [u8] {
        // SAFETY: the pinned allocation is `MAX_CHUNK_BYTES` long, ours alone (`&mut
        // self`), and no copy of ours is in flight between calls (each waits for its own).
        unsafe {
            std::slice::from_raw_parts_mut(self.buffer.host().cast(), MAX_CHUNK_BYTES as usize)
        }
    }

    unsafe fn copy_out(&mut self, src: u64, len: usize) -> std::result::Result<(), String> {
        let buffer = self.buffer.host() as usize as u64;
        // SAFETY: forwarded contract: `src..src + len` is device memory of this rank.
        unsafe { self.copy(buffer, src, len) }
    }

    unsafe fn copy_in(&mut self, dst: u64, len: usize) -> std::result::Result<(), String> {
        let buffer = self.buffer.host() as usize as u64;
        // SAFETY: forwarded contract: `dst..dst + len` is device memory of this rank.
        unsafe { self.copy(dst, buffer, len) }
    }

    unsafe fn store_counter(&mut self, dst: u64, value: u64) -> std::result::Result<(), String> {
        // SAFETY: the stream is ours; `dst` is an aligned counter of this rank's device
        // memory, kept allocated (the caller's contract); the device supports stream
        // writes (checked by `CudaStaging::new`).
        unsafe {
            self.device
                .context
                .stream_write_u64(self.stream.raw(), dst, value)
        }
        .map_err(|e| e.to_string())?;
        // Landed before the receiver goes on: a flush it acknowledges next covers it.
        self.wait()
    }
}
