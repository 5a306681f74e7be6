//! Host side of the trigger FIFO: owns the ring and its counters, and pops triggers.
//!
//! The protocol (who writes which cell, at which scope, and the lap-parity commit bit) is
//! documented with the device side in [`oxccl_device::fifo`]. This side is the single
//! consumer: it takes the slot at its position when the slot's commit bit matches the
//! position's lap, executes it, and only then releases `tail`, so `tail > p` means "trigger
//! `p` done" for the device's `sync`. The tail is written back in batches while the ring is
//! busy and at once when it runs empty, so it may lag, never lead.
//!
//! On the CPU backend the ring is ordinary heap memory; the CUDA backend will place the same
//! cells in pinned, device-mapped host memory.

use crossbeam_utils::CachePadded;
use oxccl_device::arch::atomic::{self, AtomicU64, Ordering, Scope};
use oxccl_device::fifo::{
    FifoDeviceHandle, FifoRawParts, PROXY_ASLEEP, ProxyTrigger, TriggerSlot, commit_bit_for,
};
use oxccl_device::wait::WaitPolicy;
use std::cell::Cell;
use std::sync::Arc;

#[cfg(not(oxccl_loom))]
use oxccl_device::arch::host::Doorbell;

/// Pops between two write-backs of the tail while the ring stays busy.
pub const TAIL_BATCH: u64 = 8;

/// Largest ring the proxy accepts: 2^20 slots (16 MiB).
pub const MAX_FIFO_SIZE: u32 = 1 << 20;

/// The cells of one FIFO, shared by the consumer and by whoever must keep them alive while
/// kernels may still use the handle.
///
/// Each counter has a cache line of its own: the producers' `fetch_add` on `head` and the
/// consumer's store of `tail` after every pop would otherwise move one line back and forth
/// on every trigger.
pub struct FifoCells {
    slots: Box<[TriggerSlot]>,
    size: u32,
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    tail_cache: CachePadded<AtomicU64>,
    #[cfg(not(oxccl_loom))]
    doorbell: Doorbell,
}

impl std::fmt::Debug for FifoCells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoCells")
            .field("size", &self.size)
            .field("claimed", &self.claimed())
            .field("executed", &self.executed())
            .finish()
    }
}

impl FifoCells {
    /// Where the cells are: the layout a [`FifoDeviceHandle`] carries.
    pub fn raw_parts(&self) -> FifoRawParts {
        FifoRawParts {
            triggers: self.slots.as_ptr() as u64,
            head: &*self.head as *const AtomicU64 as u64,
            tail: &*self.tail as *const AtomicU64 as u64,
            tail_cache: &*self.tail_cache as *const AtomicU64 as u64,
            #[cfg(not(oxccl_loom))]
            doorbell: &self.doorbell as *const Doorbell as u64,
            #[cfg(oxccl_loom)]
            doorbell: 0,
            size: self.size,
            reserved: 0,
        }
    }

    /// The kernel-side handle of these cells, with waits and failures under `wait`; valid
    /// as long as the cells are borrowed.
    pub fn device_handle<'a>(&'a self, wait: WaitPolicy<'a>) -> FifoDeviceHandle<'a> {
        // SAFETY: `raw_parts` names this ring's slots (`size` of them, a power of two, 16-byte
        // aligned), counters and doorbell, all owned by `self` and so alive for 'a.
        unsafe { FifoDeviceHandle::from_raw_parts(self.raw_parts(), wait) }
    }

    /// Positions executed so far, as last written back for pushers (may lag the consumer's
    /// position by less than [`TAIL_BATCH`] while the ring is busy).
    pub fn executed(&self) -> u64 {
        // Acquire: pairs with the Release write-back of the tail.
        atomic::load(&self.tail, Ordering::Acquire, Scope::System)
    }

    /// Positions claimed by pushers so far (the head without its sleep bit).
    pub fn claimed(&self) -> u64 {
        // Relaxed: only compared with the tail to spot a position nobody publishes.
        atomic::load(&self.head, Ordering::Relaxed, Scope::System) & !PROXY_ASLEEP
    }
}

