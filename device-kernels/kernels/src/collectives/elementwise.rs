//! Element-wise steps of collectives over a grid: copies and rank-ordered reductions.

use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Where a reduction finds each rank's elements: [`reduce_ranks`]'s sources.
///
/// A closure does where finding them is short (a window of the scratch). Where it is long
/// (a peer's registered buffer, found through its descriptor and checked against the
/// table), a type of its own whose method is always inlined is better: the GPU compiler
/// keeps a long closure out of line even when it is called from one place, and the
/// kernel's arguments it borrows then live in local memory (some 2 KiB of stack a thread).
pub(crate) trait RankSources<'s, T: 's> {
    /// Rank `p`'s elements.
    fn of_rank(&self, p: u32) -> Result<DeviceView<'s, T>, DeviceError>;
}

impl<'s, T: 's, F> RankSources<'s, T> for F
where
    F: Fn(u32) -> Result<DeviceView<'s, T>, DeviceError>,
{
    #[inline(always)]
    fn of_rank(&self, p: u32) -> Result<DeviceView<'s, T>, DeviceError> {
        self(p)
    }
}

/// Sets `dst` to the reduction by `op` of `sources(0)`, `sources(1)`, .., `sources(n - 1)`,
/// combined in that order (rank order: every rank that reduces the same data gets the same
/// bits), finished for `n` ranks (`Avg` divides), split among the whole grid.
///
/// A source may be `dst` itself only if it is `sources(0)` or `sources(1)`: later passes
/// read `dst` as the partial result.
///
/// `sources` is called at one place only: a closure called from several places may stay
/// out of line on the GPU, and whatever it borrows (the kernel's arguments) then lives in
/// local memory (see [`RankSources`]). The operation is matched once per pass, so that
/// each pass's loop is the operation alone (a sum of `f32`s becomes vector additions), not
/// a branch per element.
///
/// # Errors
/// A source shorter than `dst` ([`DeviceError::OutOfRange`]), or `sources`' error.
#[inline(always)]
pub(crate) fn reduce_ranks<'s, T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    n: u32,
    op: ReduceOp,
    sources: impl RankSources<'s, T>,
) -> Result<(), DeviceError> {
    let mut first = DeviceView::default();
    for p in 0..n {
        let src = sources.of_rank(p)?;
        match p {
            0 if n == 1 => dst.copy_from(Grid, src)?,
            0 => first = src,
            1 => pass_of_two(dst, first, src, op)?,
            _ => pass_onto(dst, src, op)?,
        }
    }
    finish_ranks(dst, n, op)
}

/// Finishes a reduction by `op` of `n` ranks' elements in `dst` (`Avg` divides by `n`; the
/// other operations are finished already), split among the grid as the passes that made it
/// (each thread divides the elements it combined itself).
///
/// # Errors
/// None in practice (`dst` is its own source).
#[inline(always)]
pub(crate) fn finish_ranks<T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    n: u32,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    if op == ReduceOp::Avg && n > 1 {
        dst.combine_from(Grid, dst.as_view(), |a, _| a.finish(ReduceOp::Avg, n))?;
    }
    Ok(())
}

/// `dst = a ⊕ b`, `⊕` being `op` (not finished: `Avg` sums; see [`finish_ranks`]).
#[inline(always)]
pub(crate) fn pass_of_two<T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    a: DeviceView<'_, T>,
    b: DeviceView<'_, T>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    match op {
        ReduceOp::Sum => dst.combine_two(Grid, a, b, |x: T, y| x.combine(y, ReduceOp::Sum)),
        ReduceOp::Prod => dst.combine_two(Grid, a, b, |x: T, y| x.combine(y, ReduceOp::Prod)),
        ReduceOp::Min => dst.combine_two(Grid, a, b, |x: T, y| x.combine(y, ReduceOp::Min)),
        ReduceOp::Max => dst.combine_two(Grid, a, b, |x: T, y| x.combine(y, ReduceOp::Max)),
        ReduceOp::Avg => dst.combine_two(Grid, a, b, |x: T, y| x.combine(y, ReduceOp::Avg)),
    }
}

/// `dst = dst ⊕ src`, `⊕` being `op`.
#[inline(always)]
fn pass_onto<T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    src: DeviceView<'_, T>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    match op {
        ReduceOp::Sum => dst.combine_from(Grid, src, |x: T, y| x.combine(y, ReduceOp::Sum)),
        ReduceOp::Prod => dst.combine_from(Grid, src, |x: T, y| x.combine(y, ReduceOp::Prod)),
        ReduceOp::Min => dst.combine_from(Grid, src, |x: T, y| x.combine(y, ReduceOp::Min)),
        ReduceOp::Max => dst.combine_from(Grid, src, |x: T, y| x.combine(y, ReduceOp::Max)),
        ReduceOp::Avg => dst.combine_from(Grid, src, |x: T, y| x.combine(y, ReduceOp::Avg)),
    }
}
