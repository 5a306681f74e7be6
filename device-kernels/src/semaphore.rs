//! Semaphores: monotonic u64 counters one side raises and the other waits on.
//!
//! | cell | written by | read by | scope |
//! |---|---|---|---|
//! | `inbound` | the peer (its proxy for [`Host2DeviceSemaphoreDeviceHandle`], its kernels for [`Device2DeviceSemaphoreDeviceHandle`]) | this kernel, acquire | system |
//! | `expected` | this kernel (the waiting thread) | this kernel | device |
//! | `remote_inbound` (device-to-device only) = the peer's `inbound` | this kernel: atomic add, release | the peer | system |
//!
//! Invariants: counters only grow. The `n`-th `wait` returns once `inbound >= n`, so
//! signals are never lost and may run ahead of waits. A signal is one atomic add on the
//! peer's counter (fire-and-forget `red.release.sys.global.add.u64` on the GPU), so any
//! number of threads and blocks may signal the same semaphore at once. One thread at a time
//! waits on a given semaphore (as in MSCCL++). Counters in device memory persist across
//! kernel launches, so a later kernel continues where an earlier one stopped.

use crate::arch::{Awaited, Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::error::{DeviceError, DeviceOp};
use crate::wait::WaitPolicy;

/// Where a semaphore's counters are: the layout inside the semaphore handles, without the
/// promise that the addresses are live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SemaphoreRawParts {
    /// Address of the inbound counter (raised by the peer).
    pub inbound: u64,
    /// Address of the expected-inbound counter (this side's count of consumed signals).
    pub expected: u64,
    /// Address of the peer's inbound counter, mapped here (device-to-device only; else 0).
    pub remote_inbound: u64,
}

const _: () = assert!(core::mem::size_of::<SemaphoreRawParts>() == 24);

/// Waiting side of a semaphore the peer's proxy raises (a port channel's semaphore). Valid
/// for `'a`, the life of the host object that made it; a zeroed one (`Default`) refuses
/// every call with [`DeviceError::NullHandle`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Host2DeviceSemaphoreDeviceHandle<'a> {
    raw: SemaphoreRawParts,
    wait: WaitPolicy<'a>,
}

/// A semaphore kernels raise directly in peer memory (a memory channel's semaphore). Valid
/// for `'a`; a zeroed one refuses every call with [`DeviceError::NullHandle`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Device2DeviceSemaphoreDeviceHandle<'a> {
    raw: SemaphoreRawParts,
    wait: WaitPolicy<'a>,
}

