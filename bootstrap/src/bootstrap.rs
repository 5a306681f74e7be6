//! `Bootstrap`: ranks find each other over TCP and exchange small messages before any
//! other connection exists.
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

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::acceptor::{Acceptor, Rejections};
use crate::config::Config;
use crate::env::{LaunchEnv, Launcher, SecretSource};
use crate::error::{Error, Peer, Result};
use crate::frame::{self, Body, FrameError, MAX_HOSTNAME_BYTES, Message, RankInfo, Tag};
use crate::handshake::{self, Dialed, Local};
use crate::net::{self, RootListener};
use crate::peer::{Conn, Limits, PeerSlot, Recv, Sender, WriteError};
use crate::unique_id::{Secret, UniqueId};

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
    inner: Arc<Inner>,
    acceptor: Option<Acceptor>,
    local_rank: usize,
    local_size: usize,
    hostname: String,
    launcher: Option<Launcher>,
    listen_addr: SocketAddr,
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
    secret: Secret,
    pub(crate) config: Config,
    pub(crate) listener: TcpListener,
    root: SocketAddr,
    peers: Mutex<HashMap<usize, Arc<PeerSlot>>>,
    /// Address every rank listens on, by rank; set once the table has arrived.
    addrs: OnceLock<Vec<SocketAddr>>,
    /// Set once by `Drop`; the acceptor stops when it sees it.
    pub(crate) shutdown: AtomicBool,
    seq: AtomicU64,
    pub(crate) rejections: Mutex<Rejections>,
    /// Handshakes in flight, bounded by `MAX_CONCURRENT_HANDSHAKES`.
    pub(crate) handshakes: Mutex<usize>,
    pub(crate) handshakes_cv: Condvar,
}

/// How rank 0 gets its listener.
enum RootBind {
    Bind(SocketAddr),
    Bound(TcpListener),
}

impl Bootstrap {
    /// Joins the bootstrap named by `id` as `rank` of `size`, with the default [`Config`].
    /// Rank 0 binds `id.root()`; the others dial it. Blocks until every rank has joined.
    ///
    /// # Errors
    /// As [`Bootstrap::init_with_config`].
    pub fn init(id: &UniqueId, rank: usize, size: usize) -> Result<Self> {
        Self::init_with_config(id, rank, size, &Config::default())
    }

    /// Joins the bootstrap named by `id` as `rank` of `size`.
    ///
    /// # Errors
    /// `InvalidUsage` for a bad rank, size or config; `System` if a socket cannot be bound;
    /// `Timeout` naming the ranks that did not join before `config.timeout()`;
    /// `WrongSecret`, `VersionMismatch` or `Rejected` if the root refuses this rank.
    pub fn init_with_config(
        id: &UniqueId,
        rank: usize,
        size: usize,
        config: &Config,
    ) -> Result<Self> {
        Self::start(
            id.root(),
            RootBind::Bind(id.root()),
            id.secret().clone(),
            rank,
            size,
            config,
            None,
        )
    }

    /// Rank 0 of the bootstrap named by `id`, on the listener
    /// [`UniqueId::listen`](crate::UniqueId::listen) bound.
    ///
    /// # Errors
    /// `InvalidUsage` if `listener` is not the one `id` names, else as
    /// [`Bootstrap::init_with_config`].
    pub fn init_root(
        id: &UniqueId,
        listener: RootListener,
        size: usize,
        config: &Config,
    ) -> Result<Self> {
        if listener.local_addr().port() != id.root().port() {
            return Err(Error::InvalidUsage(format!(
                "root listener is bound to {}, but the unique id names {}",
                listener.local_addr(),
                id.root()
            )));
        }
        Self::start(
            id.root(),
            RootBind::Bound(listener.listener),
            id.secret().clone(),
            0,
            size,
            config,
            None,
        )
    }

    /// Joins the bootstrap whose rank 0 listens on `root` (`ip:port` or `host:port`), all
    /// ranks sharing `secret`.
    ///
    /// # Errors
    /// `InvalidUsage` if `root` does not resolve, else as [`Bootstrap::init_with_config`].
    pub fn init_with_addr(
        root: &str,
        secret: Secret,
        rank: usize,
        size: usize,
        config: &Config,
    ) -> Result<Self> {
        let root = crate::env::resolve(root)?;
        Self::start(root, RootBind::Bind(root), secret, rank, size, config, None)
    }

    /// Joins the bootstrap described by the launcher's environment (torchrun, Open MPI,
    /// Slurm or PMI; see [`LaunchEnv`]), with the default [`Config`].
    ///
    /// # Errors
    /// As [`LaunchEnv::detect`] and [`Bootstrap::init_with_config`].
    pub fn from_env() -> Result<Self> {
        Self::from_env_with_config(&Config::default())
    }

