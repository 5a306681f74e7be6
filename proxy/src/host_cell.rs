//! A value in host memory that kernels reach too, shared like an `Arc`: a channel's abort
//! record, a rank's stop word. The host thread and the device both touch it, atomically.
//!
//! On the CPU emulator it is ordinary heap memory ([`HostCell::new`]). A GPU cannot reach the
//! heap: there the backend places the value in pinned, device-mapped host memory
//! ([`HostCell::placed`]), whose address is the same for the host and, with unified
//! addressing, for every device. Atomics of a GPU on mapped host memory are not atomic with
//! respect to the host's: what shares a cell across the bus must be written by one side and
//! read by the other, or tolerate a lost race between two writers (the first failure of a
//! channel recorded by the proxy and by a kernel at the same moment: one of them is kept).

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// A shared value the host and kernels reach at one address (see the module docs).
pub struct HostCell<T> {
    value: NonNull<T>,
    /// Keeps the memory behind `value` alive.
    keep_alive: Arc<dyn Any + Send + Sync>,
}

// SAFETY: `value` points into memory `keep_alive` keeps alive (itself `Send + Sync`), and the
// cell only gives out `&T`: sending or sharing it is sending or sharing a `&T`, which needs
// `T: Sync`.
unsafe impl<T: Sync> Send for HostCell<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for HostCell<T> {}

impl<T: Send + Sync + 'static> HostCell<T> {
    /// `value` on the heap (the CPU emulator's kernels are host threads).
    pub fn new(value: T) -> Self {
        let heap = Arc::new(value);
        HostCell {
            value: NonNull::from(&*heap),
            keep_alive: heap,
        }
    }
}

impl<T> HostCell<T> {
    /// A value at `value`, in memory `keep_alive` keeps alive.
    ///
    /// # Safety
    /// `value` points to a live, initialized, aligned `T` for as long as `keep_alive` (or
    /// a clone of it) exists, and nothing gives out a `&mut T` to it; `T` needs no drop (the
    /// value is never dropped in place).
    pub unsafe fn placed(value: NonNull<T>, keep_alive: Arc<dyn Any + Send + Sync>) -> Self {
        HostCell { value, keep_alive }
    }

    /// The value's address, the same for the host and the device.
    pub fn as_ptr(&self) -> *const T {
        self.value.as_ptr()
    }
}

impl<T> Clone for HostCell<T> {
    fn clone(&self) -> Self {
        HostCell {
            value: self.value,
            keep_alive: self.keep_alive.clone(),
        }
    }
}

impl<T> Deref for HostCell<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: `value` is live and initialized while `keep_alive` is, which `self` holds
        // (the constructors' contracts); only shared references are given out.
        unsafe { self.value.as_ref() }
    }
}

impl<T: fmt::Debug> fmt::Debug for HostCell<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HostCell").field(&**self).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn clones_share_one_value_at_one_address() {
        let cell = HostCell::new(AtomicU64::new(3));
        let other = cell.clone();
        other.store(7, Ordering::Relaxed);
        assert_eq!(cell.load(Ordering::Relaxed), 7);
        assert_eq!(cell.as_ptr(), other.as_ptr());
        drop(cell);
        assert_eq!(other.load(Ordering::Relaxed), 7);
    }
}
