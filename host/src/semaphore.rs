//! Host objects of semaphores: they own the counters in device memory (the protocol is
//! documented in [`oxccl_device::semaphore`]).
//!
//! A semaphore's counters are one *slot* of zeroed device memory: `inbound` (written by the
//! peer) at its byte 0, `expected` (this side's count) 128 bytes further, so the waiter's
//! count never shares a cache line (or an adjacent-line prefetch pair) with the peer's
//! signal. A slot is 256 bytes, so slots side by side keep that apart too. A communicator
//! takes its semaphores' slots from chunks of 64, so that a peer maps one allocation for
//! many channels; [`SemaphoreCells::new`] gives one an allocation of its own. Creating a semaphore is a
//! pairwise step: each side tells the other where its `inbound` counter is (see
//! [`Communicator`](crate::Communicator)).

use crate::buffer_memory::BufferMemory;
use crate::device::Device;
use crate::error::Result;
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;
use oxccl_device::semaphore::SemaphoreRawParts;

/// Word of a slot holding `inbound`.
const INBOUND: u64 = 0;
/// Word of a slot holding `expected`: 128 bytes after `inbound`.
const EXPECTED: u64 = 16;
/// Bytes of one semaphore's slot.
pub(crate) const SLOT_BYTES: u64 = 256;

/// The counters of one semaphore, in device memory.
#[derive(Debug)]
pub struct SemaphoreCells {
    /// The memory holding the slot, which registrations share.
    memory: BufferMemory,
    /// Byte offset of the slot in `memory`.
    slot: u64,
}

impl SemaphoreCells {
    /// Zeroed counters on `device`, in an allocation of their own (a counter must start at
    /// 0: fresh device memory holds anything).
    ///
    /// # Errors
    /// The allocation failed.
    pub fn new(device: &Device) -> Result<Self> {
        let cells = device.alloc_zeroed::<u8>(SLOT_BYTES as usize)?;
        Ok(SemaphoreCells {
            memory: cells.memory().clone(),
            slot: 0,
        })
    }

    /// The counters of slot `slot` (a byte offset, a multiple of [`SLOT_BYTES`]) of
    /// `memory`, which holds zeroes there and gives the slot to no other semaphore.
    pub(crate) fn in_slot(memory: BufferMemory, slot: u64) -> Self {
        SemaphoreCells { memory, slot }
    }

    fn cell(&self, index: u64) -> u64 {
        self.memory.addr() + self.slot + index * 8
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
        RegisteredMemory::new_local(
            rank,
            self.memory.clone(),
            self.slot + INBOUND * 8,
            8,
            transports,
        )
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
