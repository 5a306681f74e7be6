//! Bounded waiting: every device wait runs under a [`WaitPolicy`].
//!
//! Contract: a wait returns `Ok` once its condition holds, or an error once the policy's time
//! limit passes ([`DeviceError::Timeout`]) or the rank's stop word is raised
//! ([`DeviceError::Aborted`]: another channel failed, or the host stopped the rank). On
//! timeout it records the failure in its channel's abort record and raises the stop word
//! (see [`crate::abort`]), so the rank's other waits stop too and the host can report which
//! wait gave up, for what and after how long.
//!
//! The hot path of a wait is the condition alone; the clock and the stop word are read every
//! [`CHECK_EVERY`] polls, in a branch of their own.

use crate::abort::{self, AbortRecord};
use crate::arch::{self, Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::error::{DeviceError, DeviceOp};
use core::marker::PhantomData;

/// How often (in polls) a waiting thread looks at the clock and the stop word: checking
/// every poll would cost a global-timer read per spin on the GPU.
pub const CHECK_EVERY: u32 = 64;

/// The limit, the abort record and the stop word a device handle's waits and failures use.
///
/// Only the host builds one that names a record (`unsafe` [`Self::from_raw_parts`]); safe
/// code can make a standalone limit ([`Self::with_timeout_ns`]) or a zeroed policy, whose
/// waits fail with [`DeviceError::InvalidArgument`] (a zero limit is "no limit", which no
/// wait may have).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, bytemuck::Zeroable)]
pub struct WaitPolicy<'a> {
    /// Address of the channel's [`AbortRecord`], or 0.
    record: u64,
    /// Address of the rank's stop word (an `AtomicU64`), or 0.
    stop: u64,
    /// Longest a single wait may take, in nanoseconds; never 0 in a policy the host built.
    timeout_ns: u64,
    /// Number the host gave this handle (its channel), recorded with failures.
    site: u32,
    reserved: u32,
    _record: PhantomData<&'a AbortRecord>,
}

