//! Typed, bounds-checked views of device memory: how kernels read and write their local
//! buffers without `unsafe`.
//!
//! A [`DeviceView`] reads `len` elements of `T`, a [`DeviceViewMut`] reads and writes them.
//! Both are kernel parameters ([`crate::launch::KernelArg`]) that only the host builds, from
//! a device buffer that outlives the view's lifetime `'a` (`DeviceBuffer::view` and
//! `DeviceBuffer::view_mut` in `oxccl`), so safe kernel code holds no address it could
//! choose. Every access checks its index: one past the end is
//! [`DeviceError::OutOfRange`] (nothing is read or written), never a wild access.
//!
//! | call | moves | checks |
//! |---|---|---|
//! | [`DeviceView::get`] / [`DeviceViewMut::set`] | one element: one weak global load or store of its width ([`arch::GlobalWord`]) | the index |
//! | [`DeviceView::slice`] | nothing: a view of a sub-range | the range |
//! | [`DeviceViewMut::copy_from`] | `self[i] = src[i]` for every element, split among a [`Coop`] (128-bit on the GPU, as [`crate::copy`]) | both lengths, once |
//! | [`DeviceViewMut::combine_from`] | `self[i] = f(self[i], src[i])` for every element, split among a [`Coop`] | both lengths, once |
//! | [`DeviceViewMut::fill`] | one value into every element, split among a [`Coop`] | none needed |
//!
//! **Data, not synchronization.** The accesses are weak (plain `ld.global` / `st.global` on
//! the GPU): they order nothing. Publish what a kernel wrote with a release (a channel's
//! `signal`, a block barrier, a grid barrier) and read what others wrote after the matching
//! acquire. Do not poll a view for a flag: use a semaphore.
//!
//! **Concurrent writes.** Every thread of a launch gets the same view, and views are `Copy`:
//! nothing stops two threads (or a thread and a peer's channel `put`) from writing the same
//! element at once, on the GPU or in the emulator. Then the value read back is unspecified,
//! as on a GPU; it is one of the values written only for elements of one word. Memory is never
//! accessed outside the view either way. In the emulator each element access is a relaxed
//! atomic access of the element's width, so racing element accesses of kernel threads are no
//! undefined behaviour there either; bulk copies (`copy_from`, channel `put`) are plain
//! copies, as on the GPU, and so are the element-wise passes (`combine_from`,
//! `combine_two`) over the contiguous share each emulator thread takes: plain loads and
//! stores the compiler can turn into vector instructions, as `nvcc` does on the GPU.
//!
//! Element types are [`Element`]: the plain numbers kernels use (`u8` to `u64`, `i8` to
//! `i64`, `f32`, `f64`), the 16-bit floats `half::f16` and `half::bf16` (each moves as a
//! `u16`) and [`arch::Word16`].

use crate::arch::{self, GlobalWord, Word16};
use crate::coop::Coop;
use crate::copy;
use crate::error::{DeviceError, DeviceOp};
use core::marker::PhantomData;
use core::ops::Range;

/// A type a device view holds: plain data that one global load or store moves whole, aligned
/// as its word.
///
/// Sealed: implemented for `u8`, `u16`, `u32`, `u64`, `i8`, `i16`, `i32`, `i64`, `f32`, `f64`,
/// `half::f16`, `half::bf16` and [`Word16`].
pub trait Element: bytemuck::Pod + Send + Sync + sealed::Sealed {
    /// The word that moves one element: an unsigned integer (or [`Word16`]) of the same size
    /// and alignment.
    type Word: GlobalWord + bytemuck::Pod;
}

mod sealed {
    /// Only the types listed on [`super::Element`]: each needs a word of its exact size and
    /// alignment.
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $word:ty),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            type Word = $word;
        }
        const _: () = assert!(
            core::mem::size_of::<$t>() == core::mem::size_of::<$word>()
                && core::mem::align_of::<$t>() == core::mem::align_of::<$word>()
        );
    )*};
}

