//! The one error type of the crate.
//!
//! Every failure names the rank that saw it and, where there is one, the peer involved
//! (a rank, or the address of a connection that never proved who it is). Nothing here
//! panics on input from the network: bad input is an `Err`.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// Result of bootstrap calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The other end of a failed exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A rank of this bootstrap (it said so in its handshake, or we dialled it).
    Rank(usize),
    /// A connection that has not proved it is a rank yet.
    Addr(SocketAddr),
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Rank(r) => write!(f, "rank {r}"),
            Peer::Addr(a) => write!(f, "unauthenticated peer {a}"),
        }
    }
}

/// A set of ranks, printed compactly (`1, 3-7, 9`) so a timeout at 1024 ranks stays readable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankList(Vec<usize>);

impl RankList {
    /// The ranks, sorted and without duplicates.
    pub fn ranks(&self) -> &[usize] {
        &self.0
    }
}

impl From<Vec<usize>> for RankList {
    fn from(mut ranks: Vec<usize>) -> Self {
        ranks.sort_unstable();
        ranks.dedup();
        RankList(ranks)
    }
}

impl fmt::Display for RankList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// The broad class of an [`Error`], with MSCCL++'s names, for callers that only branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller asked for something the bootstrap cannot do (bad rank, bad id, bad env).
    InvalidUsage,
    /// A deadline passed.
    Timeout,
    /// A peer misbehaved, refused us, or went away.
    Remote,
    /// The operating system refused a call (bind, connect, ...).
    System,
    /// A bug in this crate.
    Internal,
}

/// Everything a bootstrap call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer did not prove knowledge of the secret, or refused our proof: the two sides
    /// hold different secrets (different `UniqueId`s), or the peer is not part of this job.
    #[error(
        "rank {rank}: authentication with {peer} failed: wrong bootstrap secret \
         (the two sides were not given the same UniqueId)"
    )]
    WrongSecret {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
    },
    /// The peer speaks another version of the bootstrap protocol.
    #[error(
        "rank {rank}: {peer} speaks another protocol: expected protocol v{expected}, peer sent v{got}"
    )]
    VersionMismatch {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
        /// Our protocol version.
        expected: u32,
        /// The version the peer's frame carried.
        got: u32,
    },
    /// A frame could not be decoded, or was not the message the protocol expects there.
    #[error("rank {rank}: malformed frame from {peer}: {reason}")]
    MalformedFrame {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
        /// What was wrong with it.
        reason: String,
    },
    /// A received frame's length prefix is above the configured limit; nothing of it was
    /// read.
    #[error("rank {rank}: frame of {len} bytes from {peer} exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
        /// The length the frame claimed.
        len: u64,
        /// The limit (`Config::with_max_frame_bytes`; smaller during the handshake).
        limit: usize,
    },
    /// A message this rank was asked to send does not fit in one frame; nothing was sent.
    #[error(
        "rank {rank}: message of {len} bytes to rank {peer} exceeds the frame limit of {limit} \
         bytes (see Config::with_max_frame_bytes)"
    )]
    MessageTooLarge {
        /// This rank.
        rank: usize,
        /// The rank it was for.
        peer: usize,
        /// The encoded size.
        len: u64,
        /// The configured limit.
        limit: usize,
    },
    /// A call ran past its deadline.
    #[error("rank {rank}: {op} timed out after {after:?}; no answer from rank(s) {peers}")]
    Timeout {
        /// This rank.
        rank: usize,
        /// The call that gave up (`init`, `all_gather`, `recv`, ...).
        op: &'static str,
        /// The ranks that did not answer in time.
        peers: RankList,
        /// The deadline the call had.
        after: Duration,
    },
    /// The peer closed its connection (it exited, dropped its `Bootstrap`, or gave up).
    #[error("rank {rank}: {peer} closed the connection")]
    PeerClosed {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
    },
    /// The peer authenticated but refused the connection, and said why.
    #[error("rank {rank}: {peer} refused the connection: {reason}")]
    Rejected {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
        /// The reason the peer gave.
        reason: String,
    },
    /// A peer sent more unclaimed messages than `Config::max_pending_bytes` /
    /// `max_pending_messages` allow; the bootstrap stops reading it rather than grow.
    #[error(
        "rank {rank}: {peer} sent {bytes} bytes in {messages} messages nobody received yet (limit reached)"
    )]
    Overflow {
        /// This rank.
        rank: usize,
        /// The other end.
        peer: Peer,
        /// Bytes waiting.
        bytes: usize,
        /// Messages waiting.
        messages: usize,
    },
    /// The caller asked for something that cannot work (rank out of range, garbage id,
    /// missing launcher variables, ...).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A `UniqueId` string could not be parsed.
    #[error(transparent)]
    ParseUniqueId(#[from] crate::unique_id::ParseUniqueIdError),
    /// The operating system refused a call.
    #[error("{context}: {source}")]
    System {
        /// What was being done, with rank and address.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A bug in this crate (a broken internal invariant), reported instead of panicking.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The broad class of the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidUsage(_) | Error::ParseUniqueId(_) | Error::MessageTooLarge { .. } => {
                ErrorKind::InvalidUsage
            }
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::WrongSecret { .. }
            | Error::VersionMismatch { .. }
            | Error::MalformedFrame { .. }
            | Error::FrameTooLarge { .. }
            | Error::PeerClosed { .. }
            | Error::Rejected { .. }
            | Error::Overflow { .. } => ErrorKind::Remote,
            Error::System { .. } => ErrorKind::System,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    pub(crate) fn system(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::System {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn timeout(
        rank: usize,
        op: &'static str,
        peers: Vec<usize>,
        after: Duration,
    ) -> Self {
        Error::Timeout {
            rank,
            op,
            peers: peers.into(),
            after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Guards against a timeout at 1024 ranks printing a thousand numbers, or merging
    // ranks that are not adjacent.
    #[test]
    fn rank_list_prints_ranges() {
        let l = RankList::from(vec![9, 1, 3, 4, 5, 6, 7, 3]);
        assert_eq!(l.to_string(), "1, 3-7, 9");
        assert_eq!(RankList::from(vec![]).to_string(), "");
        assert_eq!(RankList::from(vec![0]).to_string(), "0");
        assert_eq!(RankList::from(vec![0, 1]).to_string(), "0-1");
    }
}
