//! Plain loads and stores of "global" memory: in the emulator, relaxed atomic accesses of the
//! word's width.
//!
//! On the GPU these are weak `ld.global` / `st.global`: kernel threads that access the same
//! word at once get unspecified values, not undefined behaviour. Emulated kernel threads are
//! OS threads, for which Rust makes racing plain accesses undefined behaviour; relaxed atomics
//! keep the GPU's meaning (any value written, nothing ordered) and compile to the same plain
//! moves on x86-64 and AArch64. A 16-byte word moves as two 8-byte halves, so a racing reader
//! may see halves of two writes, which is one of the unspecified values a GPU allows too.

use crate::arch::{GlobalWord, Word16};
use core::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

/// [`GlobalWord`] for `$t` as a relaxed access through `$atomic`, of the same size and
/// alignment.
macro_rules! host_global_word {
    ($($t:ty => $atomic:ty),*) => {$(
        const _: () = assert!(core::mem::align_of::<$t>() == core::mem::align_of::<$atomic>());

        impl GlobalWord for $t {
            #[inline(always)]
            unsafe fn load_global(addr: u64) -> $t {
                // SAFETY: the caller vouches for an aligned, readable `$t` at `addr`; the
                // atomic has its size and alignment, and is only used for this access.
                let cell = unsafe { <$atomic>::from_ptr(addr as usize as *mut $t) };
                // Relaxed: data, not synchronization (see the module docs).
                cell.load(Ordering::Relaxed)
            }

            #[inline(always)]
            unsafe fn store_global(self, addr: u64) {
                // SAFETY: the caller vouches for an aligned, writable `$t` at `addr`; as above.
                let cell = unsafe { <$atomic>::from_ptr(addr as usize as *mut $t) };
                // Relaxed: as above.
                cell.store(self, Ordering::Relaxed)
            }
        }
    )*};
}

host_global_word!(u8 => AtomicU8, u16 => AtomicU16, u32 => AtomicU32, u64 => AtomicU64);

impl GlobalWord for Word16 {
    #[inline(always)]
    unsafe fn load_global(addr: u64) -> Word16 {
        // SAFETY: the caller vouches for 16 aligned, readable bytes at `addr`: two aligned
        // `u64`s.
        unsafe { Word16([u64::load_global(addr), u64::load_global(addr + 8)]) }
    }

    #[inline(always)]
    unsafe fn store_global(self, addr: u64) {
        // SAFETY: the caller vouches for 16 aligned, writable bytes at `addr`.
        unsafe {
            self.0[0].store_global(addr);
            self.0[1].store_global(addr + 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a word moved in part (a 16-byte word loaded or stored as 8 bytes).
    #[test]
    fn words_move_whole() {
        let src = Word16([0x0102_0304_0506_0708, 0x1112_1314_1516_1718]);
        let mut dst = [Word16::default(); 2];
        let from = &src as *const Word16 as usize as u64;
        let to = dst.as_mut_ptr() as usize as u64;
        // SAFETY: aligned words of live locals.
        unsafe {
            Word16::load_global(from).store_global(to + 16);
            u8::load_global(from).store_global(to);
        }
        assert_eq!(dst[1], src);
        assert_eq!(dst[0].0, [0x08, 0], "one byte, the first in memory");
    }
}
