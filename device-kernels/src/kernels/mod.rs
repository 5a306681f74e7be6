//! Kernels shipped with oxccl, each written once for the GPU and the CPU emulator.
//!
//! Conventions:
//! - A kernel returns `Result<(), DeviceError>`: a failing call has recorded its error in its
//!   channel's abort record (the host names the channel), and the emulator also reports the
//!   returned error from `synchronize`.
//! - Where one thread waits for the block, the block decides together whether to stop with
//!   [`block_agrees`], so no thread is left waiting at a barrier the others never reach.
//!   Calls that every thread makes with the same arguments (bounds checks of a split copy)
//!   fail alike on every thread.
//! - Every kernel may be launched again on the same channels right after the previous
//!   launch, with no host barrier: kernels that write into a peer's buffer first take part
//!   in a ready handshake ([`ready_handshake`]) or use per-call flags and slot sets.
//! - Kernels written for one block say so (`#[kernel(max_blocks = 1)]`): a larger grid is
//!   refused before it runs.

pub mod all_reduce;
pub mod packet_all_reduce;
pub mod packet_exchange;
pub mod pingpong;
pub mod probes;
pub mod ring_exchange;

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

/// The ready handshake of a ring, done by one thread: tell `prev` that our buffers may be
/// written (every earlier kernel on our stream, which may still have read them, is done),
/// then wait until `next` says the same of its buffers. A kernel that writes into `next`'s
/// memory does this first, so a launch never overwrites what the previous launch on `next`
/// has not consumed yet, however far ahead of `next` this rank runs.
///
/// `signal_prev` raises the semaphore `prev` waits on for our readiness; `wait_next` waits
/// for `next`'s. Release and acquire: our earlier reads are ordered before `prev`'s writes.
#[inline(always)]
pub fn ready_handshake(
    signal_prev: impl FnOnce() -> Result<(), DeviceError>,
    wait_next: impl FnOnce() -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    signal_prev()?;
    wait_next()
}
