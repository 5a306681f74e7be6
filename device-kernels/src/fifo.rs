//! The trigger FIFO: kernel threads push [`ProxyTrigger`]s, the host proxy pops them.
//!
//! Memory and who touches it (`FifoDeviceHandle` holds the addresses):
//!
//! | cell | written by | read by | scope |
//! |---|---|---|---|
//! | `head` (u64 counter; bit 63: [`PROXY_ASLEEP`]) | kernel threads, `fetch_add`; the host proxy sets and clears bit 63 (CPU emulator) | kernel threads | device (`.gpu`) |
//! | `triggers[size]` (16-byte slots) | kernel threads: `fst` relaxed, then `snd` (with the commit bit) release ([`atomic::publish_pair`]) | proxy: acquires `snd`, then reads `fst` | system |
//! | `tail` (u64 counter) | proxy, release store after executing a trigger | kernel threads, acquire | system |
//! | `tail_cache` (u64) | kernel threads | kernel threads | device |
//!
//! Invariants:
//! - `size` is a power of two (the host refuses others), so slot and lap come from a mask
//!   and a bit test rather than a 64-bit division on every push.
//! - Position `p` lives in slot `p % size`. A push takes a position from `head`, waits until
//!   `p < tail + size` (the slot's previous trigger was executed), then publishes.
//! - A slot's commit bit is the parity of its lap, inverted: lap 0 writes 1, lap 1 writes 0,
//!   ... The proxy at position `t` takes the slot only if its commit bit is
//!   [`commit_bit_for`]`(t, size)`. So a zeroed ring reads empty, and a slot still holding
//!   the previous lap's trigger is never taken for the new one — no slot is ever cleared.
//! - Bit 63 of `head` ([`PROXY_ASLEEP`]) is set by a host proxy thread (CPU emulator only)
//!   with an RMW just before it parks, and cleared when it wakes. A pusher learns from its
//!   own `fetch_add` whether the proxy was asleep and tells the doorbell. RMWs of one
//!   cell are totally ordered, so either the pusher sees the bit, or the proxy's RMW sees
//!   the claimed position beyond `tail` and does not park: no push is missed, and a push to
//!   an awake proxy costs no barrier beyond the `fetch_add` it needs anyway.
//! - `tail > p` means the proxy has *executed* trigger `p` (for a `SYNC` trigger: the
//!   connection was flushed), which is what [`FifoDeviceHandle::sync`] waits for.

use crate::arch::{self, Awaited, Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::error::{DeviceError, DeviceOp};
use crate::wait::WaitPolicy;

/// What a trigger asks the proxy to do; the bits combine.
pub mod trigger_type {
    /// Copy `size` bytes from source memory to destination memory.
    pub const DATA: u64 = 0b001;
    /// Raise the peer's semaphore of this channel (after the data, if any).
    pub const FLAG: u64 = 0b010;
    /// Flush the connection; the proxy advances `tail` past this trigger only afterwards.
    pub const SYNC: u64 = 0b100;
    /// Every defined bit.
    pub const ALL: u64 = DATA | FLAG | SYNC;
}

/// Bit positions of [`ProxyTrigger`]'s two words. Each field is `(word >> SHIFT) & MASK`.
pub mod trigger_bits {
    /// Bytes to copy: word 0, bits 0..32.
    pub const SIZE_SHIFT: u32 = 0;
    /// Mask of `size`.
    pub const SIZE_MASK: u64 = (1 << 32) - 1;
    /// Byte offset into the source memory: word 0, bits 32..64.
    pub const SRC_OFFSET_SHIFT: u32 = 32;
    /// Mask of `src_offset`.
    pub const SRC_OFFSET_MASK: u64 = (1 << 32) - 1;
    /// Byte offset into the destination memory: word 1, bits 0..32.
    pub const DST_OFFSET_SHIFT: u32 = 0;
    /// Mask of `dst_offset`.
    pub const DST_OFFSET_MASK: u64 = (1 << 32) - 1;
    /// Id of the source memory: word 1, bits 32..41.
    pub const SRC_MEMORY_ID_SHIFT: u32 = 32;
    /// Mask of `src_memory_id` (512 ids).
    pub const MEMORY_ID_MASK: u64 = (1 << 9) - 1;
    /// Id of the destination memory: word 1, bits 41..50.
    pub const DST_MEMORY_ID_SHIFT: u32 = 41;
    /// Trigger type bits ([`super::trigger_type`]): word 1, bits 50..53.
    pub const TYPE_SHIFT: u32 = 50;
    /// Mask of the type.
    pub const TYPE_MASK: u64 = (1 << 3) - 1;
    /// Id of the semaphore (= the port channel): word 1, bits 53..63.
    pub const SEMAPHORE_ID_SHIFT: u32 = 53;
    /// Mask of `semaphore_id` (1024 ids).
    pub const SEMAPHORE_ID_MASK: u64 = (1 << 10) - 1;
    /// Lap-parity commit bit: word 1, bit 63.
    pub const COMMIT_SHIFT: u32 = 63;
}

/// Bit of the FIFO head that says the host proxy is parked (see the module docs).
pub const PROXY_ASLEEP: u64 = 1 << 63;

/// Largest number of distinct memory ids a trigger can name.
pub const MAX_MEMORY_IDS: u32 = (trigger_bits::MEMORY_ID_MASK + 1) as u32;
/// Largest number of distinct semaphore (channel) ids a trigger can name.
pub const MAX_SEMAPHORE_IDS: u32 = (trigger_bits::SEMAPHORE_ID_MASK + 1) as u32;
/// Largest offset or size one trigger can carry; larger puts are split into several.
pub const MAX_TRIGGER_BYTES: u64 = trigger_bits::SIZE_MASK;

/// One request from a kernel to the proxy: 128 bits, two words, as published in a FIFO slot.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ProxyTrigger {
    /// `size` and `src_offset`.
    pub fst: u64,
    /// `dst_offset`, memory ids, type, semaphore id and the commit bit.
    pub snd: u64,
}