#[cfg(not(oxccl_loom))]
impl FifoCells {
    /// The doorbell a push rings when the consumer is parked.
    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }

    /// Parks the calling consumer thread until a pusher rings the doorbell, someone calls
    /// [`Doorbell::wake_sleeper`], or `timeout` passes. Returns false at once, without
    /// parking, when a claimed position has not been executed yet or `stop()` holds.
    ///
    /// The handshake with `FifoDeviceHandle::push`: the sleep bit is set by an RMW of
    /// `head`, so in `head`'s modification order every pusher's `fetch_add` is either after
    /// it (the pusher sees the bit and rings) or before it (this RMW sees the claimed
    /// position and we do not park).
    pub fn park_consumer(&self, timeout: std::time::Duration, stop: impl Fn() -> bool) -> bool {
        self.park(timeout, stop, false)
    }

    /// [`Self::park_consumer`], parking even though a claimed position is unexecuted: for a
    /// consumer that knows that position will never be published (a push gave up), and
    /// would otherwise never park again.
    pub fn park_consumer_stalled(
        &self,
        timeout: std::time::Duration,
        stop: impl Fn() -> bool,
    ) -> bool {
        self.park(timeout, stop, true)
    }

    fn park(&self, timeout: std::time::Duration, stop: impl Fn() -> bool, stalled: bool) -> bool {
        self.doorbell.register_sleeper();
        // AcqRel: the RMW's place in head's modification order is what the handshake needs;
        // Acquire also orders the tail load below after it.
        let claimed = atomic::fetch_or(&self.head, PROXY_ASLEEP, Ordering::AcqRel, Scope::System)
            & !PROXY_ASLEEP;
        // Acquire: pairs with the Release store of `tail` by whoever executed last.
        let executed = atomic::load(&self.tail, Ordering::Acquire, Scope::System);
        let park = (stalled || claimed == executed) && !stop();
        if park {
            std::thread::park_timeout(timeout);
        }
        atomic::fetch_and(&self.head, !PROXY_ASLEEP, Ordering::AcqRel, Scope::System);
        park
    }
}

/// The consumer of a FIFO.
pub struct Fifo {
    cells: Arc<FifoCells>,
    /// Position of the next trigger to take; equals `tail` between calls.
    next: u64,
    /// The last value written to `tail`; lags `next` by less than [`TAIL_BATCH`] while
    /// the ring is busy.
    published: Cell<u64>,
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
                size,
                head: CachePadded::new(AtomicU64::new(0)),
                tail: CachePadded::new(AtomicU64::new(0)),
                tail_cache: CachePadded::new(AtomicU64::new(0)),
                #[cfg(not(oxccl_loom))]
                doorbell: Doorbell::new(),
            }),
            next: 0,
            published: Cell::new(0),
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

    /// The kernel-side handle, with waits bounded by `wait`; valid while the FIFO is
    /// borrowed (use [`FifoCells::device_handle`] on [`Self::cells`] to keep the FIFO free for
    /// the consumer).
    pub fn device_handle<'a>(&'a self, wait: WaitPolicy<'a>) -> FifoDeviceHandle<'a> {
        self.cells.device_handle(wait)
    }

    /// The next trigger, if its producer has published it; does not consume it.
    pub fn poll(&self) -> Option<ProxyTrigger> {
        let slot = &self.cells.slots[(self.next & (self.size as u64 - 1)) as usize].words;
        // Acquire: pairs with the Release store of this word in the device's `publish_pair`
        // (after its relaxed store of the first word), so the first word and the data the kernel wrote before are visible.
        let snd = atomic::load(&slot[1], Ordering::Acquire, Scope::System);
        let trigger = ProxyTrigger { fst: 0, snd };
        if trigger.commit_bit() != commit_bit_for(self.next, self.size) {
            // Nothing to do: the moment to let pushers and flushes see how far we got.
            self.publish_tail();
            return None;
        }
        // Relaxed: ordered after the Acquire above.
        let fst = atomic::load(&slot[0], Ordering::Relaxed, Scope::System);
        Some(ProxyTrigger { fst, snd })
    }

    /// Marks the trigger returned by the last `poll` as executed, freeing its slot. The
    /// tail is written back every [`TAIL_BATCH`] pops and whenever `poll` finds the ring
    /// empty, not on every pop: each write moves a cache line that pushers read.
    pub fn pop(&mut self) {
        self.next += 1;
        if self.next.is_multiple_of(TAIL_BATCH) {
            self.publish_tail();
        }
    }

    /// Writes the tail back if pushers have not seen the latest value.
    fn publish_tail(&self) {
        if self.published.get() != self.next {
            self.published.set(self.next);
            // Release: pairs with the device's Acquire loads of `tail` in `push` and `sync`:
            // our reads of the slots, and the triggers' effects, happen before their reuse /
            // the end of the device's flush.
            atomic::store(
                &self.cells.tail,
                self.next,
                Ordering::Release,
                Scope::System,
            );
        }
    }

    /// Position of the next trigger to take (= triggers executed so far).
    pub fn tail(&self) -> u64 {
        self.next
    }
}
