//! The CUDA driver, reached through cudarc's `result` and `sys` layers: the one place in
//! oxccl that calls it. Every function here checks that the driver library is present
//! before its first call (cudarc, loading the library at run time, panics when it is not),
//! makes the device's context current where the call needs one, and turns a failure into
//! [`Error::Cuda`] naming the call and what was being done.

use crate::{Error, Result};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use std::ffi::{CString, c_void};
use std::sync::OnceLock;

/// A device handle and its primary context, retained.
#[derive(Debug)]
pub(crate) struct Context {
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a CUDA context may be made current on any thread (`cuCtxSetCurrent`); the handles
// are opaque values the driver validates.
unsafe impl Send for Context {}
// SAFETY: as above; every call through `&Context` is a driver call, which is thread-safe.
unsafe impl Sync for Context {}

/// What a device reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceFacts {
    pub(crate) name: String,
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) multiprocessors: u32,
    pub(crate) cooperative_launch: bool,
    pub(crate) uuid: [u8; 16],
}

/// Why the CUDA backend cannot be used here, if it cannot; else the number of devices.
/// Checked once per process.
pub(crate) fn device_count() -> std::result::Result<u32, String> {
    static COUNT: OnceLock<std::result::Result<u32, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            // SAFETY: only tries to open the library (`dlopen`), calling nothing in it.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "the CUDA driver library (libcuda.so) was not found: no NVIDIA driver is \
                     installed, or it is not on the loader's path"
                        .into(),
                );
            }
            result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))?;
            let n = result::device::get_count()
                .map_err(|e| format!("cuDeviceGetCount failed: {}", describe(e)))?;
            match u32::try_from(n) {
                Ok(0) | Err(_) => Err("the CUDA driver reports no device".into()),
                Ok(n) => Ok(n),
            }
        })
        .clone()
}

/// The driver's name and description of `e`.
pub(crate) fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name}: {}", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// `r`, with a failure turned into [`Error::Cuda`].
pub(crate) fn check<T>(
    r: std::result::Result<T, DriverError>,
    call: &'static str,
    context: impl FnOnce() -> String,
) -> Result<T> {
    r.map_err(|e| Error::Cuda {
        context: context(),
        call,
        code: describe(e),
    })
}

impl Context {
    /// Retains the primary context of device `ordinal` (the one the CUDA runtime and other
    /// libraries share, so buffers and streams interoperate with theirs).
    pub(crate) fn open(ordinal: usize) -> Result<(Context, DeviceFacts)> {
        let count = device_count().map_err(Error::BackendUnavailable)?;
        let what = || format!("opening cuda device {ordinal}");
        let index = i32::try_from(ordinal)
            .ok()
            .filter(|&i| (i as u32) < count)
            .ok_or_else(|| {
                Error::BackendUnavailable(format!(
                    "cuda device {ordinal} does not exist: the driver reports {count}"
                ))
            })?;
        let device = check(result::device::get(index), "cuDeviceGet", what)?;
        // SAFETY: `device` is a handle the driver just returned.
        let context = check(
            unsafe { result::primary_ctx::retain(device) },
            "cuDevicePrimaryCtxRetain",
            what,
        )?;
        let ctx = Context { device, context };
        // On failure `ctx` drops here, which releases the context.
        let facts = ctx.facts()?;
        Ok((ctx, facts))
    }

    fn facts(&self) -> Result<DeviceFacts> {
        let what = || "reading the device's attributes".to_string();
        let attribute = |a: sys::CUdevice_attribute| -> Result<u32> {
            // SAFETY: a valid device handle and attribute.
            let v = check(
                unsafe { result::device::get_attribute(self.device, a) },
                "cuDeviceGetAttribute",
                what,
            )?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        use sys::CUdevice_attribute as A;
        let uuid = check(
            result::device::get_uuid(self.device),
            "cuDeviceGetUuid",
            what,
        )?;
        Ok(DeviceFacts {
            name: check(
                result::device::get_name(self.device),
                "cuDeviceGetName",
                what,
            )?,
            major: attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            multiprocessors: attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            cooperative_launch: attribute(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
            uuid: uuid.bytes.map(|b| b as u8),
        })
    }

    /// Makes the context current on the calling thread (driver calls act on the current
    /// context).
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained as long as `self` lives.
        check(
            unsafe { result::ctx::set_current(self.context) },
            "cuCtxSetCurrent",
            || "binding the device's context to this thread".into(),
        )
    }

    /// `bytes` of device memory (`cuMemAlloc`: not stream-ordered pool memory, which cannot
    /// be shared with another process), not initialized.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<sys::CUdeviceptr> {
        self.bind()?;
        // SAFETY: the context is current; a zero size is refused by the driver, so ask for
        // at least one byte.
        check(
            unsafe { result::malloc_sync(bytes.max(1)) },
            "cuMemAlloc",
            || format!("allocating {bytes} bytes"),
        )
    }

