//! What a kernel may return: nothing, or `Result<(), DeviceError>`.
//!
//! A kernel that returns an error has already recorded it in the failing channel's abort
//! record where the handle has one. On the CPU emulator the launch also reports the
//! returned error (with the failing call's details) from `synchronize`. On the GPU a kernel
//! cannot return a value to the host: an error with no record to carry it (a zeroed handle,
//! an unsupported launch, an index out of range of a view or a channel set) stops the kernel
//! with `trap`, so the launch fails visibly instead of succeeding silently.

use crate::DeviceError;

/// A kernel's return type: `()` or `Result<(), DeviceError>`.
pub trait KernelReturn {
    /// The outcome as a `Result`.
    fn into_result(self) -> Result<(), DeviceError>;
}

impl KernelReturn for () {
    #[inline(always)]
    fn into_result(self) -> Result<(), DeviceError> {
        Ok(())
    }
}

impl KernelReturn for Result<(), DeviceError> {
    #[inline(always)]
    fn into_result(self) -> Result<(), DeviceError> {
        self
    }
}

/// Ends a kernel on the GPU with its outcome (see the module docs).
#[inline(always)]
pub fn finish_on_device(outcome: impl KernelReturn) {
    if let Err(DeviceError::NullHandle | DeviceError::UnsupportedLaunch | DeviceError::OutOfRange) =
        outcome.into_result()
    {
        crate::arch::trap()
    }
}

/// Checks, at the top of a kernel on the GPU, that the grid has at most `max_blocks` blocks
/// (0: any); `#[kernel(max_blocks = N)]` calls it. The host launcher refuses such launches
/// before they start, so this only catches launches made some other way.
#[inline(always)]
pub fn check_blocks_on_device(max_blocks: u32) {
    if max_blocks != 0 && crate::arch::blocks_per_grid() > max_blocks {
        crate::arch::trap()
    }
}
