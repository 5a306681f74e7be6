//! The trigger FIFO's memory on a CUDA device, placed as MSCCL++ places it
//! (`src/core/fifo.cc`):
//!
//! | cell | memory | who touches it |
//! |---|---|---|
//! | trigger slots, `size` x 16 bytes | pinned host memory mapped into the device (`cuMemHostAlloc(DEVICEMAP \| PORTABLE)`) | kernels write across the bus; the proxy reads |
//! | `tail`, on its own 128-byte line after the slots | the same mapped memory | the proxy writes (release); kernels read |
//! | `head`, and the tail cache on the next 128-byte line | device memory (`cuMemAlloc`), zeroed | kernels only (`atom.add.gpu`): atomics of the GPU on mapped host memory are not atomic with respect to the host, so the host never touches `head` |
//!
//! The mapped memory is zeroed when allocated (an empty ring is all zeros: commit bits
//! 0, tail 0), and `oxccl_proxy::Fifo::from_mapped` checks it again. The memory lives as long
//! as the FIFO's cells, which the proxy service and every handle holder share, and holds
//! the device, so it is freed before the context is released.

use super::cuda_device::CudaDevice;
use super::cuda_memory::CudaMemory;
use super::mapped_host_memory::MappedHostMemory;
use crate::Result;
use oxccl_device::arch::atomic::AtomicU64;
use oxccl_device::fifo::{FifoRawParts, TriggerSlot};
use oxccl_proxy::MappedFifoCells;
use std::sync::Arc;

/// Bytes between the cells that different parties write, so that none shares a line with
/// another (128: an L2 line of the GPU, two of an x86 core).
const CELL_SPACING: usize = 128;

/// What keeps a CUDA FIFO's memory alive.
struct FifoMemory {
    _mapped: MappedHostMemory,
    _counters: CudaMemory,
}

/// The cells of an empty FIFO of `size` slots (a power of two, checked by the proxy) on
/// `device`, laid out as the module docs say.
///
/// # Errors
/// The driver refused an allocation or a mapping.
pub(crate) fn fifo_cells(device: &Arc<CudaDevice>, size: u32) -> Result<MappedFifoCells> {
    let slots_bytes = size as usize * size_of::<TriggerSlot>();
    let tail_offset = slots_bytes.next_multiple_of(CELL_SPACING);
    let mapped = MappedHostMemory::new(device, tail_offset + CELL_SPACING)?;
    let counters = CudaMemory::new(device, 2 * CELL_SPACING, true)?;
    let device_parts = FifoRawParts {
        triggers: mapped.device_address(),
        head: counters.addr(),
        tail: mapped.device_address() + tail_offset as u64,
        tail_cache: counters.addr() + CELL_SPACING as u64,
        doorbell: 0,
        size,
        reserved: 0,
    };
    // Page-aligned memory (cuMemHostAlloc), so the slots are 16-byte aligned and the tail,
    // at a multiple of 128 bytes in, 8-byte aligned.
    let host_slots = mapped.host().cast::<TriggerSlot>();
    // SAFETY: `tail_offset + CELL_SPACING` bytes were allocated at `host`.
    let host_tail = unsafe { mapped.host().cast::<u8>().add(tail_offset) }.cast::<AtomicU64>();
    Ok(MappedFifoCells {
        host_slots,
        host_tail,
        device: device_parts,
        keep_alive: Box::new(FifoMemory {
            _mapped: mapped,
            _counters: counters,
        }),
    })
}
