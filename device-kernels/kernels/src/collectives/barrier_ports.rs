//! Barrier over port channels, through the proxy (ranks without a load/store path to each
//! other): one exchange with nothing in it. It is also the switch between port protocols
//! (see [`call_protocol`](super::call_protocol)): it first waits for the dones an eager
//! collective left owed.

use super::port_collective_args::PortCollectiveArgs;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Barrier over port channels: every rank signals every peer and waits for every peer's
/// signal, so it returns once every rank's kernel has reached it (and every block of this
/// rank). A signal follows every earlier put of its channel, so what the collectives before
/// it put has landed. The host launches it before a port collective whose protocol differs
/// from the last call's, with that call's [`CallProtocol`](super::CallProtocol).
///
/// # Errors
/// Invalid ids, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_barrier_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    args.check()?;
    args.settle_and_meet()
}