element! {
    u8 => u8, i8 => u8,
    u16 => u16, i16 => u16,
    u32 => u32, i32 => u32, f32 => u32,
    u64 => u64, i64 => u64, f64 => u64,
    half::f16 => u16, half::bf16 => u16,
    Word16 => Word16,
}

/// `len` elements of `T` in device memory that a kernel reads. Valid for `'a`, the borrow of
/// the device buffer the host made it from; the zeroed view (`Default`) is empty.
#[repr(C)]
pub struct DeviceView<'a, T> {
    /// Address of element 0; 0 only for an empty view. Aligned for `T`.
    addr: u64,
    /// Elements of `T` at `addr`, all readable for `'a`.
    len: u64,
    _elem: PhantomData<&'a [T]>,
}

/// `len` elements of `T` in device memory that a kernel reads and writes. Valid for `'a`,
/// the borrow of the device buffer the host made it from; the zeroed view (`Default`) is
/// empty.
///
/// `Copy`, as every kernel parameter: each thread of the launch holds the same view. See the
/// module docs for what concurrent writes to one element mean.
#[repr(C)]
pub struct DeviceViewMut<'a, T> {
    /// Address of element 0; 0 only for an empty view. Aligned for `T`.
    addr: u64,
    /// Elements of `T` at `addr`, all readable and writable for `'a`.
    len: u64,
    _elem: PhantomData<&'a [T]>,
}

const _: () = assert!(core::mem::size_of::<DeviceView<'static, u8>>() == 16);
const _: () = assert!(core::mem::size_of::<DeviceViewMut<'static, u8>>() == 16);
const _: () = assert!(core::mem::offset_of!(DeviceView<'static, u8>, len) == 8);
const _: () = assert!(core::mem::offset_of!(DeviceViewMut<'static, u8>, len) == 8);

// SAFETY: values safe code can hold are built by `from_raw_parts` (memory live, aligned and
// accessible for 'a), by `slice` of one (a sub-range of it), or zeroed (empty: every access
// is refused before memory is touched); no drop glue. Concurrent accesses through copies of
// one view give unspecified values, never accesses outside it (see the module docs).
unsafe impl<T: Element> crate::launch::KernelArg for DeviceView<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Element> crate::launch::KernelArg for DeviceViewMut<'_, T> {}

// Manual impls: derives would bound `T` although only an address and a length are held.
macro_rules! common_impls {
    ($view:ident) => {
        impl<T> Clone for $view<'_, T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $view<'_, T> {}
        impl<T> Default for $view<'_, T> {
            /// The empty view: every access is out of range.
            fn default() -> Self {
                $view {
                    addr: 0,
                    len: 0,
                    _elem: PhantomData,
                }
            }
        }
        impl<T> PartialEq for $view<'_, T> {
            /// The same memory: address and length.
            fn eq(&self, other: &Self) -> bool {
                (self.addr, self.len) == (other.addr, other.len)
            }
        }
        impl<T> Eq for $view<'_, T> {}
        impl<T> core::fmt::Debug for $view<'_, T> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(
                    f,
                    concat!(stringify!($view), "<{}>({:#x}, len {})"),
                    core::any::type_name::<T>(),
                    self.addr,
                    self.len
                )
            }
        }

        impl<'a, T: Element> $view<'a, T> {
            /// A view of the `len` elements of `T` at `addr`.
            ///
            /// # Safety
            /// For `'a`, `addr..addr + len * size_of::<T>()` is live device memory (global
            /// memory on the GPU: a device allocation, mapped peer memory, device-mapped host
            /// memory) that every thread of the kernels it is passed to may access as the
            /// view's type allows, aligned for `T`, and not freed or unmapped meanwhile; an
            /// `addr` of 0 comes with a `len` of 0. Other agents may access the memory too:
            /// that makes values unspecified, not the view unsound.
            pub const unsafe fn from_raw_parts(addr: u64, len: u64) -> Self {
                $view {
                    addr,
                    len,
                    _elem: PhantomData,
                }
            }

            /// Number of elements.
            pub const fn len(&self) -> u64 {
                self.len
            }

            /// Whether the view has no elements.
            pub const fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Device address of element 0 (0 for the zeroed view).
            pub const fn addr(&self) -> u64 {
                self.addr
            }

            /// Whether this view's bytes and `other`'s overlap (an in-place call whose
            /// output is its input, or holds it).
            pub const fn overlaps<U>(&self, other: DeviceView<'_, U>) -> bool {
                let (bytes, other_bytes) = (
                    self.len * core::mem::size_of::<T>() as u64,
                    other.len * core::mem::size_of::<U>() as u64,
                );
                self.addr < other.addr.saturating_add(other_bytes)
                    && other.addr < self.addr.saturating_add(bytes)
            }

            /// Reads element `i` (one weak load; see the module docs).
            ///
            /// # Errors
            /// [`DeviceError::OutOfRange`] if `i >= len()`; nothing is read.
            #[inline(always)]
            pub fn get(&self, i: u64) -> Result<T, DeviceError> {
                let addr = element_addr::<T>(self.addr, self.len, i)?;
                // SAFETY: element `i` lies inside the view (checked), which the constructor's
                // contract keeps readable and aligned for `T` (so for `T::Word`, of the same
                // size and alignment) in global memory for 'a.
                let word = unsafe { T::Word::load_global(addr) };
                Ok(bytemuck::cast(word))
            }

            /// The view of elements `range` of this one.
            ///
            /// # Errors
            /// [`DeviceError::OutOfRange`] if the range is reversed or ends past `len()`.
            #[inline(always)]
            pub fn slice(&self, range: Range<u64>) -> Result<Self, DeviceError> {
                let addr = sub_range::<T>(self.addr, self.len, &range)?;
                Ok($view {
                    addr,
                    len: range.end - range.start,
                    _elem: PhantomData,
                })
            }

            /// The same bytes as elements of `U`: a byte view of a buffer as the element type
            /// a kernel chose at run time, say.
            ///
            /// # Errors
            /// [`DeviceError::OutOfRange`] if the view's address is not aligned for `U` or its
            /// bytes are not a whole number of `U`s.
            #[inline(always)]
            pub fn cast<U: Element>(&self) -> Result<$view<'a, U>, DeviceError> {
                let bytes = self.len * core::mem::size_of::<T>() as u64;
                let size = core::mem::size_of::<U>() as u64;
                if !self.addr.is_multiple_of(core::mem::align_of::<U>() as u64)
                    || !bytes.is_multiple_of(size)
                {
                    return Err(fail(self.addr, bytes, size));
                }
                Ok($view {
                    addr: self.addr,
                    len: bytes / size,
                    _elem: PhantomData,
                })
            }
        }
    };
}

