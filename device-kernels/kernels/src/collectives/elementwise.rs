//! Element-wise steps of collectives over a grid: copies and rank-ordered reductions.

use oxccl_device::coop::Grid;
use oxccl_device::error::DeviceError;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Sets `dst` to the reduction by `op` of `sources(0)`, `sources(1)`, .., `sources(n - 1)`,
/// combined in that order (rank order: every rank that reduces the same data gets the same
/// bits), finished for `n` ranks (`Avg` divides), split among the whole grid.
///
/// A source may be `dst` itself only if it is `sources(0)` or `sources(1)`: later passes
/// read `dst` as the partial result.
///
/// # Errors
/// A source shorter than `dst` ([`DeviceError::OutOfRange`]), or `sources`' error.
#[inline(always)]
pub(crate) fn reduce_ranks<'s, T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    n: u32,
    op: ReduceOp,
    sources: impl Fn(u32) -> Result<DeviceView<'s, T>, DeviceError>,
) -> Result<(), DeviceError> {
    // One branch on the operation per call, so that each pass's loop is the operation
    // alone (a sum of `f32`s becomes vector additions), not a branch per element.
    match op {
        ReduceOp::Sum => combine_ranks(dst, n, &sources, |a: T, b| a.combine(b, ReduceOp::Sum)),
        ReduceOp::Prod => combine_ranks(dst, n, &sources, |a: T, b| a.combine(b, ReduceOp::Prod)),
        ReduceOp::Min => combine_ranks(dst, n, &sources, |a: T, b| a.combine(b, ReduceOp::Min)),
        ReduceOp::Max => combine_ranks(dst, n, &sources, |a: T, b| a.combine(b, ReduceOp::Max)),
        ReduceOp::Avg => {
            combine_ranks(dst, n, &sources, |a: T, b| a.combine(b, ReduceOp::Avg))?;
            if n > 1 {
                // Each thread divides the elements it summed: the pass splits as they did.
                dst.combine_from(Grid, dst.as_view(), |a, _| a.finish(ReduceOp::Avg, n))?;
            }
            Ok(())
        }
    }
}

/// `dst = sources(0) ⊕ sources(1) ⊕ ..` with `combine` as `⊕`, in rank order.
#[inline(always)]
fn combine_ranks<'s, T: ReduceElement>(
    dst: DeviceViewMut<'_, T>,
    n: u32,
    sources: &impl Fn(u32) -> Result<DeviceView<'s, T>, DeviceError>,
    combine: impl Fn(T, T) -> T + Copy,
) -> Result<(), DeviceError> {
    match n {
        0 => Ok(()),
        1 => dst.copy_from(Grid, sources(0)?),
        _ => {
            dst.combine_two(Grid, sources(0)?, sources(1)?, combine)?;
            for p in 2..n {
                dst.combine_from(Grid, sources(p)?, combine)?;
            }
            Ok(())
        }
    }
}
