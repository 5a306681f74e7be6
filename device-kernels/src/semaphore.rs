//! Semaphores: monotonic u64 counters one side raises and the other waits on.
//!
//! | cell | written by | read by | scope |
//! |---|---|---|---|
//! | `inbound` | the peer (its proxy for [`Host2DeviceSemaphoreDeviceHandle`], its kernel for [`Device2DeviceSemaphoreDeviceHandle`]) | this kernel, acquire | system |
//! | `expected` | this kernel (the waiting thread) | this kernel | device |
//! | `outbound` (device-to-device only) | this kernel (the signalling thread) | this kernel | device |
//! | `remote_inbound` (device-to-device only) = the peer's `inbound` | this kernel, release store | the peer | system |
//!
//! Invariants: counters only grow. The `n`-th `wait` returns once `inbound >= n`, so
//! signals are never lost and may run ahead of waits. One thread at a time waits on a given
//! semaphore, and one thread at a time signals it (as in MSCCL++): counters in device memory
//! persist across kernel launches, so a later kernel continues where an earlier one stopped.

use crate::arch::{Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::error::DeviceError;
use crate::wait::WaitPolicy;

/// Waiting side of a semaphore the peer's proxy raises (a port channel's semaphore).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Host2DeviceSemaphoreDeviceHandle {
    /// Address of the inbound counter.
    pub inbound: u64,
    /// Address of the expected-inbound counter.
    pub expected: u64,
    /// Limit and abort flag of `wait`.
    pub wait: WaitPolicy,
}

const _: () = assert!(core::mem::size_of::<Host2DeviceSemaphoreDeviceHandle>() == 40);

/// A semaphore kernels raise directly in peer memory (a memory channel's semaphore).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Device2DeviceSemaphoreDeviceHandle {
    /// Address of the inbound counter (the peer writes it).
    pub inbound: u64,
    /// Address of the expected-inbound counter.
    pub expected: u64,
    /// Address of the peer's inbound counter, mapped here.
    pub remote_inbound: u64,
    /// Address of the outbound counter (signals sent so far).
    pub outbound: u64,
    /// Limit and abort flag of `wait`.
    pub wait: WaitPolicy,
}

const _: () = assert!(core::mem::size_of::<Device2DeviceSemaphoreDeviceHandle>() == 56);
const _: () = assert!(core::mem::offset_of!(Device2DeviceSemaphoreDeviceHandle, wait) == 32);

#[inline(always)]
fn cell<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: semaphore handles are built by the host from semaphores whose counters live in
    // registered memory that outlives every kernel using the handle.
    unsafe { atomic::cell(addr) }
}

/// Shared by both handles: consume one inbound signal if present.
#[inline(always)]
fn poll_inbound(inbound: u64, expected: u64) -> bool {
    // Relaxed, device scope: only the waiting thread touches `expected`.
    let next = atomic::load(cell(expected), Ordering::Relaxed, Scope::Gpu) + 1;
    // Acquire: pairs with the peer's Release store (or the proxy's release write) of
    // `inbound`, so the data sent before the signal is visible.
    if atomic::load(cell(inbound), Ordering::Acquire, Scope::System) >= next {
        atomic::store(cell(expected), next, Ordering::Relaxed, Scope::Gpu);
        true
    } else {
        false
    }
}

/// Shared by both handles: wait for the next inbound signal.
#[inline(always)]
fn wait_inbound(inbound: u64, expected: u64, policy: &WaitPolicy) -> Result<(), DeviceError> {
    // Relaxed, device scope: as in `poll_inbound`.
    let next = atomic::fetch_add(cell(expected), 1, Ordering::Relaxed, Scope::Gpu) + 1;
    // Acquire: as in `poll_inbound`.
    policy.wait_until(|| atomic::load(cell(inbound), Ordering::Acquire, Scope::System) >= next)
}

impl Host2DeviceSemaphoreDeviceHandle {
    /// Consumes the next signal if it has arrived; never blocks. Data written before that
    /// signal is visible afterwards when this returns true.
    #[inline(always)]
    pub fn poll(&self) -> bool {
        poll_inbound(self.inbound, self.expected)
    }

    /// Waits for the next signal; data written before it is visible afterwards.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] past the wait limit; the signal
    /// still counts as expected, so the semaphore is out of step and the host is told.
    #[inline(always)]
    pub fn wait(&self) -> Result<(), DeviceError> {
        wait_inbound(self.inbound, self.expected, &self.wait)
    }
}

impl Device2DeviceSemaphoreDeviceHandle {
    /// Raises the peer's semaphore by one; every write this thread made before is visible to
    /// the peer once its matching `wait` returns (release, system scope).
    #[inline(always)]
    pub fn signal(&self) {
        self.signal_with(Ordering::Release)
    }

    /// Raises the peer's semaphore by one with no ordering: only the count is delivered.
    /// For pure synchronization points that carry no data of this thread.
    #[inline(always)]
    pub fn relaxed_signal(&self) {
        self.signal_with(Ordering::Relaxed)
    }

    #[inline(always)]
    fn signal_with(&self, order: Ordering) {
        // Relaxed, device scope: only the signalling thread touches `outbound`.
        let value = atomic::fetch_add(cell(self.outbound), 1, Ordering::Relaxed, Scope::Gpu) + 1;
        // Release (from `signal`): pairs with the peer's Acquire load of its inbound.
        atomic::store(cell(self.remote_inbound), value, order, Scope::System);
    }

    /// Consumes the next signal if it has arrived; never blocks.
    #[inline(always)]
    pub fn poll(&self) -> bool {
        poll_inbound(self.inbound, self.expected)
    }

    /// Waits for the next signal; the peer's writes before it are visible afterwards.
    ///
    /// # Errors
    /// As [`Host2DeviceSemaphoreDeviceHandle::wait`].
    #[inline(always)]
    pub fn wait(&self) -> Result<(), DeviceError> {
        wait_inbound(self.inbound, self.expected, &self.wait)
    }
}
