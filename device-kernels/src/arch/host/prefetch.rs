//! Write prefetch: asking for a cache line in a writable state ahead of a store.

#[cfg(all(target_arch = "x86_64", not(oxccl_loom)))]
use std::sync::OnceLock;

/// Whether the CPU has `prefetchw` (CPUID 8000_0001h, ECX bit 8, "PRFCHW"), asked once.
#[cfg(all(target_arch = "x86_64", not(oxccl_loom)))]
fn has_prefetchw() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        use core::arch::x86_64::__cpuid;
        // Every x86_64 CPU has `cpuid`; leaf 8000_0001h exists when the top extended leaf
        // (leaf 8000_0000h's EAX) reaches it.
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    })
}

/// `prefetchw` where the CPU has it, otherwise nothing. Under loom, nothing: the model has
/// no caches.
#[inline(always)]
pub(crate) fn prefetch_for_write(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(oxccl_loom)))]
    if has_prefetchw() {
        // SAFETY: a prefetch is a hint that never faults, whatever the address, and writes
        // no memory or register (`readonly`); the CPU supports the instruction.
        unsafe {
            core::arch::asm!(
                "prefetchw [{addr}]",
                addr = in(reg) addr,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(oxccl_loom))))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a write prefetch that faults: it is a hint, so any address, mapped or
    /// not, must be accepted (a push prefetches a slot it does not own yet).
    #[test]
    fn prefetch_for_write_never_faults() {
        let line = [0u8; 64];
        for addr in [
            line.as_ptr(),
            core::ptr::null(),
            usize::MAX as *const u8,
            8 as *const u8,
        ] {
            prefetch_for_write(addr);
        }
        assert_eq!(line, [0u8; 64], "a prefetch must not write");
    }
}
