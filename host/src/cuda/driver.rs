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
    /// PCI domain, bus and device of the GPU (where the system lists its NUMA node).
    pub(crate) pci: (u32, u32, u32),
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

/// The UUID of every CUDA device this process can see (`cuDeviceGetUuid`), by ordinal: how
/// a handle that names a GPU is told to be of this host. A device hidden from the process
/// (`CUDA_VISIBLE_DEVICES`) is not among them.
///
/// # Errors
/// [`Error::BackendUnavailable`] without a driver; [`Error::Cuda`] if the driver refuses.
pub(crate) fn visible_device_uuids() -> Result<Vec<[u8; 16]>> {
    let count = device_count().map_err(Error::BackendUnavailable)?;
    (0..count)
        .map(|ordinal| {
            let what = || format!("reading the UUID of cuda device {ordinal}");
            // `device_count` fits an i32 (it came from one).
            let device = check(result::device::get(ordinal as i32), "cuDeviceGet", what)?;
            let uuid = check(result::device::get_uuid(device), "cuDeviceGetUuid", what)?;
            Ok(uuid.bytes.map(|b| b as u8))
        })
        .collect()
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
            pci: (
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
            ),
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

/// Interprocess memory, mapped host memory and stream-ordered copies and writes: what the
/// CUDA transport uses (a peer's registered memory mapped through CUDA IPC, the proxy's
/// FIFO in mapped host memory, the proxy's copies and signals on its stream).
impl Context {
    /// The allocation that holds device address `ptr` (`cuMemGetAddressRange`): its base
    /// address and its size in bytes.
    pub(crate) fn address_range(&self, ptr: sys::CUdeviceptr) -> Result<(sys::CUdeviceptr, usize)> {
        self.bind()?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: the context is current and both out-pointers are live locals; the driver
        // answers CUDA_ERROR_NOT_FOUND for an address inside no allocation.
        let status = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
        check(status.result(), "cuMemGetAddressRange", || {
            format!("finding the allocation that holds device address {ptr:#x}")
        })?;
        Ok((base, size))
    }

    /// The interprocess handle of the allocation whose first byte is `base`
    /// (`cuIpcGetMemHandle`): 64 opaque bytes another process of this host opens with
    /// [`Self::ipc_open`]. The driver refuses an address that is not the base of a
    /// `cuMemAlloc` allocation (pool memory cannot be exported).
    pub(crate) fn ipc_handle(&self, base: sys::CUdeviceptr) -> Result<[u8; 64]> {
        self.bind()?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: the context is current and `handle` is a live local the driver fills; the
        // driver checks `base`.
        let status = unsafe { sys::cuIpcGetMemHandle(&mut handle, base) };
        check(status.result(), "cuIpcGetMemHandle", || {
            format!("exporting the allocation at {base:#x} for other processes")
        })?;
        Ok(handle.reserved.map(|b| b as u8))
    }

    /// Maps another process's allocation, exported with [`Self::ipc_handle`], into this
    /// context (`cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: when the
    /// allocation lives on another GPU, the driver enables peer access to it as the mapping
    /// needs it). Returns the mapping's first byte, an address valid in this process only.
    ///
    /// The driver refuses a handle exported by this same process, and a handle of a GPU this
    /// one has no peer access to. Opening a handle already open in this context returns the
    /// same address and counts one more open.
    ///
    /// # Safety
    /// `handle` came from `cuIpcGetMemHandle` in another process of this host. Each
    /// successful open is closed with [`Self::ipc_close`] exactly once. The exporter keeps
    /// the allocation (it does not `cuMemFree` it) until then: freeing exported memory before
    /// the importer closes it is undefined behaviour.
    pub(crate) unsafe fn ipc_open(&self, handle: &[u8; 64]) -> Result<sys::CUdeviceptr> {
        self.bind()?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: the context is current, `ptr` is a live local the driver fills, the handle
        // is passed by value; the rest is our caller's contract.
        let status = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) };
        check(status.result(), "cuIpcOpenMemHandle", || {
            "mapping another process's allocation (CUDA IPC)".into()
        })?;
        Ok(ptr)
    }

    /// Unmaps an allocation of another process mapped with [`Self::ipc_open`]
    /// (`cuIpcCloseMemHandle`); the last close of an allocation also drops the peer access
    /// the mapping enabled.
    ///
    /// # Safety
    /// `ptr` came from `ipc_open` of this context and is closed once per open; no queued or
    /// running work uses the mapping, and it is not used afterwards.
    pub(crate) unsafe fn ipc_close(&self, ptr: sys::CUdeviceptr) -> Result<()> {
        // The context must be current: without one the driver answers
        // CUDA_ERROR_INVALID_CONTEXT and the mapping stays.
        self.bind()?;
        // SAFETY: forwarded contract.
        let status = unsafe { sys::cuIpcCloseMemHandle(ptr) };
        check(status.result(), "cuIpcCloseMemHandle", || {
            format!("unmapping another process's allocation at {ptr:#x}")
        })
    }

    /// Blocks until every launch and copy of this context is done (`cuCtxSynchronize`): no
    /// deadline, so only ever called from a thread of its own whose waiter has one
    /// ([`super::cuda_device::CudaDevice::wait_idle`]).
    pub(crate) fn synchronize_all(&self) -> Result<()> {
        self.bind()?;
        check(result::ctx::synchronize(), "cuCtxSynchronize", || {
            "waiting for the device's work".into()
        })
    }

    /// Lets kernels and copies of this context reach memory allocated in `peer`'s (another
    /// GPU of this process): `cuDeviceCanAccessPeer`, then `cuCtxEnablePeerAccess(peer, 0)`
    /// with this context current. Access already enabled is success (the driver keeps it
    /// for the contexts' life); the same device needs nothing.
    ///
    /// # Errors
    /// The two GPUs cannot reach each other's memory, or the driver refused.
    pub(crate) fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        if peer.device == self.device {
            return Ok(());
        }
        self.bind()?;
        let what = || {
            format!(
                "letting device {} reach device {}'s memory",
                self.device, peer.device
            )
        };
        let mut can = 0;
        // SAFETY: valid device handles; `can` is a live local the driver fills.
        let status = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.device, peer.device) };
        check(status.result(), "cuDeviceCanAccessPeer", what)?;
        if can == 0 {
            return Err(Error::InvalidUsage(format!(
                "{}: the driver says these GPUs cannot access each other's memory (no peer \
                 access between them: ranks on them need processes and CUDA IPC through host \
                 staging, which is not built)",
                what()
            )));
        }
        // SAFETY: this context is current (bound above) and `peer.context` is a live,
        // retained context; flags must be 0.
        let status = unsafe { sys::cuCtxEnablePeerAccess(peer.context, 0) };
        match status.result() {
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            other => check(other, "cuCtxEnablePeerAccess", what),
        }
    }

    /// `bytes` of pinned host memory, zeroed, mapped into the device's address space
    /// (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`:
    /// portable, so every context treats it as pinned, not only this one). Its device
    /// address comes from [`Self::host_device_pointer`]; free it with [`Self::free_host`].
    pub(crate) fn host_alloc_mapped(&self, bytes: usize) -> Result<*mut c_void> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // A zero size is refused by the driver: ask for at least one byte.
        let len = bytes.max(1);
        // SAFETY: the context is current; the memory is returned as a raw pointer, not read.
        let ptr = check(
            unsafe { result::malloc_host(len, flags) },
            "cuMemHostAlloc",
            || format!("allocating {bytes} bytes of mapped host memory"),
        )?;
        // SAFETY: the driver just allocated `len` bytes at `ptr`, owned by nobody else yet.
        // Zeroed, so nothing ever reads bytes the allocation left undefined (trigger slots
        // and counters start at 0).
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, len) };
        Ok(ptr)
    }

    /// The device address of mapped host memory from [`Self::host_alloc_mapped`]
    /// (`cuMemHostGetDevicePointer`, flags 0), valid for kernels and stream operations of
    /// this context.
    ///
    /// # Safety
    /// `host` lies inside memory from `host_alloc_mapped` that is not freed.
    pub(crate) unsafe fn host_device_pointer(&self, host: *mut c_void) -> Result<sys::CUdeviceptr> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current and `ptr` is a live local the driver fills; `host`
        // is our caller's contract. The flags argument must be 0.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, host, 0) };
        check(status.result(), "cuMemHostGetDevicePointer", || {
            format!("finding the device address of mapped host memory {host:p}")
        })?;
        Ok(ptr)
    }

    /// Frees memory from [`Self::host_alloc_mapped`] (`cuMemFreeHost`).
    ///
    /// # Safety
    /// `ptr` came from `host_alloc_mapped` and is freed once; no queued or running work
    /// uses it, and neither it nor its device address is used afterwards.
    pub(crate) unsafe fn free_host(&self, ptr: *mut c_void) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        check(unsafe { result::free_host(ptr) }, "cuMemFreeHost", || {
            "freeing mapped host memory".into()
        })
    }

    /// Enqueues a copy of `bytes` bytes from `src` to `dst` on `stream` (the DMA engine
    /// does it; the call returns at once).
    ///
    /// `cuMemcpyAsync`, not `cuMemcpyDtoDAsync`: it takes unified addresses and finds from
    /// each pointer where its memory lives, so one call serves every pair the proxy copies
    /// between, a local allocation, a peer's allocation mapped by [`Self::ipc_open`] (on the
    /// same GPU or another) and mapped host memory. It needs unified addressing, which CUDA
    /// IPC needs too.
    ///
    /// # Safety
    /// `stream` is a live stream of this context. `dst..dst + bytes` and
    /// `src..src + bytes` are device-accessible memory that does not overlap, and stays
    /// allocated (and mapped) until the copy completes.
    pub(crate) unsafe fn copy_device_async(
        &self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded contract.
        let status = unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) };
        check(status.result(), "cuMemcpyAsync", || {
            format!("copying {bytes} bytes from {src:#x} to {dst:#x} on a stream")
        })
    }

    /// Enqueues a write of `value` to the 8 bytes at `addr` on `stream`
    /// (`cuStreamWriteValue64` with `CU_STREAM_WRITE_VALUE_DEFAULT`).
    ///
    /// Ordering: the write happens after all work enqueued on `stream` before it has
    /// completed, and the driver fences before it (like `__threadfence_system()`, scoped to
    /// the stream), so whoever sees the value also sees what that earlier work wrote, such
    /// as a copy's bytes.
    ///
    /// Whether the device can do it at all is [`Self::supports_stream_u64_writes`], to ask
    /// once before the first write.
    ///
    /// # Safety
    /// `stream` is a live stream of this context; `addr` is an 8-byte aligned device address
    /// (device memory, or mapped host memory's [`Self::host_device_pointer`]; not managed
    /// memory) that stays allocated until the write completes; the device supports the call
    /// ([`Self::supports_stream_u64_writes`]).
    pub(crate) unsafe fn stream_write_u64(
        &self,
        stream: sys::CUstream,
        addr: sys::CUdeviceptr,
        value: u64,
    ) -> Result<()> {
        self.bind()?;
        let flags =
            sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as std::ffi::c_uint;
        // SAFETY: forwarded contract. The `_v2` entry point is what `cuStreamWriteValue64`
        // names in CUDA 12 headers; the older entry point needs stream memory operations
        // enabled in the kernel module.
        let status = unsafe { sys::cuStreamWriteValue64_v2(stream, addr, value, flags) };
        check(status.result(), "cuStreamWriteValue64", || {
            format!("writing {value} to {addr:#x} on a stream")
        })
    }

    /// Whether [`Self::stream_write_u64`] works on this device and driver.
    ///
    /// It must be asked: CUDA documents 64-bit stream memory operations as a capability the
    /// device reports (`CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`, the attribute of
    /// the CUDA 12 entry point), and a driver older than the entry point (before 11.7) lacks
    /// it, in which case cudarc would panic on the call instead of returning an error.
    pub(crate) fn supports_stream_u64_writes(&self) -> Result<bool> {
        // SAFETY: `device_count` succeeded before this context could be opened, so the
        // library is loaded; the symbol is only looked up, never called through the type
        // given here.
        let present = unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuStreamWriteValue64_v2")
                .is_ok()
        };
        if !present {
            return Ok(false);
        }
        // SAFETY: a valid device handle and attribute.
        let v = check(
            unsafe {
                result::device::get_attribute(
                    self.device,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                )
            },
            "cuDeviceGetAttribute",
            || "asking whether the device writes 64-bit values from a stream".into(),
        )?;
        Ok(v != 0)
    }
}

