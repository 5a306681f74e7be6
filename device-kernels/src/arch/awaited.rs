//! What a wait of the device library waits for, as plain data: a test of one word of
//! device memory that the CPU emulator can make on its own while the waiting kernel thread
//! is suspended (see [`super::spin_pause_awaiting`]).
//!
//! It is a hint, never the wait's condition itself: a wait resumed because its word looks
//! ready polls its own condition again, and one whose word looks ready only later is
//! resumed every few polls anyway. So it may be looser than the condition (a packet whose
//! first half has its flag but not yet its second), never something the condition needs
//! besides loads.

use super::atomic::{self, Ordering, Scope};

/// A test of one 64-bit word of device memory at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Awaited {
    /// The word is at least `value` (a semaphore's inbound count, a FIFO's tail).
    AtLeast {
        /// Address of the word.
        addr: u64,
        /// The least value that ends the wait.
        value: u64,
    },
    /// The word is no longer `value` (a grid barrier's generation).
    Changed {
        /// Address of the word.
        addr: u64,
        /// The value the wait waits to see change.
        value: u64,
    },
    /// The word's upper 32 bits are `flag` (a packet's first half).
    Flag {
        /// Address of the word.
        addr: u64,
        /// The flag that ends the wait.
        flag: u32,
    },
}

impl Awaited {
    /// Whether the word looks as the wait wants it now (a relaxed load: the wait's own
    /// poll, once resumed, is what orders what follows).
    ///
    /// # Safety
    /// The address is an 8-byte aligned `AtomicU64` of device memory that stays live while
    /// the wait lasts: the caller calls this only while the kernel thread is suspended in
    /// the wait that gave it.
    #[inline]
    pub unsafe fn holds(self) -> bool {
        let (Awaited::AtLeast { addr, .. }
        | Awaited::Changed { addr, .. }
        | Awaited::Flag { addr, .. }) = self;
        // SAFETY: forwarded contract.
        let word = atomic::load(
            unsafe { atomic::cell(addr) },
            Ordering::Relaxed,
            Scope::System,
        );
        match self {
            Awaited::AtLeast { value, .. } => word >= value,
            Awaited::Changed { value, .. } => word != value,
            Awaited::Flag { flag, .. } => (word >> 32) as u32 == flag,
        }
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use crate::arch::atomic::AtomicU64;

    /// Guards the three tests against reading the wrong part of the word or the wrong
    /// comparison.
    #[test]
    fn each_test_reads_its_word_as_it_says() {
        let word = AtomicU64::new(0);
        let addr = word.as_ptr() as u64;
        let holds = |awaited: Awaited| {
            // SAFETY: `word` lives for the test.
            unsafe { awaited.holds() }
        };
        let at_least = |value| holds(Awaited::AtLeast { addr, value });
        let changed = |value| holds(Awaited::Changed { addr, value });
        let flag = |flag| holds(Awaited::Flag { addr, flag });
        word.store(5, Ordering::Relaxed);
        assert!(at_least(5) && at_least(4) && !at_least(6));
        assert!(changed(4) && !changed(5));
        word.store(7 << 32 | 9, Ordering::Relaxed);
        assert!(flag(7) && !flag(9));
    }
}
