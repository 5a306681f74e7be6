//! Bulk copies split among cooperating threads.
//!
//! Contract: every thread of `coop` calls [`copy`] with the same arguments; when all have
//! returned, `bytes` bytes at `src` are at `dst`. Each byte of `dst` is written by exactly one
//! thread, once. Nothing is ordered for other observers: publish the result with a release
//! (a semaphore signal). Overlapping ranges are allowed and stay in bounds, but what lands
//! where they overlap is unspecified (threads copy their shares in no particular order).
//! Any alignment of `dst`, `src` and `bytes` is allowed.
//!
//! How the bytes are dealt:
//!
//! - On the GPU (strided): the copy moves in the widest unit (16, 8, 4, 2 or 1 bytes) to
//!   which `dst` and `src` can both be aligned at once (the lowest bit where they differ
//!   decides). `dst..dst+bytes` is cut into slots of that unit, aligned like `dst`'s unit
//!   (so `src`'s side of each slot is aligned too), and thread `r` of `n` takes slots `r`,
//!   `r + n`, ...: neighbouring threads touch neighbouring words, so a warp's accesses
//!   coalesce. A whole slot is one weak global load and one weak global store of the unit
//!   ([`arch::GlobalWord`]): for a 16-byte unit, one `ld.global.v2.u64` and one
//!   `st.global.v2.u64`. Only the first and last slots can be cut by the ends of the range
//!   (the head before `dst` reaches the unit's alignment, the tail after the last whole
//!   unit); their owners copy their bytes inside the range one by one.
//! - In the emulator (contiguous): each thread copies one contiguous chunk, whole cache
//!   lines, with `ptr::copy` (`memmove`), which is fast at any alignment.

use crate::arch::{self, GlobalWord, Word16};
use crate::coop::{Coop, contiguous_chunk};

/// Bytes each emulator thread's chunk is rounded to, so two threads never share a cache line.
const CPU_CHUNK_ALIGN: u64 = 64;

/// The widest unit of the GPU path, in bytes.
const MAX_UNIT: u64 = 16;

/// Copies `bytes` bytes from address `src` to address `dst`, split among `coop`.
///
/// # Safety
/// `src..src+bytes` must be readable and `dst..dst+bytes` writable for the duration of the
/// copy, and on the GPU lie in global memory (device buffers, peer memory mapped through
/// IPC, device-mapped host memory). They may overlap (see the module docs). Other agents
/// writing the same bytes meanwhile make the copied values unspecified, as on a GPU.
#[inline(always)]
pub unsafe fn copy(coop: impl Coop, dst: u64, src: u64, bytes: u64) {
    // Read once, for whichever path runs: a group's rank and size cost special-register
    // reads and arithmetic, which LLVM would otherwise repeat in every unit's branch.
    let (rank, size) = (coop.thread_rank(), coop.size());
    // SAFETY: forwarded contract; every thread of the group passes its own rank and the
    // group's size, so the shares are disjoint and cover the range.
    unsafe {
        if arch::PREFERS_CONTIGUOUS_SPLIT {
            contiguous_share(rank, size, dst, src, bytes)
        } else {
            strided_share(rank, size, dst, src, bytes)
        }
    }
}

/// The widest unit, at most [`MAX_UNIT`] bytes, to which `dst` and `src` can be aligned at
/// once: the largest power of two dividing their distance.
#[inline(always)]
const fn unit_of(dst: u64, src: u64) -> u64 {
    // The lowest set bit of `dst ^ src` is the lowest bit where the addresses differ;
    // `| MAX_UNIT` caps it (and gives equal addresses a unit).
    let differ = (dst ^ src) | MAX_UNIT;
    differ & differ.wrapping_neg()
}

/// The GPU path: thread `rank` of `size` moves its share of the copy (see the module docs),
/// in the widest unit `dst` and `src` allow.
///
/// # Safety
/// As [`copy`].
#[inline(always)]
unsafe fn strided_share(rank: u64, size: u64, dst: u64, src: u64, bytes: u64) {
    // A group has at least one thread; `max` keeps a stray zero from looping forever.
    let size = size.max(1);
    // One branch per unit, taken before anything else: in each, the unit is a constant, and
    // nothing but the arguments is live across the choice.
    // SAFETY: forwarded contract; `unit_of` is a unit both addresses can be aligned to.
    unsafe {
        match unit_of(dst, src) {
            16 => share::<Word16>(rank, size, dst, src, bytes),
            8 => share::<u64>(rank, size, dst, src, bytes),
            4 => share::<u32>(rank, size, dst, src, bytes),
            2 => share::<u16>(rank, size, dst, src, bytes),
            _ => share::<u8>(rank, size, dst, src, bytes),
        }
    }
}