const _: () = assert!(core::mem::size_of::<ProxyTrigger>() == 16);
const _: () = assert!(core::mem::align_of::<ProxyTrigger>() == 16);
const _: () = assert!(core::mem::offset_of!(ProxyTrigger, snd) == 8);

/// The fields of a trigger, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TriggerFields {
    /// [`trigger_type`] bits.
    pub kind: u64,
    /// Destination memory id.
    pub dst_memory_id: u32,
    /// Byte offset into the destination memory.
    pub dst_offset: u64,
    /// Source memory id.
    pub src_memory_id: u32,
    /// Byte offset into the source memory.
    pub src_offset: u64,
    /// Bytes to copy.
    pub size: u64,
    /// Semaphore (channel) id.
    pub semaphore_id: u32,
}

impl TriggerFields {
    /// Whether every field fits its bit field.
    pub const fn fits(&self) -> bool {
        use trigger_bits::*;
        self.kind & !TYPE_MASK == 0
            && self.dst_memory_id as u64 <= MEMORY_ID_MASK
            && self.src_memory_id as u64 <= MEMORY_ID_MASK
            && self.dst_offset <= DST_OFFSET_MASK
            && self.src_offset <= SRC_OFFSET_MASK
            && self.size <= SIZE_MASK
            && self.semaphore_id as u64 <= SEMAPHORE_ID_MASK
    }
}

impl ProxyTrigger {
    /// Packs `f` (commit bit clear). Fields wider than their bit field are truncated: check
    /// [`TriggerFields::fits`] first.
    pub const fn encode(f: &TriggerFields) -> ProxyTrigger {
        use trigger_bits::*;
        ProxyTrigger {
            fst: (f.size & SIZE_MASK) << SIZE_SHIFT
                | (f.src_offset & SRC_OFFSET_MASK) << SRC_OFFSET_SHIFT,
            snd: (f.dst_offset & DST_OFFSET_MASK) << DST_OFFSET_SHIFT
                | (f.src_memory_id as u64 & MEMORY_ID_MASK) << SRC_MEMORY_ID_SHIFT
                | (f.dst_memory_id as u64 & MEMORY_ID_MASK) << DST_MEMORY_ID_SHIFT
                | (f.kind & TYPE_MASK) << TYPE_SHIFT
                | (f.semaphore_id as u64 & SEMAPHORE_ID_MASK) << SEMAPHORE_ID_SHIFT,
        }
    }

