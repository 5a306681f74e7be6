//! Emulated device memory: page-aligned, shareable with other processes, and never freed
//! under a running kernel.
//!
//! Every allocation of the CPU backend is an anonymous shared-memory object (`memfd`) mapped
//! `MAP_SHARED`: to kernels it is ordinary memory, and a rank in another process on the
//! same node can map the very same pages from its [`HostIpcHandle`], as a CUDA IPC handle
//! maps a peer GPU's memory. The handle travels through the bootstrap inside a registered
//! memory. The object is sealed against growing and shrinking, so a peer that maps it can
//! trust its size (a shrunk object would fault the peer's accesses).
//!
//! Like `cudaMalloc`, an allocation is not zeroed unless asked: it is filled with
//! [`UNINITIALIZED_BYTE`], so code that relies on zeroed memory (a flag read as "not yet
//! arrived") fails on the emulator as it would on a GPU.

use super::CpuDevice;
use crate::host_ipc::{HostIpcHandle, HostIpcMapping, MEMFD_NAME, map_shared};
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// Alignment (and granularity) of every emulated device allocation: one page, like
/// `cuMemAlloc`'s guarantee of at least 256 bytes and the page alignment `mmap` gives.
pub(crate) const PAGE: usize = 4096;

/// What fresh, not explicitly zeroed device memory holds on the CPU backend: every byte
/// `0xff`, so `f32`/`f64` read as NaN, counters as their maximum, flags as non-zero.
pub const UNINITIALIZED_BYTE: u8 = 0xff;

/// How a new allocation starts out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Every byte zero.
    Zero,
    /// Every byte [`UNINITIALIZED_BYTE`], as memory a GPU hands out may hold anything.
    Uninitialized,
}

/// Why an allocation failed.
#[derive(Debug)]
pub(crate) enum AllocError {
    /// The size does not fit in the address space once rounded up to pages.
    TooLarge,
    /// More than the system has available (see [`available_memory`]): refused before a
    /// page is touched, as `cuMemAlloc` refuses more than the GPU has free.
    OutOfMemory {
        /// Bytes available when it was asked.
        available: u64,
    },
    /// The system refused the memory (no memory, no file descriptors, ...).
    System(std::io::Error),
}

/// Allocations from this size on are checked against [`available_memory`] first (below
/// it the check would cost more than it can catch).
const CHECKED_FROM: usize = 64 << 20;

/// Bytes of memory the system can give now without swapping out what is in use, plus
/// free swap: `MemAvailable` and `SwapFree` of `/proc/meminfo` (shared memory, which an
/// allocation is, can go to swap), or less where the process's memory control group (a
/// container's limit) leaves less. `None` where `/proc/meminfo` says neither.
pub(crate) fn available_memory() -> Option<u64> {
    let system = system_available_memory()?;
    Some(cgroup_headroom().map_or(system, |headroom| headroom.min(system)))
}

/// What the memory control group the process sees as its own (a container's, mounted at
/// `/sys/fs/cgroup`) lets it still allocate: limit less usage, from cgroup v2's
/// `memory.max` / `memory.current` or v1's `memory.limit_in_bytes` / `memory.usage_in_bytes`.
/// `None` without a limit (`max`, or v1's page-rounded `i64::MAX`) or without the files.
fn cgroup_headroom() -> Option<u64> {
    let read =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let (limit, usage) = match read("/sys/fs/cgroup/memory.max") {
        Some(limit) => (limit, read("/sys/fs/cgroup/memory.current")?),
        None => (
            read("/sys/fs/cgroup/memory/memory.limit_in_bytes")?,
            read("/sys/fs/cgroup/memory/memory.usage_in_bytes")?,
        ),
    };
    headroom(limit, usage)
}

/// What a control group of `limit` bytes using `usage` lets a process still allocate;
/// `None` for no limit (v1 writes "no limit" as `i64::MAX` rounded down to a page).
fn headroom(limit: u64, usage: u64) -> Option<u64> {
    (limit < 1 << 62).then(|| limit.saturating_sub(usage))
}

/// `MemAvailable` plus `SwapFree` of `/proc/meminfo` (see [`available_memory`]).
fn system_available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    let available = field("MemAvailable:")?;
    Some(available.saturating_add(field("SwapFree:").unwrap_or(0)))
}

