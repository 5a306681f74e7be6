//! Errors of the proxy: refused triggers and failed connections.

use std::fmt;

/// Which side of a copy a memory id was named for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The source (this rank's memory).
    Src,
    /// The destination (the peer's memory).
    Dst,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Src => "source",
            Side::Dst => "destination",
        })
    }
}

/// Why the proxy refused a trigger. Nothing of a refused trigger is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The channel (semaphore) id names no channel of this proxy.
    #[error("unknown channel id {id}")]
    UnknownChannel {
        /// The id in the trigger.
        id: u32,
    },
    /// A memory id names no registered memory.
    #[error("unknown {side} memory id {id}")]
    UnknownMemory {
        /// Source or destination.
        side: Side,
        /// The id in the trigger.
        id: u32,
    },
    /// An offset and size fall outside the registered memory.
    #[error("{side} memory {id}: bytes {offset}..{end} outside its {size} bytes")]
    OutOfBounds {
        /// Source or destination.
        side: Side,
        /// The memory id.
        id: u32,
        /// Start of the requested range.
        offset: u64,
        /// End of the requested range (exclusive).
        end: u64,
        /// Registered size of the memory.
        size: u64,
    },
    /// The memory does not belong to the rank the trigger may touch on that side.
    #[error("{side} memory {id} belongs to rank {owner}, the channel's {side} is rank {expected}")]
    WrongRank {
        /// Source or destination.
        side: Side,
        /// The memory id.
        id: u32,
        /// Rank owning the memory.
        owner: u32,
        /// Rank the channel connects to on that side.
        expected: u32,
    },
    /// Type bits that are zero or undefined.
    #[error("invalid trigger type bits {bits:#05b}")]
    InvalidType {
        /// The bits.
        bits: u64,
    },
}

/// Everything the proxy can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A trigger was refused; its channel is stopped.
    #[error("rank {rank}: port channel {channel} ({}): trigger refused: {refusal}", peer_text(*.peer))]
    TriggerRefused {
        /// This rank.
        rank: u32,
        /// The channel (semaphore) id.
        channel: u32,
        /// The channel's peer, if the channel is known.
        peer: Option<u32>,
        /// Why.
        refusal: Refusal,
    },
    /// A connection failed to execute a trigger; its channel is stopped.
    #[error(
        "rank {rank}: connection to peer {peer} ({transport}) failed on channel {channel}: {message}"
    )]
    Connection {
        /// This rank.
        rank: u32,
        /// The peer.
        peer: u32,
        /// Transport name.
        transport: &'static str,
        /// The channel (semaphore) id.
        channel: u32,
        /// What failed.
        message: String,
    },
    /// A kernel claimed FIFO position `position` but never published a trigger there (its
    /// push gave up); the proxy cannot go past it, so every port channel of the rank is
    /// stopped.
    #[error(
        "rank {rank}: the proxy's FIFO is stuck at position {position}: a kernel claimed it but \
         published nothing for {waited:?} (its push timed out or was aborted); every port \
         channel of this rank is stopped"
    )]
    FifoStalled {
        /// This rank.
        rank: u32,
        /// The position that was never published.
        position: u64,
        /// How long the proxy waited for it.
        waited: std::time::Duration,
    },
    /// A connection from a peer carried something this rank refused (a write outside its
    /// registrations, an unknown id, a malformed frame) or broke mid-frame; nothing of the
    /// refused frame was written and the connection is closed.
    #[error(
        "rank {rank}: inbound connection from peer {peer} ({transport}) refused and closed: \
         {message}"
    )]
    Inbound {
        /// This rank (the receiver).
        rank: u32,
        /// The sending peer.
        peer: u32,
        /// Transport name.
        transport: &'static str,
        /// What was refused, and why.
        message: String,
    },
    /// A peer was lost mid-run: its process ended (or its connection closed) without the
    /// goodbye a peer that ends on purpose says first.
    #[error("rank {rank}: lost peer {peer} ({transport}): {message}")]
    PeerLost {
        /// This rank.
        rank: u32,
        /// The lost peer.
        peer: u32,
        /// The transport that noticed.
        transport: &'static str,
        /// What was seen.
        message: String,
    },
    /// A transport operation failed (a socket error, a deadline, the peer's refusal).
    #[error("{0}")]
    Transport(String),
    /// A registration or configuration the proxy cannot accept.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// More errors happened than are kept; the first ones are reported.
    #[error("{dropped} more proxy errors were not kept")]
    More {
        /// How many were dropped.
        dropped: u64,
    },
    /// The proxy thread could not be started or stopped.
    #[error("proxy thread: {0}")]
    Thread(String),
}

/// "to peer P", or "to an unknown peer" for a channel id the proxy does not know.
fn peer_text(peer: Option<u32>) -> String {
    match peer {
        Some(p) => format!("to peer {p}"),
        None => "unknown channel".into(),
    }
}
