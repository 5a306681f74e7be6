//! Host side of the trigger FIFO: owns the ring and its counters, and pops triggers.
//!
//! The protocol (who writes which cell, at which scope, and the lap-parity commit bit) is
//! documented with the device side in [`oxccl_device::fifo`]. This side is the single
//! consumer: it takes the slot at its position when the slot's commit bit matches the
//! position's lap, executes it, and only then releases `tail`, so `tail > p` means "trigger
//! `p` done" for the device's `sync`.
//!
//! On the CPU backend the ring is ordinary heap memory; the CUDA backend will place the same
//! cells in pinned, device-mapped host memory.

use oxccl_device::arch::atomic::{self, AtomicU64, Ordering, Scope};
use oxccl_device::fifo::{FifoDeviceHandle, ProxyTrigger, TriggerSlot, commit_bit_for};
use oxccl_device::wait::WaitPolicy;
use std::sync::Arc;

#[cfg(not(oxccl_loom))]
use oxccl_device::arch::host::Doorbell;

/// Largest ring the proxy accepts: 2^20 slots (16 MiB).
pub const MAX_FIFO_SIZE: u32 = 1 << 20;

/// The cells of one FIFO, shared by the consumer and by whoever must keep them alive while
/// kernels may still use the handle.
pub struct FifoCells {
    slots: Box<[TriggerSlot]>,
    head: AtomicU64,
    tail: AtomicU64,
    tail_cache: AtomicU64,
    #[cfg(not(oxccl_loom))]
    doorbell: Doorbell,
}

impl FifoCells {
    /// The doorbell a push rings.
    #[cfg(not(oxccl_loom))]
    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }
}

/// The consumer of a FIFO.
pub struct Fifo {
    cells: Arc<FifoCells>,
    /// Position of the next trigger to take; equals `tail` between calls.
    next: u64,
    size: u32,
}

impl Fifo {
    /// A zeroed (empty) ring of `size` slots.
    ///
    /// # Errors
    /// `size` not a power of two, or above [`MAX_FIFO_SIZE`].
    pub fn new(size: u32) -> Result<Self, crate::ProxyError> {
        if !size.is_power_of_two() || size > MAX_FIFO_SIZE {
            return Err(crate::ProxyError::InvalidUsage(format!(
                "FIFO size {size} is not a power of two in 1..={MAX_FIFO_SIZE}"
            )));
        }
        let slots = (0..size).map(|_| TriggerSlot::new()).collect();
        Ok(Fifo {
            cells: Arc::new(FifoCells {
                slots,
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                tail_cache: AtomicU64::new(0),
                #[cfg(not(oxccl_loom))]
                doorbell: Doorbell::new(),
            }),
            next: 0,
            size,
        })
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The cells, to keep them alive as long as kernels may use [`Self::device_handle`].
    pub fn cells(&self) -> Arc<FifoCells> {
        self.cells.clone()
    }

    /// The kernel-side handle, with waits bounded by `wait`.
    pub fn device_handle(&self, wait: WaitPolicy) -> FifoDeviceHandle {
        let c = &*self.cells;
        FifoDeviceHandle {
            triggers: c.slots.as_ptr() as u64,
            head: &c.head as *const AtomicU64 as u64,
            tail: &c.tail as *const AtomicU64 as u64,
            tail_cache: &c.tail_cache as *const AtomicU64 as u64,
            #[cfg(not(oxccl_loom))]
            doorbell: &c.doorbell as *const Doorbell as u64,
            #[cfg(oxccl_loom)]
            doorbell: 0,
            size: self.size,
            reserved: 0,
            wait,
        }
    }

    /// The next trigger, if its producer has published it; does not consume it.
    pub fn poll(&self) -> Option<ProxyTrigger> {
        let slot = &self.cells.slots[(self.next & (self.size as u64 - 1)) as usize].words;
        // Acquire: pairs with the Release in `publish_pair` (the device's single vector
        // release store), so the first word and the data the kernel wrote before are visible.
        let snd = atomic::load(&slot[1], Ordering::Acquire, Scope::System);
        let trigger = ProxyTrigger { fst: 0, snd };
        if trigger.commit_bit() != commit_bit_for(self.next, self.size) {
            return None;
        }
        // Relaxed: ordered after the Acquire above.
        let fst = atomic::load(&slot[0], Ordering::Relaxed, Scope::System);
        Some(ProxyTrigger { fst, snd })
    }

    /// Marks the trigger returned by the last `poll` as executed, freeing its slot.
    pub fn pop(&mut self) {
        self.next += 1;
        // Release: pairs with the device's Acquire loads of `tail` in `push` and `sync`:
        // our reads of the slot, and the trigger's effects, happen before its reuse / the
        // end of the device's flush.
        atomic::store(
            &self.cells.tail,
            self.next,
            Ordering::Release,
            Scope::System,
        );
    }

    /// Position of the next trigger to take (= triggers executed so far).
    pub fn tail(&self) -> u64 {
        self.next
    }
}
