//! The arch layer on the GPU: special registers, `bar.sync`, fences, the global timer, and
//! plain global loads and stores.

use super::{Dim3, GlobalWord, Scope, Word16};
use core::arch::asm;
use core::arch::nvptx;

pub(crate) const PREFERS_CONTIGUOUS_SPLIT: bool = false;

#[inline(always)]
pub(crate) fn thread_idx() -> Dim3 {
    // SAFETY: reading special registers has no preconditions inside a kernel.
    unsafe {
        Dim3 {
            x: nvptx::_thread_idx_x() as u32,
            y: nvptx::_thread_idx_y() as u32,
            z: nvptx::_thread_idx_z() as u32,
        }
    }
}

#[inline(always)]
pub(crate) fn block_idx() -> Dim3 {
    // SAFETY: reading special registers has no preconditions inside a kernel.
    unsafe {
        Dim3 {
            x: nvptx::_block_idx_x() as u32,
            y: nvptx::_block_idx_y() as u32,
            z: nvptx::_block_idx_z() as u32,
        }
    }
}

#[inline(always)]
pub(crate) fn block_dim() -> Dim3 {
    // SAFETY: reading special registers has no preconditions inside a kernel.
    unsafe {
        Dim3 {
            x: nvptx::_block_dim_x() as u32,
            y: nvptx::_block_dim_y() as u32,
            z: nvptx::_block_dim_z() as u32,
        }
    }
}

#[inline(always)]
pub(crate) fn grid_dim() -> Dim3 {
    // SAFETY: reading special registers has no preconditions inside a kernel.
    unsafe {
        Dim3 {
            x: nvptx::_grid_dim_x() as u32,
            y: nvptx::_grid_dim_y() as u32,
            z: nvptx::_grid_dim_z() as u32,
        }
    }
}

#[inline(always)]
pub(crate) fn sync_threads() {
    // SAFETY: `bar.sync 0` is the block-wide barrier; the contract of `arch::sync_threads`
    // requires every thread of the block to reach it.
    unsafe { nvptx::_syncthreads() }
}

#[inline(always)]
pub(crate) fn sync_threads_or(predicate: bool) -> bool {
    // SAFETY: barrier 0 of the block with an OR of one predicate per thread
    // (`__syncthreads_or`); the contract of `arch::sync_threads_or` requires every thread of
    // the block to reach it.
    unsafe { barrier_cta_red_or(0, predicate) }
}

unsafe extern "C" {
    /// `barrier.cta.red.or.aligned.all` (`bar.red.or.pred`): waits at barrier `barrier` for
    /// every thread of the block and returns whether any passed `predicate` true.
    ///
    /// An LLVM intrinsic rather than inline PTX so that LLVM knows the call is convergent:
    /// it never duplicates it into the arms of a branch nor sinks it under one, which would
    /// leave threads of the block waiting at different barriers. (An `asm!` block is opaque
    /// to LLVM, which may move or copy it like any other call.) LLVM 21 replaced the older
    /// `llvm.nvvm.barrier0.or` with this one.
    #[link_name = "llvm.nvvm.barrier.cta.red.or.aligned.all"]
    fn barrier_cta_red_or(barrier: i32, predicate: bool) -> bool;
}

#[inline(always)]
pub(crate) fn fence(scope: Scope) {
    // SAFETY: fences touch no memory; they only order this thread's accesses.
    unsafe {
        match scope {
            Scope::Block => asm!("fence.acq_rel.cta;", options(nostack)),
            Scope::Gpu => asm!("fence.acq_rel.gpu;", options(nostack)),
            Scope::System => asm!("fence.acq_rel.sys;", options(nostack)),
        }
    }
}

#[inline(always)]
pub(crate) fn clock_ns() -> u64 {
    let t: u64;
    // SAFETY: `%globaltimer` is a read-only special register (nanoseconds).
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nostack, nomem)) };
    t
}

#[inline(always)]
pub(crate) fn spin_pause(iteration: u32) {
    if iteration >= 64 {
        // SAFETY: `nanosleep` (sm_70+) only suspends this thread for a bounded time.
        unsafe { asm!("nanosleep.u32 100;", options(nostack, nomem)) };
    }
}