/// Thread `rank` of `size`'s share of the copy in units of `W`: its slots (see the module
/// docs), whole ones as one word, cut ones byte by byte.
///
/// # Safety
/// As [`copy`], with `dst - src` a multiple of `size_of::<W>()`; `size > 0`.
#[inline(always)]
unsafe fn share<W: GlobalWord>(rank: u64, size: u64, dst: u64, src: u64, bytes: u64) {
    let word = core::mem::size_of::<W>() as u64;
    let end = dst + bytes;
    // Slot starts are aligned to `word`; the first may start before `dst` (and `src`), by
    // as much on both sides, since their distance is a multiple of `word`.
    let first = rank * word;
    let (mut to, mut from) = ((dst & !(word - 1)) + first, (src & !(word - 1)) + first);
    let step = size * word;
    while to < end {
        if to >= dst && to + word <= end {
            // SAFETY: a whole slot: inside the ranges of the contract, aligned for `W` on
            // both sides.
            unsafe { W::load_global(from).store_global(to) }
        } else {
            // A cut slot: its bytes from `dst` (the head's) or up to `end` (the tail's).
            // `stop` (at most `word`) is held in 32 bits: this loop is where the copy holds
            // the most registers, and at sm_70 the narrow bound saves two.
            let mut b = dst.saturating_sub(to);
            let stop = if to + word > end {
                (end - to) as u32
            } else {
                word as u32
            };
            while b < stop as u64 {
                // SAFETY: `dst <= to + b < end`: one byte inside the ranges of the contract.
                unsafe { u8::load_global(from + b).store_global(to + b) }
                b += 1;
            }
        }
        to += step;
        from += step;
    }
}