/// One page-aligned, shareable allocation, unmapped on drop.
///
/// Invariants: `ptr..ptr+len` is a `MAP_SHARED` mapping of the whole of `fd` (a sealed memfd
/// of `len` bytes), unmapped only by `Drop`; `len` is a non-zero multiple of [`PAGE`].
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
    /// Allocates at least `bytes` bytes (a whole number of pages, at least one, so that
    /// even an empty buffer has a distinct, valid address), filled as `fill` says.
    pub(crate) fn new(bytes: usize, fill: Fill) -> Result<Self, AllocError> {
        let len = bytes
            .max(1)
            .checked_next_multiple_of(PAGE)
            .filter(|&len| isize::try_from(len).is_ok())
            .ok_or(AllocError::TooLarge)?;
        // A memfd is sparse: without this, a size beyond the machine's memory would be
        // granted, and the process killed by the system once the pages are touched.
        if len >= CHECKED_FROM
            && let Some(available) = available_memory()
            && len as u64 > available
        {
            return Err(AllocError::OutOfMemory { available });
        }
        let system = |e: rustix::io::Errno| AllocError::System(e.into());
        let fd =
            rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(system)?;
        // A new memfd reads as zeros up to its length.
        rustix::fs::ftruncate(&fd, len as u64).map_err(system)?;
        // Sealed at its size: a process that maps it may rely on every page staying there.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(system)?;
        let inode = rustix::fs::fstat(&fd).map_err(system)?.st_ino;
        // SAFETY: the memfd was just sized to `len`; the mapping is owned by the value built
        // below and unmapped by its `Drop`.
        let raw = unsafe { map_shared(&fd, len) }.map_err(system)?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or(AllocError::System(std::io::ErrorKind::OutOfMemory.into()))?;
        let memory = Self {
            ptr,
            len,
            fd,
            inode,
        };
        if fill == Fill::Uninitialized {
            // SAFETY: the mapping holds `len` writable bytes, and nothing else uses it yet.
            unsafe { std::ptr::write_bytes(memory.ptr.as_ptr(), UNINITIALIZED_BYTE, len) };
        }
        Ok(memory)
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes reserved (the requested size rounded up to pages).
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

/// Device memory of one emulated device, shared by everything that may still use it: the
/// buffer it was allocated as, the registered memories and channels built on it, the proxy
/// regions that name it. The last one to let go frees it, and not under a running kernel:
/// the drop first waits (bounded) until no launch of the device is queued or running, and
/// leaks the memory if the device stays busy.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    /// `None` only once `Drop` has leaked it.
    memory: Option<HostMemory>,
    device: Arc<CpuDevice>,
    /// How long the drop waits for the device.
    drop_wait: Duration,
}

impl DeviceMemory {
    pub(crate) fn new(memory: HostMemory, device: Arc<CpuDevice>, drop_wait: Duration) -> Self {
        DeviceMemory {
            memory: Some(memory),
            device,
            drop_wait,
        }
    }

    /// The first byte (null only after `Drop` leaked the memory, when nobody can ask).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.memory
            .as_ref()
            .map_or(std::ptr::null_mut(), HostMemory::as_ptr)
    }

    /// What a process on this node needs to map the same pages.
    pub(crate) fn ipc_handle(&self) -> Option<HostIpcHandle> {
        self.memory.as_ref().map(HostMemory::ipc_handle)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let bytes = self.memory.as_ref().map_or(0, HostMemory::capacity);
        release_after_kernels(
            &self.device,
            self.drop_wait,
            self.memory.take(),
            bytes,
            "device memory",
        );
    }
}

/// A peer's memory mapped into this process for the kernels of `device` (this rank's), and
/// unmapped like [`DeviceMemory`] is freed: not under a running kernel of that device.
///
/// Shared by the memory regions and channels built on it; the last one to let go unmaps it.
/// Invariant: `mapping` is `None` only once `Drop` has leaked it.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    mapping: Option<HostIpcMapping>,
    device: Arc<CpuDevice>,
    /// How long the drop waits for the device.
    drop_wait: Duration,
}

impl PeerMapping {
    pub(crate) fn new(
        mapping: HostIpcMapping,
        device: Arc<CpuDevice>,
        drop_wait: Duration,
    ) -> Self {
        PeerMapping {
            mapping: Some(mapping),
            device,
            drop_wait,
        }
    }

