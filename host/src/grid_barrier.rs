//! Grid barriers on the host: the counters of [`oxccl_device::grid_barrier`] in device
//! memory, and where a barrier's failures go. [`GridBarrier::device_handle`] is what
//! cooperative kernels get.
//!
//! Built by [`Device::grid_barrier`] (failures recorded in the barrier, read back with
//! [`GridBarrier::check`]) or [`Communicator::grid_barrier`](crate::Communicator::grid_barrier)
//! (its waits also stop when the rank is stopped, and a timeout stops the rank's other
//! waits, as a channel's does).
//!
//! The counters start at zero and are never reset: the protocol leaves them ready for the
//! next barrier, call after call and launch after launch. A barrier that failed (a block
//! never arrived) leaves them out of step: build a new one.

use crate::channel_abort::ChannelAbort;
use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::{Error, Result};
use oxccl_device::DeviceError;
use oxccl_device::abort::AbortRecord;
use oxccl_device::grid_barrier::{GridBarrierDeviceHandle, GridBarrierRawParts};
use oxccl_proxy::HostCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The site (abort-record number) grid barriers record their failures under.
pub const GRID_BARRIER_SITE: u32 = u32::MAX - 2;

/// `u64` index of the arrival counter in the cells.
const COUNT: usize = 0;
/// `u64` index of the generation counter: 128 bytes on, so the waiting blocks' polls never
/// share a cache line (or an adjacent-line prefetch pair) with the arrivals.
const GENERATION: usize = 16;
const CELLS: usize = GENERATION + 1;

/// A grid barrier: two counters in device memory that the blocks of a cooperative kernel
/// meet at (see [`oxccl_device::grid_barrier`]).
///
/// # Examples
/// ```
/// use oxccl_device::{DeviceError, DeviceViewMut, arch, grid_barrier::GridBarrierDeviceHandle, kernel};
/// use oxccl_device::launch::LaunchConfig;
/// use std::time::Duration;
///
/// /// Each block writes its rank, then (after the barrier) reads its neighbour's.
/// #[kernel(cooperative)]
/// fn neighbours(
///     barrier: GridBarrierDeviceHandle<'_>,
///     slots: DeviceViewMut<'_, u32>,
///     seen: DeviceViewMut<'_, u32>,
/// ) -> Result<(), DeviceError> {
///     let (me, blocks) = (arch::block_rank(), arch::blocks_per_grid());
///     slots.set(me as u64, me)?;
///     barrier.sync_grid()?;
///     seen.set(me as u64, slots.get(((me + 1) % blocks) as u64)?)
/// }
///
/// fn main() -> Result<(), oxccl::Error> {
///     let device = oxccl::Device::cpu(0);
///     let barrier = device.grid_barrier(Duration::from_secs(10))?;
///     let (slots, seen) = (device.alloc::<u32>(4)?, device.alloc::<u32>(4)?);
///     let stream = device.stream()?;
///     neighbours::launch(&stream, LaunchConfig::grid(4), barrier.device_handle(), slots.view_mut(), seen.view_mut())?;
///     stream.synchronize()?;
///     assert_eq!(seen.to_vec()?, [1, 2, 3, 0]);
///     barrier.check()
/// }
/// ```
#[derive(Debug)]
pub struct GridBarrier {
    /// Zeroed at allocation; `COUNT` and `GENERATION` are the counters.
    cells: DeviceBuffer<u64>,
    abort: ChannelAbort,
    /// The stop word is the barrier's own (not a rank's): `check` lowers it.
    own_stop: bool,
}

impl GridBarrier {
    /// A barrier on `device` whose waits give up after `timeout`, recording failures in its
    /// own record, or raising `stop` (a rank's stop word) too if given.
    pub(crate) fn new(
        device: &Device,
        timeout: Duration,
        stop: Option<HostCell<AtomicU64>>,
    ) -> Result<GridBarrier> {
        if timeout.is_zero() {
            return Err(Error::InvalidUsage(
                "a grid barrier's timeout is zero, which would let its waits wait forever; \
                 every wait needs a limit"
                    .into(),
            ));
        }
        let own_stop = stop.is_none();
        Ok(GridBarrier {
            cells: device.alloc_zeroed::<u64>(CELLS)?,
            abort: ChannelAbort {
                record: device.host_cell(AbortRecord::new())?,
                stop: match stop {
                    Some(stop) => stop,
                    None => device.host_cell(AtomicU64::new(0))?,
                },
                timeout,
                site: GRID_BARRIER_SITE,
            },
            own_stop,
        })
    }

    /// The kernel-side handle, valid while the barrier is borrowed.
    pub fn device_handle(&self) -> GridBarrierDeviceHandle<'_> {
        let raw = GridBarrierRawParts {
            count: self.cells.addr() + (COUNT * 8) as u64,
            generation: self.cells.addr() + (GENERATION * 8) as u64,
        };
        // SAFETY: the counters are zeroed device memory `self.cells` owns, 8-byte aligned
        // (page-aligned buffer), alive for the borrow (and while kernels run: the buffer's
        // last drop waits for the device), only ever touched by grid barrier handles made
        // here, atomically.
        unsafe { GridBarrierDeviceHandle::from_raw_parts(raw, self.abort.wait_policy()) }
    }

    /// How long one wait at the barrier may take.
    pub fn timeout(&self) -> Duration {
        self.abort.timeout
    }

    /// Reports a failure of the barrier since the last call (and forgets it): a wait that
    /// timed out because a block never arrived, or a call it refused. Call it after
    /// synchronizing the kernels that used the barrier.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming the barrier waited for and the blocks that had arrived;
    /// [`Error::InvalidUsage`] for a refused call (a block outside the blocks asked for, or
    /// more blocks than the grid has); [`Error::Aborted`] if the rank was stopped.
    pub fn check(&self) -> Result<()> {
        let Some(reason) = self.abort.record.read() else {
            return Ok(());
        };
        self.abort.record.clear();
        if self.own_stop {
            // Relaxed: only the host lowers it, after the kernels that could raise it.
            self.abort.stop.store(0, Ordering::Relaxed);
        }
        let [d0, d1, d2] = reason.detail.unwrap_or_default();
        Err(match reason.error {
            Some(DeviceError::Timeout) => Error::Timeout {
                what: format!(
                    "grid barrier: at barrier {d0} of its counters, {d1} of {d2} blocks had \
                     arrived (a block never reached it: every block of a cooperative kernel \
                     must call it the same number of times); the barrier is now out of step, \
                     build a new one"
                ),
                after: self.abort.timeout,
            },
            Some(DeviceError::InvalidArgument) => Error::InvalidUsage(format!(
                "grid barrier: block {d2} called it for {d0} blocks in a grid of {d1} (only \
                 the first `blocks` blocks may, and no more than the grid has)"
            )),
            Some(DeviceError::Aborted) => {
                Error::Aborted("grid barrier: its wait stopped because the rank was stopped".into())
            }
            error => Error::Internal(format!(
                "grid barrier failed in {}: {error:?} (details {:?})",
                reason.op, reason.detail
            )),
        })
    }
}

impl Device {
    /// A grid barrier on this device whose waits give up after `timeout` (see
    /// [`GridBarrier`]).
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for a zero timeout; the allocation failed.
    pub fn grid_barrier(&self, timeout: Duration) -> Result<GridBarrier> {
        GridBarrier::new(self, timeout, None)
    }
}
