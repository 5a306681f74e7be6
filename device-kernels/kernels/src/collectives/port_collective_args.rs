//! The arguments every collective kernel over port channels takes (ranks that reach each
//! other only through the proxy: another node, or Ethernet asked for).

use super::collective_args::{CallIds, invalid_argument};
use super::port_exchange::{Part, exchange_with_peers};
use super::port_layout::PortLayout;
use super::port_protocol::PortProtocol;
use oxccl_device::KernelArg;
use oxccl_device::channel_set::ChannelSetDeviceHandle;
use oxccl_device::error::DeviceError;
use oxccl_device::grid_barrier::GridBarrierDeviceHandle;
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::reduce::{DataType, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Arguments of the port-channel collective kernels
/// ([`collective_all_reduce_ports()`](super::all_reduce_ports::collective_all_reduce_ports())
/// and its siblings); the host API fills them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct PortCollectiveArgs<'a> {
    /// The port channel to each peer, by peer rank: `dst` the peer's scratch, `src` ours.
    pub peers: ChannelSetDeviceHandle<'a, PortChannelDeviceHandle<'a>>,
    /// This rank's grid barrier.
    pub barrier: GridBarrierDeviceHandle<'a>,
    /// The input.
    pub input: DeviceView<'a, u8>,
    /// The output; may be the input (or, for all-gather and reduce-scatter in place, the
    /// part of it the collective says).
    pub output: DeviceViewMut<'a, u8>,
    /// Our scratch, laid out by `layout` (every channel's `src`).
    pub scratch: DeviceViewMut<'a, u8>,
    /// How every rank's scratch is laid out.
    pub layout: PortLayout,
    /// Elements (per rank, for all-gather and reduce-scatter: what each rank contributes
    /// or gets).
    pub count: u64,
    /// The call's first round number (the same on every rank; a call takes one per round).
    pub sequence: u64,
    /// The protocol of the communicator's last port collective and how far its sender has
    /// heard back (see [`PortProtocol`]).
    pub protocol: PortProtocol,
    /// This rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub n_ranks: u32,
    /// Element type ([`DataType`] id).
    pub dtype: u32,
    /// Reduction ([`ReduceOp`] id; `Sum` where the collective reduces nothing).
    pub op: u32,
    /// The root (broadcast, reduce); 0 elsewhere.
    pub root: u32,
    /// Zero.
    pub reserved: u32,
}

impl PortCollectiveArgs<'_> {
    /// The call's type and operation, once the ranks, root and layout are checked.
    ///
    /// # Errors
    /// [`DeviceError::InvalidArgument`] (recorded) for an unknown type or operation, a rank
    /// or root outside the communicator, or a layout for another number of ranks.
    #[inline(always)]
    pub(crate) fn check(&self) -> Result<(DataType, ReduceOp), DeviceError> {
        let ids = CallIds {
            dtype: self.dtype,
            op: self.op,
            rank: self.rank,
            root: self.root,
            n_ranks: self.n_ranks,
            layout_ranks: self.layout.n_ranks,
        };
        ids.check(&self.barrier)
    }

    /// The start of a lockstep kernel (every port collective but broadcast and reduce): the
    /// call's type and operation, once [checked](Self::check), and the arguments to run
    /// with, their first round number past the switch from an eager protocol, if the last
    /// call ran one (see [`PortProtocol`]).
    ///
    /// # Errors
    /// As [`Self::check`], and the channels' and the grid barrier's.
    #[inline(always)]
    pub(crate) fn begin(self) -> Result<(Self, DataType, ReduceOp), DeviceError> {
        let (args, _, dtype, op) = self.begin_as(PortProtocol::LOCKSTEP)?;
        Ok((args, dtype, op))
    }

    /// The start of a kernel of protocol `kind` (with the call's root): as [`Self::begin`],
    /// and the last round the sender's dones cover, to go on from
    /// ([`PortProtocol::covered`]). Where the call continues the last call's protocol, that
    /// is the last call's; where it switches, the kernel first waits for the dones the last
    /// call left owed, then runs the switch's exchange with every peer, in the round the
    /// call's first round number names, which the dones need not cover; the arguments
    /// returned start one round later.
    ///
    /// # Errors
    /// As [`Self::begin`].
    #[inline(always)]
    pub(crate) fn begin_as(
        self,
        kind: u32,
    ) -> Result<(Self, u64, DataType, ReduceOp), DeviceError> {
        let (dtype, op) = self.check()?;
        let last = self.protocol;
        if last.continues(kind, self.root) {
            return Ok((self, last.covered, dtype, op));
        }
        let owed = match last.kind {
            PortProtocol::LOCKSTEP => 0,
            _ => PortProtocol::dones_between(last.covered, self.sequence.saturating_sub(1)),
        };
        // Plain values, not `self`: what a closure takes lives in local memory on the GPU
        // once the closure is out of line.
        let (peers, rank, n_ranks) = (self.peers, self.rank, self.n_ranks);
        if owed > 0 && oxccl_device::arch::block_rank() == 0 {
            oxccl_device::block::block_wait(move || {
                for p in (0..n_ranks).filter(|&p| last.owed_by(rank, p)) {
                    let channel = peers.get(p)?;
                    for _ in 0..owed {
                        channel.wait()?;
                    }
                }
                Ok(())
            })?;
        }
        exchange_with_peers(&self, 0, 0, Part::Nothing)?;
        let mut args = self;
        args.sequence += last.switch_rounds(kind, self.root);
        Ok((args, self.sequence, dtype, op))
    }

    /// Records `InvalidArgument` with `detail` on the barrier's policy and returns it.
    #[inline(always)]
    pub(crate) fn invalid(&self, detail: [u64; 3]) -> DeviceError {
        invalid_argument(&self.barrier, detail)
    }
}