#[inline(always)]
pub(crate) fn spin_pause_awaiting(iteration: u32, _awaited: super::Awaited) {
    spin_pause(iteration);
}

#[inline(always)]
pub(crate) fn trap() -> ! {
    // SAFETY: `trap` aborts the kernel; nothing after it runs.
    unsafe { nvptx::trap() }
}

#[inline(always)]
pub(crate) fn in_place(mut value: u64) -> u64 {
    // SAFETY: an empty instruction sequence; it only keeps LLVM from moving the value's
    // computation (the block is not `pure`, so LLVM treats it as having side effects).
    unsafe { asm!("// in_place {v}", v = inout(reg64) value, options(nostack, nomem)) };
    value
}

#[inline(always)]
pub(crate) fn ring_doorbell(_addr: u64, _proxy_asleep: bool) {}

#[inline(always)]
pub(crate) fn prefetch_for_write(_addr: *const u8) {}

#[inline(always)]
pub(crate) fn note_failure(
    _error: crate::DeviceError,
    _op: crate::error::DeviceOp,
    _site: u32,
    _detail: [u64; 3],
) {
}

/// [`GlobalWord`] for a scalar of PTX type `$ty` held in a register of class `$reg`.
///
/// Written in PTX because LLVM, given a Rust read or write through an address held as an
/// integer, emits a generic access (`ld.b64`), and splits a 16-byte struct into two 8-byte
/// ones; here each word is one access of its width, in the global state space.
macro_rules! scalar_global_word {
    ($t:ty, $ty:literal, $reg:ident) => {
        impl GlobalWord for $t {
            #[inline(always)]
            unsafe fn load_global(addr: u64) -> $t {
                let v: $t;
                // SAFETY: the caller vouches for an aligned, readable word of global memory.
                // `pure, readonly`: a plain load, which reads memory and writes nothing.
                unsafe {
                    asm!(
                        concat!("ld.global.", $ty, " {v}, [{addr}];"),
                        v = out($reg) v,
                        addr = in(reg64) addr,
                        options(nostack, pure, readonly),
                    )
                };
                v
            }

            #[inline(always)]
            unsafe fn store_global(self, addr: u64) {
                // SAFETY: the caller vouches for an aligned, writable word of global memory.
                unsafe {
                    asm!(
                        concat!("st.global.", $ty, " [{addr}], {v};"),
                        addr = in(reg64) addr,
                        v = in($reg) self,
                        options(nostack),
                    )
                };
            }
        }
    };
}

scalar_global_word!(u8, "u8", reg16);
scalar_global_word!(u16, "u16", reg16);
scalar_global_word!(u32, "u32", reg32);
scalar_global_word!(u64, "u64", reg64);

impl GlobalWord for Word16 {
    /// One `ld.global.v2.u64`: the whole 16 bytes in one 128-bit access.
    #[inline(always)]
    unsafe fn load_global(addr: u64) -> Word16 {
        let (lo, hi): (u64, u64);
        // SAFETY: the caller vouches for 16 readable bytes of global memory, aligned to 16
        // as a 128-bit access needs. `pure, readonly`: a plain load.
        unsafe {
            asm!(
                "ld.global.v2.u64 {{{lo}, {hi}}}, [{addr}];",
                lo = out(reg64) lo,
                hi = out(reg64) hi,
                addr = in(reg64) addr,
                options(nostack, pure, readonly),
            )
        };
        Word16([lo, hi])
    }

    /// One `st.global.v2.u64`: the whole 16 bytes in one 128-bit access.
    #[inline(always)]
    unsafe fn store_global(self, addr: u64) {
        // SAFETY: the caller vouches for 16 writable bytes of global memory, aligned to 16.
        unsafe {
            asm!(
                "st.global.v2.u64 [{addr}], {{{lo}, {hi}}};",
                addr = in(reg64) addr,
                lo = in(reg64) self.0[0],
                hi = in(reg64) self.0[1],
                options(nostack),
            )
        };
    }
}