/// The emulator path: thread `rank` of `size` copies its contiguous chunk of whole cache
/// lines with `ptr::copy`.
///
/// # Safety
/// As [`copy`] (any memory the host can read and write).
#[inline(always)]
unsafe fn contiguous_share(rank: u64, size: u64, dst: u64, src: u64, bytes: u64) {
    let lines = bytes.div_ceil(CPU_CHUNK_ALIGN);
    let r = contiguous_chunk(rank, size, lines);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;
    use std::vec::Vec;

    /// Guards against a copy that settles for a narrower unit than the addresses allow
    /// (a byte loop for a 1002-byte put whose ends are equally misaligned), or a wider one
    /// than they allow (a misaligned 16-byte access).
    #[test]
    fn unit_is_the_widest_both_ends_allow() {
        for dst in 0..48u64 {
            for src in 0..48u64 {
                let unit = unit_of(0x1000 + dst, 0x2000 + src);
                let distance = dst.abs_diff(src);
                let widest = [16, 8, 4, 2, 1]
                    .into_iter()
                    .find(|u| distance.is_multiple_of(*u))
                    .unwrap();
                assert_eq!(unit, widest, "dst +{dst} src +{src}");
            }
        }
        assert_eq!(unit_of(0x1003, 0x2003), 16);
        assert_eq!(unit_of(0x1000, 0x2008), 8);
        assert_eq!(unit_of(0x1001, 0x2000), 1);
    }

    /// A share function: thread `rank` of `size` copies its share of `bytes` bytes.
    type Share = unsafe fn(u64, u64, u64, u64, u64);

    /// A 16-byte aligned buffer of `len` bytes (plus slack).
    fn buffer(len: usize) -> Vec<Word16> {
        std::vec![Word16::default(); len.div_ceil(16) + 1]
    }

    fn bytes_of(buf: &mut [Word16]) -> &mut [u8] {
        bytemuck::cast_slice_mut(buf)
    }

    /// Bytes of slack before and after each range, checked to stay untouched.
    const GUARD: usize = 32;
    /// What the slack of the destination holds.
    const OUTSIDE: u8 = 0x5a;

    /// Runs `share` for each rank of `size` in turn, each on a freshly poisoned destination,
    /// and checks that together the ranks wrote every byte of the range exactly once, with
    /// the source's value, and nothing outside it, and that the source is unchanged.
    fn check_shares(share: Share, dst_mis: usize, src_mis: usize, bytes: usize, size: u64) {
        let what = format!("dst +{dst_mis} src +{src_mis} bytes {bytes} size {size}");
        let span = GUARD + 16 + bytes + GUARD;
        let mut src_buf = buffer(span);
        let src_start = GUARD + src_mis;
        for (j, b) in bytes_of(&mut src_buf).iter_mut().enumerate() {
            *b = (j * 31 + 7) as u8;
        }
        let src_before = src_buf.clone();
        let src_at = |k: usize, buf: &[Word16]| bytemuck::cast_slice::<_, u8>(buf)[src_start + k];
        let mut dst_buf = buffer(span);
        let dst_start = GUARD + dst_mis;
        // A value that differs from the byte the copy brings, so each write shows.
        let poison = |k: usize| src_at(k, &src_before) ^ 0xa5;
        let mut written = std::vec![0u32; bytes];
        for rank in 0..size {
            let dst_bytes = bytes_of(&mut dst_buf);
            dst_bytes.fill(OUTSIDE);
            for k in 0..bytes {
                dst_bytes[dst_start + k] = poison(k);
            }
            let dst = dst_bytes.as_ptr() as usize as u64 + dst_start as u64;
            let src = src_buf.as_ptr() as usize as u64 + src_start as u64;
            // SAFETY: both ranges lie inside live buffers of this test.
            unsafe { share(rank, size, dst, src, bytes as u64) };
            let dst_bytes = bytes_of(&mut dst_buf);
            for (q, &b) in dst_bytes.iter().enumerate() {
                match q.checked_sub(dst_start).filter(|&k| k < bytes) {
                    Some(k) if b == src_at(k, &src_before) => written[k] += 1,
                    Some(k) => assert_eq!(b, poison(k), "{what}: rank {rank} byte {k} wrong"),
                    None => assert_eq!(b, OUTSIDE, "{what}: rank {rank} wrote outside, at {q}"),
                }
            }
        }
        assert!(src_buf == src_before, "{what}: the source changed");
        if let Some(k) = written.iter().position(|&n| n != 1) {
            panic!("{what}: byte {k} written {} times", written[k]);
        }
    }

    /// Guards against the GPU split losing a byte, copying one twice (two threads racing on
    /// it), or touching bytes outside the range, for every pair of misalignments modulo 16
    /// and short lengths (all head, tail and body shapes), and a few longer copies.
    #[test]
    fn strided_shares_write_each_byte_once() {
        for size in [1, 2, 5, 32] {
            for dst_mis in 0..16 {
                for src_mis in 0..16 {
                    for bytes in 0..=64 {
                        check_shares(strided_share, dst_mis, src_mis, bytes, size);
                    }
                }
            }
        }
        for size in [1, 3, 32, 33] {
            for (dst_mis, src_mis) in [(0, 0), (3, 3), (0, 8), (12, 4), (1, 0), (7, 13)] {
                for bytes in [1000, 1002, 4096 + 13] {
                    check_shares(strided_share, dst_mis, src_mis, bytes, size);
                }
            }
        }
    }

    /// Guards against the emulator's chunks overlapping or leaving gaps at any alignment.
    #[test]
    fn contiguous_shares_write_each_byte_once() {
        for size in [1, 2, 3, 8] {
            for (dst_mis, src_mis) in [(0, 0), (3, 3), (0, 8), (1, 0), (7, 13)] {
                for bytes in [0, 1, 63, 64, 65, 200, 1002, 4096 + 13] {
                    check_shares(contiguous_share, dst_mis, src_mis, bytes, size);
                }
            }
        }
    }

    /// Guards against `copy` itself (the group's rank and size, read once, then the path)
    /// losing or adding a byte: one thread, misaligned source, through the public entry.
    #[test]
    fn copy_with_one_thread_copies_everything() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = std::vec![0u8; 256];
        // SAFETY: live buffers of 256 bytes; 255 bytes from offset 1 stay inside.
        unsafe {
            copy(
                crate::coop::Thread,
                dst.as_mut_ptr() as usize as u64,
                src.as_ptr() as usize as u64 + 1,
                255,
            )
        };
        assert_eq!(&dst[..255], &src[1..]);
        assert_eq!(dst[255], 0);
    }
}
