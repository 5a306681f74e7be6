//! A GPU opened through the CUDA driver: its primary context, what it reports about itself,
//! and the kernels loaded on it.
//!
//! Kernels are found by the crate that defines them ([`KernelInfo::module`]): the first
//! launch of a kernel of crate `c` loads `c`'s PTX for the newest architecture the device
//! runs (see [`crate::ptx`]), once per device and process (every handle of a GPU shares
//! one [`CudaDevice`]); each kernel's function handle is then looked up once and kept.

use super::driver::{Context, DeviceFacts};
use crate::{Error, Result};
use crate::{embedded_ptx, ptx};
use cudarc::driver::sys;
use oxccl_device::launch::KernelInfo;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A loaded kernel: its function handle, and how many blocks of it fit on the device at
/// once for the block size it was last asked about.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadedKernel {
    pub(crate) function: sys::CUfunction,
}

// SAFETY: a function handle is an opaque value valid in its context on any thread; the
// module that owns it stays loaded as long as the device (see `CudaDevice::modules`).
unsafe impl Send for LoadedKernel {}
// SAFETY: as above.
unsafe impl Sync for LoadedKernel {}

/// A loaded PTX module.
struct Module(sys::CUmodule);

// SAFETY: as for `LoadedKernel`: an opaque handle of the device's context.
unsafe impl Send for Module {}

/// One CUDA device.
pub(crate) struct CudaDevice {
    pub(crate) ordinal: usize,
    pub(crate) facts: DeviceFacts,
    pub(crate) context: Context,
    /// PTX modules loaded, by crate; a crate whose PTX could not be loaded keeps its error
    /// text, so every launch says the same thing without searching again.
    modules: Mutex<HashMap<&'static str, std::result::Result<Module, String>>>,
    /// Kernels looked up, by (crate, name).
    kernels: Mutex<HashMap<(&'static str, &'static str), LoadedKernel>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda device {} ({}, sm_{}{})",
            self.ordinal, self.facts.name, self.facts.major, self.facts.minor
        )
    }
}

/// The devices open in this process, by ordinal: every [`crate::Device`] of one GPU shares
/// one, and with it the kernels loaded on it (a module is loaded once per process, not once
/// per handle).
static OPEN: Mutex<Option<HashMap<usize, Weak<CudaDevice>>>> = Mutex::new(None);

