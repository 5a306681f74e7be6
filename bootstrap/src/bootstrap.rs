//! `Bootstrap`: the type, its shared state and its accessors. Ranks find each other over
//! TCP and exchange small messages before any other connection exists.
//!
//! Topology and contract:
//! - Every rank listens on one socket; rank 0's is the root address of the `UniqueId`. A
//!   background thread per rank accepts connections and authenticates them
//!   (`acceptor.rs`, `handshake.rs`). No data frame of a connection is read before its
//!   handshake succeeded.
//! - At init every rank dials rank 0, sends its address and host name, and receives the
//!   table of all of them. Those connections stay open and are reused.
//! - Later connections are made lazily, only between ranks that exchange messages, and
//!   cached: at 1024 ranks a full mesh would be a million sockets. A pair has at most one
//!   connection: in collectives the lower rank dials, and when both dial at once the lower
//!   rank's dial wins (`peer.rs`).
//! - Every blocking call has a deadline of `Config::timeout` from its start; when it passes
//!   the call fails with `Error::Timeout` naming the ranks that did not answer.
//! - Collectives must be called by all ranks in the same order (they are numbered, and
//!   their messages are matched by number); point-to-point messages are matched by
//!   `(peer, tag)` and may interleave with collectives freely.
//!
//! The methods live with their concept: joining and the rank table in `init.rs`, dialling
//! in `connect.rs`, point-to-point messages in `messaging.rs`, collectives in
//! `collective.rs`.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::acceptor::{Acceptor, Rejections};
use crate::config::Config;
use crate::env::Launcher;
use crate::handshake::Local;
use crate::peer::{Limits, PeerSlot};
use crate::unique_id::Secret;

// Ranks share a `Bootstrap` across threads (see the type's docs).
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
};

/// Largest number of ranks (the wire carries ranks as `u32`; the address table of this
/// many ranks still fits in the default frame limit).
pub const MAX_RANKS: usize = 1 << 16;

/// One rank's membership in a bootstrap: its peers' addresses, its connections, and the
/// out-of-band collectives and messages over them.
///
/// `Bootstrap` is `Send + Sync`; point-to-point calls may come from several threads at
/// once. Dropping it closes its listener and connections; peers then get
/// `Error::PeerClosed`.
pub struct Bootstrap {
    pub(crate) inner: Arc<Inner>,
    pub(crate) acceptor: Option<Acceptor>,
    pub(crate) local_rank: usize,
    pub(crate) local_size: usize,
    pub(crate) hostname: String,
    pub(crate) launcher: Option<Launcher>,
    pub(crate) listen_addr: SocketAddr,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("local_rank", &self.local_rank)
            .field("local_size", &self.local_size)
            .field("hostname", &self.hostname)
            .field("listen_addr", &self.listen_addr)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) secret: Secret,
    pub(crate) config: Config,
    pub(crate) listener: TcpListener,
    /// The address ranks dial to reach rank 0.
    pub(crate) root: SocketAddr,
    pub(crate) peers: Mutex<HashMap<usize, Arc<PeerSlot>>>,
    /// Address every rank listens on, by rank; set once the table has arrived.
    pub(crate) addrs: OnceLock<Vec<SocketAddr>>,
    /// Set once by `Drop`; the acceptor stops when it sees it.
    pub(crate) shutdown: AtomicBool,
    pub(crate) seq: AtomicU64,
    pub(crate) rejections: Mutex<Rejections>,
    /// Handshakes in flight, bounded by `MAX_CONCURRENT_HANDSHAKES`.
    pub(crate) handshakes: Mutex<usize>,
    pub(crate) handshakes_cv: Condvar,
}

impl Bootstrap {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Rank among the ranks on this node: the launcher's value if it gave one, else the
    /// position of this rank among the ranks with the same host name.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Number of ranks on this node (launcher's value, else counted by host name).
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// The host name this rank reported.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// The launcher whose environment this rank was started from, if any.
    pub fn launcher(&self) -> Option<Launcher> {
        self.launcher
    }

    /// The address peers dial to reach this rank.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// Deadline of each blocking call.
    pub fn timeout(&self) -> Duration {
        self.inner.config.timeout
    }

    /// How many incoming connections this rank refused (failed handshakes, duplicates).
    pub fn rejected_connections(&self) -> u64 {
        self.inner.rejections.lock().count()
    }

    /// Why the last few refused connections were refused, oldest first.
    pub fn recent_rejections(&self) -> Vec<String> {
        self.inner.rejections.lock().recent()
    }

    /// Number of peers this rank has a connection with now (connections are opened
    /// lazily, one per pair, and kept).
    pub fn connections(&self) -> usize {
        self.inner
            .peers
            .lock()
            .values()
            .filter(|s| s.is_connected())
            .count()
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        // Pairs with the Acquire loads in the acceptor: once it sees this, it accepts nothing.
        self.inner.shutdown.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take() {
            acceptor.stop(&self.inner);
        }
        for slot in self.inner.peers.lock().values() {
            slot.close();
        }
    }
}

impl Inner {
    pub(crate) fn slot(&self, peer: usize) -> Arc<PeerSlot> {
        self.peers.lock().entry(peer).or_default().clone()
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.config.max_frame_bytes,
            version: self.config.protocol_version,
            max_pending_bytes: self.config.max_pending_bytes,
            max_pending_messages: self.config.max_pending_messages,
        }
    }

    pub(crate) fn handshake_span(&self) -> Duration {
        self.config.handshake_timeout.min(self.config.timeout)
    }

    pub(crate) fn local(&self, timeout: Duration) -> Local<'_> {
        Local {
            rank: self.rank,
            size: self.size,
            secret: &self.secret,
            version: self.config.protocol_version,
            timeout,
        }
    }
}
