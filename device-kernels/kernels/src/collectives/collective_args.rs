//! What every collective kernel takes: one argument struct, the same for all of them.

use super::call_protocol::CallProtocol;
use super::packet_form::PacketForm;
use super::scratch_layout::ScratchLayout;
use oxccl_device::KernelArg;
use oxccl_device::channel_set::ChannelSetDeviceHandle;
use oxccl_device::error::{DeviceError, DeviceOp};
use oxccl_device::grid_barrier::GridBarrierDeviceHandle;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::peer_buffer_table::{NO_SLOT, PeerBufferTableDeviceHandle};
use oxccl_device::reduce::{DataType, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// Arguments of a collective kernel. The host API fills them; a kernel author calling the
/// kernels directly fills them as the module docs of each kernel say.
///
/// The buffers are byte views: each kernel checks that they hold whole elements of `dtype`
/// and are long enough for `count`, and refuses the call otherwise
/// ([`DeviceError::OutOfRange`], [`DeviceError::InvalidArgument`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, KernelArg)]
pub struct CollectiveArgs<'a> {
    /// The channel to each peer, by peer rank: its `remote` is the peer's scratch, its
    /// `local` and `packets` our scratch (laid out by `layout`).
    pub peers: ChannelSetDeviceHandle<'a, MemoryChannelDeviceHandle<'a>>,
    /// This rank's grid barrier: its blocks meet there around each exchange with peers.
    pub barrier: GridBarrierDeviceHandle<'a>,
    /// The input ("send buffer").
    pub input: DeviceView<'a, u8>,
    /// The output ("receive buffer"); may be the input, or contain it, for in-place calls.
    pub output: DeviceViewMut<'a, u8>,
    /// Our scratch: the buffer every channel's `local` names.
    pub scratch: DeviceViewMut<'a, u8>,
    /// The buffers every rank registered for the collectives, as this rank reaches them.
    pub buffers: PeerBufferTableDeviceHandle<'a>,
    /// How the scratch is laid out; the same on every rank.
    pub layout: ScratchLayout,
    /// Elements: what each collective counts (see each kernel).
    pub count: u64,
    /// The call's number on this communicator's scratch: the same on every rank; each call
    /// takes as many numbers as it runs rounds ([`super::rounds`]).
    pub sequence: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub n_ranks: u32,
    /// Element type ([`DataType`] id).
    pub dtype: u32,
    /// Reduction ([`ReduceOp`] id; ignored by collectives that do not reduce).
    pub op: u32,
    /// Root rank of a rooted collective (ignored by the others).
    pub root: u32,
    /// The slot of `buffers` whose buffer of this rank holds `input`, or
    /// [`NO_SLOT`] (the default: staged).
    pub input_slot: u32,
    /// The same for `output`.
    pub output_slot: u32,
    /// How a packet collective moves its messages: [`PacketForm::LL16`] (the default) or
    /// [`PacketForm::DATA`] (see [`super::packet_form`]); ignored by the others.
    pub packet_form: u32,
    /// The protocol of the communicator's last memory-path collective and how far its
    /// sender has heard back, or, past a switch, the protocol the call starts (see
    /// [`CallProtocol`]; the default, lockstep, for every call but the packet broadcast and
    /// reduce, and for the first).
    pub protocol: CallProtocol,
}

impl Default for CollectiveArgs<'_> {
    fn default() -> Self {
        CollectiveArgs {
            peers: Default::default(),
            barrier: Default::default(),
            input: Default::default(),
            output: Default::default(),
            scratch: Default::default(),
            buffers: Default::default(),
            layout: Default::default(),
            count: 0,
            sequence: 0,
            rank: 0,
            n_ranks: 0,
            dtype: 0,
            op: 0,
            root: 0,
            input_slot: NO_SLOT,
            output_slot: NO_SLOT,
            packet_form: PacketForm::LL16,
            protocol: CallProtocol::default(),
        }
    }
}

impl<'a> CollectiveArgs<'a> {
    /// The element type and operation, or [`DeviceError::InvalidArgument`] (recorded) for
    /// ids that name none, a rank outside the communicator or a layout of another size.
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
    /// the switch (the barrier kernel) where the last call's protocol was another eager one.
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

    /// Records `InvalidArgument` with `detail` on the barrier's policy and returns it.
    #[inline(always)]
    pub(crate) fn invalid(&self, detail: [u64; 3]) -> DeviceError {
        invalid_argument(&self.barrier, detail)
    }

    /// The channel to `peer`.
    #[inline(always)]
    pub(crate) fn peer(&self, peer: u32) -> Result<&'a MemoryChannelDeviceHandle<'a>, DeviceError> {
        self.peers.get(peer)
    }
}

/// The ids and ranks of a call, as every collective kernel checks them before it runs (the
/// memory-channel ones and the port-channel ones alike).
pub(crate) struct CallIds {
    /// Element type ([`DataType`] id).
    pub(crate) dtype: u32,
    /// Reduction ([`ReduceOp`] id).
    pub(crate) op: u32,
    /// This rank.
    pub(crate) rank: u32,
    /// The root.
    pub(crate) root: u32,
    /// Ranks of the communicator.
    pub(crate) n_ranks: u32,
    /// Ranks the scratch's layout is for.
    pub(crate) layout_ranks: u32,
}

impl CallIds {
    /// The element type and operation, or [`DeviceError::InvalidArgument`] (recorded on
    /// `barrier`'s policy) for ids that name none, a rank or root outside the communicator,
    /// or a layout for another number of ranks.
    #[inline(always)]
    pub(crate) fn check(
        &self,
        barrier: &GridBarrierDeviceHandle<'_>,
    ) -> Result<(DataType, ReduceOp), DeviceError> {
        match (DataType::from_id(self.dtype), ReduceOp::from_id(self.op)) {
            (Some(dtype), Some(op))
                if self.rank < self.n_ranks
                    && self.layout_ranks == self.n_ranks
                    && self.root < self.n_ranks =>
            {
                Ok((dtype, op))
            }
            _ => Err(invalid_argument(
                barrier,
                [self.dtype as u64, self.op as u64, self.rank as u64],
            )),
        }
    }
}

/// Where an eager kernel of protocol `kind` with `root` goes on from: `protocol`'s
/// [`CallProtocol::covered_until`], or [`DeviceError::InvalidArgument`] (recorded on
/// `barrier`'s policy) where `protocol` is another.
#[inline(always)]
pub(crate) fn eager_start(
    protocol: CallProtocol,
    kind: u32,
    root: u32,
    barrier: &GridBarrierDeviceHandle<'_>,
) -> Result<u64, DeviceError> {
    if !protocol.is(kind, root) {
        let detail = [protocol.kind as u64, protocol.root as u64, kind as u64];
        return Err(invalid_argument(barrier, detail));
    }
    Ok(protocol.covered_until)
}

/// Records `InvalidArgument` with `detail` on `barrier`'s policy and returns it.
#[inline(always)]
pub(crate) fn invalid_argument(
    barrier: &GridBarrierDeviceHandle<'_>,
    detail: [u64; 3],
) -> DeviceError {
    barrier
        .wait_policy()
        .raise(DeviceError::InvalidArgument, DeviceOp::Kernel, detail)
}
