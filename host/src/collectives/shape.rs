//! What every rank of a collective call must agree on, and the exchange that checks it.
//!
//! Ranks that call a collective with different counts, types, operations or roots would
//! read and write each other's buffers at different places and hang or compute garbage. So
//! the first call of each shape on a communicator exchanges the shape with every rank
//! (through the out-of-band exchange) and refuses the call on every rank if they differ;
//! later calls of a shape already agreed cost nothing. A rank whose shape is new while
//! another's is not waits for that exchange until the exchange's deadline, and the other
//! rank's kernel waits for its peers until the wait limit: both report an error, neither
//! hangs. Checking every call would cost a round of messages per call, which is what
//! collectives must not pay in the steady state.

use crate::error::{Error, Result};
use crate::out_of_band::OutOfBand;
use oxccl_device::reduce::{DataType, ReduceOp};
use oxccl_kernels::collectives::AllToAllvCounts;
use serde::{Deserialize, Serialize};

/// A count per rank of an all-to-all-v, as a shape carries it.
pub(crate) type PeerCounts = [u64; AllToAllvCounts::MAX_RANKS];

/// The collectives, as shapes and errors name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Collective {
    /// `all_reduce`.
    AllReduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `broadcast`.
    Broadcast,
    /// `reduce`.
    Reduce,
    /// `all_to_all`.
    AllToAll,
    /// `all_to_allv`.
    AllToAllV,
    /// `barrier_on`.
    Barrier,
}

impl Collective {
    /// The method's name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_allv",
            Collective::Barrier => "barrier_on",
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One rank's view of a call: what all ranks must agree on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Shape {
    pub(crate) collective: Collective,
    /// Element type id ([`DataType`]).
    pub(crate) dtype: u32,
    /// Operation id ([`ReduceOp`]), or `None` for collectives that do not reduce.
    pub(crate) op: Option<u32>,
    /// Elements per rank (the collective's `count`).
    pub(crate) count: u64,
    /// The root, for rooted collectives.
    pub(crate) root: Option<u32>,
    /// All-to-all-v: elements this rank sends to each rank, and receives from each (zero
    /// past the communicator's size). Arrays, not vectors: a call makes its shape, and a
    /// call allocates nothing in the steady state.
    pub(crate) counts: Option<(PeerCounts, PeerCounts)>,
}

impl Shape {
    /// A shape without all-to-all-v counts.
    pub(crate) fn new(
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        count: usize,
        root: Option<u32>,
    ) -> Shape {
        Shape {
            collective,
            dtype: dtype as u32,
            op: op.map(|o| o as u32),
            count: count as u64,
            root,
            counts: None,
        }
    }

    /// How the shape reads in an error.
    fn describe(&self) -> String {
        let dtype = DataType::from_id(self.dtype).map_or("?", DataType::name);
        let mut s = format!("{} of {} {dtype} elements", self.collective, self.count);
        if let Some(op) = self.op {
            s += &format!(", {}", ReduceOp::from_id(op).map_or("?", ReduceOp::name));
        }
        if let Some(root) = self.root {
            s += &format!(", root {root}");
        }
        s
    }
}

/// Exchanges `mine` with every rank and refuses the call unless all agree: the same shape
/// on every rank, and for an all-to-all-v, what each rank sends to each peer is what that
/// peer receives from it. Every rank must call it at the same point.
///
/// # Errors
/// The exchange failed, or the ranks disagree (the error names both sides).
pub(crate) fn agree(oob: &dyn OutOfBand, mine: &Shape) -> Result<Vec<Shape>> {
    let rank = oob.rank();
    let bytes = postcard::to_allocvec(mine)
        .map_err(|e| Error::Internal(format!("encoding a collective's shape: {e}")))?;
    let all = oob.all_gather(bytes)?;
    let mut shapes = Vec::with_capacity(all.len());
    for (peer, bytes) in all.iter().enumerate() {
        let shape: Shape = postcard::from_bytes(bytes).map_err(|e| {
            Error::InvalidUsage(format!(
                "rank {rank}: {}: rank {peer} sent a shape that cannot be read: {e}",
                mine.collective
            ))
        })?;
        shapes.push(shape);
    }
    let strip = |s: &Shape| Shape {
        counts: None,
        ..s.clone()
    };
    for (peer, theirs) in shapes.iter().enumerate() {
        if strip(theirs) != strip(mine) {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: {}: ranks disagree on the call: rank {rank} calls {}, rank {peer} \
                 calls {}",
                mine.collective,
                mine.describe(),
                theirs.describe()
            )));
        }
    }
    if let Some((send, recv)) = &mine.counts {
        for (peer, theirs) in shapes.iter().enumerate() {
            let Some((their_send, their_recv)) = &theirs.counts else {
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: all_to_allv: rank {peer} sent no counts"
                )));
            };
            let (we_send, they_recv) = (send.get(peer), their_recv.get(rank as usize));
            let (they_send, we_recv) = (their_send.get(rank as usize), recv.get(peer));
            if we_send != they_recv || they_send != we_recv {
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: all_to_allv: counts disagree with rank {peer}: we send it \
                     {we_send:?} elements and it expects {they_recv:?} from us; it sends us \
                     {they_send:?} and we expect {we_recv:?}"
                )));
            }
        }
    }
    Ok(shapes)
}
