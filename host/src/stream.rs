//! Streams: in-order queues of kernel launches on a device.
//!
//! A [`Stream`] is the [`Launcher`] that `#[kernel]`-generated `launch` functions take.
//! Launches are asynchronous: `launch` validates the configuration, copies the arguments
//! and enqueues; [`Stream::synchronize`] waits for everything enqueued so far and reports
//! what failed.
//!
//! On the CPU backend every thread of a launch (`grid * block` of them, at most
//! [`CPU_MAX_THREADS_PER_LAUNCH`]) runs at once on its own OS thread, taken from a pool of
//! parked threads shared by the process, so kernels whose blocks wait on each other behave
//! as on a GPU with co-resident blocks. A kernel that relies on it (a grid barrier) says
//! so with `#[kernel(cooperative)]`, and a launch of it too large to be co-resident is
//! refused with an error that says why (on the CPU backend: more threads than it runs at
//! once). A kernel thread that panics fails the launch: the
//! next `synchronize` returns [`Error::KernelFailed`], and the stream remains usable.

use crate::cpu::MAX_THREADS_PER_LAUNCH;
use crate::cpu::stream::CpuStream;
use crate::cuda::cuda_stream::CudaStream;
use crate::device::{Device, DeviceKind};
use crate::{Error, Result};
use oxccl_device::launch::{KernelInfo, LaunchConfig, Launcher};
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The most threads (`grid` volume times `block` volume) one launch may have on the CPU
/// backend, where each kernel thread is an OS thread.
pub const CPU_MAX_THREADS_PER_LAUNCH: u64 = MAX_THREADS_PER_LAUNCH;

/// An in-order queue of kernel launches on one device.
///
/// # Examples
/// ```
/// use oxccl_device::{arch, kernel, launch::LaunchConfig, DeviceSlice};
///
/// /// Writes each thread's rank in the grid at that rank.
/// ///
/// /// # Safety
/// /// `out` must hold one writable element per thread of the grid.
/// #[kernel]
/// unsafe fn iota(out: DeviceSlice<u64>) {
///     let i = arch::thread_rank_in_grid();
///     // SAFETY: the contract above; each thread writes its own element.
///     unsafe { out.write(i, i) };
/// }
///
/// fn main() -> Result<(), oxccl::Error> {
///     let device = oxccl::Device::cpu(0);
///     let stream = device.stream()?;
///     let out = device.alloc::<u64>(8)?;
///     // SAFETY: `out` holds one element for each of the 2 x 4 threads, and lives until
///     // the launch is synchronized.
///     unsafe { iota::launch(&stream, LaunchConfig::grid(2).block(4), out.device_slice())? };
///     stream.synchronize()?;
///     assert_eq!(out.to_vec()?, [0, 1, 2, 3, 4, 5, 6, 7]);
///     Ok(())
/// }
/// ```
pub struct Stream {
    device: Device,
    kind: StreamKind,
    timeout: Duration,
}

/// The stream of one backend.
enum StreamKind {
    Cpu(Arc<CpuStream>),
    Cuda(CudaStream),
}

// Streams, devices and buffers are shared between the threads of a program (ranks run as
// threads, a proxy, a host thread that synchronizes).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Stream>();
    send_sync::<Device>();
    send_sync::<crate::DeviceBuffer<u64>>();
};

impl Stream {
    pub(crate) fn new(device: Device, timeout: Duration) -> Result<Stream> {
        let kind = match device.kind() {
            DeviceKind::Cpu(cpu) => StreamKind::Cpu(CpuStream::new(cpu.clone())),
            DeviceKind::Cuda(cuda) => StreamKind::Cuda(CudaStream::new(cuda)?),
        };
        Ok(Stream {
            device,
            kind,
            timeout,
        })
    }

