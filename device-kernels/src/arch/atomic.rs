//! The one atomic shim: every atomic access in oxccl's device code goes through here.
//!
//! Each operation takes an [`Ordering`] and a [`Scope`]. On nvptx they become explicit PTX
//! (`ld.acquire.sys.global.u64`, `atom.relaxed.gpu.global.add.u64`, ...), because LLVM lowers
//! every non-relaxed Rust atomic to `.sys` scope and every relaxed RMW to no scope at all, and
//! the protocols here need both to be what they say. On the host they are core atomics (scope
//! has no meaning between CPU threads); under `cfg(oxccl_loom)` they are `loom` atomics, so
//! the FIFO and semaphore protocols above this module are model-checked unchanged.
//!
//! Memory shared with the host or a peer holds [`AtomicU64`] cells; handles carry their
//! addresses as `u64` (see [`cell`]).

#[cfg(oxccl_loom)]
pub use loom::sync::atomic::AtomicU64;

#[cfg(not(oxccl_loom))]
pub use core::sync::atomic::AtomicU64;

pub use core::sync::atomic::Ordering;

/// Which threads an atomic access or fence is ordered against.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Threads of the same block (`.cta`).
    Block,
    /// Threads of the same device (`.gpu`): kernel threads among themselves, e.g. the FIFO head.
    Gpu,
    /// Every agent that can reach the memory (`.sys`): the host proxy, peer devices.
    System,
}

/// Reinterprets an address held by a device handle as a reference to an atomic cell.
///
/// # Safety
/// `addr` must be non-null, aligned to 8 bytes, and point to an [`AtomicU64`] that stays
/// alive and is only accessed atomically for the lifetime `'a`.
#[inline(always)]
pub unsafe fn cell<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: the caller guarantees the address points to a live AtomicU64 for 'a.
    unsafe { &*(addr as usize as *const AtomicU64) }
}

/// Loads `a` with `order` (`Relaxed` or `Acquire`; `SeqCst` is treated as `Acquire`) at `scope`.
#[inline(always)]
pub fn load(a: &AtomicU64, order: Ordering, scope: Scope) -> u64 {
    imp::load(a, order, scope)
}

/// Stores `v` into `a` with `order` (`Relaxed` or `Release`; `SeqCst` is treated as
/// `Release`) at `scope`.
#[inline(always)]
pub fn store(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) {
    imp::store(a, v, order, scope)
}

/// Adds `v` to `a` with `order` at `scope` and returns the previous value.
#[inline(always)]
pub fn fetch_add(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) -> u64 {
    imp::fetch_add(a, v, order, scope)
}

/// Adds `v` to `a` with `order` (`Relaxed` or `Release`; others are treated as `Release`)
/// at `scope`, returning nothing: a fire-and-forget reduction (`red` on the GPU), which needs
/// no register for an old value and no round trip to memory.
#[inline(always)]
pub fn add(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) {
    imp::add(a, v, order, scope)
}

/// Replaces `a` with `new` if it holds `current`, relaxed, at `scope`; returns the value
/// found (`Ok` if it was `current` and was replaced).
#[inline(always)]
pub fn compare_exchange_relaxed(
    a: &AtomicU64,
    current: u64,
    new: u64,
    scope: Scope,
) -> Result<u64, u64> {
    imp::compare_exchange_relaxed(a, current, new, scope)
}

/// Sets the bits of `v` in `a` with `order` at `scope` and returns the previous value.
#[inline(always)]
pub fn fetch_or(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) -> u64 {
    imp::fetch_or(a, v, order, scope)
}

/// Keeps only the bits of `v` in `a` with `order` at `scope` and returns the previous value.
#[inline(always)]
pub fn fetch_and(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) -> u64 {
    imp::fetch_and(a, v, order, scope)
}

/// Publishes a 128-bit pair `[w0, w1]` so that an observer that acquires `w1` at `scope` also
/// sees `w0`.
///
/// `w0` is stored relaxed, then `w1` with release, both at `scope`; the reader must acquire
/// `w1` before reading `w0` (pairs with the Acquire in the proxy's `Fifo::poll`). On the GPU
/// this is two stores, not one `st.release.v2`: the PTX memory model treats the elements of a
/// vector access as separate accesses with no order between them, so a vector release store
/// would not order `w0` before `w1` for the reader.
#[inline(always)]
pub fn publish_pair(pair: &[AtomicU64; 2], w0: u64, w1: u64, scope: Scope) {
    imp::publish_pair(pair, w0, w1, scope)
}

/// Stores a 128-bit pair `[w0, w1]` with no ordering against other accesses; each 64-bit half
/// is single-copy atomic (what LL16 packets rely on), the pair as a whole is not.
#[inline(always)]
pub fn store_pair_relaxed(pair: &[AtomicU64; 2], w0: u64, w1: u64, scope: Scope) {
    imp::store_pair_relaxed(pair, w0, w1, scope)
}

