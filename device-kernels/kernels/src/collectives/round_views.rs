//! The views of one round of a direct collective: our half of the scratch, a peer's, and
//! windows of the caller's buffers as the element type.

use super::collective_args::CollectiveArgs;
use super::rounds::elements_per_round;
use super::scratch_layout::parity;
use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::{DeviceView, DeviceViewMut};

/// Elements per round for `windows` windows of `T`, or `InvalidArgument` if none fit.
#[inline(always)]
pub(crate) fn per_round<T>(a: &CollectiveArgs<'_>, windows: u64) -> Result<u64, DeviceError> {
    match elements_per_round(&a.layout, core::mem::size_of::<T>() as u64, windows) {
        0 => Err(a.invalid([a.layout.half_bytes, windows, 0])),
        n => Ok(n),
    }
}

/// Half `parity(sequence)` of our scratch, as `T`s.
#[inline(always)]
pub(crate) fn my_half<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    sequence: u64,
) -> Result<(u64, DeviceViewMut<'a, T>), DeviceError> {
    let off = a.layout.half(parity(sequence));
    let half = a
        .scratch
        .slice(off..off + a.layout.half_bytes)?
        .cast::<T>()?;
    Ok((off, half))
}

/// `len` `T`s of peer `p`'s half at `half_off`, from element `first` on.
#[inline(always)]
pub(crate) fn peer_half<'a, T: ReduceElement>(
    a: &CollectiveArgs<'a>,
    p: u32,
    half_off: u64,
    first: u64,
    len: u64,
) -> Result<DeviceView<'a, T>, DeviceError> {
    let size = core::mem::size_of::<T>() as u64;
    a.peer(p)?.remote_view::<T>(half_off + first * size, len)
}

/// Elements `first..first + len` of `v`.
#[inline(always)]
pub(crate) fn window<'a, T: ReduceElement>(
    v: DeviceView<'a, T>,
    first: u64,
    len: u64,
) -> Result<DeviceView<'a, T>, DeviceError> {
    v.slice(first..first.saturating_add(len))
}

/// Elements `first..first + len` of `v`, writable.
#[inline(always)]
pub(crate) fn window_mut<'a, T: ReduceElement>(
    v: DeviceViewMut<'a, T>,
    first: u64,
    len: u64,
) -> Result<DeviceViewMut<'a, T>, DeviceError> {
    v.slice(first..first.saturating_add(len))
}

/// `v` as `T`s: `len` of them from element `first` on.
#[inline(always)]
pub(crate) fn typed<'a, T: ReduceElement>(
    v: DeviceView<'a, u8>,
    first: u64,
    len: u64,
) -> Result<DeviceView<'a, T>, DeviceError> {
    window(v.cast::<T>()?, first, len)
}

/// `v` as writable `T`s: `len` of them from element `first` on.
#[inline(always)]
pub(crate) fn typed_mut<'a, T: ReduceElement>(
    v: DeviceViewMut<'a, u8>,
    first: u64,
    len: u64,
) -> Result<DeviceViewMut<'a, T>, DeviceError> {
    window_mut(v.cast::<T>()?, first, len)
}

/// Stages round `off..off + len` of each of the `n` blocks of `count` elements of `input`
/// (block `p` starts at `p * count`) into `half`, block after block: what an all-to-all or
/// a reduce-scatter round stages, every peer's window at `p * len`; block `skip`, if any,
/// is left out (a block only this rank reads, straight from `input`).
///
/// # Errors
/// A window outside `input` or `half` ([`DeviceError::OutOfRange`]).
#[inline(always)]
pub(crate) fn stage_blocks<T: ReduceElement>(
    half: DeviceViewMut<'_, T>,
    input: DeviceView<'_, T>,
    n: u32,
    count: u64,
    off: u64,
    len: u64,
    skip: Option<u32>,
) -> Result<(), DeviceError> {
    for p in (0..n).filter(|&p| Some(p) != skip).map(u64::from) {
        window_mut(half, p * len, len)?.copy_from(Grid, window(input, p * count + off, len)?)?;
    }
    Ok(())
}