const _: () = assert!(core::mem::size_of::<Host2DeviceSemaphoreDeviceHandle<'static>>() == 56);
const _: () = assert!(core::mem::size_of::<Device2DeviceSemaphoreDeviceHandle<'static>>() == 56);
const _: () =
    assert!(core::mem::offset_of!(Device2DeviceSemaphoreDeviceHandle<'static>, wait) == 24);

/// Byte offsets of the handle's parts, for tools that read a kernel's machine code: `cargo xtask build-ptx --check` finds the
/// protocol's cells among a kernel's parameters through them.
impl Host2DeviceSemaphoreDeviceHandle<'_> {
    /// Byte offset of the counters' addresses ([`SemaphoreRawParts`]).
    pub const RAW_OFFSET: usize = core::mem::offset_of!(Self, raw);
}

/// Byte offsets of the handle's parts, for tools that read a kernel's machine code: `cargo xtask build-ptx --check` finds the
/// protocol's cells among a kernel's parameters through them.
impl Device2DeviceSemaphoreDeviceHandle<'_> {
    /// Byte offset of the counters' addresses ([`SemaphoreRawParts`]).
    pub const RAW_OFFSET: usize = core::mem::offset_of!(Self, raw);
}

// SAFETY: values safe code can hold are built by `from_raw_parts` (counters live for 'a) or
// zeroed, which every method refuses before touching memory; no drop glue.
unsafe impl crate::launch::KernelArg for Host2DeviceSemaphoreDeviceHandle<'_> {}
// SAFETY: as above.
unsafe impl crate::launch::KernelArg for Device2DeviceSemaphoreDeviceHandle<'_> {}

#[inline(always)]
fn cell<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: the handles' constructor contract: non-zero counter addresses are live,
    // aligned `AtomicU64`s for the handle's lifetime; callers check for zero first.
    unsafe { atomic::cell(addr) }
}

/// Shared by both handles: consume one inbound signal if present.
#[inline(always)]
fn poll_inbound(raw: &SemaphoreRawParts, wait: &WaitPolicy<'_>) -> Result<bool, DeviceError> {
    if raw.inbound == 0 || raw.expected == 0 {
        return Err(wait.null_handle(DeviceOp::SemaphoreWait));
    }
    // Relaxed, device scope: only the waiting thread touches `expected`.
    let next = atomic::load(cell(raw.expected), Ordering::Relaxed, Scope::Gpu) + 1;
    // Acquire: pairs with the peer's Release add (or the proxy's release write) of
    // `inbound`, so the data sent before the signal is visible.
    if atomic::load(cell(raw.inbound), Ordering::Acquire, Scope::System) >= next {
        atomic::store(cell(raw.expected), next, Ordering::Relaxed, Scope::Gpu);
        Ok(true)
    } else {
        Ok(false)
    }
}

/// Shared by both handles: wait for the next inbound signal.
#[inline(always)]
fn wait_inbound(raw: &SemaphoreRawParts, wait: &WaitPolicy<'_>) -> Result<(), DeviceError> {
    if raw.inbound == 0 || raw.expected == 0 {
        return Err(wait.null_handle(DeviceOp::SemaphoreWait));
    }
    // Relaxed, device scope: as in `poll_inbound`.
    let next = atomic::fetch_add(cell(raw.expected), 1, Ordering::Relaxed, Scope::Gpu) + 1;
    let inbound = cell(raw.inbound);
    wait.wait_on_memory(
        DeviceOp::SemaphoreWait,
        Awaited::AtLeast {
            addr: raw.inbound,
            value: next,
        },
        // Acquire: as in `poll_inbound`.
        || atomic::load(inbound, Ordering::Acquire, Scope::System) >= next,
        || {
            [
                next,
                atomic::load(inbound, Ordering::Relaxed, Scope::System),
                0,
            ]
        },
    )
}

impl<'a> Host2DeviceSemaphoreDeviceHandle<'a> {
    /// A handle over the counters `raw` names (its `remote_inbound` is not used).
    ///
    /// # Safety
    /// `raw.inbound` and `raw.expected` point to live, 8-byte aligned `AtomicU64`s for `'a`,
    /// reachable by every thread that uses the handle and only accessed atomically;
    /// `raw.inbound` is raised only by the peer's proxy, `raw.expected` touched only by this
    /// side's waiting thread.
    pub unsafe fn from_raw_parts(raw: SemaphoreRawParts, wait: WaitPolicy<'a>) -> Self {
        Host2DeviceSemaphoreDeviceHandle { raw, wait }
    }

    /// The counters' addresses.
    pub const fn raw_parts(&self) -> SemaphoreRawParts {
        self.raw
    }

    /// The policy of the handle's waits.
    pub const fn wait_policy(&self) -> WaitPolicy<'a> {
        self.wait
    }

    /// Consumes the next signal if it has arrived; never blocks. Data written before that
    /// signal is visible afterwards when this returns `Ok(true)`.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn poll(&self) -> Result<bool, DeviceError> {
        poll_inbound(&self.raw, &self.wait)
    }

    /// Waits for the next signal; data written before it is visible afterwards.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] past the wait limit; the signal
    /// still counts as expected, so the semaphore is out of step and the host is told (the
    /// record says which signal was waited for and how many had arrived).
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn wait(&self) -> Result<(), DeviceError> {
        wait_inbound(&self.raw, &self.wait)
    }
}

impl<'a> Device2DeviceSemaphoreDeviceHandle<'a> {
    /// A handle over the counters `raw` names.
    ///
    /// # Safety
    /// As [`Host2DeviceSemaphoreDeviceHandle::from_raw_parts`], and `raw.remote_inbound`
    /// points to the peer's live, 8-byte aligned inbound counter, mapped here, for `'a`.
    pub unsafe fn from_raw_parts(raw: SemaphoreRawParts, wait: WaitPolicy<'a>) -> Self {
        Device2DeviceSemaphoreDeviceHandle { raw, wait }
    }

    /// The counters' addresses.
    pub const fn raw_parts(&self) -> SemaphoreRawParts {
        self.raw
    }

    /// The policy of the handle's waits.
    pub const fn wait_policy(&self) -> WaitPolicy<'a> {
        self.wait
    }

    /// Raises the peer's semaphore by one; every write this thread made before is visible to
    /// the peer once its matching `wait` returns (release, system scope). Any number of
    /// threads may signal at once: each signal is counted.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn signal(&self) -> Result<(), DeviceError> {
        self.signal_with(Ordering::Release)
    }

    /// Raises the peer's semaphore by one with no ordering: only the count is delivered.
    /// For pure synchronization points that carry no data of this thread.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn relaxed_signal(&self) -> Result<(), DeviceError> {
        self.signal_with(Ordering::Relaxed)
    }

    #[inline(always)]
    fn signal_with(&self, order: Ordering) -> Result<(), DeviceError> {
        if self.raw.remote_inbound == 0 {
            return Err(self.wait.null_handle(DeviceOp::SemaphoreSignal));
        }
        // Release (from `signal`): pairs with the peer's Acquire load of its inbound. An add,
        // not a store of a count kept here: concurrent signallers never move it backwards.
        atomic::add(cell(self.raw.remote_inbound), 1, order, Scope::System);
        Ok(())
    }

    /// Consumes the next signal if it has arrived; never blocks.
    ///
    /// # Errors
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn poll(&self) -> Result<bool, DeviceError> {
        poll_inbound(&self.raw, &self.wait)
    }

    /// Waits for the next signal; the peer's writes before it are visible afterwards.
    ///
    /// # Errors
    /// As [`Host2DeviceSemaphoreDeviceHandle::wait`].
    #[inline(always)]
    pub fn wait(&self) -> Result<(), DeviceError> {
        wait_inbound(&self.raw, &self.wait)
    }
}
