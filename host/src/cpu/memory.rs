//! Emulated device memory: page-aligned, zeroed host memory.
//!
//! Every allocation of the CPU backend goes through [`HostMemory`], so that its backing can
//! change in one place: today private heap pages; for ranks running as processes, a
//! shared-memory object (memfd + `mmap(MAP_SHARED)`) whose handle travels through the
//! bootstrap like a CUDA IPC handle. Callers see only an address and a size.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Alignment (and granularity) of every emulated device allocation: one page, like
/// `cuMemAlloc`'s guarantee of at least 256 bytes and the page alignment `mmap` gives.
pub(crate) const PAGE: usize = 4096;

/// Why an allocation failed.
#[derive(Debug)]
pub(crate) enum AllocError {
    /// The size does not fit in the address space once rounded up to pages.
    TooLarge,
    /// The allocator had no memory to give.
    OutOfMemory,
}

/// One zeroed, page-aligned allocation, freed on drop.
///
/// Invariants: `ptr` was returned by `alloc_zeroed(layout)` and is freed only by `Drop`;
/// `layout.size()` is a non-zero multiple of [`PAGE`] and `layout.align() == PAGE`.
#[derive(Debug)]
pub(crate) struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `HostMemory` owns its allocation like a `Box<[u8]>`; the pointer is not tied to
// the allocating thread. Concurrent access through the address is governed by the users of
// the address (kernels and the host copy methods), not by this type.
unsafe impl Send for HostMemory {}
// SAFETY: `&HostMemory` gives out only the address and the size.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Allocates at least `bytes` zeroed bytes (a whole number of pages, at least one, so
    /// that even an empty buffer has a distinct, valid address).
    pub(crate) fn zeroed(bytes: usize) -> Result<Self, AllocError> {
        let rounded = bytes
            .max(1)
            .checked_next_multiple_of(PAGE)
            .ok_or(AllocError::TooLarge)?;
        let layout = Layout::from_size_align(rounded, PAGE).map_err(|_| AllocError::TooLarge)?;
        // SAFETY: `layout` has a non-zero size (at least one page).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(AllocError::OutOfMemory)?;
        Ok(Self { ptr, layout })
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes reserved (the requested size rounded up to pages).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: by the invariant, `ptr` came from `alloc_zeroed(self.layout)` and is
        // freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against allocations that are not page-aligned or not zeroed (kernels and
    /// protocols rely on zeroed memory reading as "empty"), and against an empty buffer
    /// getting a null or shared address.
    #[test]
    fn zeroed_page_aligned_and_never_empty() {
        for bytes in [0, 1, 4095, 4096, 4097, 1 << 20] {
            let mem = HostMemory::zeroed(bytes).unwrap();
            assert_eq!(mem.as_ptr() as usize % PAGE, 0);
            assert!(mem.capacity() >= bytes.max(1));
            assert_eq!(mem.capacity() % PAGE, 0);
            // SAFETY: the allocation holds `capacity()` initialized (zeroed) bytes.
            let all = unsafe { std::slice::from_raw_parts(mem.as_ptr(), mem.capacity()) };
            assert!(all.iter().all(|&b| b == 0));
        }
    }

    /// Guards against a size overflow turning into a tiny allocation.
    #[test]
    fn absurd_sizes_fail_cleanly() {
        assert!(matches!(
            HostMemory::zeroed(usize::MAX),
            Err(AllocError::TooLarge)
        ));
    }
}