    /// The device the stream's kernels run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How long [`Self::synchronize`] waits before it gives up.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long [`Self::synchronize`] waits before it gives up.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Waits until every launch enqueued before this call has completed, then reports the
    /// first failure since the previous `synchronize` (and forgets it: the stream stays
    /// usable).
    ///
    /// Kernel writes are visible to the host when this returns `Ok`.
    ///
    /// # Errors
    /// - [`Error::Timeout`] if the launches did not complete within [`Self::timeout`],
    ///   naming the device, the stream and the kernel still running. The launches go on
    ///   running (a kernel thread cannot be cancelled); a later `synchronize` may succeed.
    /// - [`Error::KernelFailed`] if a kernel thread panicked (or trapped), with the thread's
    ///   indices and message.
    /// - [`Error::KernelError`] if a kernel returned an error (a device call that failed:
    ///   a wait that timed out, a call refused), with the thread and the call.
    /// - [`Error::System`] if the emulator could not start a launch's threads.
    /// - [`Error::Cuda`] if the CUDA driver failed otherwise.
    pub fn synchronize(&self) -> Result<()> {
        match &self.kind {
            StreamKind::Cpu(s) => s.synchronize(self.timeout),
            StreamKind::Cuda(s) => s.synchronize(self.timeout),
        }
    }

    /// The CUDA driver's handle of this stream (`CUstream`), to enqueue work of one's own
    /// (cudarc, a CUDA library) in order with oxccl's launches; `None` on the CPU backend.
    pub fn cuda_stream(&self) -> Option<*mut std::ffi::c_void> {
        match &self.kind {
            StreamKind::Cpu(_) => None,
            StreamKind::Cuda(s) => Some(s.raw().cast()),
        }
    }

    /// A stream of `device` over a CUDA stream created elsewhere (cudarc's
    /// `CudaStream::cu_stream()`, a CUDA library's): oxccl's launches go in order with the
    /// caller's work on it. The stream is not destroyed when the returned one is dropped.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of the primary context of `device`'s GPU (the context
    /// cudarc's `CudaContext::new(ordinal)` and the CUDA runtime use), and outlives the
    /// returned stream.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `device` is not a CUDA device or `stream` is null.
    pub unsafe fn from_cuda_stream(
        device: &Device,
        stream: *mut std::ffi::c_void,
    ) -> Result<Stream> {
        let DeviceKind::Cuda(cuda) = device.kind() else {
            return Err(Error::InvalidUsage(format!(
                "Stream::from_cuda_stream: {device:?} is not a cuda device"
            )));
        };
        if stream.is_null() {
            return Err(Error::InvalidUsage(
                "Stream::from_cuda_stream: the stream is null (the legacy default stream \
                 would serialize with every other stream; pass a stream of its own)"
                    .into(),
            ));
        }
        // SAFETY: forwarded contract.
        let kind = StreamKind::Cuda(unsafe { CudaStream::borrowed(cuda, stream.cast()) });
        Ok(Stream {
            device: device.clone(),
            kind,
            timeout: crate::device::timeout_from_env()?,
        })
    }

    /// The emulator's stream.
    #[cfg(test)]
    pub(crate) fn cpu_stream(&self) -> &Arc<CpuStream> {
        match &self.kind {
            StreamKind::Cpu(s) => s,
            StreamKind::Cuda(_) => panic!("a test asked a cuda stream for its emulator stream"),
        }
    }

