//! Cooperating threads as a type: who shares a piece of work, and how it is split.
//!
//! [`Thread`], [`Warp`], [`Block`] and [`Grid`] are the groups. A device call that splits
//! work (a copy, packet packing) takes `impl Coop` instead of a
//! `(thread_id, num_threads)` pair. [`Coop::split`] gives each thread its share in the order
//! that is fast on the target: on the GPU consecutive threads take consecutive elements
//! (coalesced loads), in the CPU emulator each thread takes one contiguous chunk (cache lines
//! stay with one core, and `memcpy` gets long runs). Kernel code is the same on both.
//!
//! The groups are sealed: a call that splits work trusts every thread of the group to
//! report its own rank in `0..size()` and the same size, so that the shares are disjoint and
//! cover the work. A group written outside this module could break that from safe code
//! (two threads claiming the same rank would write the same bytes of a `put`), so only the
//! four groups here implement [`Coop`]:
//!
//! ```compile_fail,E0277
//! use oxccl_device::coop::Coop;
//!
//! /// Claims to be rank 0 of 1 on every thread: every thread would copy the whole range.
//! #[derive(Clone, Copy)]
//! struct Everyone;
//!
//! impl Coop for Everyone {
//!     fn thread_rank(&self) -> u64 {
//!         0
//!     }
//!     fn size(&self) -> u64 {
//!         1
//!     }
//! }
//! ```

use crate::arch;
use core::ops::Range;

/// A group of threads that call the same device function together, each knowing its rank.
///
/// Sealed (see the module docs): implemented by [`Thread`], [`Warp`], [`Block`] and
/// [`Grid`] only. Its contract, which device calls that split work rely on: every thread of
/// the group gets the same [`Coop::size`] and a [`Coop::thread_rank`] of its own in
/// `0..size()`.
pub trait Coop: Copy + sealed::Sealed {
    /// Rank of the calling thread within the group, in `0..size()`.
    fn thread_rank(&self) -> u64;
    /// Number of threads in the group.
    fn size(&self) -> u64;

    /// The calling thread's share of `n` elements.
    #[inline(always)]
    fn split(&self, n: u64) -> Split {
        Split::new(self.thread_rank(), self.size(), n)
    }
}

/// A group that can also wait for all of its members.
pub trait SyncCoop: Coop {
    /// Waits until every thread of the group has reached this call.
    fn sync(&self);
}

/// The calling thread alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct Thread;

/// Threads per warp on NVIDIA GPUs.
pub const WARP_SIZE: u32 = 32;

/// The threads of the calling thread's warp: [`WARP_SIZE`] consecutive threads of the block
/// (fewer in the block's last warp when the block size is not a multiple). On the GPU they
/// run in lock step; in the emulator they are ordinary threads, so code must not rely on
/// lock step (hence no `SyncCoop` for it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Warp;

/// All threads of the calling thread's block.
#[derive(Clone, Copy, Debug, Default)]
pub struct Block;

/// All threads of the grid.
#[derive(Clone, Copy, Debug, Default)]
pub struct Grid;

impl Coop for Thread {
    #[inline(always)]
    fn thread_rank(&self) -> u64 {
        0
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        1
    }
}

impl SyncCoop for Thread {
    #[inline(always)]
    fn sync(&self) {}
}

mod sealed {
    /// Only the groups of this module: see [`super::Coop`].
    pub trait Sealed {}
    impl Sealed for super::Thread {}
    impl Sealed for super::Warp {}
    impl Sealed for super::Block {}
    impl Sealed for super::Grid {}
}

/// Rank within its warp and size of the warp of the thread of rank `thread` in a block of
/// `block_threads` threads.
#[inline(always)]
pub const fn warp_of(thread: u32, block_threads: u32) -> (u32, u32) {
    let lane = thread % WARP_SIZE;
    let first = thread - lane;
    let left = block_threads.saturating_sub(first);
    (lane, if left < WARP_SIZE { left } else { WARP_SIZE })
}

