//! Host IPC: how a rank maps another rank's emulated device memory on the same node, the
//! CPU backend's counterpart of CUDA IPC handles.
//!
//! The owner's [`HostIpcHandle`] names its memfd by node, process id, descriptor number
//! and inode. A peer opens `/proc/<pid>/fd/<fd>` and maps it `MAP_SHARED`: both then read
//! and write the same pages, and atomics on them work across processes. Ranks that are
//! threads of one process map each other's memory the same way, so a rank that frees its
//! memory early (it failed, say) unmaps only its own view and never pulls pages from under
//! a peer.
//!
//! A handle comes from a peer and is not trusted. Before anything is mapped, [`HostIpcHandle::map`]
//! checks that the descriptor names an oxccl device-memory object ([`MEMFD_NAME`]), and,
//! once it is open (so it cannot be swapped meanwhile), that it lives on the memfd file
//! system, has the inode and the exact size the handle says, and is sealed against
//! shrinking and growing (so the mapping can never fault). Anything else is refused with an
//! error that says which check failed.

use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd, RawFd};
use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use serde::{Deserialize, Serialize};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// Name every emulated device-memory object is created with (it shows in
/// `/proc/<pid>/fd` as `/memfd:oxccl-device-memory (deleted)`).
pub const MEMFD_NAME: &str = "oxccl-device-memory";

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

/// The device number of the file system memfds live on, learnt from one of our own.
fn memfd_device() -> Option<u64> {
    static DEV: OnceLock<Option<u64>> = OnceLock::new();
    *DEV.get_or_init(|| {
        let fd = rustix::fs::memfd_create("oxccl-probe", MemfdFlags::CLOEXEC).ok()?;
        rustix::fs::fstat(&fd).ok().map(|s| s.st_dev)
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

    /// Whether the memory belongs to this process.
    pub fn is_local(&self) -> bool {
        self.pid == std::process::id() && self.node == node_name()
    }

    /// Maps the memory into this process, after the checks of the module docs.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for memory on another node, or a descriptor that is not an
    /// oxccl device-memory object of the handle's inode and size, sealed; [`Error::System`]
    /// when the owner's descriptor cannot be opened (the process ended, or another user owns
    /// it) or the mapping fails.
    pub fn map(&self) -> Result<HostIpcMapping> {
        if self.node != node_name() {
            return Err(Error::InvalidUsage(format!(
                "memory on node `{}` cannot be mapped on node `{}`: host IPC works within one node",
                self.node,
                node_name()
            )));
        }
        let path = format!("/proc/{}/fd/{}", self.pid, self.fd);
        let refuse = |why: String| {
            Error::InvalidUsage(format!(
                "refusing to map {path} (memory of process {}): {why}",
                self.pid
            ))
        };
        let system = |what: &str, e: rustix::io::Errno| {
            let gone = if e == rustix::io::Errno::NOENT {
                ": the owner freed it, or ended"
            } else {
                ""
            };
            Error::System {
                context: format!("{what} {path} (memory of process {}){gone}", self.pid),
                source: e.into(),
            }
        };
        // What the descriptor names, before opening it: only oxccl's own objects.
        let target = rustix::fs::readlink(&path, Vec::new()).map_err(|e| system("reading", e))?;
        let expected = format!("/memfd:{MEMFD_NAME}");
        if !target.to_bytes().starts_with(expected.as_bytes()) {
            return Err(refuse(format!(
                "it is `{}`, not an oxccl device-memory object ({expected})",
                target.to_string_lossy()
            )));
        }
        // The owner could swap its descriptor between the look above and this open: whatever
        // it names then must neither block the open (a FIFO), become our terminal, nor be
        // mapped (checked below). A memfd ignores both flags.
        let flags = OFlags::RDWR | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&path, flags, Mode::empty()).map_err(|e| system("opening", e))?;
        // Checked on the open descriptor: what we map is what we checked.
        self.check_object(&fd).map_err(refuse)?;
        let len = usize::try_from(self.len)
            .map_err(|_| Error::InvalidUsage(format!("{} bytes do not fit", self.len)))?;
        // SAFETY: the object holds exactly `len` bytes and is sealed against shrinking
        // (checked above), so every page of the mapping stays backed.
        let raw = unsafe { map_shared(&fd, len) }.map_err(|e| system("mapping", e))?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::Internal("mmap returned null".into()))?;
        Ok(HostIpcMapping { ptr, len })
    }

    /// Checks the open object against the handle: memfd file system, inode, exact size,
    /// seals. Returns why it does not match.
    fn check_object(&self, fd: &OwnedFd) -> std::result::Result<(), String> {
        let stat = rustix::fs::fstat(fd).map_err(|e| format!("cannot inspect it: {e}"))?;
        if memfd_device().is_some_and(|dev| dev != stat.st_dev) {
            return Err("it does not live on the memfd file system".into());
        }
        if stat.st_ino != self.inode {
            return Err(format!(
                "it is inode {}, the handle names inode {} (freed, and the descriptor reused?)",
                stat.st_ino, self.inode
            ));
        }
        if self.len == 0 || stat.st_size as u64 != self.len {
            return Err(format!(
                "it holds {} bytes, the handle says {}",
                stat.st_size, self.len
            ));
        }
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| format!("no seals: {e}"))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err("it is not sealed at its size (it could shrink under the mapping)".into());
        }
        Ok(())
    }
}

