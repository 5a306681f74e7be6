//! Abort records: how the first failure on a channel reaches the host, with its details, and
//! how it stops the rank's other waits.
//!
//! Memory and who touches it (a [`crate::wait::WaitPolicy`] holds the addresses):
//!
//! | cell | written by | read by | scope |
//! |---|---|---|---|
//! | `record.reason` (one record per channel) | the first device thread (or the host proxy) that fails on the channel: compare-and-swap from 0 | the host | system |
//! | `record.detail` | the thread that won `reason`, before it sets [`DETAILS_READY`] | the host | system |
//! | `stop` (one word per rank) | the first failure on any channel of the rank (compare-and-swap from 0), or the host | every device wait, every few polls | system |
//!
//! Invariants:
//! - The first reason wins: later failures on the same channel leave the record alone, so
//!   the host reports the cause, not its consequences. A wait that stops because `stop` was
//!   raised returns [`DeviceError::Aborted`] and records nothing.
//! - A reason word is [`RAISED`] `| op << 48 | code << 32 | site`, never zero. Its details
//!   are valid once [`DETAILS_READY`] is set (release; the host acquires the word).
//! - Only the host lowers records and `stop` (after it reported them and the kernels that
//!   used them have completed).

use crate::arch::{Scope, atomic, atomic::AtomicU64, atomic::Ordering};
use crate::error::{DeviceError, DeviceOp};

/// Bit set in every raised reason word, so a raised word is never zero.
pub const RAISED: u64 = 1 << 63;
/// Bit set once the record's details are written.
pub const DETAILS_READY: u64 = 1 << 62;
const OP_SHIFT: u32 = 48;
const OP_MASK: u64 = 0xff;
const CODE_SHIFT: u32 = 32;
const CODE_MASK: u64 = 0xffff;

/// The first failure on one channel: a reason word and three detail words whose meaning
/// depends on the operation (see [`DeviceOp`]).
#[repr(C, align(32))]
pub struct AbortRecord {
    /// 0 while the channel is healthy; else the encoded reason (see the module docs).
    pub reason: AtomicU64,
    /// Details of the failure, valid once the reason carries [`DETAILS_READY`].
    pub detail: [AtomicU64; 3],
}

#[cfg(not(oxccl_loom))]
const _: () = assert!(core::mem::size_of::<AbortRecord>() == 32);

