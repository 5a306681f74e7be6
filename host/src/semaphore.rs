//! Host objects of semaphores: they own the counters in device memory (the protocol is
//! documented in [`oxccl_device::semaphore`]).
//!
//! Counters live in one small zeroed device buffer per semaphore: `inbound` (written by the
//! peer) at byte 0, `expected` (this side's count) 128 bytes further, so the waiter's count
//! never shares a cache line (or an adjacent-line prefetch pair) with the peer's signal. Creating a semaphore is a pairwise step: each
//! side tells the other where its `inbound` counter is (see
//! [`Communicator`](crate::Communicator)).

use crate::buffer_memory::BufferMemory;
use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::error::Result;
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;
use oxccl_device::semaphore::SemaphoreRawParts;

const INBOUND: u64 = 0;
const EXPECTED: u64 = 16;
const CELLS: usize = 17;

/// The counters of one semaphore, in device memory.
#[derive(Debug)]
pub struct SemaphoreCells {
    cells: DeviceBuffer<u64>,
    /// The cells' memory, which registrations share.
    memory: BufferMemory,
}

impl SemaphoreCells {
    /// Zeroed counters on `device` (a counter must start at 0: fresh device memory holds
    /// anything).
    ///
    /// # Errors
    /// The allocation failed.
    pub fn new(device: &Device) -> Result<Self> {
        let cells = device.alloc_zeroed::<u64>(CELLS)?;
        let memory = cells.memory().clone();
        Ok(SemaphoreCells { cells, memory })
    }

    fn cell(&self, index: u64) -> u64 {
        self.cells.addr() + index * 8
    }

    /// The inbound counter as registered memory, to hand to the peer (8 bytes).
    ///
    /// # Errors
    /// The driver refused to export counters on a CUDA device.
    pub fn inbound_memory(
        &self,
        rank: u32,
        transports: Vec<Transport>,
    ) -> Result<RegisteredMemory> {
        RegisteredMemory::new_local(rank, self.memory.clone(), INBOUND * 8, 8, transports)
    }

    /// The counters' addresses, with `remote_inbound` (the peer's counter, mapped here, or
    /// 0 for a semaphore the peer's proxy raises).
    pub fn raw_parts(&self, remote_inbound: u64) -> SemaphoreRawParts {
        SemaphoreRawParts {
            inbound: self.cell(INBOUND),
            expected: self.cell(EXPECTED),
            remote_inbound,
        }
    }
}
