//! The grid barrier: every block of a launch waits until every block has arrived (MSCCL++'s
//! `DeviceSyncer`), bounded like every wait.
//!
//! Two counters in device memory, written by thread 0 of each block that takes part:
//!
//! | cell | written by | read by | scope |
//! |---|---|---|---|
//! | `count` | each arriving block: atomic add, acquire-release; the last arriver of a barrier resets it to 0 | the arriving blocks | device |
//! | `generation` | the last arriver of a barrier: store of one more, release | the blocks waiting at it: acquire | device |
//!
//! Invariants: between barriers `count` is 0 and `generation` the number of barriers
//! completed on the cells so far; neither is ever reset by the host, so the barrier is
//! reused across calls and launches as it is (a generation count, as `DeviceSyncer` flips a
//! sense flag). A block reads `generation` before it arrives: no barrier can complete
//! between that read and its arrival, since the barrier needs that arrival, so the value
//! read names the barrier it arrives at. The last arriver resets `count` before it raises
//! `generation`, and a block arrives at the next barrier only after it has acquired the new
//! generation, so no arrival is counted for the wrong barrier. The participant count may
//! change from one call to the next.
//!
//! Memory order: a block barrier, then a device-scope fence on thread 0 (the block's writes
//! before its arrival), the acquire-release arrival (the last arriver acquires every
//! earlier arrival), the release of `generation` by the last arriver, the acquire of it by
//! each waiting thread 0, then a block barrier again: every write any taking-part block made
//! before the barrier is visible to every thread of every such block after it.
//!
//! **Co-residency.** Every block that takes part must run at the same time as the others: a
//! block that waits for one that has not started keeps the one it waits for from starting,
//! if the GPU has no room for both. Kernels that call it say so with `#[kernel(cooperative)]`,
//! and launchers refuse such a kernel a grid larger than the device holds at once. A kernel
//! launched some other way, or a block that never arrives, makes the others' wait time out
//! ([`DeviceError::Timeout`], recorded like any wait), never hang.
//!
//! One launch at a time may use a barrier's cells: two kernels running at once on the same
//! barrier would count each other's arrivals.

use crate::arch::{self, Awaited, Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::block::block_agrees;
use crate::error::{DeviceError, DeviceOp};
use crate::wait::WaitPolicy;

/// Where a grid barrier's counters are: the layout inside [`GridBarrierDeviceHandle`],
/// without the promise that the addresses are live.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GridBarrierRawParts {
    /// Address of the arrival counter (blocks arrived at the current barrier).
    pub count: u64,
    /// Address of the generation counter (barriers completed).
    pub generation: u64,
}

const _: () = assert!(core::mem::size_of::<GridBarrierRawParts>() == 16);

/// Kernel-side handle of a grid barrier. Valid for `'a`, the life of the host object that
/// made it; a zeroed one (`Default`) refuses every call with [`DeviceError::NullHandle`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct GridBarrierDeviceHandle<'a> {
    raw: GridBarrierRawParts,
    wait: WaitPolicy<'a>,
}