/// Maps the first `len` bytes of the shared object `fd`, readable and writable, at an
/// address of the kernel's choosing: how both an allocation and a peer's view of it are made.
///
/// # Safety
/// `fd` must be a shared-memory object of at least `len` bytes that cannot shrink while
/// mapped; the caller owns the mapping and unmaps it exactly once.
pub(crate) unsafe fn map_shared(
    fd: impl AsFd,
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

/// How many oxccl device-memory objects this process has mapped (for tests that check a
/// refused handle mapped nothing).
pub fn mapped_objects() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|maps| maps.lines().filter(|l| l.contains(MEMFD_NAME)).count())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::memory::{Fill, HostMemory};

    /// Guards against a handle that names something other than an oxccl device-memory
    /// object (any file the owner has open, forged by a peer) being mapped, and against a
    /// handle whose inode or size does not match the object: each refused, nothing mapped.
    #[test]
    fn forged_handles_are_refused_before_mapping() {
        let mem = HostMemory::new(2 * 4096, Fill::Zero).unwrap();
        let good = mem.ipc_handle();
        let file = tempfile::tempfile().unwrap();
        let before = mapped_objects();
        let forged = [
            (
                HostIpcHandle {
                    fd: rustix::fd::AsRawFd::as_raw_fd(&file),
                    ..good.clone()
                },
                "not an oxccl device-memory object",
            ),
            (
                HostIpcHandle {
                    inode: good.inode + 1,
                    ..good.clone()
                },
                "inode",
            ),
            (
                HostIpcHandle {
                    len: good.len + 4096,
                    ..good.clone()
                },
                "holds",
            ),
            (
                HostIpcHandle {
                    len: good.len - 4096,
                    ..good.clone()
                },
                "holds",
            ),
        ];
        for (handle, why) in forged {
            let err = handle.map().expect_err("a forged handle was mapped");
            assert!(
                matches!(err, Error::InvalidUsage(_)) && err.to_string().contains(why),
                "{why}: {err}"
            );
        }
        assert_eq!(mapped_objects(), before, "a refused handle left a mapping");
        let elsewhere = HostIpcHandle {
            node: "another-node".into(),
            ..good.clone()
        };
        assert!(matches!(elsewhere.map(), Err(Error::InvalidUsage(_))));
        let gone = HostIpcHandle {
            pid: u32::MAX - 7,
            ..good.clone()
        };
        assert!(matches!(gone.map(), Err(Error::System { .. })));
        assert!(good.map().is_ok());
    }

    /// Guards against a handle a peer forged from a real one by changing any of its
    /// numbers (process, descriptor, inode, size; negative, zero, past the end) being
    /// mapped or making the check panic: only the handle as issued maps.
    #[test]
    fn only_the_issued_handle_maps() {
        use proptest::prelude::*;
        let mem = HostMemory::new(2 * 4096, Fill::Zero).unwrap();
        let good = mem.ipc_handle();
        let config = ProptestConfig {
            cases: 128,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(config, |(
            pid in proptest::option::of(prop_oneof![Just(0), Just(1), any::<u32>()]),
            fd in proptest::option::of(prop_oneof![-2i32..64, any::<i32>()]),
            inode in proptest::option::of(any::<u64>()),
            len in proptest::option::of(prop_oneof![0u64..3 * 4096, any::<u64>()]),
        )| {
            let forged = HostIpcHandle {
                pid: pid.unwrap_or(good.pid),
                fd: fd.unwrap_or(good.fd),
                inode: inode.unwrap_or(good.inode),
                len: len.unwrap_or(good.len),
                ..good.clone()
            };
            let mapped = forged.map();
            prop_assert_eq!(mapped.is_ok(), forged == good, "{:?}: {:?}", forged, mapped);
        });
    }
}
