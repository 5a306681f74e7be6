//! Emulated device memory: page-aligned, zeroed, and shareable with other processes.
//!
//! Every allocation of the CPU backend is an anonymous shared-memory object (`memfd`)
//! mapped `MAP_SHARED`: to kernels it is ordinary memory, and a rank in another process on
//! the same node can map the very same pages from its [`HostIpcHandle`], as a CUDA IPC
//! handle maps a peer GPU's memory. The handle travels through the bootstrap inside a
//! registered memory.

use crate::host_ipc::{HostIpcHandle, map_shared};
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::MemfdFlags;
use std::ptr::NonNull;

/// Alignment (and granularity) of every emulated device allocation: one page, like
/// `cuMemAlloc`'s guarantee of at least 256 bytes and the page alignment `mmap` gives.
pub(crate) const PAGE: usize = 4096;

/// Why an allocation failed.
#[derive(Debug)]
pub(crate) enum AllocError {
    /// The size does not fit in the address space once rounded up to pages.
    TooLarge,
    /// The system refused the memory (no memory, no file descriptors, ...).
    System(std::io::Error),
}

/// One zeroed, page-aligned, shareable allocation, unmapped on drop.
///
/// Invariants: `ptr..ptr+len` is a `MAP_SHARED` mapping of the whole of `fd` (a memfd of
/// `len` bytes), unmapped only by `Drop`; `len` is a non-zero multiple of [`PAGE`].
#[derive(Debug)]
pub(crate) struct HostMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    inode: u64,
}

// SAFETY: `HostMemory` owns its mapping like a `Box<[u8]>`; the pointer is not tied to the
// allocating thread. Concurrent access through the address is governed by the users of
// the address (kernels and the host copy methods), not by this type.
unsafe impl Send for HostMemory {}
// SAFETY: `&HostMemory` gives out only the address, the size and the handle.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// Allocates at least `bytes` zeroed bytes (a whole number of pages, at least one, so
    /// that even an empty buffer has a distinct, valid address).
    pub(crate) fn zeroed(bytes: usize) -> Result<Self, AllocError> {
        let len = bytes
            .max(1)
            .checked_next_multiple_of(PAGE)
            .filter(|&len| isize::try_from(len).is_ok())
            .ok_or(AllocError::TooLarge)?;
        let system = |e: rustix::io::Errno| AllocError::System(e.into());
        let fd =
            rustix::fs::memfd_create("oxccl-device-memory", MemfdFlags::CLOEXEC).map_err(system)?;
        // A new memfd reads as zeros up to its length: the buffer is zeroed for free.
        rustix::fs::ftruncate(&fd, len as u64).map_err(system)?;
        let inode = rustix::fs::fstat(&fd).map_err(system)?.st_ino;
        // SAFETY: the memfd was just sized to `len`; the mapping is owned by the value built
        // below and unmapped by its `Drop`.
        let raw = unsafe { map_shared(&fd, len) }.map_err(system)?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or(AllocError::System(std::io::ErrorKind::OutOfMemory.into()))?;
        Ok(Self {
            ptr,
            len,
            fd,
            inode,
        })
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes reserved (the requested size rounded up to pages).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.len
    }

    /// What a process on this node needs to map the same pages.
    pub(crate) fn ipc_handle(&self) -> HostIpcHandle {
        HostIpcHandle::of_this_process(self.fd.as_raw_fd(), self.inode, self.len as u64)
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: by the invariant, `ptr..ptr+len` is our mapping and is unmapped only here.
        // A peer's mapping of the same memfd stays valid; the pages go when the last
        // mapping and descriptor are gone.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
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

    /// Guards against a mapping through the handle that does not share the pages (peers
    /// would write into a copy), and against a handle accepted for another object or node.
    #[test]
    fn handle_maps_the_same_pages() {
        let mem = HostMemory::zeroed(3 * PAGE).unwrap();
        let handle = mem.ipc_handle();
        assert!(handle.is_local());
        let mapping = handle.map().unwrap();
        assert_eq!(mapping.len(), (3 * PAGE) as u64);
        // SAFETY: both ranges are live mappings of the same 3 pages, used by this thread only.
        unsafe {
            (mapping.addr() as *mut u64).add(1000).write(0xfeed);
            assert_eq!((mem.as_ptr() as *const u64).add(1000).read(), 0xfeed);
            mem.as_ptr().add(2 * PAGE).write(7);
            assert_eq!(
                ((mapping.addr() as usize + 2 * PAGE) as *const u8).read(),
                7
            );
        }
        let wrong_inode = HostIpcHandle {
            inode: handle.inode + 1,
            ..handle.clone()
        };
        assert!(matches!(
            wrong_inode.map(),
            Err(crate::Error::System { .. })
        ));
        let too_long = HostIpcHandle {
            len: handle.len + PAGE as u64,
            ..handle.clone()
        };
        assert!(too_long.map().is_err());
        let elsewhere = HostIpcHandle {
            node: "another-node".into(),
            ..handle
        };
        assert!(matches!(
            elsewhere.map(),
            Err(crate::Error::InvalidUsage(_))
        ));
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
