//! Bounded waiting: every device wait runs under a [`WaitPolicy`].
//!
//! Contract: a wait returns `Ok` once its condition holds, or an error once the policy's time
//! limit passes ([`DeviceError::Timeout`]) or someone raised the abort flag
//! ([`DeviceError::Aborted`]). On timeout it raises the abort flag itself, so the other
//! threads of the kernel stop too and the host can report which wait gave up.
//!
//! The abort flag is one `u64` in memory the host can read, written with
//! [`WaitPolicy::raise`]: `ABORT_RAISED | code << 32 | site`, where `site` is a number the
//! host gave the handle (its channel id) so the host can name the channel that failed.

use crate::arch::{self, Scope, atomic, atomic::Ordering};
use crate::error::DeviceError;

/// Bit set in every raised abort value, so a raised flag is never zero.
pub const ABORT_RAISED: u64 = 1 << 63;

/// How often (in polls) a waiting thread looks at the clock and the abort flag: checking
/// every poll would cost a global-timer read per spin on the GPU.
pub const CHECK_EVERY: u32 = 64;

/// The limit and the abort flag a device handle's waits run under.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WaitPolicy {
    /// Address of the abort flag (an `AtomicU64` the host can read), or 0 for none.
    /// Written by any device thread (Relaxed RMW, system scope); read by device and host.
    pub abort_flag: u64,
    /// Longest a single wait may take, in nanoseconds; 0 means no limit.
    pub timeout_ns: u64,
    /// Number the host gave this handle, written into the abort flag on failure.
    pub site: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<WaitPolicy>() == 24);
const _: () = assert!(core::mem::offset_of!(WaitPolicy, timeout_ns) == 8);
const _: () = assert!(core::mem::offset_of!(WaitPolicy, site) == 16);

/// A decoded abort-flag value: what failed and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortReason {
    /// The error that raised the flag; `None` if the code is unknown (raised by the host).
    pub error: Option<DeviceError>,
    /// The handle's site number (channel id).
    pub site: u32,
}

impl AbortReason {
    /// Decodes a flag value; `None` if the flag is not raised.
    pub const fn decode(value: u64) -> Option<Self> {
        if value & ABORT_RAISED == 0 {
            return None;
        }
        Some(AbortReason {
            error: DeviceError::from_code(((value >> 32) & 0x7fff_ffff) as u32),
            site: value as u32,
        })
    }

    /// The flag value for `error` at `site`.
    pub const fn encode(error: DeviceError, site: u32) -> u64 {
        ABORT_RAISED | (error.code() as u64) << 32 | site as u64
    }
}

impl WaitPolicy {
    /// No limit and no abort flag: waits until the condition holds.
    pub const UNBOUNDED: WaitPolicy = WaitPolicy {
        abort_flag: 0,
        timeout_ns: 0,
        site: 0,
        reserved: 0,
    };

    /// At most `timeout_ns` nanoseconds per wait, and no abort flag.
    pub const fn with_timeout_ns(timeout_ns: u64) -> WaitPolicy {
        WaitPolicy {
            abort_flag: 0,
            timeout_ns,
            site: 0,
            reserved: 0,
        }
    }

    /// Whether the abort flag has been raised.
    #[inline(always)]
    pub fn aborted(&self) -> bool {
        if self.abort_flag == 0 {
            return false;
        }
        // SAFETY: a non-zero abort address is set by the host to a live AtomicU64 that
        // outlives every handle carrying it.
        let flag = unsafe { atomic::cell(self.abort_flag) };
        // Relaxed: the flag carries no data; observing it late only delays the stop.
        atomic::load(flag, Ordering::Relaxed, Scope::System) != 0
    }

    /// Raises the abort flag with `error` (the first raise wins), then returns `error`.
    #[inline(always)]
    pub fn raise(&self, error: DeviceError) -> DeviceError {
        if self.abort_flag != 0 {
            // SAFETY: as in `aborted`.
            let flag = unsafe { atomic::cell(self.abort_flag) };
            let value = AbortReason::encode(error, self.site);
            // Relaxed: as in `aborted`. Only the first raise is kept (compare against zero
            // with a max would keep the largest; a load-then-store keeps the first observed).
            if atomic::load(flag, Ordering::Relaxed, Scope::System) == 0 {
                atomic::store(flag, value, Ordering::Relaxed, Scope::System);
            }
        }
        error
    }

    /// Polls `ready` until it returns true, within the policy's limit.
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] after `timeout_ns` (raising the abort flag), or
    /// [`DeviceError::Aborted`] once the abort flag is seen raised.
    #[inline(always)]
    pub fn wait_until(&self, mut ready: impl FnMut() -> bool) -> Result<(), DeviceError> {
        if ready() {
            return Ok(());
        }
        let mut started_ns = 0u64;
        let mut iteration = 0u32;
        loop {
            arch::spin_pause(iteration);
            iteration = iteration.wrapping_add(1);
            if ready() {
                return Ok(());
            }
            if iteration.is_multiple_of(CHECK_EVERY) {
                if self.aborted() {
                    return Err(DeviceError::Aborted);
                }
                if self.timeout_ns != 0 {
                    let now = arch::clock_ns();
                    if started_ns == 0 {
                        started_ns = now.max(1);
                    } else if now.saturating_sub(started_ns) > self.timeout_ns {
                        return Err(self.raise(DeviceError::Timeout));
                    }
                }
            }
        }
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU64;

    /// Guards against a wait with a limit that hangs, or that times out without telling
    /// the host which handle failed.
    #[test]
    fn wait_times_out_and_raises_flag() {
        let flag = AtomicU64::new(0);
        let policy = WaitPolicy {
            abort_flag: flag.as_ptr() as u64,
            timeout_ns: 2_000_000,
            site: 7,
            reserved: 0,
        };
        assert_eq!(policy.wait_until(|| false), Err(DeviceError::Timeout));
        let reason = AbortReason::decode(flag.load(Ordering::Relaxed)).unwrap();
        assert_eq!(reason.error, Some(DeviceError::Timeout));
        assert_eq!(reason.site, 7);
        // A second waiter stops on the raised flag instead of waiting out its own limit.
        let second = WaitPolicy {
            timeout_ns: 0,
            ..policy
        };
        assert_eq!(second.wait_until(|| false), Err(DeviceError::Aborted));
    }

    /// Guards against an abort code that does not survive the round trip through the flag.
    #[test]
    fn abort_reason_round_trips() {
        for e in [
            DeviceError::Timeout,
            DeviceError::Aborted,
            DeviceError::OutOfBounds,
            DeviceError::InvalidArgument,
        ] {
            let v = AbortReason::encode(e, 0xfeed);
            assert_eq!(
                AbortReason::decode(v),
                Some(AbortReason {
                    error: Some(e),
                    site: 0xfeed
                })
            );
        }
        assert_eq!(AbortReason::decode(0), None);
    }
}
