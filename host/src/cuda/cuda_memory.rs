//! Device memory of a CUDA device: `cuMemAlloc`'d (shareable with other processes through
//! CUDA IPC, unlike stream-ordered pool memory), freed when the last holder drops it.

use super::cuda_device::CudaDevice;
use crate::Result;
use cudarc::driver::sys;
use std::sync::Arc;

/// One allocation.
#[derive(Debug)]
pub(crate) struct CudaMemory {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Arc<CudaDevice>,
}

impl CudaMemory {
    /// `bytes` of device memory; zeroed if `zero`, else not initialized (as `cudaMalloc`).
    pub(crate) fn new(device: &Arc<CudaDevice>, bytes: usize, zero: bool) -> Result<Self> {
        let ptr = device.context.alloc(bytes)?;
        super::gpu_address_ranges::enter(ptr, bytes as u64);
        let memory = CudaMemory {
            ptr,
            bytes,
            device: device.clone(),
        };
        if zero {
            // SAFETY: the whole allocation.
            unsafe { device.context.set_bytes(ptr, 0, bytes)? };
        }
        Ok(memory)
    }

    /// The device address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device the memory lives on.
    pub(crate) fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Copies `src` to bytes `offset..offset + src.len()`, synchronously. The caller has
    /// checked the range lies inside the allocation.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        debug_assert!(offset + src.len() <= self.bytes);
        // SAFETY: the range lies inside the allocation (checked by the caller).
        unsafe {
            self.device
                .context
                .copy_to_device(self.ptr + offset as u64, src)
        }
    }

    /// Copies bytes `offset..offset + dst.len()` into `dst`, synchronously. The caller has
    /// checked the range lies inside the allocation.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        debug_assert!(offset + dst.len() <= self.bytes);
        // SAFETY: as in `write`.
        unsafe {
            self.device
                .context
                .copy_to_host(dst, self.ptr + offset as u64)
        }
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        // `cuMemFree` waits for the device's work that may use the memory, as a buffer
        // dropped on the emulator does.
        super::gpu_address_ranges::remove(self.ptr);
        // SAFETY: allocated in this context by `new`, not used after the last holder drops.
        if let Err(e) = unsafe { self.device.context.free(self.ptr) } {
            tracing::warn!(error = %e, bytes = self.bytes, "freeing device memory failed");
        }
    }
}
