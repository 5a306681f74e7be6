//! Connections between ranks: which side dials, dialling and authenticating, and the
//! address each rank is dialled at.
//!
//! Connections are made lazily, only between ranks that exchange messages, and cached: at
//! 1024 ranks a full mesh would be a million sockets. A pair has at most one connection:
//! in collectives the lower rank dials, and when both dial at once the lower rank's dial
//! wins (`peer.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::bootstrap::{Bootstrap, Inner};
use crate::error::{Error, Peer, Result};
use crate::handshake::{self, Dialed};
use crate::net;
use crate::peer::{Conn, Sender};

impl Bootstrap {
    /// Makes sure a connection to `peer` exists or is being made by the side that should
    /// make it (the lower rank), so a following `recv_body` can succeed.
    pub(crate) fn link(&self, peer: usize, deadline: Instant, op: &'static str) -> Result<()> {
        if self.inner.rank < peer {
            self.conn_for(peer, true, deadline, op)?;
        }
        Ok(())
    }

    /// The connection to send to `peer` on, dialling it if `initiate` and there is none.
    pub(crate) fn conn_for(
        &self,
        peer: usize,
        initiate: bool,
        deadline: Instant,
        op: &'static str,
    ) -> Result<Arc<Conn>> {
        let rank = self.inner.rank;
        let slot = self.inner.slot(peer);
        let mut initiate = initiate;
        loop {
            match slot.sender(initiate, deadline) {
                Sender::Ready(c) => return Ok(c),
                Sender::TimedOut => {
                    return Err(Error::timeout(rank, op, vec![peer], self.timeout()));
                }
                Sender::Failed(f) => {
                    return Err(f.to_error(rank, peer, self.inner.config.protocol_version));
                }
                Sender::MustConnect => match self.dial(peer, deadline, op) {
                    Ok(Some(conn)) => {
                        return slot.finish_connect(Some(Arc::new(conn))).ok_or(
                            Error::PeerClosed {
                                rank,
                                peer: Peer::Rank(peer),
                            },
                        );
                    }
                    Ok(None) => {
                        // The lower rank is dialling us; its connection is on its way.
                        slot.finish_connect(None);
                        initiate = false;
                    }
                    Err(e) => {
                        slot.finish_connect(None);
                        return Err(e);
                    }
                },
            }
        }
    }

    /// Dials `peer` and authenticates, retrying connections that drop during the
    /// handshake (a listener backlog overflowing under a thousand simultaneous dials)
    /// until `deadline`. `None` if the peer is dialling us at the same time and its
    /// connection wins.
    fn dial(&self, peer: usize, deadline: Instant, op: &'static str) -> Result<Option<Conn>> {
        let rank = self.inner.rank;
        let addr = self.inner.addr_of(peer)?;
        let mut backoff = Duration::from_millis(1);
        loop {
            let Some(stream) = net::connect(addr, deadline).map_err(|e| {
                Error::system(
                    format!("rank {rank}: connecting to rank {peer} at {addr}"),
                    e,
                )
            })?
            else {
                return Err(Error::timeout(rank, op, vec![peer], self.timeout()));
            };
            let hs_span = self.inner.handshake_span();
            let hs_deadline = deadline.min(Instant::now() + hs_span);
            let me = self.inner.local(hs_span);
            match handshake::connect(&stream, &me, peer, hs_deadline) {
                Ok(Dialed::Welcome) => {
                    return Conn::new(stream).map(Some).map_err(|e| {
                        Error::system(
                            format!("rank {rank}: configuring the connection to rank {peer}"),
                            e,
                        )
                    });
                }
                Ok(Dialed::Raced) => return Ok(None),
                Err(Error::PeerClosed { .. } | Error::Timeout { .. })
                    if Instant::now() < deadline =>
                {
                    tracing::debug!(
                        "rank {rank}: handshake with rank {peer} at {addr} dropped; retrying"
                    );
                    thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                Err(Error::Timeout { .. }) => {
                    return Err(Error::timeout(rank, op, vec![peer], self.timeout()));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Inner {
    fn addr_of(&self, peer: usize) -> Result<SocketAddr> {
        match self.addrs.get() {
            Some(addrs) => addrs
                .get(peer)
                .copied()
                .ok_or_else(|| Error::InvalidUsage(format!("rank {peer} out of range"))),
            None if peer == 0 => Ok(self.root),
            None => Err(Error::Internal(format!(
                "rank {}: dialling rank {peer} before the address table arrived",
                self.rank
            ))),
        }
    }
}