    /// Unpacks the fields (the commit bit is not a field: see [`Self::commit_bit`]).
    pub const fn decode(&self) -> TriggerFields {
        use trigger_bits::*;
        TriggerFields {
            size: (self.fst >> SIZE_SHIFT) & SIZE_MASK,
            src_offset: (self.fst >> SRC_OFFSET_SHIFT) & SRC_OFFSET_MASK,
            dst_offset: (self.snd >> DST_OFFSET_SHIFT) & DST_OFFSET_MASK,
            src_memory_id: ((self.snd >> SRC_MEMORY_ID_SHIFT) & MEMORY_ID_MASK) as u32,
            dst_memory_id: ((self.snd >> DST_MEMORY_ID_SHIFT) & MEMORY_ID_MASK) as u32,
            kind: (self.snd >> TYPE_SHIFT) & TYPE_MASK,
            semaphore_id: ((self.snd >> SEMAPHORE_ID_SHIFT) & SEMAPHORE_ID_MASK) as u32,
        }
    }

    /// The commit bit (0 or 1).
    pub const fn commit_bit(&self) -> u64 {
        self.snd >> trigger_bits::COMMIT_SHIFT
    }

    /// The same trigger with its commit bit set to `bit` (0 or 1).
    pub const fn with_commit_bit(self, bit: u64) -> ProxyTrigger {
        let mask = 1u64 << trigger_bits::COMMIT_SHIFT;
        ProxyTrigger {
            fst: self.fst,
            snd: (self.snd & !mask) | ((bit & 1) << trigger_bits::COMMIT_SHIFT),
        }
    }
}

/// The commit bit a trigger at `position` carries in a ring of `size` slots (a power of
/// two): the parity of its lap, inverted, so lap 0 (a zeroed ring) is not mistaken for
/// committed. With `size` a power of two, the lap's parity is bit `log2(size)` of `position`.
#[inline(always)]
pub const fn commit_bit_for(position: u64, size: u32) -> u64 {
    (position & size as u64 == 0) as u64
}

/// How far ahead of its own slot a push asks for the ring's cache line in a writable state
/// ([`arch::prefetch_for_write`]): two 64-byte lines of four slots. Further ahead, the line
/// may be taken back by the consumer before it is used; nearer, the request has no time.
pub const PREFETCH_AHEAD: u64 = 8;

/// One FIFO slot: two 64-bit cells, 16-byte aligned so that both halves share a cache line.
///
/// A push writes `fst` relaxed and then `snd`, which holds the commit bit, with release
/// ([`atomic::publish_pair`]): two stores, not one vector store, because the PTX memory
/// model gives the elements of a vector access no order among themselves.
#[repr(C, align(16))]
pub struct TriggerSlot {
    /// `ProxyTrigger::fst`, then `snd` (which holds the commit bit).
    pub words: [AtomicU64; 2],
}

#[cfg(not(oxccl_loom))]
const _: () = assert!(core::mem::size_of::<TriggerSlot>() == 16);