/// What an RDMA device registers GPU memory through (`ib` transport).
impl Context {
    /// A dma-buf file descriptor for `size` bytes of device memory at `base`
    /// (`cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`), which
    /// an RDMA device registers without a kernel module of NVIDIA's (`ibv_reg_dmabuf_mr`).
    /// `None` where the device or driver cannot export one
    /// (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` is 0, or the driver predates the call, which
    /// cudarc would panic on instead of returning an error).
    ///
    /// # Errors
    /// The driver refused the range (it must be page-aligned and inside one allocation).
    #[cfg_attr(not(feature = "ib"), allow(dead_code))]
    pub(crate) fn dma_buf(
        &self,
        base: sys::CUdeviceptr,
        size: usize,
    ) -> Result<Option<std::os::fd::OwnedFd>> {
        // SAFETY: the library is loaded (this context exists); the symbol is only looked up.
        let present = unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuMemGetHandleForAddressRange")
                .is_ok()
        };
        // SAFETY: a valid device handle and attribute; an older driver answers an error,
        // read as "not supported".
        let supported = present
            && unsafe {
                result::device::get_attribute(
                    self.device,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                )
            }
            .is_ok_and(|v| v != 0);
        if !supported {
            return Ok(None);
        }
        self.bind()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the context is current, `fd` is a live local the driver fills, and the
        // driver checks the range.
        let status = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast(),
                base,
                size,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        check(status.result(), "cuMemGetHandleForAddressRange", || {
            format!("exporting {size} bytes of device memory at {base:#x} as a dma-buf")
        })?;
        if fd < 0 {
            return Err(Error::Internal(format!(
                "cuMemGetHandleForAddressRange succeeded but gave descriptor {fd}"
            )));
        }
        // SAFETY: the driver just opened `fd` for us; nothing else owns it.
        Ok(Some(unsafe {
            <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        }))
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
