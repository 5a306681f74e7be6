//! Host side of the trigger FIFO: the ring's cells, and its single consumer.
//!
//! The protocol (who writes which cell, at which scope, and the lap-parity commit bit) is
//! documented with the device side in [`oxccl_device::fifo`]. This side is the single
//! consumer: it takes the slot at its position when the slot's commit bit matches the
//! position's lap, executes it, and only then releases `tail`, so `tail > p` means "trigger
//! `p` done" for the device's `sync`. The tail is written back in batches while the ring is
//! busy and at once when it runs empty, so it may lag, never lead.
//!
//! Where the cells live:
//! - On the CPU backend, on the heap ([`Fifo::new`]): every cell is ordinary memory, and
//!   the ring has a doorbell the pushers ring when the consumer parks (see
//!   [`crate::idle_policy`]); [`Fifo::without_doorbell`] leaves it out, as on a GPU.
//! - On a GPU ([`Fifo::from_mapped`]), where the backend placed them, as MSCCL++ does: the
//!   slots and `tail` in pinned, device-mapped host memory (the host reads the slots and
//!   writes `tail`; the device reads and writes them across the bus), `head` and the tail
//!   cache in device memory, which only the GPU touches: atomics of the GPU on mapped host
//!   memory are not atomic with respect to the host, so the host never reads-modifies-writes
//!   `head` there (no doorbell, no sleep bit, and no look at `head` at all).

use crossbeam_utils::CachePadded;
use oxccl_device::arch::atomic::{self, AtomicU64, Ordering, Scope};
use oxccl_device::fifo::{
    FifoDeviceHandle, FifoRawParts, PROXY_ASLEEP, ProxyTrigger, TriggerSlot, commit_bit_for,
};
use oxccl_device::wait::WaitPolicy;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::Arc;

#[cfg(not(oxccl_loom))]
use oxccl_device::arch::host::Doorbell;

/// Pops between two write-backs of the tail while the ring stays busy.
pub const TAIL_BATCH: u64 = 8;

/// Largest ring the proxy accepts: 2^20 slots (16 MiB).
pub const MAX_FIFO_SIZE: u32 = 1 << 20;

/// The cells of one FIFO, shared by the consumer and by whoever must keep them alive while
/// kernels may still use the handle.
pub struct FifoCells {
    /// Host address of the `size` slots.
    slots: NonNull<TriggerSlot>,
    size: u32,
    /// Host address of the head, where the host may read it (`None`: in device memory).
    head: Option<NonNull<AtomicU64>>,
    /// Host address of the tail.
    tail: NonNull<AtomicU64>,
    /// The addresses the device uses, as its handles carry them.
    device: FifoRawParts,
    storage: Storage,
}

// SAFETY: the pointers name atomics inside `storage` (heap cells, or memory the
// `MappedFifoCells::keep_alive` it holds keeps alive, which is `Send + Sync`), and every
// access through them is atomic.
unsafe impl Send for FifoCells {}
// SAFETY: as above: shared access is atomic accesses only.
unsafe impl Sync for FifoCells {}