impl CudaDevice {
    /// Waits until every launch and copy of the device's context is done, at most
    /// `timeout`; returns whether it got there. The driver's wait has no deadline, so it runs
    /// on a thread of its own, left to finish by itself (detached) if the limit passes.
    pub(crate) fn wait_idle(self: &Arc<Self>, timeout: Duration) -> bool {
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let device = self.clone();
        let waiter = std::thread::Builder::new()
            .name(format!("oxccl-cuda-idle-{}", self.ordinal))
            .spawn(move || {
                let _ = done.send(device.context.synchronize_all());
            });
        if let Err(e) = waiter {
            tracing::warn!(error = %e, "could not start a thread to wait for the GPU");
            return false;
        }
        match finished.recv_timeout(timeout) {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "waiting for the GPU's work failed");
                false
            }
            Err(_) => false,
        }
    }

    /// Device `ordinal`, shared with every other handle of it in this process (opened if
    /// none is alive).
    ///
    /// # Errors
    /// As [`Self::open`].
    pub(crate) fn shared(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let mut open = OPEN.lock();
        let open = open.get_or_insert_with(HashMap::new);
        if let Some(device) = open.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(device);
        }
        let device = Arc::new(CudaDevice::open(ordinal)?);
        open.insert(ordinal, Arc::downgrade(&device));
        Ok(device)
    }

    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] without a driver or without that device;
    /// [`Error::Cuda`] if the driver refuses.
    pub(crate) fn open(ordinal: usize) -> Result<CudaDevice> {
        let (context, facts) = Context::open(ordinal)?;
        tracing::info!(
            ordinal,
            name = %facts.name,
            arch = %format!("sm_{}{}", facts.major, facts.minor),
            multiprocessors = facts.multiprocessors,
            "cuda device opened"
        );
        Ok(CudaDevice {
            ordinal,
            facts,
            context,
            modules: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
        })
    }

    /// `kernel`, loaded on this device (its crate's PTX module loaded first if needed).
    ///
    /// # Errors
    /// No PTX module of the kernel's crate for this device (the message names the command
    /// that builds it), a module the driver refuses, or a module without the kernel.
    pub(crate) fn kernel(&self, kernel: &'static KernelInfo) -> Result<LoadedKernel> {
        if let Some(k) = self.kernels.lock().get(&(kernel.module, kernel.name)) {
            return Ok(*k);
        }
        let mut modules = self.modules.lock();
        let module = modules
            .entry(kernel.module)
            .or_insert_with(|| self.load_module(kernel.module));
        let module = module
            .as_ref()
            .map_err(|why| Error::InvalidUsage(format!("kernel `{}`: {why}", kernel.name)))?;
        // SAFETY: the module is loaded in this device's context and stays loaded (modules
        // are never unloaded before the device is dropped).
        let function = unsafe { self.context.function(module.0, kernel.name)? };
        let loaded = LoadedKernel { function };
        self.kernels
            .lock()
            .insert((kernel.module, kernel.name), loaded);
        Ok(loaded)
    }

    /// Loads `crate_name`'s kernels: its cubin if one runs on this device (unless
    /// [`KERNEL_IMAGE_ENV`] says `ptx`), else its PTX, which the driver compiles; files
    /// first ([`ptx`]'s search), then the modules embedded at build time
    /// ([`crate::embedded_ptx`], feature `embed-ptx`).
    fn load_module(&self, crate_name: &str) -> std::result::Result<Module, String> {
        let (major, minor) = (self.facts.major, self.facts.minor);
        let started = std::time::Instant::now();
        let cubins = match kernel_image_from_env()? {
            KernelImage::Auto => true,
            KernelImage::Ptx => false,
        };
        let loaded = |module: sys::CUmodule, kind: &str, arch: &str, from: &str| {
            tracing::info!(
                module = crate_name,
                %arch,
                from,
                elapsed = ?started.elapsed(),
                "{kind} module loaded"
            );
            Module(module)
        };
        if let Some((path, arch)) = cubins
            .then(|| ptx::locate_cubin_for_device(crate_name, major, minor))
            .flatten()
        {
            let what = format!("{} ({arch}) on {self:?}", path.display());
            let image =
                std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()));
            match image.and_then(|image| {
                self.context
                    .load_cubin(&image, &what)
                    .map_err(|e| e.to_string())
            }) {
                Ok(module) => {
                    return Ok(loaded(module, "cubin", &arch, &path.display().to_string()));
                }
                // A cubin of a ptxas newer than the driver, say: the PTX still works.
                Err(why) => tracing::warn!("{why}; loading the PTX instead"),
            }
        }
        let not_found = match ptx::locate_for_device(crate_name, major, minor) {
            Ok((path, arch)) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                let what = format!("{} ({arch}) on {self:?}", path.display());
                let module = self
                    .context
                    .load_module(&text, &what)
                    .map_err(|e| e.to_string())?;
                let from = path.display().to_string();
                return Ok(loaded(module, "ptx (compiled by the driver)", &arch, &from));
            }
            Err(e) => e,
        };
        if let Some((image, m)) = cubins
            .then(|| embedded_ptx::cubin_for_device(crate_name, major, minor))
            .flatten()
        {
            let what = format!("embedded {} ({}) on {self:?}", m.source, m.arch);
            match self.context.load_cubin(image, &what) {
                Ok(module) => return Ok(loaded(module, "cubin", m.arch, "embedded")),
                Err(why) => tracing::warn!("{why}; loading the embedded PTX instead"),
            }
        }
        let m = embedded_ptx::ptx_for_device(crate_name, major, minor).ok_or_else(|| {
            format!(
                "{not_found}; build it with `cargo xtask build-ptx` (or `oxccl-build` for a \
                 kernel crate of your own), or point {} at a copy of `target/ptx`, or build \
                 with the `embed-ptx` feature after building the PTX",
                ptx::PTX_DIR_ENV
            )
        })?;
        let what = format!("embedded {} ({}) on {self:?}", m.source, m.arch);
        let module = self
            .context
            .load_module(m.ptx, &what)
            .map_err(|e| e.to_string())?;
        Ok(loaded(
            module,
            "ptx (compiled by the driver)",
            m.arch,
            "embedded",
        ))
    }
}

/// Environment variable choosing what the CUDA backend loads kernels from: `auto` (the
/// default: a cubin that runs on the device if there is one, else the PTX) or `ptx` (always
/// the PTX, compiled by the driver).
pub const KERNEL_IMAGE_ENV: &str = "OXCCL_KERNEL_IMAGE";

/// What kernels are loaded from ([`KERNEL_IMAGE_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KernelImage {
    Auto,
    Ptx,
}

/// [`KERNEL_IMAGE_ENV`], or why its value is not one.
fn kernel_image_from_env() -> std::result::Result<KernelImage, String> {
    match std::env::var(KERNEL_IMAGE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(KernelImage::Auto),
        Ok(v) if v.is_empty() || v == "auto" => Ok(KernelImage::Auto),
        Ok(v) if v == "ptx" => Ok(KernelImage::Ptx),
        Ok(v) => Err(format!(
            "{KERNEL_IMAGE_ENV}={v:?}: expected `auto` or `ptx`"
        )),
        Err(e) => Err(format!("{KERNEL_IMAGE_ENV}: {e}")),
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Every stream and buffer holds the device, so none is left to use a module; work
        // still queued completes before the context goes (streams are destroyed after
        // their last synchronize, buffers freed after theirs).
        for module in self.modules.get_mut().drain().filter_map(|(_, m)| m.ok()) {
            // SAFETY: loaded in this context; nothing can launch its kernels any more (see
            // above).
            if let Err(e) = unsafe { self.context.unload_module(module.0) } {
                tracing::warn!(error = %e, "unloading a PTX module failed");
            }
        }
    }
}
