//! A device: where kernels run and device memory lives.
//!
//! On [`Backend::Cpu`] a device is an emulated GPU: its memory is page-aligned host memory
//! and its kernels run on the emulator's threads. Any number of devices (one per rank, for
//! ranks run as threads of one process) can coexist; each has its own streams. On
//! [`Backend::Cuda`] it is a GPU, opened through the CUDA driver (its primary context).

use crate::backend::Backend;
use crate::cpu::CpuDevice;
use crate::cpu::memory::Fill;
use crate::cuda::cuda_device::CudaDevice;
use crate::cuda::mapped_cells::MappedCells;
use crate::device_buffer::DeviceBuffer;
use crate::stream::Stream;
use crate::{Error, Result};
use bytemuck::Pod;
use oxccl_proxy::HostCell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable giving the default timeout of a stream's `synchronize`, in seconds
/// (fractions allowed).
pub const TIMEOUT_ENV: &str = "OXCCL_TIMEOUT_SECS";

/// The timeout of `synchronize` when `OXCCL_TIMEOUT_SECS` is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// A handle to one device of a backend. Cheap to clone: clones share the device.
///
/// # Examples
/// ```
/// let device = oxccl::Device::cpu(0);
/// let buf = device.alloc_from(&[1u32, 2, 3])?;
/// assert_eq!(buf.to_vec()?, [1, 2, 3]);
/// # Ok::<(), oxccl::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    kind: DeviceKind,
    /// Where cells the host and this GPU's kernels share are placed (CUDA only).
    mapped_cells: Option<MappedCells>,
}

/// The device of one backend.
pub(crate) enum DeviceKind {
    /// An emulated device.
    Cpu(Arc<CpuDevice>),
    /// A GPU.
    Cuda(Arc<CudaDevice>),
}

impl Device {
    /// Opens device `ordinal` of `backend`.
    ///
    /// On [`Backend::Cpu`] every ordinal exists: it only names the emulated device in
    /// messages (use the rank's local index). [`Backend::Auto`] opens the CUDA device if the
    /// driver reports devices, else the emulated one ([`Backend::resolve`]). Every `Device`
    /// of one GPU in a process shares that GPU's loaded kernels: a kernel crate's module is
    /// loaded at the first launch of one of its kernels, once per process.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] if the backend cannot be used on this machine (never
    /// for `Cpu` or `Auto`): no CUDA driver, or no device `ordinal`. [`Error::Cuda`] if the
    /// driver refuses to open it.
    pub fn new(backend: Backend, ordinal: usize) -> Result<Device> {
        match backend.resolve() {
            Backend::Cuda => {
                let device = CudaDevice::shared(ordinal)?;
                Ok(Device {
                    inner: Arc::new(DeviceInner {
                        mapped_cells: Some(MappedCells::new(&device)),
                        kind: DeviceKind::Cuda(device),
                    }),
                })
            }
            _ => Ok(Device::cpu(ordinal)),
        }
    }

    /// The device of the rank with index `local_rank` on its node: on the CUDA backend GPU
    /// `local_rank % n` of the `n` the driver reports (ranks share GPUs when there are
    /// more ranks than GPUs, as two processes on one GPU may), on the CPU backend emulated
    /// device `local_rank`.
    ///
    /// # Errors
    /// As [`Device::new`].
    pub fn for_local_rank(backend: Backend, local_rank: usize) -> Result<Device> {
        match backend.resolve() {
            Backend::Cuda => {
                let gpus = Backend::cuda_device_count()?.max(1) as usize;
                if local_rank >= gpus {
                    tracing::info!(local_rank, gpus, "ranks share GPUs: more ranks than GPUs");
                }
                Device::new(Backend::Cuda, local_rank % gpus)
            }
            _ => Ok(Device::cpu(local_rank)),
        }
    }

