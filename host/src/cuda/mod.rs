//! The CUDA backend: devices, device memory, streams and kernel launches on NVIDIA GPUs,
//! through the CUDA driver API (cudarc, with the driver library loaded at run time, so a
//! build without CUDA installed runs and reports the backend unavailable).
//!
//! What works on this backend: opening a device (`Device::new(Backend::Cuda, i)`), device
//! buffers (allocation, copies, views for kernels), streams, launching any `#[kernel]`
//! whose crate's PTX was built (`cargo xtask build-ptx`), cooperative launches checked
//! against the occupancy the driver reports, bounded `synchronize`, and communicators: a
//! proxy whose trigger FIFO lives in mapped host memory and device memory
//! (`Device::proxy_service`, [`cuda_fifo_memory`]), abort records and stop words in mapped
//! host memory ([`mapped_cells`]), port channels through the CUDA IPC connection
//! (`oxccl::cuda_ipc_connection`: copies and semaphore writes on a stream), and registered
//! memory that travels as a CUDA IPC handle ([`cuda_ipc`]), opened by ranks of other
//! processes and reached at its own address by ranks of this one (with peer access enabled
//! between two GPUs of the process), Ethernet from GPU memory through pinned staging
//! ([`cuda_staging`]), InfiniBand from GPU memory registered with the RDMA device through
//! a dma-buf (`Context::dma_buf`) or as is (GPUDirect RDMA).

pub(crate) mod cuda_device;
pub(crate) mod cuda_fifo_memory;
pub(crate) mod cuda_ipc;
pub(crate) mod cuda_memory;
pub(crate) mod cuda_staging;
pub(crate) mod cuda_stream;
pub(crate) mod driver;
pub(crate) mod gpu_address_ranges;
pub(crate) mod mapped_cells;
pub(crate) mod mapped_host_memory;
pub(crate) mod numa_cpus;
pub(crate) mod registered_shares;
