//! Device memory owned by the host: allocation, copies to and from the host, and the views
//! kernels receive.
//!
//! On [`Backend::Cpu`](crate::Backend::Cpu) a buffer is page-aligned (4096), zeroed host
//! memory; its address is what kernels dereference.

use crate::cpu::memory::{AllocError, HostMemory};
use crate::device::{Device, timeout_from_env};
use crate::{Error, Result};
use bytemuck::Pod;
use oxccl_device::{DevicePtr, DeviceSlice};
use std::fmt;
use std::marker::PhantomData;

/// `len` elements of `T` in device memory, freed on drop.
///
/// Kernels reach the buffer through [`Self::device_slice`] (or [`Self::device_ptr`]); the
/// host through the copy methods, which are **synchronous** (like `cuMemcpy`): they copy
/// when called, without waiting for kernels. Synchronize the streams whose kernels write
/// (or read) the buffer before copying from (or into) it.
///
/// Dropping a buffer first waits until no launch of its device is queued or running (as
/// `cuMemFree` does), at most the default `synchronize` timeout (`OXCCL_TIMEOUT_SECS`);
/// if the device is still busy then, the memory is leaked rather than freed under a
/// running kernel. Once such a wait (or a stream's `synchronize`) has timed out, later
/// drops leak at once until the device goes idle, so that cleaning up after a stuck
/// kernel does not wait a whole timeout per buffer.
///
/// # Examples
/// ```
/// let device = oxccl::Device::cpu(0);
/// let mut buf = device.alloc::<u64>(4)?;
/// buf.copy_from_host(&[1, 2, 3, 4])?;
/// let mut out = [0u64; 4];
/// buf.copy_to_host(&mut out)?;
/// assert_eq!(out, [1, 2, 3, 4]);
/// # Ok::<(), oxccl::Error>(())
/// ```
pub struct DeviceBuffer<T> {
    /// Holds at least `len * size_of::<T>()` bytes; `None` only after `Drop` leaked it.
    memory: Option<HostMemory>,
    len: usize,
    device: Device,
    _elem: PhantomData<T>,
}

// SAFETY: the buffer owns its memory like a `Box<[T]>`: sending it sends the `T`s.
unsafe impl<T: Send> Send for DeviceBuffer<T> {}
// SAFETY: `&DeviceBuffer` only reads the `T`s (`copy_to_host`) or hands out addresses.
unsafe impl<T: Sync> Sync for DeviceBuffer<T> {}

impl<T: Pod> DeviceBuffer<T> {
    pub(crate) fn zeroed(device: &Device, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "a buffer of {len} elements of {} bytes does not fit in memory",
                size_of::<T>()
            ))
        })?;
        let memory = HostMemory::zeroed(bytes).map_err(|err| match err {
            AllocError::TooLarge => {
                Error::InvalidUsage(format!("a buffer of {bytes} bytes does not fit in memory"))
            }
            AllocError::System(source) => Error::System {
                context: format!(
                    "allocating {bytes} bytes on {} device {}",
                    device.backend(),
                    device.ordinal()
                ),
                source,
            },
        })?;
        Ok(Self {
            memory: Some(memory),
            len,
            device: device.clone(),
            _elem: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes (`len * size_of::<T>()`).
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// What another process on this node needs to map the buffer (none once a buffer of
    /// a stuck device was leaked).
    pub(crate) fn ipc_handle(&self) -> Option<crate::host_ipc::HostIpcHandle> {
        self.memory.as_ref().map(HostMemory::ipc_handle)
    }

    /// Device address of the first element (page-aligned).
    pub fn addr(&self) -> u64 {
        self.base() as usize as u64
    }

    /// The kernel-side view of the whole buffer: its address and length.
    pub fn device_slice(&self) -> DeviceSlice<T> {
        DeviceSlice::new(self.addr(), self.len as u64)
    }

    /// The kernel-side address of the first element.
    pub fn device_ptr(&self) -> DevicePtr<T> {
        DevicePtr::new(self.addr())
    }

    /// Copies `src` into the buffer, synchronously.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `src.len() != self.len()`.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        // SAFETY: the buffer holds `len` elements' worth of bytes at `base()`, aligned for
        // `T` (page-aligned); `src` has the same length and, being a host slice borrowed
        // while we hold `&mut self`, does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().cast::<T>(), src.len()) };
        Ok(())
    }

    /// Copies the buffer into `dst`, synchronously.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `dst.len() != self.len()`.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        // SAFETY: the buffer holds `len` initialized elements at `base()` (zeroed at
        // allocation; every bit pattern is a valid `T: Pod`), aligned for `T`; `dst` is an
        // exclusive host slice of the same length, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().cast::<T>(), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// The buffer's contents as a new vector, copied synchronously.
    ///
    /// # Errors
    /// None on the CPU backend; the `Result` leaves room for backends whose copies can
    /// fail.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Sets every element to `value`, synchronously.
    ///
    /// # Errors
    /// None on the CPU backend (see [`Self::to_vec`]).
    pub fn fill(&mut self, value: T) -> Result<()> {
        let base = self.base().cast::<T>();
        for i in 0..self.len {
            // SAFETY: `i < len`, and the buffer holds `len` elements aligned for `T`.
            unsafe { base.add(i).write(value) };
        }
        Ok(())
    }

    /// Sets every byte to zero, synchronously.
    ///
    /// # Errors
    /// None on the CPU backend (see [`Self::to_vec`]).
    pub fn zero(&mut self) -> Result<()> {
        // SAFETY: the buffer holds `size_bytes()` writable bytes at `base()`.
        unsafe { std::ptr::write_bytes(self.base(), 0, self.size_bytes()) };
        Ok(())
    }

    fn check_len(&self, what: &str, host_len: usize) -> Result<()> {
        if host_len == self.len {
            Ok(())
        } else {
            Err(Error::InvalidUsage(format!(
                "{what}: the host slice has {host_len} elements, the device buffer {}",
                self.len
            )))
        }
    }
}

impl<T> DeviceBuffer<T> {
    fn base(&self) -> *mut u8 {
        match &self.memory {
            Some(memory) => memory.as_ptr(),
            // Only `Drop` takes the memory, and nothing runs after it.
            None => std::ptr::null_mut(),
        }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        let device = self.device.cpu_device();
        if device.is_idle() {
            return;
        }
        // A kernel still running may use this memory: wait for the device (bounded), and
        // leak the memory if it does not go idle rather than free it under the kernel.
        let timeout = timeout_from_env().unwrap_or(crate::device::DEFAULT_TIMEOUT);
        if !device.wait_idle(timeout) {
            let memory = self.memory.take();
            tracing::warn!(
                device = device.ordinal,
                bytes = self.len * size_of::<T>(),
                "device buffer dropped while kernels of its device still run; leaking its memory"
            );
            std::mem::forget(memory);
        }
    }
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device)
            .field("addr", &format_args!("{:#x}", self.base() as usize))
            .field("len", &self.len)
            .finish()
    }
}