    /// As [`Bootstrap::from_env`], with `config`.
    ///
    /// # Errors
    /// As [`Bootstrap::from_env`].
    pub fn from_env_with_config(config: &Config) -> Result<Self> {
        Self::from_launch_env(&LaunchEnv::detect()?, config)
    }

    /// Joins the bootstrap `env` describes. The launcher's local rank and size win over
    /// the ones computed from host names, unless `config` sets them.
    ///
    /// # Errors
    /// As [`Bootstrap::init_with_config`].
    pub fn from_launch_env(env: &LaunchEnv, config: &Config) -> Result<Self> {
        tracing::info!("oxccl bootstrap: found {env}");
        if env.secret_source == SecretSource::Derived {
            tracing::warn!(
                "oxccl bootstrap: neither {} nor {} is set; using a secret derived from the job's \
                 environment, which keeps other jobs out but does not authenticate against \
                 anyone who can read this job's environment",
                crate::env::ENV_UNIQUE_ID,
                crate::env::ENV_SECRET
            );
        }
        let mut config = config.clone();
        if config.local_rank.is_none() && config.local_size.is_none() {
            config.local_rank = env.local_rank;
            config.local_size = env.local_size;
        }
        let root = env.root_addr()?;
        // Like torchrun's store, rank 0 listens on every interface at MASTER_PORT: the name
        // in MASTER_ADDR may resolve differently on the root itself.
        let bind = if env.root_from_unique_id {
            root
        } else {
            SocketAddr::new(net::unspecified_like(&root), root.port())
        };
        Self::start(
            root,
            RootBind::Bind(bind),
            env.secret().clone(),
            env.rank,
            env.size,
            &config,
            Some(env.launcher),
        )
    }

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

