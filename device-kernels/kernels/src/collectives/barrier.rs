//! Barrier: every rank's kernel meets every other's. It is also the switch between the
//! memory path's protocols (see [`call_protocol`](super::call_protocol)): it first waits
//! for the dones an eager packet collective left owed.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::collect_owed_and_meet;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Barrier: returns once every rank's kernel has reached it (and every block of this rank);
/// what each rank wrote before it is visible to every rank after it. Takes no call number.
/// The host launches it before a collective whose protocol differs from the last call's
/// eager one, with that call's [`CallProtocol`](super::CallProtocol).
///
/// # Errors
/// Channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_barrier(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    args.check()?;
    collect_owed_and_meet(&args)
}
