//! Device memory owned by the host: allocation, copies to and from the host, and the views
//! kernels receive.
//!
//! On [`Backend::Cpu`](crate::Backend::Cpu) a buffer is page-aligned (4096) host memory;
//! its address is what kernels dereference. On [`Backend::Cuda`](crate::Backend::Cuda) it
//! is GPU memory (`cuMemAlloc`, 256-byte aligned at least), copied through the driver.

use crate::buffer_memory::BufferMemory;
use crate::cpu::memory::{AllocError, DeviceMemory, Fill, HostMemory};
use crate::cuda::cuda_memory::CudaMemory;
use crate::device::{Device, DeviceKind, timeout_from_env};
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
    memory: BufferMemory,
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
        let memory = match device.kind() {
            DeviceKind::Cpu(cpu) => {
                let memory = HostMemory::new(bytes, fill).map_err(|err| match err {
                    AllocError::TooLarge => Error::InvalidUsage(format!(
                        "a buffer of {bytes} bytes does not fit in memory"
                    )),
                    AllocError::OutOfMemory { available } => Error::System {
                        context: format!(
                            "allocating {bytes} bytes on {} device {}: the machine has {available} \
                             bytes of memory available",
                            device.backend(),
                            device.ordinal()
                        ),
                        source: std::io::ErrorKind::OutOfMemory.into(),
                    },
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
                BufferMemory::Cpu(Arc::new(DeviceMemory::new(memory, cpu.clone(), drop_wait)))
            }
            DeviceKind::Cuda(cuda) => BufferMemory::Cuda(Arc::new(CudaMemory::new(
                cuda,
                bytes,
                matches!(fill, Fill::Zero),
            )?)),
        };
        Ok(Self {
            memory,
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

    /// The buffer's memory, shared with whatever keeps it alive beyond the buffer.
    pub(crate) fn memory(&self) -> &BufferMemory {
        &self.memory
    }

    /// Device address of the first element (page-aligned on the CPU backend, at least
    /// 256-byte aligned on CUDA).
    pub fn addr(&self) -> u64 {
        self.memory.addr()
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
    /// [`Error::InvalidUsage`] if `src.len() != self.len()`; [`Error::Cuda`] if the driver
    /// fails the copy.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        // SAFETY: the whole buffer; `&mut self` excludes every other host access to it.
        unsafe { self.memory.write(0, bytemuck::cast_slice(src)) }
    }

    /// Copies the buffer into `dst`, synchronously.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `dst.len() != self.len()`; [`Error::Cuda`] if the driver
    /// fails the copy.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        // SAFETY: the whole buffer, which holds `len` elements.
        unsafe { self.memory.read(0, bytemuck::cast_slice_mut(dst)) }
    }

    /// Copies `src` into elements `offset..offset + src.len()` of the buffer, synchronously;
    /// the other elements are left as they are.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the range does not lie inside the buffer; [`Error::Cuda`]
    /// if the driver fails the copy.
    pub fn copy_from_host_at(&mut self, offset: usize, src: &[T]) -> Result<()> {
        self.check_range("copy_from_host_at", offset, src.len())?;
        // SAFETY: elements `offset..offset + src.len()` lie inside the buffer (checked);
        // `&mut self` excludes every other host access to it.
        unsafe {
            self.memory
                .write(offset * size_of::<T>(), bytemuck::cast_slice(src))
        }
    }

    /// Copies elements `offset..offset + dst.len()` of the buffer into `dst`, synchronously.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the range does not lie inside the buffer; [`Error::Cuda`]
    /// if the driver fails the copy.
    pub fn copy_to_host_at(&self, offset: usize, dst: &mut [T]) -> Result<()> {
        self.check_range("copy_to_host_at", offset, dst.len())?;
        // SAFETY: elements `offset..offset + dst.len()` lie inside the buffer (checked).
        unsafe {
            self.memory
                .read(offset * size_of::<T>(), bytemuck::cast_slice_mut(dst))
        }
    }

    /// The buffer's contents as a new vector, copied synchronously.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver fails the copy (never on the CPU backend).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Sets every element to `value`, synchronously.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver fails the copy (never on the CPU backend).
    pub fn fill(&mut self, value: T) -> Result<()> {
        // Through a bounded host block, copied as often as it takes.
        let block = vec![
            value;
            self.len
                .min(FILL_BLOCK_BYTES / size_of::<T>().max(1))
                .max(1)
        ];
        let mut at = 0;
        while at < self.len {
            let n = block.len().min(self.len - at);
            self.copy_from_host_at(at, &block[..n])?;
            at += n;
        }
        Ok(())
    }

    /// Sets every byte to zero, synchronously.
    ///
    /// # Errors
    /// As [`Self::fill`].
    pub fn zero(&mut self) -> Result<()> {
        self.fill(T::zeroed())
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

/// Bytes of the host block [`DeviceBuffer::fill`] copies from.
const FILL_BLOCK_BYTES: usize = 1 << 20;

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device)
            .field("addr", &format_args!("{:#x}", self.memory.addr()))
            .field("len", &self.len)
            .finish()
    }
}