    /// Refuses a launch this stream cannot run, before anything is enqueued.
    ///
    /// # Safety
    /// As [`Launcher::launch_raw`]: `params` holds one pointer per parameter of `kernel`,
    /// the i-th pointing to a valid value of the i-th parameter's type.
    unsafe fn validate(
        &self,
        kernel: &'static KernelInfo,
        config: &LaunchConfig,
        params: &[*const c_void],
    ) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::InvalidUsage(format!(
                "launch of kernel `{}` on {} device {}: {why}",
                kernel.name,
                self.device.backend(),
                self.device.ordinal()
            )))
        };
        if params.len() != kernel.params.len() {
            return refuse(format!(
                "the kernel takes {} parameters, the launch passed {}",
                kernel.params.len(),
                params.len()
            ));
        }
        if let Some(i) = params.iter().position(|p| p.is_null()) {
            return refuse(format!("the pointer to parameter {i} is null"));
        }
        let (g, b) = (config.grid, config.block);
        if g.volume() == 0 || b.volume() == 0 {
            return refuse(format!("grid {g} and block {b} must have no zero extent"));
        }
        if let Some(unsupported) = kernel.unsupported(config) {
            return Err(Error::InvalidUsage(unsupported.to_string()));
        }
        // A cooperative kernel (grid barrier) needs every block resident at once.
        match &self.kind {
            StreamKind::Cpu(_) => {
                // The emulator runs every thread of a launch at once, so it holds as many
                // blocks as fit in its thread limit.
                let resident_blocks = CPU_MAX_THREADS_PER_LAUNCH / b.volume();
                if let Some(too_large) = kernel.not_co_resident(config, resident_blocks) {
                    return refuse(format!(
                        "{too_large} (the cpu backend runs at most \
                         {CPU_MAX_THREADS_PER_LAUNCH} threads of a launch at once)"
                    ));
                }
                if config.total_threads() > CPU_MAX_THREADS_PER_LAUNCH {
                    return refuse(format!(
                        "grid {g} times block {b} is {} threads; the cpu backend runs at most \
                         {CPU_MAX_THREADS_PER_LAUNCH} per launch",
                        config.total_threads()
                    ));
                }
                if config.shared_mem_bytes != 0 {
                    return refuse(format!(
                        "{} bytes of dynamic shared memory requested; the cpu backend has none",
                        config.shared_mem_bytes
                    ));
                }
                // SAFETY: our contract: one pointer per parameter of `kernel` (counted
                // above), each to a valid value of its type (non-null: checked above).
                if let Some(why) = unsafe { gpu_address_in(kernel, params) } {
                    return refuse(why);
                }
            }
            StreamKind::Cuda(s) => {
                // The GPU holds what the occupancy API says: blocks per multiprocessor for
                // the kernel, block size and shared memory, times the multiprocessors.
                if kernel.cooperative {
                    let resident_blocks = s.resident_blocks(kernel, config)?;
                    if let Some(too_large) = kernel.not_co_resident(config, resident_blocks) {
                        return refuse(format!("{too_large} (the device's occupancy)"));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Launcher for Stream {
    type Error = Error;

    /// Validates the launch, copies the parameter values and enqueues the kernel; it runs
    /// after every launch enqueued on this stream before it.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`], naming the kernel, if the parameter count does not match
    /// the kernel's, a parameter pointer is null, the grid or block has a zero extent, the
    /// launch has more than [`CPU_MAX_THREADS_PER_LAUNCH`] threads or more blocks than the
    /// kernel supports (`#[kernel(max_blocks = N)]`), a cooperative kernel's blocks could
    /// not all run at once (`#[kernel(cooperative)]`, said so in its own words), or it asks
    /// for dynamic shared memory.
    ///
    /// # Safety
    /// `params` must hold one pointer per parameter of `kernel`, the i-th pointing to a
    /// valid value of the i-th parameter's type.
    unsafe fn launch_raw(
        &self,
        kernel: &'static KernelInfo,
        config: LaunchConfig,
        params: &[*const c_void],
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.validate(kernel, &config, params)? };
        // SAFETY: the count is checked above; the values are valid by our caller's contract.
        unsafe {
            match &self.kind {
                StreamKind::Cpu(s) => s.launch(kernel, config, params),
                StreamKind::Cuda(s) => s.launch(kernel, config, params),
            }
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device)
            .field(
                "id",
                &match &self.kind {
                    StreamKind::Cpu(s) => format!("{}", s.id),
                    StreamKind::Cuda(s) => format!("{s:?}"),
                },
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a launch on the CPU backend must be refused because a parameter of `kernel` holds
/// an address of live CUDA memory, which the emulator would dereference on the host; `None`
/// if none does (at once while no CUDA memory is alive).
///
/// # Safety
/// `params` holds one non-null pointer per parameter of `kernel`, each to a valid value of
/// its type (what [`Launcher::launch_raw`] requires of its caller).
unsafe fn gpu_address_in(kernel: &KernelInfo, params: &[*const c_void]) -> Option<String> {
    use crate::cuda::gpu_address_ranges::{any_live, first_gpu_address};
    if !any_live() {
        return None;
    }
    params
        .iter()
        .zip(kernel.params)
        .enumerate()
        .find_map(|(i, (&p, layout))| {
            // SAFETY: `p` points to a valid value of the i-th parameter type (the function's
            // contract), whose size the kernel's layout gives; a `KernelArg` has no padding, so
            // every byte of it is initialized.
            let value = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), layout.size) };
            first_gpu_address(value).map(|(at, addr)| {
                format!(
                    "parameter {i} holds, at byte {at}, the address {addr:#x} of CUDA device \
                     memory (a view or handle of a buffer of a cuda device); a kernel on the \
                     cpu backend reaches only the emulator's memory"
                )
            })
        })
}
