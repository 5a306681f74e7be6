//! The ready handshake of kernels launched again and again on the same channels.
//!
//! A kernel that writes into a peer's buffer must not overwrite what the peer's previous
//! launch has not consumed yet. Without a handshake a rank that runs ahead of its peer by a
//! whole launch (or more, in a ring of more than two) does exactly that, and repeated launches
//! give wrong data. So the writer first learns that the peer is ready: each rank signals the
//! rank that writes into it, then waits for the rank it writes into.

use crate::error::DeviceError;

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