const _: () = assert!(core::mem::size_of::<WaitPolicy<'static>>() == 32);
const _: () = assert!(core::mem::offset_of!(WaitPolicy<'static>, timeout_ns) == 16);
const _: () = assert!(core::mem::offset_of!(WaitPolicy<'static>, site) == 24);

impl WaitPolicy<'static> {
    /// At most `timeout_ns` nanoseconds per wait, with no abort record and no stop word:
    /// failures are returned, not recorded. A limit of 0 makes every wait that has to wait
    /// fail with [`DeviceError::InvalidArgument`].
    pub const fn with_timeout_ns(timeout_ns: u64) -> WaitPolicy<'static> {
        WaitPolicy {
            record: 0,
            stop: 0,
            timeout_ns,
            site: 0,
            reserved: 0,
            _record: PhantomData,
        }
    }
}

impl<'a> WaitPolicy<'a> {
    /// A policy whose failures go to `record` and `stop`, each of which may be null (none).
    ///
    /// # Safety
    /// Each non-null pointer must point to a live, aligned [`AbortRecord`] / `AtomicU64` in
    /// memory every device thread and the host can reach, only accessed atomically, for `'a`.
    pub unsafe fn from_raw_parts(
        record: *const AbortRecord,
        stop: *const AtomicU64,
        timeout_ns: u64,
        site: u32,
    ) -> WaitPolicy<'a> {
        WaitPolicy {
            record: record as usize as u64,
            stop: stop as usize as u64,
            timeout_ns,
            site,
            reserved: 0,
            _record: PhantomData,
        }
    }

    /// The time limit of one wait, in nanoseconds.
    pub const fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// The number the host gave this handle (its channel).
    pub const fn site(&self) -> u32 {
        self.site
    }

    /// Address of the abort record (0: none).
    pub const fn record_addr(&self) -> u64 {
        self.record
    }

    /// Address of the rank's stop word (0: none).
    pub const fn stop_addr(&self) -> u64 {
        self.stop
    }

    /// The same policy with another site number (the host's way to tag one channel's
    /// handles that share a FIFO).
    pub const fn with_site(self, site: u32) -> WaitPolicy<'a> {
        WaitPolicy { site, ..self }
    }

    /// Whether the rank's stop word has been raised.
    #[inline(always)]
    pub fn aborted(&self) -> bool {
        stopped(self.stop)
    }

    /// Whether this policy's own channel has recorded a failure.
    #[inline(always)]
    pub fn channel_failed(&self) -> bool {
        if self.record == 0 {
            return false;
        }
        // SAFETY: a non-zero record address is live for 'a (constructor contract).
        let r = unsafe { &*(self.record as usize as *const AbortRecord) };
        // Relaxed: the flag carries no data the caller reads.
        atomic::load(&r.reason, Ordering::Relaxed, Scope::System) != 0
    }

    /// Records `error` in `op` with `detail` (the first failure of the channel and of the
    /// rank wins), then returns `error`.
    #[inline(always)]
    pub fn raise(&self, error: DeviceError, op: DeviceOp, detail: [u64; 3]) -> DeviceError {
        abort::raise(
            self.record,
            self.stop,
            self.site,
            error,
            op,
            detail[0],
            detail[1],
            detail[2],
        )
    }

    /// Refuses `op` on a handle whose cells are not set (a zeroed handle), returning
    /// [`DeviceError::NullHandle`].
    ///
    /// Nothing is recorded in the abort record: a handle with no cells was not built by
    /// the host, so its policy names no record either (a zeroed handle's policy is zeroed).
    /// The emulator reports the failure with the kernel's error; on the GPU a kernel that
    /// returns it traps (see [`crate::kernel_return`]). Keeping the compare-and-swap of a
    /// record out of this path keeps it out of every caller's registers.
    #[inline(always)]
    pub fn null_handle(&self, op: DeviceOp) -> DeviceError {
        arch::note_failure(DeviceError::NullHandle, op, self.site, [0; 3]);
        DeviceError::NullHandle
    }

    /// Polls `ready` until it returns true, within the policy's limit. `detail` computes what
    /// the abort record says if the wait times out (see [`DeviceOp`] for `op`'s words).
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] after `timeout_ns` (recorded), [`DeviceError::Aborted`] once
    /// the rank's stop word is seen raised, [`DeviceError::InvalidArgument`] for a zero limit.
    #[inline(always)]
    pub fn wait_until(
        &self,
        op: DeviceOp,
        ready: impl FnMut() -> bool,
        detail: impl FnOnce() -> [u64; 3],
    ) -> Result<(), DeviceError> {
        self.poll(&mut Deadline::default(), op, None, ready, detail)
    }

    /// [`Self::wait_until`] against `deadline`, which several waits of one call share: the
    /// first of them that has to look at the clock sets it, so the call as a whole, not each
    /// of its waits, gets the policy's limit (the packets of one `unpack_packets`).
    ///
    /// # Errors
    /// As [`Self::wait_until`].
    #[inline(always)]
    pub fn wait_until_within(
        &self,
        deadline: &mut Deadline,
        op: DeviceOp,
        ready: impl FnMut() -> bool,
        detail: impl FnOnce() -> [u64; 3],
    ) -> Result<(), DeviceError> {
        self.poll(deadline, op, None, ready, detail)
    }

    /// [`Self::wait_until`] for the library's own waits, which know what word of device
    /// memory they wait for: `awaited` (a hint that may be looser than `ready`, see
    /// [`arch::Awaited`]) lets the emulator tell when to resume a kernel thread suspended in
    /// this wait without switching back to it for each poll.
    #[inline(always)]
    pub(crate) fn wait_on_memory(
        &self,
        op: DeviceOp,
        awaited: arch::Awaited,
        ready: impl FnMut() -> bool,
        detail: impl FnOnce() -> [u64; 3],
    ) -> Result<(), DeviceError> {
        self.poll(&mut Deadline::default(), op, Some(awaited), ready, detail)
    }

    /// [`Self::wait_until_within`] as [`Self::wait_on_memory`].
    #[inline(always)]
    pub(crate) fn wait_on_memory_within(
        &self,
        deadline: &mut Deadline,
        op: DeviceOp,
        awaited: arch::Awaited,
        ready: impl FnMut() -> bool,
        detail: impl FnOnce() -> [u64; 3],
    ) -> Result<(), DeviceError> {
        self.poll(deadline, op, Some(awaited), ready, detail)
    }

    /// The wait loop of all of them; `awaited` goes to each pause (see
    /// [`Self::wait_on_memory`]).
    #[inline(always)]
    fn poll(
        &self,
        deadline: &mut Deadline,
        op: DeviceOp,
        awaited: Option<arch::Awaited>,
        mut ready: impl FnMut() -> bool,
        detail: impl FnOnce() -> [u64; 3],
    ) -> Result<(), DeviceError> {
        // Few values live across the loop, so a waiting kernel needs few registers: the poll
        // count and the deadline, nothing else. The hot path is `ready` and the count.
        let mut polls = 0u32;
        let error = loop {
            if ready() {
                return Ok(());
            }
            if polls % CHECK_EVERY == CHECK_EVERY - 1 {
                // The slow part, every CHECK_EVERY polls: the stop word, then the clock.
                if stopped(self.stop) {
                    return Err(DeviceError::Aborted);
                }
                if self.timeout_ns == 0 {
                    break DeviceError::InvalidArgument;
                }
                let now = arch::clock_ns();
                if deadline.0 == 0 {
                    deadline.0 = now.saturating_add(self.timeout_ns);
                } else if now > deadline.0 {
                    break DeviceError::Timeout;
                }
            }
            // `polls` is 0 at a wait's first pause: the emulator's back-off learns from it
            // that a new wait began.
            match awaited {
                Some(awaited) => arch::spin_pause_awaiting(polls, awaited),
                None => arch::spin_pause(polls),
            }
            polls = polls.wrapping_add(1);
        };
        Err(self.raise(error, op, detail()))
    }
}