/// Loads a 128-bit pair with no ordering; each 64-bit half is single-copy atomic.
#[inline(always)]
pub fn load_pair_relaxed(pair: &[AtomicU64; 2], scope: Scope) -> [u64; 2] {
    imp::load_pair_relaxed(pair, scope)
}

#[cfg(not(target_arch = "nvptx64"))]
mod imp {
    use super::{AtomicU64, Ordering, Scope};

    fn load_order(order: Ordering) -> Ordering {
        match order {
            Ordering::Relaxed => Ordering::Relaxed,
            _ => Ordering::Acquire,
        }
    }

    fn store_order(order: Ordering) -> Ordering {
        match order {
            Ordering::Relaxed => Ordering::Relaxed,
            _ => Ordering::Release,
        }
    }

    #[inline(always)]
    pub fn load(a: &AtomicU64, order: Ordering, _scope: Scope) -> u64 {
        a.load(load_order(order))
    }

    #[inline(always)]
    pub fn store(a: &AtomicU64, v: u64, order: Ordering, _scope: Scope) {
        a.store(v, store_order(order))
    }

    #[inline(always)]
    pub fn fetch_add(a: &AtomicU64, v: u64, order: Ordering, _scope: Scope) -> u64 {
        a.fetch_add(v, order)
    }

    #[inline(always)]
    pub fn add(a: &AtomicU64, v: u64, order: Ordering, _scope: Scope) {
        a.fetch_add(v, store_order(order));
    }

    #[inline(always)]
    pub fn compare_exchange_relaxed(
        a: &AtomicU64,
        current: u64,
        new: u64,
        _scope: Scope,
    ) -> Result<u64, u64> {
        a.compare_exchange(current, new, Ordering::Relaxed, Ordering::Relaxed)
    }

    #[inline(always)]
    pub fn fetch_or(a: &AtomicU64, v: u64, order: Ordering, _scope: Scope) -> u64 {
        a.fetch_or(v, order)
    }

    #[inline(always)]
    pub fn fetch_and(a: &AtomicU64, v: u64, order: Ordering, _scope: Scope) -> u64 {
        a.fetch_and(v, order)
    }

    #[inline(always)]
    pub fn publish_pair(pair: &[AtomicU64; 2], w0: u64, w1: u64, _scope: Scope) {
        // Relaxed: ordered before the observer's read by the Release store of w1 below.
        pair[0].store(w0, Ordering::Relaxed);
        // Release: pairs with the Acquire load of w1 in the reader.
        pair[1].store(w1, Ordering::Release);
    }

    #[inline(always)]
    pub fn store_pair_relaxed(pair: &[AtomicU64; 2], w0: u64, w1: u64, _scope: Scope) {
        pair[0].store(w0, Ordering::Relaxed);
        pair[1].store(w1, Ordering::Relaxed);
    }

    #[inline(always)]
    pub fn load_pair_relaxed(pair: &[AtomicU64; 2], _scope: Scope) -> [u64; 2] {
        [
            pair[0].load(Ordering::Relaxed),
            pair[1].load(Ordering::Relaxed),
        ]
    }
}

#[cfg(target_arch = "nvptx64")]
mod imp {
    use super::{AtomicU64, Ordering, Scope};
    use core::arch::asm;

    /// Expands to a `match` over scope that runs the same instruction text with `.cta`,
    /// `.gpu` or `.sys` spliced in, so each combination is a literal PTX string.
    macro_rules! scoped {
        ($scope:expr, $pre:literal, $post:expr, $($operands:tt)*) => {
            match $scope {
                Scope::Block => asm!(concat!($pre, ".cta", $post), $($operands)*),
                Scope::Gpu => asm!(concat!($pre, ".gpu", $post), $($operands)*),
                Scope::System => asm!(concat!($pre, ".sys", $post), $($operands)*),
            }
        };
    }

    #[inline(always)]
    pub fn load(a: &AtomicU64, order: Ordering, scope: Scope) -> u64 {
        let p = a.as_ptr();
        let v: u64;
        // SAFETY: `p` comes from a live `&AtomicU64` in global memory; the load has the
        // ordering and scope asked for and touches only those 8 bytes.
        unsafe {
            match order {
                Ordering::Relaxed => scoped!(scope, "ld.relaxed", ".global.u64 {v}, [{p}];",
                    v = out(reg64) v, p = in(reg64) p, options(nostack)),
                _ => scoped!(scope, "ld.acquire", ".global.u64 {v}, [{p}];",
                    v = out(reg64) v, p = in(reg64) p, options(nostack)),
            }
        }
        v
    }

    #[inline(always)]
    pub fn store(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) {
        let p = a.as_ptr();
        // SAFETY: as in `load`; the store writes only the 8 bytes of the cell.
        unsafe {
            match order {
                Ordering::Relaxed => scoped!(scope, "st.relaxed", ".global.u64 [{p}], {v};",
                    v = in(reg64) v, p = in(reg64) p, options(nostack)),
                _ => scoped!(scope, "st.release", ".global.u64 [{p}], {v};",
                    v = in(reg64) v, p = in(reg64) p, options(nostack)),
            }
        }
    }