    /// Frees memory from [`Self::alloc`].
    ///
    /// # Safety
    /// `ptr` came from `alloc` of this context and is not used afterwards.
    pub(crate) unsafe fn free(&self, ptr: sys::CUdeviceptr) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        check(unsafe { result::free_sync(ptr) }, "cuMemFree", || {
            "freeing device memory".into()
        })
    }

    /// Copies `src` to device address `dst`, synchronously.
    ///
    /// # Safety
    /// `dst..dst + src.len()` lies inside memory of this context.
    pub(crate) unsafe fn copy_to_device(&self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract; `src` is a live host slice.
        check(
            unsafe { result::memcpy_htod_sync(dst, src) },
            "cuMemcpyHtoD",
            || format!("copying {} bytes to the device", src.len()),
        )
    }

    /// Copies device address `src` into `dst`, synchronously.
    ///
    /// # Safety
    /// `src..src + dst.len()` lies inside memory of this context.
    pub(crate) unsafe fn copy_to_host(&self, dst: &mut [u8], src: sys::CUdeviceptr) -> Result<()> {
        self.bind()?;
        let n = dst.len();
        // SAFETY: forwarded contract; `dst` is a live, exclusive host slice.
        check(
            unsafe { result::memcpy_dtoh_sync(dst, src) },
            "cuMemcpyDtoH",
            || format!("copying {n} bytes from the device"),
        )
    }

    /// Sets `bytes` bytes at `dst` to `value`, synchronously.
    ///
    /// # Safety
    /// `dst..dst + bytes` lies inside memory of this context.
    pub(crate) unsafe fn set_bytes(
        &self,
        dst: sys::CUdeviceptr,
        value: u8,
        bytes: usize,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        check(
            unsafe { result::memset_d8_sync(dst, value, bytes) },
            "cuMemsetD8",
            || format!("setting {bytes} bytes"),
        )
    }

    /// A new stream that does not synchronize with the legacy default stream.
    pub(crate) fn create_stream(&self) -> Result<sys::CUstream> {
        self.bind()?;
        check(
            result::stream::create(result::stream::StreamKind::NonBlocking),
            "cuStreamCreate",
            || "creating a stream".into(),
        )
    }

    /// Destroys a stream from [`Self::create_stream`] (work still queued on it completes).
    ///
    /// # Safety
    /// `stream` came from `create_stream` of this context and is not used afterwards.
    pub(crate) unsafe fn destroy_stream(&self, stream: sys::CUstream) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        check(
            unsafe { result::stream::destroy(stream) },
            "cuStreamDestroy",
            || "destroying a stream".into(),
        )
    }

    /// Whether everything queued on `stream` has completed: `Ok(true)` done, `Ok(false)`
    /// still running, an error if a launch on it failed (the context is then unusable, as
    /// after any kernel fault on a GPU).
    ///
    /// # Safety
    /// `stream` is a live stream of this context.
    pub(crate) unsafe fn stream_done(&self, stream: sys::CUstream) -> Result<bool> {
        self.bind()?;
        // SAFETY: forwarded contract.
        match unsafe { sys::cuStreamQuery(stream) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check(other.result().map(|()| true), "cuStreamQuery", || {
                "waiting for the stream".into()
            }),
        }
    }

    /// Loads a PTX module (the driver compiles it for the device).
    pub(crate) fn load_module(&self, ptx: &str, what: &str) -> Result<sys::CUmodule> {
        self.bind()?;
        let image = CString::new(ptx)
            .map_err(|_| Error::InvalidUsage(format!("{what}: the PTX text holds a NUL byte")))?;
        // SAFETY: `image` is a NUL-terminated PTX text, alive for the call (the driver
        // copies what it needs).
        check(
            unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) },
            "cuModuleLoadData",
            || format!("loading {what}"),
        )
    }

    /// Loads a module of machine code (a cubin from ptxas), which the driver checks against
    /// the device.
    pub(crate) fn load_cubin(&self, cubin: &[u8], what: &str) -> Result<sys::CUmodule> {
        self.bind()?;
        // An ELF image, copied into 8-byte aligned memory for the driver's parser.
        let mut image = vec![0u64; cubin.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut image)[..cubin.len()].copy_from_slice(cubin);
        // SAFETY: `image` holds the whole cubin, alive for the call (the driver copies what
        // it needs); the driver validates the image and refuses a malformed one.
        check(
            unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) },
            "cuModuleLoadData",
            || format!("loading {what}"),
        )
    }

    /// Unloads a module from [`Self::load_module`] or [`Self::load_cubin`].
    ///
    /// # Safety
    /// `module` is a loaded module of this context, and no launch of its kernels is queued
    /// or running, nor made afterwards.
    pub(crate) unsafe fn unload_module(&self, module: sys::CUmodule) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        check(
            unsafe { result::module::unload(module) },
            "cuModuleUnload",
            || "unloading a PTX module".into(),
        )
    }

    /// The kernel `name` of `module`.
    ///
    /// # Safety
    /// `module` is a loaded module of this context.
    pub(crate) unsafe fn function(
        &self,
        module: sys::CUmodule,
        name: &str,
    ) -> Result<sys::CUfunction> {
        self.bind()?;
        let c_name = CString::new(name)
            .map_err(|_| Error::InvalidUsage(format!("kernel name `{name}` holds a NUL byte")))?;
        // SAFETY: forwarded contract.
        check(
            unsafe { result::module::get_function(module, c_name) },
            "cuModuleGetFunction",
            || format!("finding kernel `{name}` in its PTX module"),
        )
    }

    /// Blocks of `function` that fit on one multiprocessor at once with `block_threads`
    /// threads and `shared_bytes` of dynamic shared memory.
    ///
    /// # Safety
    /// `function` is a kernel of a loaded module of this context.
    pub(crate) unsafe fn resident_blocks_per_sm(
        &self,
        function: sys::CUfunction,
        block_threads: u32,
        shared_bytes: usize,
    ) -> Result<u32> {
        self.bind()?;
        let threads = i32::try_from(block_threads).unwrap_or(i32::MAX);
        // SAFETY: forwarded contract.
        let n = check(
            unsafe {
                result::occupancy::max_active_block_per_multiprocessor(
                    function,
                    threads,
                    shared_bytes,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            || "asking how many blocks fit at once".into(),
        )?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Enqueues `function` on `stream`.
    ///
    /// # Safety
    /// `function` is a kernel of a loaded module of this context and `stream` a live stream
    /// of it; `params` holds one pointer per kernel parameter, each to a value of the
    /// parameter's type, alive for the call (the driver copies the values).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        function: sys::CUfunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
        cooperative: bool,
        kernel: &str,
    ) -> Result<()> {
        self.bind()?;
        let what = || format!("launching kernel `{kernel}`");
        if cooperative {
            // SAFETY: forwarded contract.
            check(
                unsafe {
                    result::launch_cooperative_kernel(
                        function,
                        grid,
                        block,
                        shared_bytes,
                        stream,
                        params,
                    )
                },
                "cuLaunchCooperativeKernel",
                what,
            )
        } else {
            // SAFETY: forwarded contract.
            check(
                unsafe {
                    result::launch_kernel(function, grid, block, shared_bytes, stream, params)
                },
                "cuLaunchKernel",
                what,
            )
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `open` retained the device's primary context once; this releases it once.
        if let Err(e) = unsafe { result::primary_ctx::release(self.device) } {
            tracing::warn!(error = %describe(e), "cuDevicePrimaryCtxRelease failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a machine without a driver making cudarc panic (it does on the first
    /// call into a library it could not load) instead of giving a reason.
    #[test]
    fn without_a_driver_the_count_is_a_reason() {
        // SAFETY: only tries to open the library.
        let present = unsafe { sys::is_culib_present() };
        match device_count() {
            Ok(n) => assert!(present && n > 0),
            Err(why) => assert!(!why.is_empty(), "an empty reason"),
        }
    }
}
