//! The device call that last failed on this emulated kernel thread.
//!
//! A failure on a channel is recorded in the channel's abort record for the host. A handle
//! that was never set up has no record, and a kernel that returns an error may fail in a
//! call without one: the emulator keeps the last failure of each kernel thread here, so the
//! launch can say which call failed and why when the kernel returns the error.

use crate::error::{DeviceError, DeviceOp};
use std::cell::Cell;

/// A failed device call, as seen by the thread that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastFailure {
    /// The error.
    pub error: DeviceError,
    /// The call.
    pub op: DeviceOp,
    /// The handle's site (channel number), 0 for none.
    pub site: u32,
    /// The call's details (see [`DeviceOp`]).
    pub detail: [u64; 3],
}

std::thread_local! {
    static LAST: Cell<Option<LastFailure>> = const { Cell::new(None) };
}

/// Records a failure of the calling thread (the first since the thread entered its kernel
/// is kept: it is the cause, later ones are consequences).
#[inline(never)]
pub(crate) fn note_failure(error: DeviceError, op: DeviceOp, site: u32, detail: [u64; 3]) {
    LAST.with(|l| {
        if l.get().is_none() {
            l.set(Some(LastFailure {
                error,
                op,
                site,
                detail,
            }))
        }
    });
}

/// Takes the calling thread's recorded failure, if any.
#[inline(never)]
pub fn take_last_failure() -> Option<LastFailure> {
    LAST.with(Cell::take)
}
