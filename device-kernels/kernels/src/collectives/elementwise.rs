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
    match n {
        0 => Ok(()),
        1 => {
            dst.copy_from(Grid, sources(0)?)?;
            if op == ReduceOp::Avg {
                dst.combine_from(Grid, dst.as_view(), |a, _| a.finish(op, 1))?;
            }
            Ok(())
        }
        _ => {
            let last = n - 1;
            dst.combine_two(Grid, sources(0)?, sources(1)?, |a, b| {
                let c = a.combine(b, op);
                if last == 1 { c.finish(op, n) } else { c }
            })?;
            for p in 2..n {
                dst.combine_from(Grid, sources(p)?, |a, b| {
                    let c = a.combine(b, op);
                    if p == last { c.finish(op, n) } else { c }
                })?;
            }
            Ok(())
        }
    }
}
