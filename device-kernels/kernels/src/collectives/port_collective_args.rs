//! The arguments every collective kernel over port channels takes (ranks that reach each
//! other only through the proxy: another node, or Ethernet asked for).

use super::call_protocol::CallProtocol;
use super::collective_args::{CallIds, eager_start, invalid_argument};
use super::port_layout::PortLayout;
use super::port_source::PortSource;
use oxccl_device::KernelArg;
use oxccl_device::arch;
use oxccl_device::block::block_signal_and_wait;
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
    /// The input's memory at the proxy, where the input is registered (see
    /// [`PortSource`]); zeroed: it is staged.
    pub input_source: PortSource,
    /// The output's, likewise (the two-shot all-reduce puts its reduced chunk from it).
    pub output_source: PortSource,
    /// The protocol of the communicator's last port collective and how far its sender has
    /// heard back (see [`CallProtocol`]); the host keeps it.
    pub protocol: CallProtocol,
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

    /// The start of an eager kernel of protocol `kind` (with the call's root): the call's
    /// type and operation, once [checked](Self::check), and the first round the sender's
    /// dones do not cover, to go on from ([`CallProtocol::covered_until`]). The host has run
    /// the switch (a barrier kernel) where the last call's protocol was another.
    ///
    /// # Errors
    /// As [`Self::check`]; [`DeviceError::InvalidArgument`] (recorded) for a protocol that
    /// is not this call's.
    #[inline(always)]
    pub(crate) fn begin_eager(&self, kind: u32) -> Result<(u64, DataType, ReduceOp), DeviceError> {
        let (dtype, op) = self.check()?;
        let covered_until = eager_start(self.protocol, kind, self.root, &self.barrier)?;
        Ok((covered_until, dtype, op))
    }

    /// The barrier, which is also the switch between protocols (see [`CallProtocol`]):
    /// signals every peer, waits for the dones the last call left owed (if it ran an eager
    /// protocol), then for every peer's signal; every block then proceeds. Signals alone: no
    /// part of the scratch, no round number.
    ///
    /// # Errors
    /// The channels' (a peer that does not answer) and the grid barrier's.
    #[inline(always)]
    pub(crate) fn settle_and_meet(&self) -> Result<(), DeviceError> {
        let last = self.protocol;
        let owed = match last.kind {
            CallProtocol::LOCKSTEP => 0,
            _ => PortLayout::EAGER.dones_between(last.covered_until, self.sequence),
        };
        // Plain values, not `self`: what a closure takes lives in local memory on the GPU
        // once the closure is out of line.
        let (peers, rank, n_ranks) = (self.peers, self.rank, self.n_ranks);
        self.barrier.sync_grid()?;
        if n_ranks > 1 && arch::block_rank() == 0 {
            block_signal_and_wait(
                move || {
                    for p in (0..n_ranks).filter(|&p| p != rank) {
                        peers.get(p)?.signal()?;
                    }
                    Ok(())
                },
                move || {
                    for p in (0..n_ranks).filter(|&p| p != rank) {
                        let channel = peers.get(p)?;
                        let dones = if last.owed_by(rank, p) { owed } else { 0 };
                        // The owed dones first, then the peer's signal of this meeting.
                        for _ in 0..=dones {
                            channel.wait()?;
                        }
                    }
                    Ok(())
                },
            )?;
        }
        self.barrier.sync_grid()
    }

    /// Records `InvalidArgument` with `detail` on the barrier's policy and returns it.
    #[inline(always)]
    pub(crate) fn invalid(&self, detail: [u64; 3]) -> DeviceError {
        invalid_argument(&self.barrier, detail)
    }
}