    #[inline(always)]
    pub fn fetch_add(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) -> u64 {
        let p = a.as_ptr();
        let old: u64;
        // SAFETY: as in `load`; `atom.add` reads and writes only the 8 bytes of the cell.
        unsafe {
            match order {
                Ordering::Relaxed => {
                    scoped!(scope, "atom.relaxed", ".global.add.u64 {o}, [{p}], {v};",
                    o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack))
                }
                Ordering::Acquire => {
                    scoped!(scope, "atom.acquire", ".global.add.u64 {o}, [{p}], {v};",
                    o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack))
                }
                Ordering::Release => {
                    scoped!(scope, "atom.release", ".global.add.u64 {o}, [{p}], {v};",
                    o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack))
                }
                _ => scoped!(scope, "atom.acq_rel", ".global.add.u64 {o}, [{p}], {v};",
                    o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack)),
            }
        }
        old
    }

    #[inline(always)]
    pub fn add(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) {
        let p = a.as_ptr();
        // SAFETY: as in `load`; `red.add` writes only the 8 bytes of the cell.
        unsafe {
            match order {
                Ordering::Relaxed => scoped!(scope, "red.relaxed", ".global.add.u64 [{p}], {v};",
                    v = in(reg64) v, p = in(reg64) p, options(nostack)),
                _ => scoped!(scope, "red.release", ".global.add.u64 [{p}], {v};",
                    v = in(reg64) v, p = in(reg64) p, options(nostack)),
            }
        }
    }

    #[inline(always)]
    pub fn compare_exchange_relaxed(
        a: &AtomicU64,
        current: u64,
        new: u64,
        scope: Scope,
    ) -> Result<u64, u64> {
        let p = a.as_ptr();
        let old: u64;
        // SAFETY: as in `fetch_add`; `atom.cas` reads and writes only the 8 bytes of the cell.
        unsafe {
            scoped!(scope, "atom.relaxed", ".global.cas.b64 {o}, [{p}], {c}, {n};",
                o = out(reg64) old, c = in(reg64) current, n = in(reg64) new, p = in(reg64) p,
                options(nostack))
        }
        if old == current { Ok(old) } else { Err(old) }
    }

    /// `atom.<order>.<scope>.global.<op>.b64` for the bitwise RMWs.
    macro_rules! bitwise_rmw {
        ($name:ident, $op:literal) => {
            #[inline(always)]
            pub fn $name(a: &AtomicU64, v: u64, order: Ordering, scope: Scope) -> u64 {
                let p = a.as_ptr();
                let old: u64;
                // SAFETY: as in `fetch_add`.
                unsafe {
                    match order {
                        Ordering::Relaxed => scoped!(scope, "atom.relaxed", concat!(".global.", $op, ".b64 {o}, [{p}], {v};"),
                            o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack)),
                        _ => scoped!(scope, "atom.acq_rel", concat!(".global.", $op, ".b64 {o}, [{p}], {v};"),
                            o = out(reg64) old, v = in(reg64) v, p = in(reg64) p, options(nostack)),
                    }
                }
                old
            }
        };
    }

    bitwise_rmw!(fetch_or, "or");
    bitwise_rmw!(fetch_and, "and");

    #[inline(always)]
    pub fn publish_pair(pair: &[AtomicU64; 2], w0: u64, w1: u64, scope: Scope) {
        // Relaxed: ordered before the reader's view of `w1` by the release store below.
        store(&pair[0], w0, Ordering::Relaxed, scope);
        // Release: pairs with the reader's Acquire load of `w1`.
        store(&pair[1], w1, Ordering::Release, scope);
    }

    #[inline(always)]
    pub fn store_pair_relaxed(pair: &[AtomicU64; 2], w0: u64, w1: u64, _scope: Scope) {
        let p = pair.as_ptr() as *mut u64;
        // SAFETY: as in `publish_pair`, without ordering. `volatile` is relaxed at system
        // scope on sm_70 and later, and (unlike `.relaxed`) is accepted on vector stores.
        unsafe {
            asm!("st.volatile.global.v2.u64 [{p}], {{{a}, {b}}};",
                a = in(reg64) w0, b = in(reg64) w1, p = in(reg64) p, options(nostack))
        }
    }

    #[inline(always)]
    pub fn load_pair_relaxed(pair: &[AtomicU64; 2], _scope: Scope) -> [u64; 2] {
        let p = pair.as_ptr() as *mut u64;
        let (a, b): (u64, u64);
        // SAFETY: as in `publish_pair`; one volatile vector load of the two words.
        unsafe {
            asm!("ld.volatile.global.v2.u64 {{{a}, {b}}}, [{p}];",
                a = out(reg64) a, b = out(reg64) b, p = in(reg64) p, options(nostack))
        }
        [a, b]
    }
}
