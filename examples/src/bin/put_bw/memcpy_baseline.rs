//! The host-ipc baseline: one thread copying between two shared memory mappings (memfds, as
//! the CPU backend's device memory is), the copy the proxy makes for a put on one node.

use oxccl::{Error, Result};
use rustix::fs::{MemfdFlags, ftruncate, memfd_create};
use rustix::mm::{MapFlags, ProtFlags, mmap, munmap};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Two shared mappings of `len` bytes each.
pub(crate) struct SharedCopy {
    src: SharedMapping,
    dst: SharedMapping,
}

impl SharedCopy {
    /// Maps two memfds of `len` bytes and writes every page of both (so no run pays for
    /// page faults).
    ///
    /// # Errors
    /// The system refused a memfd or a mapping.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let mut src = SharedMapping::new(len)?;
        let mut dst = SharedMapping::new(len)?;
        for (i, b) in src.bytes_mut().iter_mut().enumerate() {
            *b = i as u8;
        }
        dst.bytes_mut().fill(0);
        Ok(SharedCopy { src, dst })
    }

    /// The best of `runs` timed runs, each copying the first `bytes` from one mapping to the
    /// other `iters` times.
    pub(crate) fn best_of(&mut self, bytes: u64, iters: u32, runs: u32) -> Duration {
        let n = (bytes as usize).min(self.src.len);
        let mut best = Duration::MAX;
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            for _ in 0..iters {
                let src = std::hint::black_box(&self.src.bytes()[..n]);
                self.dst.bytes_mut()[..n].copy_from_slice(src);
            }
            std::hint::black_box(self.dst.bytes());
            best = best.min(start.elapsed());
        }
        best
    }
}

/// A read-write shared mapping of a memfd of its own.
struct SharedMapping {
    /// Start of the mapping; `len` bytes, readable and writable, until `drop`.
    ptr: NonNull<u8>,
    len: usize,
}

impl SharedMapping {
    fn new(len: usize) -> Result<Self> {
        let system = |context: &str, e: rustix::io::Errno| Error::System {
            context: context.into(),
            source: e.into(),
        };
        let fd = memfd_create("oxccl-put-bw-baseline", MemfdFlags::CLOEXEC)
            .map_err(|e| system("creating a memfd for the memcpy baseline", e))?;
        ftruncate(&fd, len as u64).map_err(|e| system("sizing the baseline's memfd", e))?;
        // SAFETY: a new mapping at an address the kernel picks, of a file of `len` bytes;
        // it overlaps no Rust object. The mapping outlives the descriptor, closed on return.
        let raw = unsafe {
            mmap(
                std::ptr::null_mut(),
                len.max(1),
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| system("mapping the baseline's memfd", e))?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::Internal("mmap returned a null mapping".into()))?;
        Ok(SharedMapping { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped read-write until drop (field invariant); only this
        // process maps the memfd, and `&self` excludes a `bytes_mut` borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once; no borrow of it outlives `self`.
        // An error here leaves the pages mapped until exit, which harms nothing.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}
