//! A block that decides together: one thread does a step that can fail, and every thread of
//! the block learns the outcome, so no thread is left waiting at a barrier the others never
//! reach.

use crate::arch;
use crate::error::DeviceError;

/// Runs `step` on thread 0 of the block, then has every thread of the block learn whether
/// it failed (a block barrier): `Ok` on every thread, or `Err(Aborted)` on every thread
/// (thread 0 returns its own error).
///
/// Every thread of the block must call it.
#[inline(always)]
pub fn block_agrees(step: impl FnOnce() -> Result<(), DeviceError>) -> Result<(), DeviceError> {
    let mine = if arch::thread_rank_in_block() == 0 {
        step()
    } else {
        Ok(())
    };
    if arch::sync_threads_or(mine.is_err()) {
        return Err(mine.err().unwrap_or(DeviceError::Aborted));
    }
    Ok(())
}
