//! The semaphores of a communicator, taken from few allocations.
//!
//! Every channel has a semaphore, and a peer maps (or, on a GPU, opens by CUDA IPC) the
//! allocation holding its `inbound` counter: one allocation per semaphore meant one mapping
//! per channel on the peer, and on the emulator a shared-memory object (a file descriptor
//! and a page) on each side. So a communicator takes its semaphores' slots from chunks of
//! [`SLOTS_PER_CHUNK`], zeroed once; a peer maps a chunk once for all the channels it
//! holds (mappings are cached per allocation).
//!
//! A slot is never given out twice, not even after its semaphore is dropped: a peer may
//! still signal the counter it was told of, and that must not count for a new semaphore.
//! Channels are made at setup, not per call, so a chunk is not many. A chunk stays
//! allocated while a semaphore of it (or a registration of one) lives.

use crate::buffer_memory::BufferMemory;
use crate::device::Device;
use crate::error::Result;
use crate::semaphore::{SLOT_BYTES, SemaphoreCells};

/// Semaphores of one chunk: 16 KiB.
pub(crate) const SLOTS_PER_CHUNK: u64 = 64;

/// Where a communicator's semaphores come from.
#[derive(Debug, Default)]
pub(crate) struct SemaphoreArena {
    /// The chunk slots are taken from now, and how many of its slots are taken.
    chunk: Option<(BufferMemory, u64)>,
}

impl SemaphoreArena {
    /// The counters of a new semaphore on `device`: the next free slot of the current
    /// chunk, or the first of a new one.
    ///
    /// # Errors
    /// A new chunk was needed and its allocation failed.
    pub(crate) fn cells(&mut self, device: &Device) -> Result<SemaphoreCells> {
        let (memory, taken) = match self.chunk.take() {
            Some((memory, taken)) if taken < SLOTS_PER_CHUNK => (memory, taken),
            _ => {
                let zeroed = device.alloc_zeroed::<u8>((SLOTS_PER_CHUNK * SLOT_BYTES) as usize)?;
                (zeroed.memory().clone(), 0)
            }
        };
        let cells = SemaphoreCells::in_slot(memory.clone(), taken * SLOT_BYTES);
        self.chunk = Some((memory, taken + 1));
        Ok(cells)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Guards against two semaphores sharing a counter (or a cache-line pair), and against
    /// a chunk handing out more slots than it has: the slots of a chunk lie 256 bytes apart
    /// in one allocation, and the semaphore after them comes from another.
    #[test]
    fn semaphores_take_distinct_slots_of_few_chunks() {
        let device = Device::cpu(0);
        let mut arena = SemaphoreArena::default();
        let n = SLOTS_PER_CHUNK + 3;
        let inbound: Vec<u64> = (0..n)
            .map(|_| {
                let parts = arena.cells(&device).unwrap().raw_parts(0);
                assert_eq!(parts.expected - parts.inbound, 128);
                parts.inbound
            })
            .collect();
        let mut pairs = HashSet::new();
        for (i, &at) in inbound.iter().enumerate() {
            // 128-byte pairs of cache lines: each counter has one to itself.
            assert!(pairs.insert(at / 128), "semaphore {i} shares a line pair");
            assert!(
                pairs.insert(at / 128 + 1),
                "semaphore {i} shares a line pair"
            );
        }
        let chunk = SLOTS_PER_CHUNK * SLOT_BYTES;
        let (first, second) = (inbound[0], inbound[SLOTS_PER_CHUNK as usize]);
        for (i, &at) in inbound.iter().enumerate() {
            let i = i as u64;
            let expected = match i.checked_sub(SLOTS_PER_CHUNK) {
                None => first + i * SLOT_BYTES,
                Some(j) => second + j * SLOT_BYTES,
            };
            assert_eq!(at, expected, "semaphore {i} is not in its chunk's slot");
        }
        assert!(
            second + chunk <= first || second >= first + chunk,
            "the semaphore after a full chunk lies inside it"
        );
    }
}