impl TriggerSlot {
    /// An empty slot (commit bit 0).
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn new() -> Self {
        TriggerSlot {
            words: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Default for TriggerSlot {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a FIFO's cells are and how many slots it has: the layout inside
/// [`FifoDeviceHandle`], without the promise that the addresses are live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FifoRawParts {
    /// Address of `size` [`TriggerSlot`]s.
    pub triggers: u64,
    /// Address of the head counter.
    pub head: u64,
    /// Address of the tail counter.
    pub tail: u64,
    /// Address of the device-side cache of the tail.
    pub tail_cache: u64,
    /// Address of the host proxy's doorbell (CPU emulator), or 0.
    pub doorbell: u64,
    /// Number of slots: a power of two.
    pub size: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<FifoRawParts>() == 48);
const _: () = assert!(core::mem::offset_of!(FifoRawParts, size) == 40);

/// The kernel-side view of a FIFO: the cells of the table above, and the limit and abort
/// record of its waits. Valid for `'a`, the life of the host object that made it.
///
/// Built by the host (`unsafe` [`Self::from_raw_parts`]); a zeroed handle (`Default`) is
/// safe to use and refuses every push with [`DeviceError::NullHandle`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct FifoDeviceHandle<'a> {
    raw: FifoRawParts,
    wait: WaitPolicy<'a>,
}

const _: () = assert!(core::mem::size_of::<FifoDeviceHandle<'static>>() == 80);
const _: () = assert!(core::mem::offset_of!(FifoDeviceHandle<'static>, wait) == 48);

/// Byte offsets of the handle's parts, for tools that read a kernel's machine code: `cargo xtask build-ptx --check` finds the
/// protocol's cells among a kernel's parameters through them.
impl FifoDeviceHandle<'_> {
    /// Byte offset of the cells' addresses ([`FifoRawParts`]).
    pub const RAW_OFFSET: usize = core::mem::offset_of!(Self, raw);
}

// SAFETY: every value safe code can hold is either built by `from_raw_parts`, whose contract
// keeps its cells live for 'a, or zeroed, which `push` and `sync` refuse before touching
// memory; the type has no drop glue.
unsafe impl crate::launch::KernelArg for FifoDeviceHandle<'_> {}

impl<'a> FifoDeviceHandle<'a> {
    /// A handle over the cells `raw` names, whose waits and failures go to `wait`.
    ///
    /// # Safety
    /// For `'a`: `raw.triggers` points to `raw.size` [`TriggerSlot`]s (16-byte aligned),
    /// `raw.size` is a power of two, `head`, `tail` and `tail_cache` point to `AtomicU64`s,
    /// all in memory every thread that uses the handle can reach and only accessed
    /// atomically; `raw.doorbell` is 0 or (CPU emulator only) points to a live
    /// `arch::host::Doorbell`.
    pub unsafe fn from_raw_parts(raw: FifoRawParts, wait: WaitPolicy<'a>) -> Self {
        FifoDeviceHandle { raw, wait }
    }

    /// The cells' addresses and the ring's size.
    pub const fn raw_parts(&self) -> FifoRawParts {
        self.raw
    }

    /// The policy of the handle's waits.
    pub const fn wait_policy(&self) -> WaitPolicy<'a> {
        self.wait
    }

    /// The same FIFO, with waits and failures under `wait` (e.g. one channel's record).
    pub fn with_wait<'b>(self, wait: WaitPolicy<'b>) -> FifoDeviceHandle<'b>
    where
        'a: 'b,
    {
        FifoDeviceHandle {
            raw: self.raw,
            wait,
        }
    }

    #[inline(always)]
    fn cell(&self, addr: u64) -> &AtomicU64 {
        // SAFETY: `from_raw_parts`'s contract: the counters are live for 'a; a zeroed handle
        // never gets here (`push`, `sync` and `pushed` check `size` first).
        unsafe { atomic::cell(addr) }
    }

    #[inline(always)]
    fn slot(&self, position: u64) -> &[AtomicU64; 2] {
        let index = (position & (self.raw.size as u64 - 1)) as usize;
        // SAFETY: `triggers` points to `size` slots, `size` a non-zero power of two (the
        // constructor's contract; `push` refuses a zeroed handle before calling this), so
        // the mask keeps the index below `size`.
        unsafe { &(*(self.raw.triggers as usize as *const TriggerSlot).add(index)).words }
    }

    /// Pushes `trigger` and returns its position. Any kernel thread may call it concurrently
    /// with others; the trigger is visible to the proxy (system scope) when this returns.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] if the ring stays full past the
    /// wait limit. The position is then lost: the proxy stops at it, and reports it to the
    /// host, naming the position. [`DeviceError::NullHandle`] for a zeroed handle: nothing
    /// is written.
    #[inline(always)]
    pub fn push(&self, trigger: ProxyTrigger) -> Result<u64, DeviceError> {
        if !self.raw.size.is_power_of_two() {
            return Err(self.wait.null_handle(DeviceOp::FifoPush));
        }
        // Relaxed, device scope: the head only hands out positions (and, through its
        // modification order, the proxy's sleep bit); the slot's publish carries the ordering.
        let claimed = atomic::fetch_add(self.cell(self.raw.head), 1, Ordering::Relaxed, Scope::Gpu);
        let position = claimed & !PROXY_ASLEEP;
        let size = self.raw.size as u64;
        // Acquire: pairs with the Release store of the cache below, which another pusher did
        // after acquiring `tail`, so our slot write is ordered after the proxy's read of it.
        let cached = atomic::load(
            self.cell(self.raw.tail_cache),
            Ordering::Acquire,
            Scope::Gpu,
        );
        if position >= cached + size {
            self.wait.wait_on_memory(
                DeviceOp::FifoPush,
                // The slot is free once the tail is past `position - size` (at least
                // `cached + 1` here).
                Awaited::AtLeast {
                    addr: self.raw.tail,
                    value: position - size + 1,
                },
                || {
                    // Acquire: pairs with the proxy's Release store of `tail` after it read
                    // (and executed) the slot's previous trigger.
                    let tail =
                        atomic::load(self.cell(self.raw.tail), Ordering::Acquire, Scope::System);
                    if position < tail + size {
                        // Release: pairs with the Acquire load of the cache above in other
                        // pushers. A plain store: a racing pusher may put back an older tail,
                        // which only makes later pushes look again; every cached value was a
                        // real tail.
                        atomic::store(
                            self.cell(self.raw.tail_cache),
                            tail,
                            Ordering::Release,
                            Scope::Gpu,
                        );
                        true
                    } else {
                        false
                    }
                },
                || [position, self.tail_now(), size],
            )?;
        }
        let t = trigger.with_commit_bit(commit_bit_for(position, self.raw.size));
        atomic::publish_pair(self.slot(position), t.fst, t.snd, Scope::System);
        arch::prefetch_for_write(self.slot(position + PREFETCH_AHEAD).as_ptr().cast());
        arch::ring_doorbell(self.raw.doorbell, claimed & PROXY_ASLEEP != 0);
        Ok(position)
    }

    /// The position the next push will take: every trigger pushed before this call, by
    /// this thread or one it synchronized with, has a smaller one. Read after a round of
    /// pushes, it lets [`Self::sync_before`] wait for that round alone later, after more
    /// pushes. 0 for a zeroed handle.
    #[inline(always)]
    pub fn pushed(&self) -> u64 {
        if !self.raw.size.is_power_of_two() {
            return 0;
        }
        // Relaxed: a position, not data; the head's modification order has this thread's
        // own claims before this load.
        let head = atomic::load(self.cell(self.raw.head), Ordering::Relaxed, Scope::Gpu);
        head & !PROXY_ASLEEP
    }

    /// Waits until the proxy has executed every trigger before `position` (a value of
    /// [`Self::pushed`]); returns at once for 0.
    ///
    /// # Errors
    /// As [`Self::sync`].
    #[inline(always)]
    pub fn sync_before(&self, position: u64) -> Result<(), DeviceError> {
        match position {
            0 => Ok(()),
            p => self.sync(p - 1),
        }
    }

    /// Waits until the proxy has executed the trigger at `position` (and so every earlier
    /// one: the proxy executes in order).
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] / [`DeviceError::Aborted`] past the wait limit;
    /// [`DeviceError::Aborted`] also when the proxy got there but the handle's channel has
    /// failed (a refused trigger stops the channel: its later triggers are skipped, not
    /// executed, so a flush must not report success); [`DeviceError::NullHandle`] for a
    /// zeroed handle.
    #[inline(always)]
    pub fn sync(&self, position: u64) -> Result<(), DeviceError> {
        if !self.raw.size.is_power_of_two() {
            return Err(self.wait.null_handle(DeviceOp::FifoSync));
        }
        // Acquire: pairs with the proxy's Release store of `tail`, so effects of the
        // executed triggers (e.g. a flushed write) are ordered before what follows.
        self.wait.wait_on_memory(
            DeviceOp::FifoSync,
            Awaited::AtLeast {
                addr: self.raw.tail,
                value: position + 1,
            },
            || atomic::load(self.cell(self.raw.tail), Ordering::Acquire, Scope::System) > position,
            || [position, self.tail_now(), 0],
        )?;
        if self.wait.channel_failed() {
            return Err(DeviceError::Aborted);
        }
        Ok(())
    }

    /// The tail as it is now, for failure details.
    #[cold]
    fn tail_now(&self) -> u64 {
        // Relaxed: only reported.
        atomic::load(self.cell(self.raw.tail), Ordering::Relaxed, Scope::System)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TriggerFields {
        TriggerFields {
            kind: trigger_type::DATA | trigger_type::FLAG,
            dst_memory_id: 0x1a5,
            dst_offset: 0xdead_beef,
            src_memory_id: 0x0c3,
            src_offset: 0x1234_5678,
            size: 0xffff_fff0,
            semaphore_id: 0x2f1,
        }
    }

    /// Guards against fields overlapping or being shifted into each other's bits.
    #[test]
    fn each_field_round_trips() {
        let f = sample();
        assert!(f.fits());
        let t = ProxyTrigger::encode(&f);
        assert_eq!(t.decode(), f);
        // One field at a time at its maximum, all others zero: nothing leaks.
        let maxes = [
            TriggerFields {
                size: MAX_TRIGGER_BYTES,
                ..Default::default()
            },
            TriggerFields {
                src_offset: MAX_TRIGGER_BYTES,
                ..Default::default()
            },
            TriggerFields {
                dst_offset: MAX_TRIGGER_BYTES,
                ..Default::default()
            },
            TriggerFields {
                src_memory_id: MAX_MEMORY_IDS - 1,
                ..Default::default()
            },
            TriggerFields {
                dst_memory_id: MAX_MEMORY_IDS - 1,
                ..Default::default()
            },
            TriggerFields {
                kind: trigger_type::ALL,
                ..Default::default()
            },
            TriggerFields {
                semaphore_id: MAX_SEMAPHORE_IDS - 1,
                ..Default::default()
            },
        ];
        for f in maxes {
            let t = ProxyTrigger::encode(&f);
            assert_eq!(t.decode(), f, "{f:?}");
            assert_eq!(t.commit_bit(), 0);
        }
    }

    /// Guards against the bit layout drifting from the documented positions (the CUDA
    /// backend and any other consumer read the same bits).
    #[test]
    fn bit_positions_match_documentation() {
        let t = |f: TriggerFields| ProxyTrigger::encode(&f);
        assert_eq!(
            t(TriggerFields {
                size: 1,
                ..Default::default()
            })
            .fst,
            1
        );
        assert_eq!(
            t(TriggerFields {
                src_offset: 1,
                ..Default::default()
            })
            .fst,
            1 << 32
        );
        assert_eq!(
            t(TriggerFields {
                dst_offset: 1,
                ..Default::default()
            })
            .snd,
            1
        );
        assert_eq!(
            t(TriggerFields {
                src_memory_id: 1,
                ..Default::default()
            })
            .snd,
            1 << 32
        );
        assert_eq!(
            t(TriggerFields {
                dst_memory_id: 1,
                ..Default::default()
            })
            .snd,
            1 << 41
        );
        assert_eq!(
            t(TriggerFields {
                kind: trigger_type::DATA,
                ..Default::default()
            })
            .snd,
            1 << 50
        );
        assert_eq!(
            t(TriggerFields {
                kind: trigger_type::SYNC,
                ..Default::default()
            })
            .snd,
            1 << 52
        );
        assert_eq!(
            t(TriggerFields {
                semaphore_id: 1,
                ..Default::default()
            })
            .snd,
            1 << 53
        );
        assert_eq!(ProxyTrigger::default().with_commit_bit(1).snd, 1 << 63);
    }

    /// Guards against the commit bit clobbering a field, or a field clobbering it.
    #[test]
    fn commit_bit_is_independent() {
        let t = ProxyTrigger::encode(&sample());
        let c = t.with_commit_bit(1);
        assert_eq!(c.commit_bit(), 1);
        assert_eq!(c.decode(), sample());
        assert_eq!(c.with_commit_bit(0), t);
    }

    /// Guards against a zeroed ring reading as full of lap-0 triggers, and a stale slot of
    /// the previous lap reading as committed.
    #[test]
    fn commit_parity_alternates_by_lap() {
        for size in [1u32, 2, 4, 8, 1 << 20] {
            for position in 0..64u64 * size.min(8) as u64 {
                let lap = position / size as u64;
                assert_eq!(
                    commit_bit_for(position, size),
                    (lap & 1) ^ 1,
                    "size {size} position {position}"
                );
            }
        }
        assert_eq!(commit_bit_for(0, 4), 1);
        assert_eq!(commit_bit_for(4, 4), 0);
    }

    /// Guards against a zeroed handle (one the host never set up) dividing by zero or
    /// dereferencing null addresses: push and sync refuse it, naming it as such.
    #[test]
    fn zeroed_handle_refuses_push_and_sync() {
        let handle = FifoDeviceHandle::default();
        assert_eq!(
            handle.push(ProxyTrigger::default()),
            Err(DeviceError::NullHandle)
        );
        assert_eq!(handle.sync(0), Err(DeviceError::NullHandle));
    }

    /// Guards against a field too wide for its bits being accepted.
    #[test]
    fn oversized_fields_do_not_fit() {
        assert!(
            !TriggerFields {
                dst_offset: 1 << 32,
                ..Default::default()
            }
            .fits()
        );
        assert!(
            !TriggerFields {
                semaphore_id: MAX_SEMAPHORE_IDS,
                ..Default::default()
            }
            .fits()
        );
        assert!(
            !TriggerFields {
                kind: 8,
                ..Default::default()
            }
            .fits()
        );
    }
}
