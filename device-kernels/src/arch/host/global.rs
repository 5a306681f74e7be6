//! Plain loads and stores of "global" memory: in the emulator, ordinary copies.

use crate::arch::{GlobalWord, Word16};

/// [`GlobalWord`] for `$t` as an ordinary read and write (the emulator's device memory is
/// host memory; the compiler picks the instructions).
macro_rules! host_global_word {
    ($($t:ty),*) => {$(
        impl GlobalWord for $t {
            #[inline(always)]
            unsafe fn load_global(addr: u64) -> $t {
                // SAFETY: the caller vouches for an aligned, readable `$t` at `addr`.
                unsafe { (addr as usize as *const $t).read() }
            }

            #[inline(always)]
            unsafe fn store_global(self, addr: u64) {
                // SAFETY: the caller vouches for an aligned, writable `$t` at `addr`.
                unsafe { (addr as usize as *mut $t).write(self) }
            }
        }
    )*};
}

host_global_word!(u8, u16, u32, u64, Word16);

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
