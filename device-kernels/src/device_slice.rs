//! Typed device addresses that can be passed to kernels and stored in handles.
//!
//! `bytemuck::Pod` does not accept raw pointers, and the GPU sees addresses as 64-bit
//! integers anyway, so shared layouts hold addresses as `u64`; these wrappers add the type.

use core::marker::PhantomData;

/// The address of one `T` in device memory (or emulated device memory).
#[repr(C)]
pub struct DevicePtr<T> {
    addr: u64,
    _elem: PhantomData<T>,
}

/// A pointer and a length in elements: the kernel-side view of a device buffer.
#[repr(C)]
pub struct DeviceSlice<T> {
    addr: u64,
    len: u64,
    _elem: PhantomData<T>,
}

const _: () = assert!(core::mem::size_of::<DevicePtr<u8>>() == 8);
const _: () = assert!(core::mem::size_of::<DeviceSlice<u8>>() == 16);

// Manual impls: derives would require `T: Clone` etc. although only an address is stored.
impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}
impl<T> Clone for DeviceSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<T> {}
impl<T> core::fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DevicePtr({:#x})", self.addr)
    }
}
impl<T> core::fmt::Debug for DeviceSlice<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DeviceSlice({:#x}, len {})", self.addr, self.len)
    }
}

// SAFETY: both are `repr(C)` structs of `u64`s (PhantomData is zero-sized), with no padding;
// every bit pattern is a valid value and all-zero is the null pointer / empty slice.
unsafe impl<T: 'static> bytemuck::Zeroable for DevicePtr<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Pod for DevicePtr<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Zeroable for DeviceSlice<T> {}
// SAFETY: as above.
unsafe impl<T: 'static> bytemuck::Pod for DeviceSlice<T> {}
// SAFETY: only an address is held; sending it is sending an integer. Access through it is
// governed by the unsafe accessors below.
unsafe impl<T> Send for DevicePtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for DevicePtr<T> {}
// SAFETY: as above.
unsafe impl<T> Send for DeviceSlice<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for DeviceSlice<T> {}

impl<T> DevicePtr<T> {
    /// A pointer to `addr`.
    pub const fn new(addr: u64) -> Self {
        DevicePtr {
            addr,
            _elem: PhantomData,
        }
    }

    /// The address.
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// The address as a raw pointer.
    pub const fn as_ptr(self) -> *mut T {
        self.addr as usize as *mut T
    }
}

impl<T> DeviceSlice<T> {
    /// A slice of `len` elements at `addr`.
    pub const fn new(addr: u64, len: u64) -> Self {
        DeviceSlice {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// The address of the first element.
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub const fn len(self) -> u64 {
        self.len
    }

    /// Whether the slice has no elements.
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// The first element as a raw pointer.
    pub const fn as_ptr(self) -> *mut T {
        self.addr as usize as *mut T
    }

    /// A shared reference to element `i`, or `None` past the end.
    ///
    /// # Safety
    /// The slice must describe live memory holding valid `T`s that no one writes while the
    /// reference lives.
    pub unsafe fn get(&self, i: u64) -> Option<&T> {
        if i < self.len {
            // SAFETY: in bounds by the check; validity is the caller's promise.
            Some(unsafe { &*self.as_ptr().add(i as usize) })
        } else {
            None
        }
    }

    /// Reads element `i` by value, or `None` past the end.
    ///
    /// # Safety
    /// As [`Self::get`], for the duration of the read.
    pub unsafe fn read(&self, i: u64) -> Option<T>
    where
        T: Copy,
    {
        // SAFETY: forwarded contract.
        unsafe { self.get(i).copied() }
    }

    /// Writes `v` to element `i`; returns `false` (writing nothing) past the end.
    ///
    /// # Safety
    /// The slice must describe live, writable memory for `T`s that no one else accesses
    /// at that element during the write.
    pub unsafe fn write(&self, i: u64, v: T) -> bool {
        if i < self.len {
            // SAFETY: in bounds by the check; exclusivity is the caller's promise.
            unsafe { self.as_ptr().add(i as usize).write(v) };
            true
        } else {
            false
        }
    }
}
