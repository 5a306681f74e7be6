//! Bulk copies split among cooperating threads.
//!
//! Contract: every thread of `coop` calls [`copy`] with the same arguments; when all have
//! returned, `bytes` bytes at `src` are at `dst`. Nothing is ordered for other observers:
//! publish the result with a release (a semaphore signal). Overlapping ranges are allowed
//! and stay in bounds, but what lands where they overlap is unspecified (threads copy their
//! shares in no particular order).

use crate::arch;
use crate::coop::{Coop, Split, contiguous_chunk};

/// A 16-byte unit, so GPU threads move data with 128-bit loads and stores.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Word16([u64; 2]);

/// Bytes each emulator thread's chunk is rounded to, so two threads never share a cache line.
const CPU_CHUNK_ALIGN: u64 = 64;

/// Copies `bytes` bytes from address `src` to address `dst`, split among `coop`.
///
/// # Safety
/// `src..src+bytes` must be readable and `dst..dst+bytes` writable for the duration of the
/// copy. They may overlap (see the module docs). Other agents writing the same bytes
/// meanwhile make the copied values unspecified, as on a GPU.
#[inline(always)]
pub unsafe fn copy(coop: impl Coop, dst: u64, src: u64, bytes: u64) {
    if arch::PREFERS_CONTIGUOUS_SPLIT {
        let lines = bytes.div_ceil(CPU_CHUNK_ALIGN);
        let r = contiguous_chunk(coop.thread_rank(), coop.size(), lines);
        let start = r.start * CPU_CHUNK_ALIGN;
        let end = (r.end * CPU_CHUNK_ALIGN).min(bytes);
        if start < end {
            // SAFETY: within the ranges the caller vouched for; `ptr::copy` is correct for
            // overlapping ranges too (a channel whose buffers alias one another).
            unsafe {
                core::ptr::copy(
                    (src + start) as usize as *const u8,
                    (dst + start) as usize as *mut u8,
                    (end - start) as usize,
                )
            }
        }
        return;
    }
    let alignment = dst | src | bytes;
    // SAFETY: forwarded contract; each branch's unit size divides the addresses and length.
    unsafe {
        if alignment.is_multiple_of(16) {
            strided::<Word16>(coop, dst, src, bytes / 16)
        } else if alignment.is_multiple_of(8) {
            strided::<u64>(coop, dst, src, bytes / 8)
        } else if alignment.is_multiple_of(4) {
            strided::<u32>(coop, dst, src, bytes / 4)
        } else {
            strided::<u8>(coop, dst, src, bytes)
        }
    }
}

/// # Safety
/// As [`copy`], with `dst` and `src` aligned for `T` and `units` whole `T`s to move.
#[inline(always)]
unsafe fn strided<T: Copy>(coop: impl Coop, dst: u64, src: u64, units: u64) {
    let (dst, src) = (dst as usize as *mut T, src as usize as *const T);
    for i in Split::new(coop.thread_rank(), coop.size(), units) {
        // SAFETY: `i < units`, inside the ranges of the contract, aligned for T.
        unsafe { dst.add(i as usize).write(src.add(i as usize).read()) }
    }
}
