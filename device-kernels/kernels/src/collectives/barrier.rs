//! Barrier: every rank's kernel meets every other's.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Barrier: returns once every rank's kernel has reached it (and every block of this rank);
/// what each rank wrote before it is visible to every rank after it. Takes no call number.
///
/// # Errors
/// Channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_barrier(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    args.check()?;
    all_peers_meet(&args)
}
