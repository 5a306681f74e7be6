//! Where a channel's failures go: its abort record, the rank's stop word, and the wait
//! limit, owned by the channel so the device handles it gives out can borrow them.
//!
//! The protocol is documented in [`oxccl_device::abort`]; the communicator reads the
//! records back ([`Communicator::check`](crate::Communicator::check)).

use oxccl_device::abort::AbortRecord;
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::HostCell;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// A channel's abort record, the rank's stop word, the wait limit and the site number its
/// failures are recorded under.
#[derive(Clone, Debug)]
pub(crate) struct ChannelAbort {
    pub(crate) record: HostCell<AbortRecord>,
    pub(crate) stop: HostCell<AtomicU64>,
    pub(crate) timeout: Duration,
    pub(crate) site: u32,
}

impl ChannelAbort {
    /// The wait policy of the channel's device handles, valid while `self` is borrowed.
    pub(crate) fn wait_policy(&self) -> WaitPolicy<'_> {
        let timeout_ns = self.timeout.as_nanos().clamp(1, u64::MAX as u128) as u64;
        // SAFETY: the record and the stop word are owned (shared) by `self`, so they live
        // as long as the borrow; both are only accessed atomically.
        unsafe { WaitPolicy::from_raw_parts(&*self.record, &*self.stop, timeout_ns, self.site) }
    }
}