/// When the waits of one call must give up: unset until the first of them has waited
/// [`CHECK_EVERY`] polls, then that moment plus the policy's limit. A wait whose condition
/// holds within fewer polls never reads the clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadline(u64);

/// Whether the stop word at `stop` (0: none) is raised.
#[inline(always)]
fn stopped(stop: u64) -> bool {
    if stop == 0 {
        return false;
    }
    // SAFETY: a non-zero stop address is live for the policy's lifetime (constructor
    // contract of `WaitPolicy::from_raw_parts`).
    let s = unsafe { atomic::cell(stop) };
    // Relaxed: the word carries no data; observing it late only delays the stop.
    atomic::load(s, Ordering::Relaxed, Scope::System) != 0
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a wait with a limit that hangs, or that times out without telling
    /// the host which handle failed and with what.
    #[test]
    fn wait_times_out_and_records_why() {
        let record = AbortRecord::new();
        let stop = AtomicU64::new(0);
        // SAFETY: both live for the test, only accessed atomically.
        let policy = unsafe { WaitPolicy::from_raw_parts(&record, &stop, 2_000_000, 7) };
        assert_eq!(
            policy.wait_until(DeviceOp::SemaphoreWait, || false, || [3, 2, 0]),
            Err(DeviceError::Timeout)
        );
        let reason = record.read().unwrap();
        assert_eq!(reason.error, Some(DeviceError::Timeout));
        assert_eq!((reason.site, reason.detail), (7, Some([3, 2, 0])));
        // A second waiter of the rank stops on the raised stop word instead of waiting out
        // its own limit, and records nothing.
        let other = AbortRecord::new();
        // SAFETY: as above.
        let second = unsafe { WaitPolicy::from_raw_parts(&other, &stop, u64::MAX, 8) };
        assert_eq!(
            second.wait_until(DeviceOp::SemaphoreWait, || false, || [0; 3]),
            Err(DeviceError::Aborted)
        );
        assert_eq!(other.read(), None);
    }

    /// Guards against a zero limit meaning "wait forever".
    #[test]
    fn zero_limit_is_refused() {
        let zero = WaitPolicy::with_timeout_ns(0);
        assert_eq!(
            zero.wait_until(DeviceOp::SemaphoreWait, || false, || [0; 3]),
            Err(DeviceError::InvalidArgument)
        );
        // A condition that already holds needs no wait.
        assert_eq!(
            zero.wait_until(DeviceOp::SemaphoreWait, || true, || [0; 3]),
            Ok(())
        );
        assert_eq!(
            WaitPolicy::default().wait_until(DeviceOp::FifoSync, || false, || [0; 3]),
            Err(DeviceError::InvalidArgument)
        );
    }
}
