//! Pinned host memory mapped into a device's address space (`cuMemHostAlloc` with
//! `DEVICEMAP | PORTABLE`), zeroed, freed when dropped: where the host and a GPU's kernels
//! share cells (the trigger FIFO's slots and tail, abort records, stop words).

use super::cuda_device::CudaDevice;
use crate::Result;
use std::ffi::c_void;
use std::sync::Arc;

/// Pinned host memory mapped into a device's address space, freed on drop.
#[derive(Debug)]
pub(crate) struct MappedHostMemory {
    host: *mut c_void,
    device_address: u64,
    device: Arc<CudaDevice>,
}

// SAFETY: the pointer is to memory owned by this value (freed once, on drop); the driver
// calls that free it may be made from any thread.
unsafe impl Send for MappedHostMemory {}
// SAFETY: `&MappedHostMemory` gives no access to the memory itself, only its addresses.
unsafe impl Sync for MappedHostMemory {}

impl MappedHostMemory {
    /// `bytes` of zeroed pinned memory, mapped into `device`.
    pub(crate) fn new(device: &Arc<CudaDevice>, bytes: usize) -> Result<Self> {
        let host = device.context.host_alloc_mapped(bytes)?;
        // Owned from here: a failure below frees it.
        let mut memory = MappedHostMemory {
            host,
            device_address: 0,
            device: device.clone(),
        };
        // SAFETY: `host` is the start of live memory from `host_alloc_mapped`.
        memory.device_address = unsafe { device.context.host_device_pointer(host)? };
        Ok(memory)
    }
}

impl MappedHostMemory {
    /// The host address of the first byte.
    pub(crate) fn host(&self) -> *mut c_void {
        self.host
    }

    /// The device address of the first byte.
    pub(crate) fn device_address(&self) -> u64 {
        self.device_address
    }
}

impl Drop for MappedHostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once, when the last holder of this value (the
        // FIFO's cells, the host cells placed in it) lets go of it.
        if let Err(e) = unsafe { self.device.context.free_host(self.host) } {
            tracing::warn!(error = %e, "freeing mapped host memory failed");
        }
    }
}
