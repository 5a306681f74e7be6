//! A stream of a CUDA device: launches through `cuLaunchKernel` (or
//! `cuLaunchCooperativeKernel` for kernels with a grid barrier), and a `synchronize` with a
//! deadline (`cuStreamQuery` polled, then slept between, never an unbounded
//! `cuStreamSynchronize`).
//!
//! A kernel that fails on a GPU (a `trap` from a failed device call, an illegal address)
//! does not say which launch it was: the stream remembers the kernels launched since its
//! last `synchronize` and names them in the error.

use super::cuda_device::CudaDevice;
use crate::{Error, Result};
use cudarc::driver::sys;
use oxccl_device::launch::{KernelInfo, LaunchConfig};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kernels named in a failure report; later ones are counted.
const NAMED_LAUNCHES: usize = 8;

/// Polls of a running stream before `synchronize` starts sleeping between them.
const SPIN_POLLS: u32 = 64;

/// Longest sleep between two polls.
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// One CUDA stream.
pub(crate) struct CudaStream {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
    /// Whether the stream was created here (and is destroyed on drop), or lent by the
    /// caller ([`Self::borrowed`]).
    owned: bool,
    /// Kernels launched since the last `synchronize`: the first few names and the count.
    since_sync: Mutex<(Vec<&'static str>, u64)>,
}

// SAFETY: a stream handle is an opaque value of its context, usable from any thread with
// the context current (every call binds it).
unsafe impl Send for CudaStream {}
// SAFETY: as above; the driver serializes work enqueued on one stream from several threads.
unsafe impl Sync for CudaStream {}

impl std::fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {:p} of {:?}", self.stream, self.device)
    }
}

impl CudaStream {
    /// A new stream on `device`.
    pub(crate) fn new(device: &Arc<CudaDevice>) -> Result<Self> {
        Ok(CudaStream {
            stream: device.context.create_stream()?,
            device: device.clone(),
            owned: true,
            since_sync: Mutex::new((Vec::new(), 0)),
        })
    }

    /// A stream created elsewhere (by the caller's own CUDA code), used but not destroyed.
    ///
    /// # Safety
    /// `stream` is a live stream of `device`'s primary context, and stays alive as long as
    /// the returned value.
    pub(crate) unsafe fn borrowed(device: &Arc<CudaDevice>, stream: sys::CUstream) -> Self {
        CudaStream {
            stream,
            device: device.clone(),
            owned: false,
            since_sync: Mutex::new((Vec::new(), 0)),
        }
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.stream
    }

    /// Most blocks of `kernel` with `config`'s block shape the device holds at once.
    pub(crate) fn resident_blocks(
        &self,
        kernel: &'static KernelInfo,
        config: &LaunchConfig,
    ) -> Result<u64> {
        let loaded = self.device.kernel(kernel)?;
        // SAFETY: `loaded.function` is a kernel of a module loaded on this device.
        let per_sm = unsafe {
            self.device.context.resident_blocks_per_sm(
                loaded.function,
                config.block.volume() as u32,
                config.shared_mem_bytes as usize,
            )?
        };
        Ok(u64::from(per_sm) * u64::from(self.device.facts.multiprocessors))
    }

    /// Enqueues `kernel`.
    ///
    /// # Safety
    /// `params` holds one pointer per parameter of `kernel`, each to a valid value of the
    /// parameter's type (the driver copies the values before this returns).
    pub(crate) unsafe fn launch(
        &self,
        kernel: &'static KernelInfo,
        config: LaunchConfig,
        params: &[*const c_void],
    ) -> Result<()> {
        let loaded = self.device.kernel(kernel)?;
        if kernel.cooperative && !self.device.facts.cooperative_launch {
            return Err(Error::BackendUnavailable(format!(
                "kernel `{}` synchronizes its grid, and {:?} cannot launch cooperative kernels",
                kernel.name, self.device
            )));
        }
        // The driver takes `void**` but only reads the values (copied at launch).
        let mut params: Vec<*mut c_void> = params.iter().map(|p| p.cast_mut()).collect();
        let (g, b) = (config.grid, config.block);
        // SAFETY: the function is loaded on this device, the stream is ours and alive,
        // and `params` is our caller's contract.
        unsafe {
            self.device.context.launch(
                loaded.function,
                (g.x, g.y, g.z),
                (b.x, b.y, b.z),
                config.shared_mem_bytes,
                self.stream,
                &mut params,
                kernel.cooperative,
                kernel.name,
            )?;
        }
        let mut since = self.since_sync.lock();
        if since.0.len() < NAMED_LAUNCHES {
            since.0.push(kernel.name);
        }
        since.1 += 1;
        Ok(())
    }

    /// Waits for everything enqueued so far, at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] past the deadline (the work keeps running); [`Error::KernelFailed`]
    /// if a kernel failed, naming the kernels launched since the last call.
    pub(crate) fn synchronize(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let mut polls = 0u32;
        let mut sleep = Duration::from_micros(1);
        loop {
            // SAFETY: the stream is ours and alive.
            match unsafe { self.device.context.stream_done(self.stream) } {
                Ok(true) => {
                    *self.since_sync.lock() = (Vec::new(), 0);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    let (names, count) = std::mem::take(&mut *self.since_sync.lock());
                    return Err(Error::KernelFailed {
                        kernel: names.first().copied().unwrap_or("(none)"),
                        message: format!(
                            "{e}; kernels launched on the stream since its last synchronize: \
                             {}{} (the device's context cannot be used after such a fault)",
                            names.join(", "),
                            if count > names.len() as u64 {
                                format!(" and {} more", count - names.len() as u64)
                            } else {
                                String::new()
                            }
                        ),
                    });
                }
            }
            if started.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: format!("synchronize of {self:?}"),
                    after: started.elapsed(),
                });
            }
            polls += 1;
            if polls > SPIN_POLLS {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(MAX_SLEEP);
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: created by `new` in this device's context and not used after this.
        if let Err(e) = unsafe { self.device.context.destroy_stream(self.stream) } {
            tracing::warn!(error = %e, "destroying a stream failed");
        }
    }
}