impl Coop for Warp {
    #[inline(always)]
    fn thread_rank(&self) -> u64 {
        warp_of(arch::thread_rank_in_block(), arch::threads_per_block()).0 as u64
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        warp_of(arch::thread_rank_in_block(), arch::threads_per_block()).1 as u64
    }
}

impl Coop for Block {
    #[inline(always)]
    fn thread_rank(&self) -> u64 {
        arch::thread_rank_in_block() as u64
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        arch::threads_per_block() as u64
    }
}

impl SyncCoop for Block {
    #[inline(always)]
    fn sync(&self) {
        arch::sync_threads()
    }
}

impl Coop for Grid {
    #[inline(always)]
    fn thread_rank(&self) -> u64 {
        arch::thread_rank_in_grid()
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        arch::threads_per_grid()
    }
}

/// A thread's share of `n` elements: the indices it handles, in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    next: u64,
    end: u64,
    stride: u64,
}

impl Split {
    /// The share of thread `rank` of `size` in `n` elements, in the target's preferred order.
    #[inline(always)]
    pub fn new(rank: u64, size: u64, n: u64) -> Self {
        if arch::PREFERS_CONTIGUOUS_SPLIT {
            let r = contiguous_chunk(rank, size, n);
            Split {
                next: r.start,
                end: r.end,
                stride: 1,
            }
        } else {
            Split {
                next: rank,
                end: n,
                stride: size.max(1),
            }
        }
    }

    /// The first index, the end (exclusive) and the step of the share: the indices are
    /// `first, first + step, ...` below `end`.
    #[inline(always)]
    pub fn bounds(&self) -> (u64, u64, u64) {
        (self.next, self.end, self.stride)
    }

    /// The share as one range, if it is contiguous (always so in the emulator).
    #[inline(always)]
    pub fn as_range(&self) -> Option<Range<u64>> {
        (self.stride == 1).then_some(self.next..self.end.max(self.next))
    }
}

impl Iterator for Split {
    type Item = u64;
    #[inline(always)]
    fn next(&mut self) -> Option<u64> {
        if self.next < self.end {
            let i = self.next;
            self.next += self.stride;
            Some(i)
        } else {
            None
        }
    }
}

/// Thread `rank`'s contiguous chunk when `n` elements are dealt to `size` threads as evenly
/// as possible (the first `n % size` chunks hold one more).
#[inline(always)]
pub const fn contiguous_chunk(rank: u64, size: u64, n: u64) -> Range<u64> {
    let size = if size == 0 { 1 } else { size };
    let base = n / size;
    let extra = n % size;
    let start = rank * base + if rank < extra { rank } else { extra };
    let len = base + if rank < extra { 1 } else { 0 };
    let start = if start > n { n } else { start };
    let end = if start + len > n { n } else { start + len };
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a split that drops or duplicates elements for uneven sizes.
    #[test]
    fn chunks_cover_exactly_once() {
        for n in [0u64, 1, 7, 64, 1000, 1001] {
            for size in [1u64, 2, 3, 8, 33] {
                let mut seen = std::vec![0u8; n as usize];
                for rank in 0..size {
                    for i in Split::new(rank, size, n) {
                        seen[i as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n={n} size={size}");
            }
        }
    }

    /// Guards against warps of a block whose size is not a multiple of 32 overlapping or
    /// leaving threads out (the last warp is partial).
    #[test]
    fn warps_partition_the_block() {
        for block in [1u32, 31, 32, 33, 40, 64, 100] {
            let mut seen = std::vec![0u32; block as usize];
            for t in 0..block {
                let (lane, size) = warp_of(t, block);
                assert!(lane < size && size <= WARP_SIZE, "block {block} thread {t}");
                seen[(t - lane) as usize] += 1;
                assert_eq!(warp_of(t - lane, block).1, size, "one size per warp");
            }
            for first in (0..block).step_by(WARP_SIZE as usize) {
                assert_eq!(seen[first as usize], WARP_SIZE.min(block - first));
            }
        }
    }

    /// Guards against the emulator losing its contiguous chunks (and with them memcpy speed).
    #[test]
    fn emulator_split_is_contiguous() {
        let s = Split::new(1, 4, 10);
        assert_eq!(s.as_range(), Some(3..6));
    }
}
