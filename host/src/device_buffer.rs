//! Device memory owned by the host: allocation, copies to and from the host, and the views
//! kernels receive.
//!
//! On [`Backend::Cpu`](crate::Backend::Cpu) a buffer is page-aligned (4096) host memory;
//! its address is what kernels dereference.

use crate::cpu::memory::{AllocError, DeviceMemory, Fill, HostMemory};
use crate::device::{Device, timeout_from_env};
use crate::{Error, Result};
use bytemuck::Pod;
use oxccl_device::device_view::Element;
use oxccl_device::{DevicePtr, DeviceSlice, DeviceView, DeviceViewMut};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` in device memory.
///
/// Kernels reach the buffer through a view ([`Self::view`], [`Self::view_mut`]: typed and
/// bounds-checked, for safe kernels) or a raw slice ([`Self::device_slice`],
/// [`Self::device_ptr`], for `unsafe` ones); the host through the copy methods, which are
/// **synchronous** (like `cuMemcpy`): they copy when called, without waiting for kernels.
/// Synchronize the streams whose kernels write (or read) the buffer before copying from (or
/// into) it.
///
/// Fresh memory is not zeroed unless asked ([`Device::alloc_zeroed`]): like `cudaMalloc`'s,
/// its contents are unspecified (on the CPU backend every byte is
/// [`UNINITIALIZED_BYTE`](crate::UNINITIALIZED_BYTE)).
///
/// The memory is freed when the buffer and everything built on it (registrations,
/// channels) are gone, and not while a launch of its device is queued or running: the last
/// drop waits for the device (as `cuMemFree` does), at most the default `synchronize`
/// timeout (`OXCCL_TIMEOUT_SECS`), and leaks the memory if the device is still busy then.
/// Once such a wait (or a stream's `synchronize`) has timed out, later drops leak at once
/// until the device goes idle, so that cleaning up after a stuck kernel does not wait a
/// whole timeout per buffer.
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
    /// Holds at least `len * size_of::<T>()` bytes.
    memory: Arc<DeviceMemory>,
    len: usize,
    device: Device,
    _elem: PhantomData<T>,
}

// SAFETY: the buffer owns its memory like a `Box<[T]>`: sending it sends the `T`s.
unsafe impl<T: Send> Send for DeviceBuffer<T> {}
// SAFETY: `&DeviceBuffer` only reads the `T`s (`copy_to_host`) or hands out addresses.
unsafe impl<T: Sync> Sync for DeviceBuffer<T> {}

impl<T: Pod> DeviceBuffer<T> {
    pub(crate) fn new(device: &Device, len: usize, fill: Fill) -> Result<Self> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "a buffer of {len} elements of {} bytes does not fit in memory",
                size_of::<T>()
            ))
        })?;
        let memory = HostMemory::new(bytes, fill).map_err(|err| match err {
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
        let drop_wait = timeout_from_env().unwrap_or(crate::device::DEFAULT_TIMEOUT);
        Ok(Self {
            memory: Arc::new(DeviceMemory::new(
                memory,
                device.cpu_device().clone(),
                drop_wait,
            )),
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

    /// The memory, shared with whatever keeps it alive beyond the buffer.
    pub(crate) fn memory(&self) -> &Arc<DeviceMemory> {
        &self.memory
    }

    /// Device address of the first element (page-aligned).
    pub fn addr(&self) -> u64 {
        self.base() as usize as u64
    }

    /// A view of the whole buffer that kernels read: typed, bounds-checked, safe to use
    /// (see [`oxccl_device::device_view`]).
    ///
    /// # Examples
    /// ```
    /// use oxccl_device::{DeviceError, DeviceView, DeviceViewMut, arch, kernel};
    /// use oxccl_device::launch::LaunchConfig;
    ///
    /// /// `out[i] = 2 * input[i]` for one element per thread of the grid.
    /// #[kernel]
    /// fn double(out: DeviceViewMut<'_, f32>, input: DeviceView<'_, f32>) -> Result<(), DeviceError> {
    ///     let i = arch::thread_rank_in_grid();
    ///     out.set(i, 2.0 * input.get(i)?)
    /// }
    ///
    /// fn main() -> Result<(), oxccl::Error> {
    ///     let device = oxccl::Device::cpu(0);
    ///     let stream = device.stream()?;
    ///     let input = device.alloc_from(&[1.0f32, 2.0, 3.0, 4.0])?;
    ///     let out = device.alloc::<f32>(4)?;
    ///     // Safe: the views carry their lengths, and a launch of more threads than
    ///     // elements fails with `OutOfRange` instead of writing past the end.
    ///     double::launch(&stream, LaunchConfig::grid(1).block(4), out.view_mut(), input.view())?;
    ///     stream.synchronize()?;
    ///     assert_eq!(out.to_vec()?, [2.0, 4.0, 6.0, 8.0]);
    ///     Ok(())
    /// }
    /// ```
    pub fn view(&self) -> DeviceView<'_, T>
    where
        T: Element,
    {
        // SAFETY: the buffer holds `len` elements of `T` at `addr()`, page-aligned (so
        // aligned for `T`), device memory every kernel thread of its device can access; the
        // memory stays allocated for the borrow (and past it while kernels run: the last
        // drop waits for the device).
        unsafe { DeviceView::from_raw_parts(self.addr(), self.len as u64) }
    }

    /// A view of the whole buffer that kernels read and write: typed, bounds-checked, safe to
    /// use (see [`oxccl_device::device_view`]).
    ///
    /// It takes `&self`, as [`Self::device_slice`] does: a launch is asynchronous, so no
    /// borrow could cover the kernel's writes anyway, and device memory is shared like the
    /// registered memory peers write through their channels. What the host must do is the
    /// same for every kernel that writes the buffer: synchronize its stream before reading
    /// the buffer back. Concurrent writes of kernel threads to one element are allowed and
    /// leave it unspecified, as on a GPU.
    pub fn view_mut(&self) -> DeviceViewMut<'_, T>
    where
        T: Element,
    {
        // SAFETY: as in `view`; the memory is writable.
        unsafe { DeviceViewMut::from_raw_parts(self.addr(), self.len as u64) }
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
        // SAFETY: the buffer holds `len` initialized elements at `base()` (filled at
        // allocation; every bit pattern is a valid `T: Pod`), aligned for `T`; `dst` is an
        // exclusive host slice of the same length, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().cast::<T>(), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` into elements `offset..offset + src.len()` of the buffer, synchronously;
    /// the other elements are left as they are.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the range does not lie inside the buffer.
    pub fn copy_from_host_at(&mut self, offset: usize, src: &[T]) -> Result<()> {
        self.check_range("copy_from_host_at", offset, src.len())?;
        // SAFETY: elements `offset..offset + src.len()` lie inside the buffer (checked),
        // aligned for `T`; `src` is a host slice borrowed while we hold `&mut self`, so the
        // two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.base().cast::<T>().add(offset),
                src.len(),
            )
        };
        Ok(())
    }

    /// Copies elements `offset..offset + dst.len()` of the buffer into `dst`, synchronously.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the range does not lie inside the buffer.
    pub fn copy_to_host_at(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        self.check_range("copy_to_host_at", offset, dst.len())?;
        // SAFETY: elements `offset..offset + dst.len()` lie inside the buffer (checked),
        // initialized (every bit pattern is a valid `T: Pod`) and aligned for `T`; `dst` is
        // an exclusive host slice, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base().cast::<T>().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
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

    fn check_range(&self, what: &str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidUsage(format!(
                "{what}: elements {offset}..{offset}+{len} do not lie inside the device buffer \
                 of {} elements",
                self.len
            ))),
        }
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
        self.memory.as_ptr()
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