    /// Address of the first byte in this process (0 only after `Drop` leaked it).
    pub(crate) fn addr(&self) -> u64 {
        self.mapping.as_ref().map_or(0, HostIpcMapping::addr)
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> u64 {
        self.mapping.as_ref().map_or(0, HostIpcMapping::len)
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        let bytes = self.len() as usize;
        release_after_kernels(
            &self.device,
            self.drop_wait,
            self.mapping.take(),
            bytes,
            "a peer's memory mapped here",
        );
    }
}

/// Drops `memory` once no launch of `device` is queued or running, waiting at most
/// `drop_wait`; if the device stays busy, leaks it instead: a kernel still running (one
/// that timed out, say, and went on in the background) may use it, and freeing or
/// unmapping it would crash the process under that kernel.
fn release_after_kernels<T>(
    device: &CpuDevice,
    drop_wait: Duration,
    memory: Option<T>,
    bytes: usize,
    what: &str,
) {
    if device.is_idle() || device.wait_idle(drop_wait) {
        drop(memory);
        return;
    }
    tracing::warn!(
        device = device.ordinal,
        bytes,
        "{what} released while kernels of its device still run; leaking it"
    );
    std::mem::forget(memory);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against an allocation larger than the machine's memory being handed out (a
    /// memfd is sparse) and then filled, which got the process killed by the system (a
    /// 1 TB `pingpong --bytes` buffer) where `cuMemAlloc` returns out-of-memory.
    #[test]
    fn more_than_the_machine_has_is_refused_untouched() {
        let available = available_memory().expect("MemAvailable in /proc/meminfo");
        for fill in [Fill::Zero, Fill::Uninitialized] {
            let bytes = usize::try_from(available)
                .unwrap()
                .saturating_mul(4)
                .max(1 << 40);
            match HostMemory::new(bytes, fill) {
                Err(AllocError::OutOfMemory { available: a }) => assert!(a < bytes as u64),
                other => panic!("{bytes} bytes: {other:?}"),
            }
        }
    }

    /// Guards against a container's memory limit being ignored, or v1's way of saying
    /// "no limit" being taken for one.
    #[test]
    fn cgroup_headroom_is_limit_less_usage() {
        assert_eq!(headroom(4 << 30, 1 << 30), Some(3 << 30));
        assert_eq!(headroom(1 << 30, 2 << 30), Some(0));
        assert_eq!(headroom(9_223_372_036_854_771_712, 1 << 30), None);
    }

    /// Guards against allocations that are not page-aligned, not zeroed when asked, or
    /// zeroed when not asked (code relying on zeroed memory must fail here as on a GPU), and
    /// against an empty buffer getting a null or shared address.
    #[test]
    fn page_aligned_filled_as_asked_and_never_empty() {
        for (fill, byte) in [(Fill::Zero, 0u8), (Fill::Uninitialized, UNINITIALIZED_BYTE)] {
            for bytes in [0, 1, 4095, 4096, 4097, 1 << 20] {
                let mem = HostMemory::new(bytes, fill).unwrap();
                assert_eq!(mem.as_ptr() as usize % PAGE, 0);
                assert!(mem.capacity() >= bytes.max(1));
                assert_eq!(mem.capacity() % PAGE, 0);
                // SAFETY: the allocation holds `capacity()` initialized bytes.
                let all = unsafe { std::slice::from_raw_parts(mem.as_ptr(), mem.capacity()) };
                assert!(all.iter().all(|&b| b == byte), "{fill:?}");
            }
        }
    }

    /// Guards against a mapping through the handle that does not share the pages (peers
    /// would write into a copy), and against a handle accepted for another object or node.
    #[test]
    fn handle_maps_the_same_pages() {
        let mem = HostMemory::new(3 * PAGE, Fill::Zero).unwrap();
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
    }

    /// Guards against an object a peer maps being resized under it (a shrink would fault the
    /// peer's accesses): it is sealed at its size.
    #[test]
    fn allocations_are_sealed_at_their_size() {
        let mem = HostMemory::new(PAGE, Fill::Zero).unwrap();
        assert!(rustix::fs::ftruncate(&mem.fd, 0).is_err());
        assert!(rustix::fs::ftruncate(&mem.fd, 2 * PAGE as u64).is_err());
        let seals = rustix::fs::fcntl_get_seals(&mem.fd).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
    }

    /// Guards against a size overflow turning into a tiny allocation.
    #[test]
    fn absurd_sizes_fail_cleanly() {
        assert!(matches!(
            HostMemory::new(usize::MAX, Fill::Zero),
            Err(AllocError::TooLarge)
        ));
    }
}
