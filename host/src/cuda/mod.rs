//! The CUDA backend: devices, device memory, streams and kernel launches on NVIDIA GPUs,
//! through the CUDA driver API (cudarc, with the driver library loaded at run time, so a
//! build without CUDA installed runs and reports the backend unavailable).
//!
//! What works on this backend: opening a device (`Device::new(Backend::Cuda, i)`), device
//! buffers (allocation, copies, views for kernels), streams, launching any `#[kernel]`
//! whose crate's PTX was built (`cargo xtask build-ptx`), cooperative launches checked
//! against the occupancy the driver reports, and bounded `synchronize`. What does not yet:
//! communicators (connections through CUDA IPC between processes, the trigger FIFO in mapped
//! host memory, the proxy on streams); asking for one on a CUDA device is an error that says
//! so. The CUDA IPC handle a registered range travels as, and its mapping on the peer,
//! exist ([`cuda_ipc`]); no connection uses them yet.

pub(crate) mod cuda_device;
#[allow(
    dead_code,
    reason = "the communicator does not build CUDA IPC connections yet; tests use the handles"
)]
pub(crate) mod cuda_ipc;
pub(crate) mod cuda_memory;
pub(crate) mod cuda_stream;
pub(crate) mod driver;
pub(crate) mod gpu_address_ranges;