common_impls!(DeviceView);
common_impls!(DeviceViewMut);

impl<'a, T: Element> DeviceViewMut<'a, T> {
    /// Writes `value` as element `i` (one weak store; see the module docs).
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`] if `i >= len()`; nothing is written.
    #[inline(always)]
    pub fn set(&self, i: u64, value: T) -> Result<(), DeviceError> {
        let addr = element_addr::<T>(self.addr, self.len, i)?;
        let word: T::Word = bytemuck::cast(value);
        // SAFETY: element `i` lies inside the view (checked), which the constructor's contract
        // keeps writable and aligned for `T` (so for `T::Word`) in global memory for 'a.
        unsafe { word.store_global(addr) };
        Ok(())
    }

    /// The same elements, read only.
    pub const fn as_view(&self) -> DeviceView<'a, T> {
        DeviceView {
            addr: self.addr,
            len: self.len,
            _elem: PhantomData,
        }
    }

    /// Fills this view with the first `len()` elements of `src`, split among `coop` (every
    /// thread of it calls this with the same arguments). The copy moves the widest words
    /// both ends allow (see [`crate::copy`]); like a channel `put` it orders nothing for
    /// other threads, so a barrier or a signal must follow before they read the result.
    ///
    /// `src` may overlap this view (the same buffer, say): what lands where they overlap is
    /// then unspecified, as for any copy split among threads.
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`] if `src` is shorter than this view; nothing is copied.
    #[inline(always)]
    pub fn copy_from(&self, coop: impl Coop, src: DeviceView<'_, T>) -> Result<(), DeviceError> {
        if src.len < self.len {
            return Err(fail(0, self.len, src.len));
        }
        let bytes = self.len * core::mem::size_of::<T>() as u64;
        // SAFETY: both ranges lie inside their views (`self.len <= src.len`), which their
        // constructors keep readable (`src`) and writable (`self`) global memory for their
        // lifetimes, borrowed for this call; `copy` tolerates overlap.
        unsafe { copy::copy(coop, self.addr, src.addr, bytes) };
        Ok(())
    }

    /// Sets every element `i` of this view to `f(self[i], src[i])`, split among `coop` (every
    /// thread of it calls this with the same arguments): an element-wise reduction such as
    /// `|a, b| a + b`. The lengths are checked once, so each element costs two loads and a
    /// store. Orders nothing for other threads (see [`Self::copy_from`]); `src` may be this
    /// very memory (then `f` sees each element twice).
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`] if `src` is shorter than this view; nothing is written.
    #[inline(always)]
    pub fn combine_from(
        &self,
        coop: impl Coop,
        src: DeviceView<'_, T>,
        f: impl Fn(T, T) -> T,
    ) -> Result<(), DeviceError> {
        if src.len < self.len {
            return Err(fail(0, self.len, src.len));
        }
        let split = coop.split(self.len);
        if let Some(range) = split.as_range().filter(|_| CONTIGUOUS_PLAIN) {
            // SAFETY: `range` lies below `len`, and `src` holds at least `len` elements
            // (checked): inside both views, aligned, accessible for their lifetimes.
            unsafe { plain_pass(self.addr, self.addr, src.addr, range, |a, b, _| f(a, b)) };
            return Ok(());
        }
        let size = core::mem::size_of::<T>() as u64;
        let (first, end, stride) = split.bounds();
        // Addresses step by the stride rather than being recomputed from an index: the loop
        // keeps two addresses and an end live, no index (what nvcc makes of the same loop).
        let (mut dst, mut from) = (self.addr + first * size, src.addr + first * size);
        let dst_end = self.addr + end.max(first) * size;
        let step = stride * size;
        while dst < dst_end {
            // SAFETY: `dst` is element `i < len` of this view and `from` element `i` of `src`,
            // which holds at least `len` (checked): inside both views, aligned for `T`, in the
            // memory their constructors keep accessible for their lifetimes.
            unsafe {
                let a: T = bytemuck::cast(T::Word::load_global(dst));
                let b: T = bytemuck::cast(T::Word::load_global(from));
                let out: T::Word = bytemuck::cast(f(a, b));
                out.store_global(dst);
            }
            dst += step;
            from += step;
        }
        Ok(())
    }

    /// Sets every element `i` of this view to `f(a[i], b[i])`, split among `coop` (every
    /// thread of it calls this with the same arguments): an element-wise reduction of two
    /// sources in one pass. Either source may be this very memory (each element is read
    /// before it is written, by the same thread). Orders nothing for other threads (see
    /// [`Self::copy_from`]).
    ///
    /// # Errors
    /// [`DeviceError::OutOfRange`] if a source is shorter than this view; nothing is written.
    #[inline(always)]
    pub fn combine_two(
        &self,
        coop: impl Coop,
        a: DeviceView<'_, T>,
        b: DeviceView<'_, T>,
        f: impl Fn(T, T) -> T,
    ) -> Result<(), DeviceError> {
        if a.len < self.len || b.len < self.len {
            return Err(fail(0, self.len, a.len.min(b.len)));
        }
        let split = coop.split(self.len);
        if let Some(range) = split.as_range().filter(|_| CONTIGUOUS_PLAIN) {
            // SAFETY: `range` lies below `len`, and `a` and `b` hold at least `len` elements
            // (checked): inside all three views, aligned, accessible for their lifetimes.
            unsafe { plain_pass(self.addr, a.addr, b.addr, range, |x, y, _| f(x, y)) };
            return Ok(());
        }
        let size = core::mem::size_of::<T>() as u64;
        let (first, end, stride) = split.bounds();
        let mut off = first * size;
        let off_end = end.max(first) * size;
        let step = stride * size;
        while off < off_end {
            // SAFETY: `off` is element `i < len` of this view, and of `a` and `b`, which hold
            // at least `len` (checked): inside all three views, aligned for `T`, in memory
            // their constructors keep accessible for their lifetimes.
            unsafe {
                let x: T = bytemuck::cast(T::Word::load_global(a.addr + off));
                let y: T = bytemuck::cast(T::Word::load_global(b.addr + off));
                let out: T::Word = bytemuck::cast(f(x, y));
                out.store_global(self.addr + off);
            }
            off += step;
        }
        Ok(())
    }

    /// Writes `value` into every element, split among `coop` (every thread of it calls this
    /// with the same arguments). Orders nothing for other threads (see
    /// [`Self::copy_from`]).
    #[inline(always)]
    pub fn fill(&self, coop: impl Coop, value: T) {
        let word: T::Word = bytemuck::cast(value);
        let size = core::mem::size_of::<T>() as u64;
        for i in coop.split(self.len) {
            // SAFETY: `i < len` (the split's indices are below its count), so the element
            // lies inside the view, writable and aligned for `T` for 'a.
            unsafe { word.store_global(self.addr + i * size) };
        }
    }
}

impl<'a, T: Element> From<DeviceViewMut<'a, T>> for DeviceView<'a, T> {
    fn from(view: DeviceViewMut<'a, T>) -> Self {
        view.as_view()
    }
}

/// Whether element-wise passes over a contiguous share use plain loads and stores: on the
/// host (the emulator), where each thread's share is one contiguous range, and not under
/// loom, which must see every access of its models as an atomic one.
const CONTIGUOUS_PLAIN: bool = cfg!(not(any(target_arch = "nvptx64", oxccl_loom)));

/// Sets `dst[i] = f(a[i], b[i], i)` for every `i` in `range`, with plain loads and stores
/// (vectorised by the compiler). `a` or `b` may be `dst` itself: each element is read before
/// it is written.
///
/// The compiler vectorises a loop over pointers it cannot tell apart only behind a check at
/// run time that their ranges do not overlap, and runs a scalar loop where they do: an
/// in-place pass (`dst` is `a` or `b`) would always take it, at a quarter of the speed for
/// `f32` sums. So the pass is written once per case, each loop naming a source that is the
/// destination by the destination's own pointer: element `i` of both is then one address,
/// which vectorises as it is, and only the distinct pointers are checked.
///
/// # Safety
/// Elements `range` of `T` at `dst`, `a` and `b` are in live memory the host may read (and
/// write, at `dst`), aligned for `T`.
#[inline(always)]
unsafe fn plain_pass<T: Element>(
    dst: u64,
    a: u64,
    b: u64,
    range: Range<u64>,
    f: impl Fn(T, T, u64) -> T,
) {
    let dst = dst as usize as *mut T;
    let (a, b) = (a as usize as *const T, b as usize as *const T);
    let here = dst.cast_const();
    if a == here {
        // SAFETY: forwarded contract (`a` is `dst`).
        unsafe { plain_loop(dst, here, b, range, f) }
    } else if b == here {
        // SAFETY: forwarded contract (`b` is `dst`).
        unsafe { plain_loop(dst, a, here, range, f) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { plain_loop(dst, a, b, range, f) }
    }
}

/// The loop of [`plain_pass`].
///
/// # Safety
/// As [`plain_pass`].
#[inline(always)]
unsafe fn plain_loop<T: Element>(
    dst: *mut T,
    a: *const T,
    b: *const T,
    range: Range<u64>,
    f: impl Fn(T, T, u64) -> T,
) {
    for i in range {
        // SAFETY: element `i` of each lies in the range the caller vouched for.
        unsafe {
            let v = f(a.add(i as usize).read(), b.add(i as usize).read(), i);
            dst.add(i as usize).write(v);
        }
    }
}

/// Address of element `i` of a view of `len` elements of `T` at `addr`, or the failure.
#[inline(always)]
fn element_addr<T>(addr: u64, len: u64, i: u64) -> Result<u64, DeviceError> {
    if i < len {
        // No overflow: the view's elements all lie in the address space (its contract).
        Ok(addr + i * core::mem::size_of::<T>() as u64)
    } else {
        Err(fail(i, 0, len))
    }
}

/// Address of element `range.start` of a view of `len` elements of `T` at `addr`, if the
/// range lies inside it.
#[inline(always)]
fn sub_range<T>(addr: u64, len: u64, range: &Range<u64>) -> Result<u64, DeviceError> {
    if range.start <= range.end && range.end <= len {
        Ok(addr + range.start * core::mem::size_of::<T>() as u64)
    } else {
        Err(fail(range.start, range.end, len))
    }
}

/// Notes an access outside a view (for the emulator's report of the kernel's error) and
/// returns the error. Inline and with no record to write, so the failure branch costs a few
/// instructions and no call frame on the GPU.
#[inline(always)]
fn fail(index: u64, end: u64, len: u64) -> DeviceError {
    arch::note_failure(
        DeviceError::OutOfRange,
        DeviceOp::View,
        0,
        [index, end, len],
    );
    DeviceError::OutOfRange
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    fn view_of<T: Element>(data: &mut [T]) -> DeviceViewMut<'_, T> {
        // SAFETY: `data` is live, aligned and only used through the view for its borrow.
        unsafe {
            DeviceViewMut::from_raw_parts(data.as_mut_ptr() as usize as u64, data.len() as u64)
        }
    }

    /// Guards against an index past the end reaching memory: the access is refused, and
    /// nothing around the view changes.
    #[test]
    fn out_of_range_is_an_error_not_an_access() {
        let mut data = [1u32, 2, 3, 4, 5];
        let view = view_of(&mut data[1..4]);
        assert_eq!(view.get(0), Ok(2));
        assert_eq!(view.get(2), Ok(4));
        assert_eq!(view.get(3), Err(DeviceError::OutOfRange));
        assert_eq!(view.get(u64::MAX), Err(DeviceError::OutOfRange));
        assert_eq!(view.set(3, 9), Err(DeviceError::OutOfRange));
        view.set(2, 40).unwrap();
        assert_eq!(data, [1, 2, 3, 40, 5]);
        let empty = DeviceView::<f64>::default();
        assert_eq!(empty.get(0), Err(DeviceError::OutOfRange));
    }

    /// Guards against a sub-view that reaches past its parent, or that starts at the wrong
    /// element.
    #[test]
    fn slices_stay_inside() {
        let mut data = [0i64; 8];
        let view = view_of(&mut data);
        let mid = view.slice(2..6).unwrap();
        assert_eq!(mid.len(), 4);
        mid.set(0, -7).unwrap();
        assert_eq!(mid.slice(4..4).map(|v| v.len()), Ok(0));
        assert_eq!(mid.slice(3..5), Err(DeviceError::OutOfRange));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = mid.slice(3..1);
        assert_eq!(reversed, Err(DeviceError::OutOfRange));
        assert_eq!(data[2], -7);
    }

    /// Guards against floats stored as converted integers rather than as their bits, and
    /// against copies and fills that write past the destination.
    #[test]
    fn floats_copies_and_fills() {
        let mut src = [1.5f32, -0.25, f32::INFINITY];
        let mut dst = [0f32; 4];
        let src = view_of(&mut src).as_view();
        let d = view_of(&mut dst);
        assert_eq!(
            d.copy_from(crate::coop::Thread, src),
            Err(DeviceError::OutOfRange)
        );
        d.slice(0..3)
            .unwrap()
            .copy_from(crate::coop::Thread, src)
            .unwrap();
        d.slice(0..2)
            .unwrap()
            .combine_from(crate::coop::Thread, src, |a, b| a * b)
            .unwrap();
        assert_eq!(d.get(1), Ok(0.0625));
        d.slice(0..2)
            .unwrap()
            .combine_from(crate::coop::Thread, src, |_, b| b)
            .unwrap();
        assert_eq!(
            d.combine_from(crate::coop::Thread, src, |a, _| a),
            Err(DeviceError::OutOfRange)
        );
        assert_eq!(d.get(1), Ok(-0.25));
        // The first elements of a longer source.
        d.slice(3..4)
            .unwrap()
            .copy_from(crate::coop::Thread, src)
            .unwrap();
        assert_eq!(d.get(3), Ok(1.5));
        d.slice(3..4).unwrap().fill(crate::coop::Thread, 8.0);
        assert_eq!(dst, [1.5, -0.25, f32::INFINITY, 8.0]);
    }

    /// Guards against a cast that miscounts elements or accepts a misaligned address, and a
    /// two-source combine that reads a source past its end.
    #[test]
    fn casts_and_two_source_combines() {
        let mut words = [0u64; 4];
        let bytes = view_of(&mut words).cast::<u8>().unwrap();
        assert_eq!(bytes.len(), 32);
        let floats = bytes.cast::<f32>().unwrap();
        assert_eq!(floats.len(), 8);
        assert_eq!(
            bytes.slice(1..9).unwrap().cast::<u64>(),
            Err(DeviceError::OutOfRange)
        );
        assert_eq!(
            bytes.slice(0..6).unwrap().cast::<f32>(),
            Err(DeviceError::OutOfRange)
        );
        let mut a = [1i32, 2, 3];
        let mut b = [10i32, 20, 30];
        let (a, b) = (view_of(&mut a).as_view(), view_of(&mut b).as_view());
        let mut out = [0i32; 3];
        let o = view_of(&mut out);
        o.combine_two(crate::coop::Thread, a, b, |x, y| x * y)
            .unwrap();
        assert_eq!(
            o.combine_two(crate::coop::Thread, a.slice(0..2).unwrap(), b, |x, _| x),
            Err(DeviceError::OutOfRange)
        );
        // A source that is the destination itself.
        o.combine_two(crate::coop::Thread, o.as_view(), a, |x, y| x - y)
            .unwrap();
        // The destination's own elements come first, the source's second.
        o.combine_from(crate::coop::Thread, b, |x, y| x - y)
            .unwrap();
        assert_eq!(out, [-1, 18, 57]);
        // A source that is the destination itself, second.
        let o = view_of(&mut out);
        o.combine_two(crate::coop::Thread, a, o.as_view(), |x, y| x - y)
            .unwrap();
        assert_eq!(out, [2, -16, -54]);
    }

    /// Guards against an element-wise pass that mixes up its sources, or skips or repeats
    /// elements, where one source is the destination (each case has a loop of its own on
    /// the host): long enough for vector loops and their scalar tails, an operation that
    /// tells its operands apart.
    #[test]
    fn passes_onto_themselves_keep_the_order_of_their_sources() {
        let n = 1003;
        let a: std::vec::Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: std::vec::Vec<f32> = (0..n).map(|i| (3 * i % 17) as f32).collect();
        let f = |x: f32, y: f32| x - 2.0 * y;
        let (mut a_copy, mut b_copy) = (a.clone(), b.clone());
        let (av, bv) = (
            view_of(&mut a_copy).as_view(),
            view_of(&mut b_copy).as_view(),
        );
        let want_ab: std::vec::Vec<f32> = a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect();
        let want_ba: std::vec::Vec<f32> = b.iter().zip(&a).map(|(&x, &y)| f(x, y)).collect();
        // The destination first.
        let mut dst = a.clone();
        let d = view_of(&mut dst);
        d.combine_two(crate::coop::Thread, d.as_view(), bv, f)
            .unwrap();
        assert_eq!(dst, want_ab);
        let mut dst = a.clone();
        let d = view_of(&mut dst);
        d.combine_from(crate::coop::Thread, bv, f).unwrap();
        assert_eq!(dst, want_ab);
        // The destination second.
        let mut dst = a.clone();
        let d = view_of(&mut dst);
        d.combine_two(crate::coop::Thread, bv, d.as_view(), f)
            .unwrap();
        assert_eq!(dst, want_ba);
        // Neither.
        let mut dst = std::vec![0.0f32; n];
        view_of(&mut dst)
            .combine_two(crate::coop::Thread, av, bv, f)
            .unwrap();
        assert_eq!(dst, want_ab);
    }
}