#[cfg(not(target_arch = "nvptx64"))]
impl AbortRecord {
    /// A healthy record.
    pub fn new() -> Self {
        AbortRecord {
            reason: AtomicU64::new(0),
            detail: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// The recorded failure, if any (details included once they are written).
    pub fn read(&self) -> Option<AbortReason> {
        // Acquire: pairs with the Release that sets DETAILS_READY in `raise`.
        let word = self.reason.load(Ordering::Acquire);
        let mut reason = AbortReason::decode(word)?;
        if word & DETAILS_READY != 0 {
            // Relaxed: ordered after the Acquire above.
            reason.detail = Some(self.detail.each_ref().map(|d| d.load(Ordering::Relaxed)));
        }
        Some(reason)
    }

    /// Records `error` in `op` at `site` with `detail`, as a failing device call does (the
    /// first reason wins), and raises `stop` if it is the rank's first failure: for the host
    /// side of a channel (the proxy refusing a trigger).
    pub fn raise(
        &self,
        stop: Option<&AtomicU64>,
        site: u32,
        error: DeviceError,
        op: DeviceOp,
        detail: [u64; 3],
    ) -> DeviceError {
        let stop = stop.map_or(0, |s| s as *const AtomicU64 as u64);
        raise(
            self as *const AbortRecord as u64,
            stop,
            site,
            error,
            op,
            detail[0],
            detail[1],
            detail[2],
        )
    }

    /// Lowers the record (the host, after reporting it).
    pub fn clear(&self) {
        // Relaxed: only the host clears, after the kernels that could raise it completed.
        self.reason.store(0, Ordering::Relaxed);
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Debug for AbortRecord {
    /// The decoded reason, or `AbortRecord(healthy)`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.read() {
            Some(reason) => f.debug_tuple("AbortRecord").field(&reason).finish(),
            None => f.write_str("AbortRecord(healthy)"),
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Default for AbortRecord {
    fn default() -> Self {
        Self::new()
    }
}

/// A decoded reason word: what failed, in which call, on which channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortReason {
    /// The error; `None` if the code is unknown.
    pub error: Option<DeviceError>,
    /// The call that failed.
    pub op: DeviceOp,
    /// The number the host gave the handle (its channel), so it can name it.
    pub site: u32,
    /// The details, if the record carried them (see [`DeviceOp`] for their meaning).
    pub detail: Option<[u64; 3]>,
}

impl AbortReason {
    /// The reason word for `error` in `op` at `site` (without [`DETAILS_READY`]).
    pub const fn encode(error: DeviceError, op: DeviceOp, site: u32) -> u64 {
        RAISED
            | (op as u64 & OP_MASK) << OP_SHIFT
            | (error.code() as u64 & CODE_MASK) << CODE_SHIFT
            | site as u64
    }

    /// Decodes a reason word; `None` if it is not raised. Details are not in the word.
    pub const fn decode(word: u64) -> Option<Self> {
        if word & RAISED == 0 {
            return None;
        }
        Some(AbortReason {
            error: DeviceError::from_code(((word >> CODE_SHIFT) & CODE_MASK) as u32),
            op: DeviceOp::from_code(((word >> OP_SHIFT) & OP_MASK) as u8),
            site: word as u32,
            detail: None,
        })
    }
}

/// Records `error` in `op` with `detail` in the record at `record` (if it is the channel's
/// first failure) and in the rank's `stop` word (if it is the rank's first), then returns
/// `error`. Either address may be 0 (none).
///
/// Inline, in the caller's failure branch: on the GPU an out-of-line call costs every kernel
/// that can fail a call frame in local memory and the callee's registers, while inline its
/// few instructions sit in a branch the hot path never takes. It takes scalars, so no
/// handle has to be put in memory either way.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn raise(
    record: u64,
    stop: u64,
    site: u32,
    error: DeviceError,
    op: DeviceOp,
    d0: u64,
    d1: u64,
    d2: u64,
) -> DeviceError {
    // Keeps the inputs, and what is computed from them, inside the failure branch.
    use crate::arch::in_place;
    let (record, stop) = (in_place(record), in_place(stop));
    let site = in_place(site as u64) as u32;
    let (d0, d1, d2) = (in_place(d0), in_place(d1), in_place(d2));
    crate::arch::note_failure(error, op, site, [d0, d1, d2]);
    let word = AbortReason::encode(error, op, site);
    if record != 0 {
        // SAFETY: a non-zero record address comes from a `WaitPolicy`, whose constructor's
        // contract makes it a live, aligned `AbortRecord` for the handle's lifetime.
        let r = unsafe { &*(record as usize as *const AbortRecord) };
        if atomic::compare_exchange_relaxed(&r.reason, 0, word, Scope::System).is_ok() {
            // Relaxed: published by the Release below. Three plain statements rather than
            // a loop over an array: the array would be built in local memory on the GPU.
            atomic::store(&r.detail[0], d0, Ordering::Relaxed, Scope::System);
            atomic::store(&r.detail[1], d1, Ordering::Relaxed, Scope::System);
            atomic::store(&r.detail[2], d2, Ordering::Relaxed, Scope::System);
            // Release: pairs with the host's Acquire in `AbortRecord::read`.
            atomic::fetch_or(&r.reason, DETAILS_READY, Ordering::Release, Scope::System);
        }
    }
    if stop != 0 {
        // SAFETY: as for `record`, for the rank's stop word.
        let s = unsafe { atomic::cell(stop) };
        // Relaxed: the word carries no data; a wait that sees it late only stops late.
        let _ = atomic::compare_exchange_relaxed(s, 0, word, Scope::System);
    }
    error
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a reason that does not survive the round trip through the word.
    #[test]
    fn reasons_round_trip() {
        for e in [
            DeviceError::Timeout,
            DeviceError::Aborted,
            DeviceError::OutOfBounds,
            DeviceError::InvalidArgument,
            DeviceError::NullHandle,
            DeviceError::UnsupportedLaunch,
            DeviceError::OutOfRange,
        ] {
            let word = AbortReason::encode(e, DeviceOp::UnpackPackets, 0xfeed);
            assert_eq!(
                AbortReason::decode(word),
                Some(AbortReason {
                    error: Some(e),
                    op: DeviceOp::UnpackPackets,
                    site: 0xfeed,
                    detail: None
                })
            );
        }
        assert_eq!(AbortReason::decode(0), None);
    }

    /// Guards against a later failure overwriting the first (the host must report the
    /// cause), and against details that are not the winner's.
    #[test]
    fn first_failure_wins_with_its_details() {
        let record = AbortRecord::new();
        let stop = AtomicU64::new(0);
        let (r, s) = (
            &record as *const AbortRecord as u64,
            &stop as *const AtomicU64 as u64,
        );
        raise(
            r,
            s,
            7,
            DeviceError::Timeout,
            DeviceOp::SemaphoreWait,
            5,
            4,
            0,
        );
        raise(
            r,
            s,
            7,
            DeviceError::OutOfBounds,
            DeviceOp::MemoryPut,
            1,
            2,
            3,
        );
        let got = record.read().unwrap();
        assert_eq!(got.error, Some(DeviceError::Timeout));
        assert_eq!(got.op, DeviceOp::SemaphoreWait);
        assert_eq!((got.site, got.detail), (7, Some([5, 4, 0])));
        let first = AbortReason::decode(stop.load(Ordering::Relaxed)).unwrap();
        assert_eq!(first.error, Some(DeviceError::Timeout));
        record.clear();
        assert_eq!(record.read(), None);
    }
}