    /// Sends `data` to `peer` under `tag`. Returns once the message is handed to the
    /// socket; it is received by `peer`'s [`Bootstrap::recv`] with the same tag. Messages
    /// with the same `(peer, tag)` arrive in order.
    ///
    /// # Errors
    /// `InvalidUsage` if `peer` is out of range; `MessageTooLarge` if `data` exceeds the
    /// frame limit; `Timeout`, `PeerClosed`, or a connection error from dialling `peer`.
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        let deadline = self.deadline();
        self.send_body(
            peer,
            Tag::User(tag),
            Body::Bytes(data.to_vec()),
            deadline,
            "send",
            true,
        )
    }

    /// Receives the next message `peer` sent under `tag`, waiting until the deadline.
    /// Messages with other tags that arrive meanwhile are kept for their own `recv`.
    ///
    /// # Errors
    /// `InvalidUsage` if `peer` is out of range; `Timeout` naming `peer`; `PeerClosed`;
    /// `MalformedFrame` / `FrameTooLarge` / `Overflow` if the peer broke the protocol.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        match self.recv_body(peer, Tag::User(tag), self.deadline(), "recv")? {
            Body::Bytes(b) => Ok(b),
            other => Err(self.unexpected(peer, "bytes", &other)),
        }
    }

    /// Sends `value` (postcard-encoded) to `peer` under `tag`.
    ///
    /// # Errors
    /// As [`Bootstrap::send`]; `InvalidUsage` if `value` does not serialize.
    pub fn send_value<T: Serialize + ?Sized>(
        &self,
        peer: usize,
        tag: u64,
        value: &T,
    ) -> Result<()> {
        self.send(peer, tag, &self.encode_value(value)?)
    }

    /// Receives a value `peer` sent with [`Bootstrap::send_value`] under `tag`.
    ///
    /// # Errors
    /// As [`Bootstrap::recv`]; `MalformedFrame` if the bytes are not a `T`.
    pub fn recv_value<T: DeserializeOwned>(&self, peer: usize, tag: u64) -> Result<T> {
        let bytes = self.recv(peer, tag)?;
        self.decode_value(peer, &bytes)
    }

    // ---- private: init ----

    fn start(
        root: SocketAddr,
        root_bind: RootBind,
        secret: Secret,
        rank: usize,
        size: usize,
        config: &Config,
        launcher: Option<Launcher>,
    ) -> Result<Self> {
        config.validate().map_err(Error::InvalidUsage)?;
        if size == 0 || size > MAX_RANKS || rank >= size {
            return Err(Error::InvalidUsage(format!(
                "rank {rank} of size {size}: need 0 < size <= {MAX_RANKS} and rank < size"
            )));
        }
        let deadline = Instant::now() + config.timeout;
        let listener = match (rank, root_bind) {
            (0, RootBind::Bound(l)) => l,
            (0, RootBind::Bind(addr)) => net::bind_listener(addr).map_err(|e| {
                Error::system(
                    format!("rank 0: binding the bootstrap root listener on {addr}"),
                    e,
                )
            })?,
            (_, _) => {
                let ip = config
                    .listen_ip
                    .unwrap_or_else(|| net::unspecified_like(&root));
                let addr = SocketAddr::new(ip, 0);
                net::bind_listener(addr).map_err(|e| {
                    Error::system(format!("rank {rank}: binding a listener on {addr}"), e)
                })?
            }
        };
        let bound = listener.local_addr().map_err(|e| {
            Error::system(format!("rank {rank}: reading the listener's address"), e)
        })?;
        let hostname = config.hostname.clone().unwrap_or_else(net::hostname);
        let inner = Arc::new(Inner {
            rank,
            size,
            secret,
            config: config.clone(),
            listener,
            root,
            peers: Mutex::new(HashMap::new()),
            addrs: OnceLock::new(),
            shutdown: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            rejections: Mutex::new(Rejections::default()),
            handshakes: Mutex::new(0),
            handshakes_cv: Condvar::new(),
        });
        let acceptor = Acceptor::spawn(inner.clone())?;
        // From here on, an early return drops `bs`, which stops the acceptor and closes
        // every connection.
        let mut bs = Bootstrap {
            inner,
            acceptor: Some(acceptor),
            local_rank: 0,
            local_size: 1,
            hostname,
            launcher,
            listen_addr: if rank == 0 { root } else { bound },
        };
        let table = if rank == 0 {
            bs.gather_table(deadline)?
        } else {
            bs.join_root(bound.port(), deadline)?
        };
        let (computed_rank, computed_size) = local_of(&table, rank);
        bs.local_rank = config.local_rank.unwrap_or(computed_rank);
        bs.local_size = config.local_size.unwrap_or(computed_size);
        if bs.local_rank >= bs.local_size {
            tracing::warn!(
                "rank {rank}: launcher local rank {} is not below the {} ranks on host {:?}",
                bs.local_rank,
                bs.local_size,
                bs.hostname
            );
        }
        let addrs: Vec<SocketAddr> = table.into_iter().map(|i| i.listen).collect();
        if bs.inner.addrs.set(addrs).is_err() {
            return Err(Error::Internal("address table set twice".into()));
        }
        tracing::debug!(
            "rank {rank}/{size}: bootstrap ready (local rank {} of {}, listening on {})",
            bs.local_rank,
            bs.local_size,
            bs.listen_addr
        );
        Ok(bs)
    }

    /// Rank 0: waits for every rank to join, then sends each the table.
    fn gather_table(&self, deadline: Instant) -> Result<Vec<RankInfo>> {
        let size = self.inner.size;
        for r in 1..size {
            if !self.inner.slot(r).wait_connected(deadline) {
                let missing: Vec<usize> = (r..size)
                    .filter(|&q| !self.inner.slot(q).is_connected())
                    .collect();
                return Err(Error::timeout(
                    0,
                    "init (waiting for ranks to join)",
                    missing,
                    self.timeout(),
                ));
            }
        }
        let mut table = Vec::with_capacity(size);
        table.push(RankInfo {
            listen: self.inner.root,
            hostname: self.hostname.clone(),
        });
        for r in 1..size {
            match self.recv_body(r, Tag::Join, deadline, "init (waiting for join messages)")? {
                Body::Join(info) if valid_info(&info) => table.push(info),
                Body::Join(_) => {
                    return Err(Error::MalformedFrame {
                        rank: 0,
                        peer: Peer::Rank(r),
                        reason: "join message with a bad address or host name".into(),
                    });
                }
                other => return Err(self.unexpected(r, "join message", &other)),
            }
        }
        let msg = Message::Data {
            tag: Tag::Table,
            body: Body::Table(table),
        };
        // The table goes to every rank; name the first in an error.
        let frame = self.encode(&msg, 1)?;
        for r in 1..size {
            self.send_frame(
                r,
                &frame,
                deadline,
                "init (sending the address table)",
                false,
            )?;
        }
        let Message::Data {
            body: Body::Table(table),
            ..
        } = msg
        else {
            return Err(Error::Internal("table message changed".into()));
        };
        Ok(table)
    }

    /// Ranks other than 0: dial the root, say where this rank listens, get the table.
    fn join_root(&self, port: u16, deadline: Instant) -> Result<Vec<RankInfo>> {
        let rank = self.inner.rank;
        let conn = self.conn_for(0, true, deadline, "init (joining the root)")?;
        let ip = match self.inner.config.listen_ip {
            Some(ip) => ip,
            // The interface that reaches the root is the one peers can reach us on.
            None => conn
                .stream()
                .local_addr()
                .map_err(|e| Error::system(format!("rank {rank}: reading the local address"), e))?
                .ip(),
        };
        let info = RankInfo {
            listen: SocketAddr::new(ip, port),
            hostname: self.hostname.clone(),
        };
        self.send_body(
            0,
            Tag::Join,
            Body::Join(info),
            deadline,
            "init (joining the root)",
            true,
        )?;
        let table = match self.recv_body(
            0,
            Tag::Table,
            deadline,
            "init (waiting for the address table)",
        )? {
            Body::Table(t) => t,
            other => return Err(self.unexpected(0, "address table", &other)),
        };
        if table.len() != self.inner.size || !table.iter().all(valid_info) {
            return Err(Error::MalformedFrame {
                rank,
                peer: Peer::Rank(0),
                reason: format!(
                    "address table with {} entries for {} ranks, or a bad entry",
                    table.len(),
                    self.inner.size
                ),
            });
        }
        Ok(table)
    }

    // ---- crate-internal: messaging used by the collectives ----

    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.timeout
    }

    pub(crate) fn next_seq(&self) -> u64 {
        // Relaxed: the number is only a label matched across ranks; it publishes nothing.
        self.inner.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends `body` to `peer`; `initiate` says whether this rank dials if there is no
    /// connection yet (collectives: only the lower rank of the pair).
    pub(crate) fn send_body(
        &self,
        peer: usize,
        tag: Tag,
        body: Body,
        deadline: Instant,
        op: &'static str,
        initiate: bool,
    ) -> Result<()> {
        if peer == self.inner.rank {
            let bytes = body_bytes(&body);
            return self
                .inner
                .slot(peer)
                .push_local(tag, body, bytes, &self.inner.limits())
                .map_err(|f| f.to_error(peer, peer, self.inner.config.protocol_version));
        }
        let frame = self.encode(&Message::Data { tag, body }, peer)?;
        self.send_frame(peer, &frame, deadline, op, initiate)
    }

    /// Receives the message tagged `tag` from `peer`.
    pub(crate) fn recv_body(
        &self,
        peer: usize,
        tag: Tag,
        deadline: Instant,
        op: &'static str,
    ) -> Result<Body> {
        match self
            .inner
            .slot(peer)
            .recv(tag, deadline, &self.inner.limits())
        {
            Recv::Got(b) => Ok(b),
            Recv::TimedOut => Err(Error::timeout(
                self.inner.rank,
                op,
                vec![peer],
                self.timeout(),
            )),
            Recv::Failed(f) => {
                Err(f.to_error(self.inner.rank, peer, self.inner.config.protocol_version))
            }
        }
    }

    /// Makes sure a connection to `peer` exists or is being made by the side that should
    /// make it (the lower rank), so a following `recv_body` can succeed.
    pub(crate) fn link(&self, peer: usize, deadline: Instant, op: &'static str) -> Result<()> {
        if self.inner.rank < peer {
            self.conn_for(peer, true, deadline, op)?;
        }
        Ok(())
    }

    /// Sends `body` to `to` and receives the message tagged `tag` from `from`, as one step
    /// of a collective. What the socket buffer does not take at once is written by a
    /// helper thread while this one receives: two ranks exchanging large messages must
    /// not both block in `write` with nobody reading.
    pub(crate) fn exchange(
        &self,
        to: usize,
        from: usize,
        tag: Tag,
        body: Body,
        deadline: Instant,
        op: &'static str,
    ) -> Result<Body> {
        let rank = self.inner.rank;
        let frame = self.encode(&Message::Data { tag, body }, to)?;
        let conn = self.conn_for(to, rank < to, deadline, op)?;
        self.link(from, deadline, op)?;
        let writer = conn
            .writer(deadline)
            .map_err(|e| self.write_error(to, op, e))?;
        let done = writer
            .write_nonblocking(&frame)
            .map_err(|e| self.write_error(to, op, e))?;
        if done == frame.len() {
            drop(writer);
            return self.recv_body(from, tag, deadline, op);
        }
        let rest = &frame[done..];
        thread::scope(|s| {
            let sender = thread::Builder::new()
                .name(format!("oxccl-bootstrap-send-{rank}"))
                .spawn_scoped(s, move || writer.write_all(rest, deadline))
                .map_err(|e| Error::system(format!("rank {rank}: spawning a sender thread"), e))?;
            let got = self.recv_body(from, tag, deadline, op);
            let sent = sender
                .join()
                .map_err(|_| Error::Internal("sender thread panicked".into()))?;
            sent.map_err(|e| self.write_error(to, op, e))?;
            got
        })
    }

    pub(crate) fn unexpected(&self, peer: usize, wanted: &str, got: &Body) -> Error {
        let kind = match got {
            Body::Bytes(_) => "bytes",
            Body::Blocks(_) => "all-gather blocks",
            Body::Join(_) => "join message",
            Body::Table(_) => "address table",
        };
        Error::MalformedFrame {
            rank: self.inner.rank,
            peer: Peer::Rank(peer),
            reason: format!("expected {wanted}, got {kind}"),
        }
    }

    pub(crate) fn encode_value<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>> {
        postcard::to_stdvec(value)
            .map_err(|e| Error::InvalidUsage(format!("value does not serialize: {e}")))
    }

    pub(crate) fn decode_value<T: DeserializeOwned>(&self, peer: usize, bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes).map_err(|e| Error::MalformedFrame {
            rank: self.inner.rank,
            peer: Peer::Rank(peer),
            reason: format!(
                "value does not decode as {}: {e}",
                std::any::type_name::<T>()
            ),
        })
    }

    // ---- private: connections ----

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.inner.size {
            return Err(Error::InvalidUsage(format!(
                "rank {}: peer {peer} out of range (size {})",
                self.inner.rank, self.inner.size
            )));
        }
        Ok(())
    }

    fn encode(&self, msg: &Message, to: usize) -> Result<Vec<u8>> {
        let c = &self.inner.config;
        frame::encode(c.protocol_version, msg, c.max_frame_bytes).map_err(|e| match e {
            FrameError::TooLarge { len, limit } => Error::MessageTooLarge {
                rank: self.inner.rank,
                peer: to,
                len,
                limit,
            },
            e => Error::Internal(format!("message does not encode: {e}")),
        })
    }

    fn send_frame(
        &self,
        peer: usize,
        frame: &[u8],
        deadline: Instant,
        op: &'static str,
        initiate: bool,
    ) -> Result<()> {
        let conn = self.conn_for(peer, initiate, deadline, op)?;
        let writer = conn
            .writer(deadline)
            .map_err(|e| self.write_error(peer, op, e))?;
        let done = writer
            .write_nonblocking(frame)
            .map_err(|e| self.write_error(peer, op, e))?;
        writer
            .write_all(&frame[done..], deadline)
            .map_err(|e| self.write_error(peer, op, e))
    }

    fn write_error(&self, peer: usize, op: &'static str, e: WriteError) -> Error {
        match e {
            WriteError::TimedOut => Error::timeout(self.inner.rank, op, vec![peer], self.timeout()),
            WriteError::Closed => Error::PeerClosed {
                rank: self.inner.rank,
                peer: Peer::Rank(peer),
            },
        }
    }

    /// The connection to send to `peer` on, dialling it if `initiate` and there is none.
    fn conn_for(
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

    fn limits(&self) -> Limits {
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

/// Position of `rank` among the ranks with its host name, and how many there are.
fn local_of(table: &[RankInfo], rank: usize) -> (usize, usize) {
    let Some(mine) = table.get(rank) else {
        return (0, 1);
    };
    let same = |i: &&RankInfo| i.hostname == mine.hostname;
    let local_rank = table[..rank].iter().filter(same).count();
    let local_size = table.iter().filter(same).count();
    (local_rank, local_size)
}

fn valid_info(info: &RankInfo) -> bool {
    !info.hostname.is_empty()
        && info.hostname.len() <= MAX_HOSTNAME_BYTES
        && info.listen.port() != 0
}

fn body_bytes(body: &Body) -> usize {
    match body {
        Body::Bytes(b) => b.len(),
        Body::Blocks(bs) => bs.iter().map(|b| b.data.len() + 8).sum(),
        Body::Join(_) | Body::Table(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str) -> RankInfo {
        RankInfo {
            listen: "127.0.0.1:1".parse().unwrap(),
            hostname: host.into(),
        }
    }

    // Guards against local rank being the global rank, or counting other hosts' ranks.
    #[test]
    fn local_rank_groups_by_host() {
        let t = vec![info("a"), info("b"), info("a"), info("b"), info("a")];
        assert_eq!(local_of(&t, 0), (0, 3));
        assert_eq!(local_of(&t, 1), (0, 2));
        assert_eq!(local_of(&t, 2), (1, 3));
        assert_eq!(local_of(&t, 3), (1, 2));
        assert_eq!(local_of(&t, 4), (2, 3));
    }
}
