//! `Config`: deadlines and limits of one bootstrap.
//!
//! Read once at init; every blocking call of the resulting `Bootstrap` gets a deadline of
//! `timeout` from its start. Limits bound what a peer can make this rank allocate.

use std::net::IpAddr;
use std::time::Duration;

use crate::frame::PROTOCOL_VERSION;

/// Default deadline of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default deadline of one connection handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default limit on one frame (length prefix excluded).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;
/// Smallest accepted frame limit: the address table of a small job must fit.
pub const MIN_MAX_FRAME_BYTES: usize = 4 << 10;
/// Default limit on bytes received from one peer and not yet claimed by a `recv`.
pub const DEFAULT_MAX_PENDING_BYTES: usize = 64 << 20;
/// Default limit on messages received from one peer and not yet claimed by a `recv`.
pub const DEFAULT_MAX_PENDING_MESSAGES: usize = 4096;

/// Settings of a bootstrap; `Config::default()` suits most jobs.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_frame_bytes: usize,
    pub(crate) max_pending_bytes: usize,
    pub(crate) max_pending_messages: usize,
    pub(crate) hostname: Option<String>,
    pub(crate) local_rank: Option<usize>,
    pub(crate) local_size: Option<usize>,
    pub(crate) listen_ip: Option<IpAddr>,
    pub(crate) root_bind_ip: Option<IpAddr>,
    pub(crate) protocol_version: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            max_pending_messages: DEFAULT_MAX_PENDING_MESSAGES,
            hostname: None,
            local_rank: None,
            local_size: None,
            listen_ip: None,
            root_bind_ip: None,
            protocol_version: PROTOCOL_VERSION,
        }
    }
}

impl Config {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Deadline of every blocking call (init, collectives, send, recv), counted from the
    /// start of the call. Default [`DEFAULT_TIMEOUT`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Deadline of one connection handshake; an unauthenticated connection is dropped when
    /// it passes. Capped by the call timeout. Default [`DEFAULT_HANDSHAKE_TIMEOUT`].
    #[must_use]
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Largest frame this rank sends or accepts. Default [`DEFAULT_MAX_FRAME_BYTES`];
    /// must be at least [`MIN_MAX_FRAME_BYTES`] and below 4 GiB.
    #[must_use]
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }

    /// Bytes and messages one peer may have waiting for a `recv` before the bootstrap stops
    /// reading it and reports [`Error::Overflow`](crate::Error::Overflow).
    #[must_use]
    pub fn with_max_pending(mut self, bytes: usize, messages: usize) -> Self {
        self.max_pending_bytes = bytes;
        self.max_pending_messages = messages;
        self
    }

    /// The name ranks are grouped by to compute the local rank (default: the OS host name).
    /// Lets tests pretend threads of one process are on several nodes.
    #[must_use]
    pub fn with_hostname(mut self, hostname: impl Into<String>) -> Self {
        self.hostname = Some(hostname.into());
        self
    }

    /// The local rank and node size given by a launcher; they win over the values computed
    /// from host names. `Bootstrap::from_env` sets them from the environment.
    #[must_use]
    pub fn with_local_rank(mut self, local_rank: Option<usize>, local_size: Option<usize>) -> Self {
        self.local_rank = local_rank;
        self.local_size = local_size;
        self
    }

    /// The IP this rank listens on and advertises to its peers (ranks other than 0).
    /// Default: the address of the interface that reaches the root.
    #[must_use]
    pub fn with_listen_ip(mut self, ip: IpAddr) -> Self {
        self.listen_ip = Some(ip);
        self
    }

    /// The IP rank 0 listens on, instead of the root address's own; the port stays the
    /// root's. `0.0.0.0` or `::` listen on every interface (as torchrun's store does), for a
    /// root whose name resolves on the root itself to an address the peers cannot reach
    /// (a `127.0.1.1` line in `/etc/hosts`, NAT).
    ///
    /// Default: rank 0 listens on exactly the root address (`MASTER_ADDR` resolved, or the
    /// `UniqueId`'s), so the bootstrap port is not open on other networks.
    /// [`Bootstrap::from_env`](crate::Bootstrap::from_env) takes it from
    /// `OXCCL_BOOTSTRAP_BIND` when it is not set here. Not used by
    /// [`Bootstrap::init_root`](crate::Bootstrap::init_root), whose listener is bound already.
    #[must_use]
    pub fn with_root_bind_ip(mut self, ip: IpAddr) -> Self {
        self.root_bind_ip = Some(ip);
        self
    }

    /// Speak another protocol version; only for testing how versions are told apart.
    #[doc(hidden)]
    #[must_use]
    pub fn with_protocol_version(mut self, version: u32) -> Self {
        self.protocol_version = version;
        self
    }

    /// Deadline of every blocking call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Largest frame this rank sends or accepts.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.timeout.is_zero() {
            return Err("timeout must be above zero".into());
        }
        if self.handshake_timeout.is_zero() {
            return Err("handshake timeout must be above zero".into());
        }
        if self.max_frame_bytes < MIN_MAX_FRAME_BYTES || self.max_frame_bytes > u32::MAX as usize {
            return Err(format!(
                "max_frame_bytes = {} is outside {MIN_MAX_FRAME_BYTES}..={}",
                self.max_frame_bytes,
                u32::MAX
            ));
        }
        if self.max_pending_messages == 0 {
            return Err("max_pending_messages must be above zero".into());
        }
        if let Some(h) = &self.hostname
            && (h.is_empty() || h.len() > crate::frame::MAX_HOSTNAME_BYTES)
        {
            return Err(format!(
                "hostname must have 1..={} bytes",
                crate::frame::MAX_HOSTNAME_BYTES
            ));
        }
        Ok(())
    }
}
