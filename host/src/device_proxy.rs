//! A proxy service whose trigger FIFO the kernels of a device can push to: on the heap
//! for the CPU emulator, in pinned device-mapped host memory (slots, tail) and device memory
//! (head, tail cache) on a GPU (see `cuda::cuda_fifo_memory`), with the rank's stop word
//! where those kernels reach it ([`Device::host_cell`]). The one place that decides where a
//! FIFO lives; communicators and hand-built channels get their proxy here.

use crate::Device;
use crate::device::DeviceKind;
use crate::error::Result;
use oxccl_proxy::{IdlePolicy, PollSchedule, ProxyConfig, ProxyService};
use std::sync::atomic::AtomicU64;

impl Device {
    /// A proxy service (not started) whose FIFO this device's kernels can push to.
    ///
    /// On a GPU the FIFO has no doorbell (a GPU cannot wake a host thread), so the proxy
    /// polls: [`IdlePolicy::Doorbell`] in `config` becomes [`IdlePolicy::Poll`] with the
    /// default [`PollSchedule`], and `assist` has no effect; without `config.cpus`, the
    /// proxy thread runs on the CPUs of the GPU's NUMA node where the system lists one.
    ///
    /// # Errors
    /// What [`ProxyService::new`] refuses, or (GPU) the driver refused the FIFO's memory.
    pub fn proxy_service(&self, config: ProxyConfig) -> Result<ProxyService> {
        match self.kind() {
            DeviceKind::Cpu(_) => Ok(ProxyService::new(config)?),
            DeviceKind::Cuda(device) => {
                let idle = match config.idle {
                    IdlePolicy::Doorbell => IdlePolicy::Poll(PollSchedule::default()),
                    poll => poll,
                };
                let cells = crate::cuda::cuda_fifo_memory::fifo_cells(device, config.fifo_size)?;
                let stop_word = self.host_cell(AtomicU64::new(0))?;
                let cpus = (config.cpus.clone())
                    .or_else(|| crate::cuda::numa_cpus::cpus_near(device.facts.pci));
                // SAFETY: `fifo_cells` placed `fifo_size` zeroed slots and a zero tail in
                // mapped host memory (host and device addresses of the same bytes), and a
                // zeroed head and tail cache in device memory only kernels touch; all kept
                // alive by `keep_alive`, which the FIFO's cells hold. The stop word is where
                // the device's kernels reach it (`host_cell`).
                Ok(unsafe {
                    ProxyService::with_mapped_fifo(
                        ProxyConfig {
                            idle,
                            cpus,
                            ..config
                        },
                        cells,
                        stop_word,
                    )?
                })
            }
        }
    }
}
