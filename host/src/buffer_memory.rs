//! The memory behind a device buffer, on its backend: host memory of the emulator, or a
//! GPU's memory. Byte-level: the address kernels see, and synchronous copies between it and
//! the host.

use crate::Result;
use crate::cpu::memory::DeviceMemory;
use crate::cuda::cuda_memory::CudaMemory;
use std::sync::Arc;

/// A buffer's memory.
#[derive(Clone, Debug)]
pub(crate) enum BufferMemory {
    /// Emulator memory: kernels and the host use the same address.
    Cpu(Arc<DeviceMemory>),
    /// GPU memory: only kernels dereference the address; the host copies through the
    /// driver.
    Cuda(Arc<CudaMemory>),
}

impl BufferMemory {
    /// The device address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        match self {
            BufferMemory::Cpu(m) => m.as_ptr() as usize as u64,
            BufferMemory::Cuda(m) => m.addr(),
        }
    }

    /// A share of the memory, to keep it allocated (a region's keep-alive).
    pub(crate) fn share(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        match self {
            BufferMemory::Cpu(m) => m.clone(),
            BufferMemory::Cuda(m) => m.clone(),
        }
    }

    /// Copies `src` to bytes `offset..offset + src.len()`, synchronously.
    ///
    /// # Safety
    /// The range lies inside the memory, and on the emulator no host reference covers it.
    pub(crate) unsafe fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        match self {
            BufferMemory::Cpu(m) => {
                // SAFETY: the range lies inside the memory (caller), which is writable host
                // memory; `src` is a host slice, so the two do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), m.as_ptr().add(offset), src.len())
                };
                Ok(())
            }
            BufferMemory::Cuda(m) => m.write(offset, src),
        }
    }

    /// Copies bytes `offset..offset + dst.len()` into `dst`, synchronously.
    ///
    /// # Safety
    /// The range lies inside the memory.
    pub(crate) unsafe fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            BufferMemory::Cpu(m) => {
                // SAFETY: the range lies inside the memory (caller), initialized at
                // allocation; `dst` is an exclusive host slice, so the two do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        m.as_ptr().add(offset),
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
                Ok(())
            }
            BufferMemory::Cuda(m) => m.read(offset, dst),
        }
    }
}