/// What keeps the cells' memory alive.
enum Storage {
    /// The CPU backend's cells, boxed so that their addresses do not move. (The loom
    /// models reach them only through the cell pointers.)
    Heap(#[cfg_attr(oxccl_loom, allow(dead_code))] Box<HeapCells>),
    /// Memory a backend placed, held until the cells are dropped.
    Mapped(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// Every cell of a heap FIFO. Each counter has a cache line of its own: the producers'
/// `fetch_add` on `head` and the consumer's store of `tail` after every pop would otherwise
/// move one line back and forth on every trigger.
struct HeapCells {
    slots: Box<[TriggerSlot]>,
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
    tail_cache: CachePadded<AtomicU64>,
    #[cfg(not(oxccl_loom))]
    doorbell: Option<Doorbell>,
}

/// FIFO cells a backend placed (see the module docs), for [`Fifo::from_mapped`].
pub struct MappedFifoCells {
    /// Host address of the slots (16-byte aligned, zeroed).
    pub host_slots: *mut TriggerSlot,
    /// Host address of the tail (8-byte aligned, zero).
    pub host_tail: *mut AtomicU64,
    /// The device's addresses of the same slots and tail, and of the head and tail cache
    /// (zeroed device memory), with the number of slots; no doorbell.
    pub device: FifoRawParts,
    /// Keeps all of that memory alive; dropped with the cells.
    pub keep_alive: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for FifoCells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoCells")
            .field("size", &self.size)
            .field("mapped", &matches!(self.storage, Storage::Mapped(_)))
            .field("claimed", &self.claimed())
            .field("executed", &self.executed())
            .finish()
    }
}

impl FifoCells {
    fn on_heap(size: u32, doorbell: bool) -> Self {
        let heap = Box::new(HeapCells {
            slots: (0..size).map(|_| TriggerSlot::new()).collect(),
            head: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            tail_cache: CachePadded::new(AtomicU64::new(0)),
            #[cfg(not(oxccl_loom))]
            doorbell: doorbell.then(Doorbell::new),
        });
        #[cfg(oxccl_loom)]
        let _ = doorbell;
        let address = |cell: &AtomicU64| cell as *const AtomicU64 as u64;
        let device = FifoRawParts {
            triggers: heap.slots.as_ptr() as u64,
            head: address(&heap.head),
            tail: address(&heap.tail),
            tail_cache: address(&heap.tail_cache),
            #[cfg(not(oxccl_loom))]
            doorbell: heap
                .doorbell
                .as_ref()
                .map_or(0, |d| d as *const Doorbell as u64),
            #[cfg(oxccl_loom)]
            doorbell: 0,
            size,
            reserved: 0,
        };
        FifoCells {
            slots: NonNull::from(&heap.slots[0]),
            size,
            head: Some(NonNull::from(&*heap.head)),
            tail: NonNull::from(&*heap.tail),
            device,
            storage: Storage::Heap(heap),
        }
    }

    /// Where the cells are for the device: the layout a [`FifoDeviceHandle`] carries.
    pub fn raw_parts(&self) -> FifoRawParts {
        self.device
    }

    /// The kernel-side handle of these cells, with waits and failures under `wait`; valid
    /// as long as the cells are borrowed.
    pub fn device_handle<'a>(&'a self, wait: WaitPolicy<'a>) -> FifoDeviceHandle<'a> {
        // SAFETY: `raw_parts` names this ring's slots (`size` of them, a power of two, 16-byte
        // aligned), counters and doorbell (or 0), all kept alive by `self` for 'a: heap cells
        // of ours, or mapped ones whose placement `Fifo::from_mapped`'s caller vouched for.
        unsafe { FifoDeviceHandle::from_raw_parts(self.device, wait) }
    }

    /// Slot `index` (below `size`).
    #[inline(always)]
    fn slot(&self, index: usize) -> &TriggerSlot {
        debug_assert!(index < self.size as usize);
        // SAFETY: `slots` points to `size` live slots (see the type's fields), index < size.
        unsafe { &*self.slots.as_ptr().add(index) }
    }

    #[inline(always)]
    fn tail_cell(&self) -> &AtomicU64 {
        // SAFETY: `tail` points to a live counter (see the type's fields).
        unsafe { self.tail.as_ref() }
    }

    fn head_cell(&self) -> Option<&AtomicU64> {
        // SAFETY: `head`, when the host may read it, points to a live counter.
        self.head.map(|head| unsafe { &*head.as_ptr() })
    }

    /// Positions executed so far, as last written back for pushers (may lag the consumer's
    /// position by less than [`TAIL_BATCH`] while the ring is busy).
    pub fn executed(&self) -> u64 {
        // Acquire: pairs with the Release write-back of the tail.
        atomic::load(self.tail_cell(), Ordering::Acquire, Scope::System)
    }

    /// Positions claimed by pushers so far (the head without its sleep bit); `None` where
    /// the head is in device memory, out of the host's reach.
    pub fn claimed(&self) -> Option<u64> {
        // Relaxed: only compared with the tail to spot a position nobody publishes.
        self.head_cell()
            .map(|head| atomic::load(head, Ordering::Relaxed, Scope::System) & !PROXY_ASLEEP)
    }

    /// The head as the host sees it, sleep bit included; `None` where it is in device
    /// memory.
    pub fn head_word(&self) -> Option<u64> {
        // Relaxed: a look, for checks and tests.
        self.head_cell()
            .map(|head| atomic::load(head, Ordering::Relaxed, Scope::System))
    }
}

#[cfg(not(oxccl_loom))]
impl FifoCells {
    /// The doorbell a push rings when the consumer is parked; `None` for a ring whose
    /// pushers cannot wake a host thread (see [`crate::idle_policy`]).
    pub fn doorbell(&self) -> Option<&Doorbell> {
        match &self.storage {
            Storage::Heap(heap) => heap.doorbell.as_ref(),
            Storage::Mapped(_) => None,
        }
    }

    /// Parks the calling consumer thread until a pusher rings the doorbell, someone calls
    /// [`Doorbell::wake_sleeper`], or `timeout` passes. Returns false at once, without
    /// parking, when a claimed position has not been executed yet, `stop()` holds, or the
    /// ring has no doorbell.
    ///
    /// The handshake with `FifoDeviceHandle::push`: the sleep bit is set by an RMW of
    /// `head`, so in `head`'s modification order every pusher's `fetch_add` is either after
    /// it (the pusher sees the bit and rings) or before it (this RMW sees the claimed
    /// position and we do not park).
    pub fn park_consumer(&self, timeout: std::time::Duration, stop: impl Fn() -> bool) -> bool {
        Self::park_consumers(&[(self, false)], timeout, stop)
    }

    /// [`Self::park_consumer`] for a thread that consumes several rings: parks only if every
    /// ring is empty or, flagged `true`, stalled (its claimed position will never be
    /// published, because its push gave up: such a ring would otherwise never let the
    /// thread park again), with every ring's sleep bit set, so a push to any of them rings
    /// its doorbell, which wakes the calling thread. Returns false at once, without
    /// parking, as the single form does for any of them (no ring at all: false).
    pub fn park_consumers(
        rings: &[(&FifoCells, bool)],
        timeout: std::time::Duration,
        stop: impl Fn() -> bool,
    ) -> bool {
        let mut announced = 0;
        let mut park = !rings.is_empty();
        for &(ring, stalled) in rings {
            let (Some(doorbell), Some(head)) = (ring.doorbell(), ring.head_cell()) else {
                park = false;
                break;
            };
            doorbell.register_sleeper();
            // AcqRel: the RMW's place in head's modification order is what the handshake
            // needs; Acquire also orders the tail load below after it.
            let claimed = atomic::fetch_or(head, PROXY_ASLEEP, Ordering::AcqRel, Scope::System)
                & !PROXY_ASLEEP;
            announced += 1;
            // Acquire: pairs with the Release store of `tail` by whoever executed last.
            let executed = atomic::load(ring.tail_cell(), Ordering::Acquire, Scope::System);
            if !stalled && claimed != executed {
                park = false;
                break;
            }
        }
        let park = park && !stop();
        if park {
            std::thread::park_timeout(timeout);
        }
        for &(ring, _) in &rings[..announced] {
            if let Some(head) = ring.head_cell() {
                atomic::fetch_and(head, !PROXY_ASLEEP, Ordering::AcqRel, Scope::System);
            }
        }
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

fn check_size(size: u32) -> Result<(), crate::ProxyError> {
    if !size.is_power_of_two() || size > MAX_FIFO_SIZE {
        return Err(crate::ProxyError::InvalidUsage(format!(
            "FIFO size {size} is not a power of two in 1..={MAX_FIFO_SIZE}"
        )));
    }
    Ok(())
}

impl Fifo {
    /// An empty ring of `size` slots on the heap, with a doorbell (the CPU backend's).
    ///
    /// # Errors
    /// `size` not a power of two, or above [`MAX_FIFO_SIZE`].
    pub fn new(size: u32) -> Result<Self, crate::ProxyError> {
        check_size(size)?;
        Ok(Self::over(FifoCells::on_heap(size, true)))
    }

    /// An empty ring of `size` slots on the heap whose handles carry no doorbell: its
    /// consumer must poll, as a GPU's proxy does ([`crate::IdlePolicy::Poll`]).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn without_doorbell(size: u32) -> Result<Self, crate::ProxyError> {
        check_size(size)?;
        Ok(Self::over(FifoCells::on_heap(size, false)))
    }

    /// A ring over cells a backend placed (see the module docs).
    ///
    /// # Errors
    /// A size that [`Self::new`] refuses, a doorbell, a null or misaligned address, or
    /// host cells that are not zero (an empty ring is zeroed: memory a GPU driver hands out
    /// is not, unless asked).
    ///
    /// # Safety
    /// Until `cells.keep_alive` is dropped: `host_slots` points to `device.size` slots and
    /// `host_tail` to a counter, both readable and writable by this process and accessed
    /// only atomically by others; `device` names, for the device, those same slots and tail
    /// and a head and tail cache that are zero and that only the device touches.
    pub unsafe fn from_mapped(cells: MappedFifoCells) -> Result<Self, crate::ProxyError> {
        let d = cells.device;
        check_size(d.size)?;
        let refuse = |why: String| Err(crate::ProxyError::InvalidUsage(why));
        if d.doorbell != 0 || d.reserved != 0 {
            return refuse(format!(
                "mapped FIFO: doorbell {:#x} and reserved {} must be 0 (no one can wake the \
                 host from a GPU)",
                d.doorbell, d.reserved
            ));
        }
        let aligned = |address: u64, align: u64| address != 0 && address.is_multiple_of(align);
        let slot_align = align_of::<TriggerSlot>() as u64;
        let device_ok = aligned(d.triggers, slot_align)
            && [d.head, d.tail, d.tail_cache]
                .iter()
                .all(|&a| aligned(a, 8));
        let host_ok =
            aligned(cells.host_slots as u64, slot_align) && aligned(cells.host_tail as u64, 8);
        if !device_ok || !host_ok {
            return refuse(format!(
                "mapped FIFO: a null or misaligned address (device {d:?}, host slots {:p}, \
                 host tail {:p})",
                cells.host_slots, cells.host_tail
            ));
        }
        let fifo = Self::over(FifoCells {
            // Checked non-null above.
            slots: NonNull::new(cells.host_slots).expect("checked non-null"),
            size: d.size,
            head: None,
            tail: NonNull::new(cells.host_tail).expect("checked non-null"),
            device: d,
            storage: Storage::Mapped(cells.keep_alive),
        });
        let stale = (0..d.size as usize).find(|&i| {
            let words = &fifo.cells.slot(i).words;
            // Relaxed: nothing has been published yet; this checks the memory's start state.
            words
                .iter()
                .any(|w| atomic::load(w, Ordering::Relaxed, Scope::System) != 0)
        });
        if let Some(i) = stale {
            return refuse(format!(
                "mapped FIFO: slot {i} is not zero; the ring must start zeroed (GPU drivers do \
                 not zero memory unless asked)"
            ));
        }
        if fifo.cells.executed() != 0 {
            return refuse("mapped FIFO: the tail is not zero".into());
        }
        Ok(fifo)
    }

    fn over(cells: FifoCells) -> Self {
        Fifo {
            size: cells.size,
            cells: Arc::new(cells),
            next: 0,
            published: Cell::new(0),
        }
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
        let slot = &self
            .cells
            .slot((self.next & (self.size as u64 - 1)) as usize)
            .words;
        // Acquire: pairs with the Release store of this word in the device's `publish_pair`
        // (after its relaxed store of the first word), so the first word and the data the
        // kernel wrote before are visible.
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
                self.cells.tail_cell(),
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
