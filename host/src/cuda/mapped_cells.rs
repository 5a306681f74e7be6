//! Small values the host and a GPU's kernels share (abort records, stop words), placed in
//! pinned device-mapped host memory ([`MappedHostMemory`]): many to a chunk, each chunk
//! kept alive by the cells placed in it, so a communicator's few dozen records take one
//! pinned allocation rather than a page each.
//!
//! A cell's host address is also its device address: the driver maps memory from
//! `cuMemHostAlloc` at the same address on every device with unified addressing (checked
//! for each chunk), so kernels can be handed the very pointer the host uses.

use super::cuda_device::CudaDevice;
use super::mapped_host_memory::MappedHostMemory;
use crate::{Error, Result};
use oxccl_proxy::HostCell;
use parking_lot::Mutex;
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes of one chunk.
const CHUNK_BYTES: usize = 64 * 1024;

/// Smallest spacing of two cells: a cache line, so that cells written by different parties
/// do not share one.
const CELL_SPACING: usize = 64;

/// A device's allocator of shared cells.
#[derive(Debug)]
pub(crate) struct MappedCells {
    device: Arc<CudaDevice>,
    /// The chunk being filled, and the bytes of it used.
    current: Mutex<Option<(Arc<MappedHostMemory>, usize)>>,
}

impl MappedCells {
    /// An allocator for `device` (allocating nothing yet).
    pub(crate) fn new(device: &Arc<CudaDevice>) -> Self {
        MappedCells {
            device: device.clone(),
            current: Mutex::new(None),
        }
    }

    /// `value`, placed where the host and the device's kernels reach it at one address.
    ///
    /// # Errors
    /// A type that needs dropping (a placed value is never dropped) or does not fit a
    /// chunk; the driver refused the memory, or mapped it at another address for the device.
    pub(crate) fn place<T: Send + Sync + 'static>(&self, value: T) -> Result<HostCell<T>> {
        let (size, align) = (size_of::<T>(), align_of::<T>().max(CELL_SPACING));
        if std::mem::needs_drop::<T>() || size > CHUNK_BYTES || align > 4096 {
            return Err(Error::InvalidUsage(format!(
                "a {} cannot be placed in mapped host memory ({size} bytes, aligned to {align}, \
                 {}needing a drop)",
                std::any::type_name::<T>(),
                if std::mem::needs_drop::<T>() {
                    ""
                } else {
                    "not "
                }
            )));
        }
        let mut current = self.current.lock();
        let fits = |used: usize| used.next_multiple_of(align) + size <= CHUNK_BYTES;
        let (chunk, used) = match current.take() {
            Some((chunk, used)) if fits(used) => (chunk, used),
            _ => {
                let chunk = MappedHostMemory::new(&self.device, CHUNK_BYTES)?;
                if chunk.device_address() != chunk.host() as u64 {
                    return Err(Error::BackendUnavailable(format!(
                        "{:?} maps host memory {:p} at device address {:#x}: shared cells need \
                         unified addressing (one address for the host and the device)",
                        self.device,
                        chunk.host(),
                        chunk.device_address()
                    )));
                }
                (Arc::new(chunk), 0)
            }
        };
        let offset = used.next_multiple_of(align);
        // SAFETY: `offset + size <= CHUNK_BYTES` (`fits`, or a fresh chunk and `size` no larger
        // than a chunk), and the chunk is page-aligned, so the place is inside the chunk and
        // aligned for `T`.
        let place = unsafe { chunk.host().cast::<u8>().add(offset) }.cast::<T>();
        // SAFETY: the place is inside the chunk, aligned, and unused (the bump offset only
        // grows); nothing else reads it before this write.
        unsafe { place.write(value) };
        *current = Some((chunk.clone(), offset + size));
        let place =
            NonNull::new(place).ok_or_else(|| Error::Internal("null mapped memory".into()))?;
        // SAFETY: a live, initialized, aligned `T` in the chunk, which the cell's keep-alive
        // holds; `T` needs no drop (checked); only shared references are given out.
        Ok(unsafe { HostCell::placed(place, chunk) })
    }
}
