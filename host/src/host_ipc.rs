//! Host IPC: how a rank maps another process's emulated device memory on the same node,
//! the CPU backend's counterpart of CUDA IPC handles.
//!
//! The owner's [`HostIpcHandle`] names its memfd by node, process id, descriptor number
//! and inode. A peer opens `/proc/<pid>/fd/<fd>` (same user, same node), checks that it is
//! still the same object (inode) and large enough, and maps it `MAP_SHARED`: both processes
//! then read and write the same pages, and atomics on them work across processes.

use crate::error::{Error, Result};
use rustix::fd::RawFd;
use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use serde::{Deserialize, Serialize};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// What a process on the same node needs to map a shared allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostIpcHandle {
    /// Host name of the node the memory lives on.
    pub node: String,
    /// Owning process.
    pub pid: u32,
    /// The owner's descriptor of the memfd.
    pub fd: i32,
    /// Inode of the memfd, to tell it from a later object behind a reused descriptor.
    pub inode: u64,
    /// Bytes of the object.
    pub len: u64,
}

/// This node's host name (looked up once).
pub fn node_name() -> &'static str {
    static NODE: OnceLock<String> = OnceLock::new();
    NODE.get_or_init(|| {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    })
}

impl HostIpcHandle {
    pub(crate) fn of_this_process(fd: RawFd, inode: u64, len: u64) -> Self {
        HostIpcHandle {
            node: node_name().to_owned(),
            pid: std::process::id(),
            fd,
            inode,
            len,
        }
    }

    /// Whether the memory belongs to this process (its address can be used as is).
    pub fn is_local(&self) -> bool {
        self.pid == std::process::id() && self.node == node_name()
    }

    /// Maps the memory into this process.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for memory on another node; [`Error::System`] when the
    /// owner's descriptor cannot be opened (the process ended, or another user owns it),
    /// names another object than the handle (it was freed and the number reused), is
    /// smaller than the handle says, or cannot be mapped.
    pub fn map(&self) -> Result<HostIpcMapping> {
        if self.node != node_name() {
            return Err(Error::InvalidUsage(format!(
                "memory on node `{}` cannot be mapped on node `{}`: host IPC works within one node",
                self.node,
                node_name()
            )));
        }
        let path = format!("/proc/{}/fd/{}", self.pid, self.fd);
        let system = |what: &str, e: rustix::io::Errno| Error::System {
            context: format!("{what} {path} (memory of process {})", self.pid),
            source: e.into(),
        };
        let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| system("opening", e))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| system("inspecting", e))?;
        if stat.st_ino != self.inode || (stat.st_size as u64) < self.len {
            return Err(Error::System {
                context: format!(
                    "{path} is not the {}-byte object the handle names (inode {} of {} bytes, expected inode {})",
                    self.len, stat.st_ino, stat.st_size, self.inode
                ),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        let len = usize::try_from(self.len)
            .map_err(|_| Error::InvalidUsage(format!("{} bytes do not fit", self.len)))?;
        // SAFETY: the object holds at least `len` bytes (checked above).
        let raw = unsafe { map_shared(&fd, len) }.map_err(|e| system("mapping", e))?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::Internal("mmap returned null".into()))?;
        Ok(HostIpcMapping { ptr, len })
    }
}

/// Maps the first `len` bytes of the shared object `fd`, readable and writable, at an
/// address of the kernel's choosing: how both an allocation and a peer's view of it are made.
///
/// # Safety
/// `fd` must be a shared-memory object of at least `len` bytes; the caller owns the mapping
/// and unmaps it exactly once.
pub(crate) unsafe fn map_shared(
    fd: impl rustix::fd::AsFd,
    len: usize,
) -> rustix::io::Result<*mut core::ffi::c_void> {
    // SAFETY: a fresh mapping (null hint), so no existing memory is replaced; the size is
    // within the object by the caller's promise.
    unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
}

/// A peer's memory mapped into this process; unmapped on drop.
///
/// Invariant: `ptr..ptr+len` is a mapping owned by this value.
#[derive(Debug)]
pub struct HostIpcMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, not tied to a thread; access through the
// address is governed by the channels and kernels that use it.
unsafe impl Send for HostIpcMapping {}
// SAFETY: `&HostIpcMapping` only gives out the address and the length.
unsafe impl Sync for HostIpcMapping {}

impl HostIpcMapping {
    /// Address of the first byte in this process.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether nothing is mapped (never: mappings are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostIpcMapping {
    fn drop(&mut self) {
        // SAFETY: by the invariant the range is our mapping, unmapped only here.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
