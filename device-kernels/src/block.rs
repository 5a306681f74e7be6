//! A block that decides together: one thread does a step that can fail, and every thread of
//! the block learns the outcome, so no thread is left waiting at a barrier the others never
//! reach.
//!
//! The three shapes a kernel's steps take, each a call every thread of the block makes:
//!
//! | call | barriers | what it guarantees |
//! |---|---|---|
//! | [`block_signal`] | 2 | the block has written; thread 0 then signals: every thread's earlier writes are ordered before the signal |
//! | [`block_wait`] | 1 | thread 0 waits; the block proceeds (and sees what the signal published) or stops, together |
//! | [`block_signal_and_wait`] | 2 | both, the step of a ring: the block has written, thread 0 signals and waits |
//!
//! [`block_agrees`] is the general form under them: thread 0 runs any step, the block learns
//! the outcome. Each of these holds block barriers, so every thread of the block must call
//! it, with the same arguments, at the same point (the PTX check `cargo xtask build-ptx
//! --check` counts them as the barrier sites the table says).
//!
//! On errors: thread 0 returns its own error; every other thread returns
//! [`DeviceError::Aborted`], so a kernel that `?`s the call ends on every thread of the block,
//! and its failure is reported once (the failed call has recorded it in its channel's abort
//! record).

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

/// The block has written; one thread signals. A block barrier (every thread's earlier
/// writes are then ordered before what thread 0 does next), then `signal` on thread 0 (raise
/// one or more channels' semaphores), its outcome agreed by the block as [`block_agrees`]
/// does.
///
/// With a release signal (`MemoryChannelDeviceHandle::signal`) the peer that waits for it
/// sees every write the block made before this call: the barrier orders the block's writes
/// before thread 0's release, which is cumulative.
///
/// Every thread of the block must call it.
///
/// # Errors
/// `signal`'s error on thread 0, [`DeviceError::Aborted`] on the others.
#[inline(always)]
pub fn block_signal(signal: impl FnOnce() -> Result<(), DeviceError>) -> Result<(), DeviceError> {
    arch::sync_threads();
    block_agrees(signal)
}

/// One thread waits; the block proceeds or stops together. `wait` runs on thread 0 (wait
/// for one or more channels' signals), then a block barrier tells every thread its outcome.
///
/// When it returns `Ok`, every thread of the block sees what the signals thread 0 waited for
/// published (thread 0's acquire, then the barrier).
///
/// Every thread of the block must call it.
///
/// # Errors
/// `wait`'s error on thread 0 (a timeout, an abort), [`DeviceError::Aborted`] on the others.
#[inline(always)]
pub fn block_wait(wait: impl FnOnce() -> Result<(), DeviceError>) -> Result<(), DeviceError> {
    block_agrees(wait)
}

/// The step of a ring: the block has written, thread 0 signals, then waits, and the block
/// proceeds or stops together. [`block_signal`] and [`block_wait`] in one, with one barrier
/// less: the barrier that agrees on the signal's outcome is the one after the wait.
///
/// Every thread of the block must call it.
///
/// # Errors
/// The first error of `signal` and `wait` on thread 0 (`wait` does not run if `signal`
/// failed), [`DeviceError::Aborted`] on the others.
#[inline(always)]
pub fn block_signal_and_wait(
    signal: impl FnOnce() -> Result<(), DeviceError>,
    wait: impl FnOnce() -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    arch::sync_threads();
    block_agrees(|| {
        signal()?;
        wait()
    })
}