    /// Opens emulated device `ordinal` of the CPU backend, which is always available.
    pub fn cpu(ordinal: usize) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                kind: DeviceKind::Cpu(Arc::new(CpuDevice::new(ordinal))),
                mapped_cells: None,
            }),
        }
    }

    /// Lets the kernel threads of this (emulated) device's streams take turns with those of
    /// other devices that allow it, on one host thread, where the process has fewer cores
    /// than kernel threads (`OXCCL_CPU_CORUN`; see the emulator's `corun` module). Set for
    /// the device of every communicator; nothing on a GPU.
    pub(crate) fn allow_corun(&self) {
        if let DeviceKind::Cpu(d) = &self.inner.kind {
            d.corun.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The device's index within its backend.
    pub fn ordinal(&self) -> usize {
        match &self.inner.kind {
            DeviceKind::Cpu(d) => d.ordinal,
            DeviceKind::Cuda(d) => d.ordinal,
        }
    }

    /// The backend the device belongs to (`Cpu` or `Cuda`, never `Auto`).
    pub fn backend(&self) -> Backend {
        match &self.inner.kind {
            DeviceKind::Cpu(_) => Backend::Cpu,
            DeviceKind::Cuda(_) => Backend::Cuda,
        }
    }

    /// The GPU's name and compute capability (`NVIDIA H100 80GB HBM3, sm_90`), or
    /// `cpu emulator` on the CPU backend.
    pub fn description(&self) -> String {
        match &self.inner.kind {
            DeviceKind::Cpu(_) => "cpu emulator".into(),
            DeviceKind::Cuda(d) => {
                format!("{}, sm_{}{}", d.facts.name, d.facts.major, d.facts.minor)
            }
        }
    }

    /// Allocates `len` elements of device memory, not initialized: as with `cudaMalloc`,
    /// the contents are unspecified until written (on the CPU backend every byte is
    /// [`UNINITIALIZED_BYTE`](crate::UNINITIALIZED_BYTE), so code that relies on
    /// zeroed memory fails here as it would on a GPU).
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `len` elements of `T` do not fit in the address space;
    /// [`Error::System`] if the memory cannot be allocated.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::new(self, len, Fill::Uninitialized)
    }

    /// Allocates `len` zeroed elements of device memory.
    ///
    /// # Errors
    /// As [`Self::alloc`].
    pub fn alloc_zeroed<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::new(self, len, Fill::Zero)
    }

    /// Allocates device memory holding a copy of `data`.
    ///
    /// # Errors
    /// As [`Self::alloc`].
    pub fn alloc_from<T: Pod>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = DeviceBuffer::new(self, data.len(), Fill::Uninitialized)?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// Creates a stream: an in-order queue of kernel launches on this device.
    ///
    /// Its `synchronize` timeout is `OXCCL_TIMEOUT_SECS` seconds if that is set, else
    /// [`DEFAULT_TIMEOUT`]; change it with [`Stream::set_timeout`].
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if `OXCCL_TIMEOUT_SECS` is set but is not a positive number
    /// of seconds.
    pub fn stream(&self) -> Result<Stream> {
        Stream::new(self.clone(), timeout_from_env()?)
    }

    /// `value` where the host and this device's kernels both reach it, at one address:
    /// the heap on the CPU backend, pinned device-mapped host memory on a GPU (see
    /// [`HostCell`]). For abort records and stop words: a value placed on a GPU is never
    /// dropped, so types that need a drop are refused there.
    ///
    /// # Errors
    /// (GPU) a type that needs dropping, or the driver refused the memory.
    pub fn host_cell<T: Send + Sync + 'static>(&self, value: T) -> Result<HostCell<T>> {
        match &self.inner.mapped_cells {
            Some(cells) => cells.place(value),
            None => Ok(HostCell::new(value)),
        }
    }

    /// The GPU's multiprocessors (`None` on the CPU backend, whose blocks are host threads).
    pub fn multiprocessors(&self) -> Option<u32> {
        match &self.inner.kind {
            DeviceKind::Cpu(_) => None,
            DeviceKind::Cuda(d) => Some(d.facts.multiprocessors),
        }
    }

    /// The device of its backend.
    pub(crate) fn kind(&self) -> &DeviceKind {
        &self.inner.kind
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({} {})", self.backend(), self.ordinal())
    }
}

/// The default `synchronize` timeout: `OXCCL_TIMEOUT_SECS`, else [`DEFAULT_TIMEOUT`].
pub(crate) fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_TIMEOUT),
        Ok(value) if value.trim().is_empty() => Ok(DEFAULT_TIMEOUT),
        Ok(value) => parse_timeout(&value),
        Err(std::env::VarError::NotUnicode(raw)) => Err(Error::InvalidUsage(format!(
            "{TIMEOUT_ENV}={raw:?} is not valid Unicode; expected a number of seconds"
        ))),
    }
}

fn parse_timeout(value: &str) -> Result<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|secs| *secs > 0.0)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            Error::InvalidUsage(format!(
                "{TIMEOUT_ENV}=`{value}` is not a positive number of seconds"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a mistyped OXCCL_TIMEOUT_SECS silently becoming no timeout, a zero
    /// timeout, or a panic.
    #[test]
    fn timeout_values() {
        assert_eq!(parse_timeout("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_timeout(" 0.25 ").unwrap(), Duration::from_millis(250));
        for bad in ["0", "-1", "abc", "inf", "NaN", "1e300"] {
            assert!(
                matches!(parse_timeout(bad), Err(Error::InvalidUsage(_))),
                "{bad}"
            );
        }
    }

    /// Guards against a rank of the emulator opening another rank's device number.
    #[test]
    fn a_cpu_rank_opens_its_own_device() {
        let device = Device::for_local_rank(Backend::Cpu, 3).unwrap();
        assert_eq!((device.backend(), device.ordinal()), (Backend::Cpu, 3));
    }
}
