//! Barrier over port channels, through the proxy (ranks without a load/store path to each
//! other): one exchange with nothing in it.

use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{Part, exchange_with_peers};
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;

/// Barrier over port channels: every rank signals every peer and waits for every peer's
/// signal, so it returns once every rank's kernel has reached it (and every block of this
/// rank). A signal follows every earlier put of its channel, so what the collectives before
/// it put has landed. Takes one call number, as a round of the other port collectives.
///
/// # Errors
/// Invalid ids, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_barrier_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (args, _, _) = args.begin()?;
    exchange_with_peers(&args, 0, 0, Part::Nothing)
}