const _: () = assert!(core::mem::size_of::<GridBarrierDeviceHandle<'static>>() == 48);
const _: () = assert!(core::mem::offset_of!(GridBarrierDeviceHandle<'static>, wait) == 16);

// SAFETY: values safe code can hold are built by `from_raw_parts` (counters live for 'a) or
// zeroed, which every method refuses before touching memory; no drop glue.
unsafe impl crate::launch::KernelArg for GridBarrierDeviceHandle<'_> {}

#[inline(always)]
fn cell<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: the handle's constructor contract: its non-zero counter addresses are live,
    // aligned `AtomicU64`s for the handle's lifetime; callers check for zero first.
    unsafe { atomic::cell(addr) }
}

impl<'a> GridBarrierDeviceHandle<'a> {
    /// A handle over the counters `raw` names, whose waits run under `wait`.
    ///
    /// # Safety
    /// `raw.count` and `raw.generation` point to live, 8-byte aligned `AtomicU64`s in device
    /// memory for `'a`, reachable by every thread of the kernels that use the handle, only
    /// accessed atomically, and touched by nothing but grid barrier handles over the same
    /// pair (both zero when first used, or left by completed barriers).
    pub const unsafe fn from_raw_parts(raw: GridBarrierRawParts, wait: WaitPolicy<'a>) -> Self {
        GridBarrierDeviceHandle { raw, wait }
    }

    /// The counters' addresses.
    pub const fn raw_parts(&self) -> GridBarrierRawParts {
        self.raw
    }

    /// The policy of the barrier's waits.
    pub const fn wait_policy(&self) -> WaitPolicy<'a> {
        self.wait
    }

    /// Waits until every thread of every block of the grid has called this; then every write
    /// any of them made before the call is visible to all of them (device scope).
    ///
    /// Every thread of every block must call it, at the same point. Only a kernel whose
    /// blocks all run at once may: declare it `#[kernel(cooperative)]` (see the module
    /// docs).
    ///
    /// # Errors
    /// On every thread of a block whose wait failed: [`DeviceError::Timeout`] (recorded)
    /// if some block did not arrive within the wait limit, [`DeviceError::Aborted`] if the
    /// rank was stopped; [`DeviceError::NullHandle`] for a zeroed handle. Thread 0 returns
    /// the error, the other threads of its block [`DeviceError::Aborted`].
    #[inline(always)]
    pub fn sync_grid(&self) -> Result<(), DeviceError> {
        self.sync_blocks(arch::blocks_per_grid())
    }

    /// [`Self::sync_grid`] for the first `blocks` blocks of the grid (by linear block rank):
    /// every thread of each of them must call it, and no other block.
    ///
    /// # Errors
    /// As [`Self::sync_grid`], and [`DeviceError::InvalidArgument`] (recorded) on a block
    /// that is not among the first `blocks`, or for 0 blocks or more than the grid has.
    #[inline(always)]
    pub fn sync_blocks(&self, blocks: u32) -> Result<(), DeviceError> {
        // The block's writes are done before its thread 0 arrives.
        arch::sync_threads();
        // The closure takes a copy of the handle, not `self`: if the compiler keeps it out
        // of line, a reference would force whatever holds the handle (a kernel's argument
        // struct) into local memory.
        let this = *self;
        block_agrees(move || {
            let (grid, me) = (arch::blocks_per_grid(), arch::block_rank());
            if blocks == 0 || blocks > grid || me >= blocks {
                if this.raw.count == 0 || this.raw.generation == 0 {
                    return Err(this.wait.null_handle(DeviceOp::GridBarrier));
                }
                return Err(this.wait.raise(
                    DeviceError::InvalidArgument,
                    DeviceOp::GridBarrier,
                    [blocks as u64, grid as u64, me as u64],
                ));
            }
            this.arrive_and_wait(blocks)
        })
    }

    /// The barrier's protocol for one thread: arrives as one of `participants`, and waits
    /// until all of them have arrived. [`Self::sync_blocks`] runs it on thread 0 of each
    /// block, between two block barriers; call it directly only where exactly one thread of
    /// each participant calls it (and orders its participant's writes before the call).
    ///
    /// On `Ok`, every write the participants' calling threads had made, or had ordered
    /// before their call, is visible to the calling thread (device scope).
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] (recorded) if the others do not all arrive within the wait
    /// limit; [`DeviceError::Aborted`] if the rank was stopped;
    /// [`DeviceError::InvalidArgument`] (recorded) for 0 participants;
    /// [`DeviceError::NullHandle`] for a zeroed handle.
    #[inline(always)]
    pub fn arrive_and_wait(&self, participants: u32) -> Result<(), DeviceError> {
        if self.raw.count == 0 || self.raw.generation == 0 {
            return Err(self.wait.null_handle(DeviceOp::GridBarrier));
        }
        if participants == 0 {
            return Err(self.wait.raise(
                DeviceError::InvalidArgument,
                DeviceOp::GridBarrier,
                [0, 0, 0],
            ));
        }
        if participants == 1 {
            // Alone: nothing to wait for, nothing to count.
            return Ok(());
        }
        let (count, generation) = (cell(self.raw.count), cell(self.raw.generation));
        // Relaxed: the barrier we arrive at cannot complete before our arrival below, so this
        // is its generation (we acquired it, or raised it, at the previous barrier; a new
        // launch is ordered after the last one by the kernel boundary).
        let current = atomic::load(generation, Ordering::Relaxed, Scope::Gpu);
        // Orders every write this thread made, or saw through the block barrier before, ahead
        // of the arrival at device scope (the block's writes, for every block that passes).
        arch::fence(Scope::Gpu);
        // AcqRel: Release publishes our writes to the last arriver (the release sequence of
        // `count` carries every earlier arrival's); Acquire, on the last arriver, gets them
        // all, to be released again with `generation` below.
        let arrived = atomic::fetch_add(count, 1, Ordering::AcqRel, Scope::Gpu) + 1;
        if arrived == participants as u64 {
            // Relaxed: ordered before the generation's release; the next barrier's arrivals
            // come after their acquire of it.
            atomic::store(count, 0, Ordering::Relaxed, Scope::Gpu);
            // Release: pairs with the Acquire loads of the waiting participants.
            atomic::store(generation, current + 1, Ordering::Release, Scope::Gpu);
            return Ok(());
        }
        self.wait.wait_on_memory(
            DeviceOp::GridBarrier,
            Awaited::Changed {
                addr: self.raw.generation,
                value: current,
            },
            // Acquire: pairs with the last arriver's Release of `generation`.
            || atomic::load(generation, Ordering::Acquire, Scope::Gpu) != current,
            || {
                [
                    current + 1,
                    // Relaxed: only reported.
                    atomic::load(count, Ordering::Relaxed, Scope::Gpu),
                    participants as u64,
                ]
            },
        )
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a zeroed handle touching address 0, and against a call that names no
    /// participant waiting forever.
    #[test]
    fn zeroed_handle_and_no_participants_are_refused() {
        let zeroed = GridBarrierDeviceHandle::default();
        assert_eq!(zeroed.arrive_and_wait(2), Err(DeviceError::NullHandle));
        assert_eq!(zeroed.sync_grid(), Err(DeviceError::NullHandle));
        let cells = [AtomicU64::new(0), AtomicU64::new(0)];
        let raw = GridBarrierRawParts {
            count: &cells[0] as *const AtomicU64 as u64,
            generation: &cells[1] as *const AtomicU64 as u64,
        };
        // SAFETY: the cells outlive the handle and are only accessed atomically.
        let h = unsafe {
            GridBarrierDeviceHandle::from_raw_parts(raw, WaitPolicy::with_timeout_ns(1_000_000))
        };
        assert_eq!(h.arrive_and_wait(0), Err(DeviceError::InvalidArgument));
        // Alone (a one-block grid outside a launch): passes at once, counts nothing.
        assert_eq!(h.sync_grid(), Ok(()));
        assert_eq!(cells[0].load(Ordering::Relaxed), 0);
        // Two participants and only one arrives: a timeout, not a hang.
        assert_eq!(h.arrive_and_wait(2), Err(DeviceError::Timeout));
        assert_eq!(h.sync_blocks(2), Err(DeviceError::InvalidArgument));
    }
}
