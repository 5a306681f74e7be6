//! Kernels that check a backend end to end: memory the device writes, read back by the host.

use oxccl_device::error::DeviceError;
use oxccl_device::{DeviceViewMut, arch, kernel};

/// Sets `out[i] = first + i` (wrapping) for every element, the grid's threads striding over
/// the buffer.
///
/// # Errors
/// None in practice: every index written lies inside the view.
#[kernel]
pub fn fill_sequence(out: DeviceViewMut<'_, u32>, first: u32) -> Result<(), DeviceError> {
    let threads = arch::grid_dim().volume() * arch::block_dim().volume();
    let mut i = arch::thread_rank_in_grid();
    while i < out.len() {
        out.set(i, first.wrapping_add(i as u32))?;
        i += threads;
    }
    Ok(())
}
