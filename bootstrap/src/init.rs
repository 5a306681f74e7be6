//! Joining a bootstrap: the constructors of [`Bootstrap`], binding this rank's listener,
//! and the rank table rank 0 gathers and hands out.
//!
//! At init every rank dials rank 0, sends its address and host name (`Join`), and
//! receives the table of all of them (`Table`); those connections stay open and are
//! reused. The local rank and size come from the launcher when it gives them, else from
//! the table's host names.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::acceptor::{Acceptor, Rejections};
use crate::bootstrap::{Bootstrap, Inner, MAX_RANKS};
use crate::config::Config;
use crate::env::{ENV_BOOTSTRAP_BIND, LaunchEnv, Launcher, SecretSource};
use crate::error::{Error, Peer, Result};
use crate::frame::{Body, MAX_HOSTNAME_BYTES, Message, RankInfo, Tag};
use crate::net::{self, RootListener};
use crate::unique_id::{Secret, UniqueId};

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
    /// the ones computed from host names, unless `config` sets them. Rank 0 listens on
    /// the root address `env` names, or on the IP of [`Config::with_root_bind_ip`], else
    /// of `OXCCL_BOOTSTRAP_BIND` ([`LaunchEnv::root_bind`]). A secret derived from the
    /// launcher's variables is warned about, once per process.
    ///
    /// # Errors
    /// As [`Bootstrap::init_with_config`].
    pub fn from_launch_env(env: &LaunchEnv, config: &Config) -> Result<Self> {
        tracing::info!("oxccl bootstrap: found {env}");
        if env.secret_source == SecretSource::Derived {
            crate::env::warn_derived_secret_once(env.launcher);
        }
        let mut config = config.clone();
        if config.local_rank.is_none() && config.local_size.is_none() {
            config.local_rank = env.local_rank;
            config.local_size = env.local_size;
        }
        if config.root_bind_ip.is_none() {
            config.root_bind_ip = env.root_bind;
        }
        let root = env.root_addr()?;
        if env.rank == 0 {
            warn_if_name_is_loopback(env, root, &config);
        }
        Self::start(
            root,
            RootBind::Bind(root),
            env.secret().clone(),
            env.rank,
            env.size,
            &config,
            Some(env.launcher),
        )
    }

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
            (0, RootBind::Bind(root)) => {
                let addr = SocketAddr::new(config.root_bind_ip.unwrap_or(root.ip()), root.port());
                net::bind_listener(addr).map_err(|e| {
                    Error::system(
                        format!(
                            "rank 0: binding the bootstrap root listener on {addr} (to listen \
                             on another address, set {ENV_BOOTSTRAP_BIND} or \
                             Config::with_root_bind_ip)"
                        ),
                        e,
                    )
                })?
            }
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
        // What peers dial, as the table has it: a rank other than 0 is bound to the
        // unspecified address, which names no interface another node can reach.
        if let Some(mine) = table.get(rank) {
            bs.listen_addr = mine.listen;
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
}

/// Warns when a host name (not an IP, not `localhost`) resolves to a loopback address on
/// rank 0 of a job of several ranks: Debian-style `/etc/hosts` maps a host's own name to
/// `127.0.1.1`, where ranks on other hosts cannot reach the root.
fn warn_if_name_is_loopback(env: &LaunchEnv, root: SocketAddr, config: &Config) {
    if env.size == 1 || config.root_bind_ip.is_some() {
        return;
    }
    if let Some(host) = loopback_name(&env.root, root) {
        tracing::warn!(
            "oxccl bootstrap: the root name {host:?} resolves to {} on rank 0, so the root \
             listens there and only ranks on this host can reach it; if ranks run on other \
             hosts, set MASTER_ADDR to an address they can reach, or {ENV_BOOTSTRAP_BIND}=0.0.0.0",
            root.ip()
        );
    }
}

/// The host part of `host_port` if it is a name other than `localhost` and `resolved` is
/// a loopback address.
fn loopback_name(host_port: &str, resolved: SocketAddr) -> Option<&str> {
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    let is_ip = host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok();
    (resolved.ip().is_loopback() && !is_ip && !host.eq_ignore_ascii_case("localhost"))
        .then_some(host)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str) -> RankInfo {
        RankInfo {
            listen: "127.0.0.1:1".parse().unwrap(),
            hostname: host.into(),
        }
    }

    /// Guards against the loopback warning missing a host name that resolved to loopback
    /// (`/etc/hosts` mapping the host's name to 127.0.1.1), or firing for addresses and
    /// `localhost`, which name loopback on purpose.
    #[test]
    fn loopback_names_are_told_apart() {
        let lo: SocketAddr = "127.0.1.1:29500".parse().unwrap();
        let lo6: SocketAddr = "[::1]:29500".parse().unwrap();
        let real: SocketAddr = "10.0.0.7:29500".parse().unwrap();
        assert_eq!(loopback_name("node7:29500", lo), Some("node7"));
        assert_eq!(loopback_name("node7:29500", lo6), Some("node7"));
        assert_eq!(loopback_name("node7:29500", real), None);
        assert_eq!(loopback_name("127.0.1.1:29500", lo), None);
        assert_eq!(loopback_name("[::1]:29500", lo6), None);
        assert_eq!(loopback_name("LocalHost:29500", lo), None);
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
