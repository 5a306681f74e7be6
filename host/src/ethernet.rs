//! The Ethernet transport's endpoint: a rank's listener, and the admission of peers'
//! connections to it.
//!
//! A connection is set up pairwise through the out-of-band exchange (which the bootstrap
//! authenticates with the job's secret): each rank draws a fresh random token for the
//! connection its peer will open to it and sends its listener's address and the token to
//! the peer; the peer connects and presents the token in its first frame, which
//! [`EthernetEndpoint::accept`] checks. A connection that does not present the expected token from
//! the expected rank within the limit is told why and closed, and the endpoint keeps
//! waiting for the right one until its deadline; each token admits one connection. So only
//! a rank that took part in the authenticated exchange gets to write this rank's memory, and
//! even then only inside its registrations (see `ethernet_receiver.rs`).
//!
//! One connection per peer pair and direction: a rank's proxy writes over the connection it
//! opened, and applies what its peer writes from the connection it accepted.

use crate::error::{Error, Result};
use crate::ethernet_receiver::{Receiver, ReceiverContext, readable};
use crate::ethernet_registry::EthernetRegistry;
use crate::ethernet_staging::Staging;
use crate::ethernet_wire::{Message, ReadOutcome, TOKEN_BYTES, read_header, send_frame};
use oxccl_proxy::{FailureSink, ProxyError};
use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a connection may take to send its first frame; a connection that sends nothing
/// holds up the admission of others only that long.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an accepted socket's reads wait before the deadline is looked at again.
const READ_TICK: Duration = Duration::from_millis(50);

/// Most receivers (admitted connections) an endpoint runs at once.
const MAX_RECEIVERS: usize = 4096;

/// A random token for one connection.
///
/// # Errors
/// The operating system's random source failed.
pub fn new_token() -> Result<[u8; TOKEN_BYTES]> {
    let mut token = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut token).map_err(|e| Error::System {
        context: "drawing an Ethernet connection token".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(token)
}

/// The error of `peer` lost mid-run, as this rank (`rank`) saw it over Ethernet: `what` says
/// how (its connection closed or reset without a goodbye, under a receive, send or flush).
pub(crate) fn lost_peer(rank: u32, peer: u32, what: &str) -> ProxyError {
    ProxyError::PeerLost {
        rank,
        peer,
        transport: "ethernet",
        message: format!("{what}: its process ended, or it dropped the connection mid-run"),
    }
}

/// A rank's Ethernet listener and the receivers of the connections it admitted.
pub struct EthernetEndpoint {
    listener: TcpListener,
    addr: SocketAddr,
    context: ReceiverContext,
    receivers: Mutex<Vec<Receiver>>,
}

impl EthernetEndpoint {
    /// A listener of rank `rank` on `ip` (a free port), whose admitted connections write
    /// into `registry` and report refusals to `failures`; `timeout` bounds every admission,
    /// frame and reply.
    ///
    /// # Errors
    /// The socket could not be bound.
    pub fn bind(
        rank: u32,
        ip: IpAddr,
        registry: Arc<EthernetRegistry>,
        failures: FailureSink,
        timeout: Duration,
    ) -> Result<Self> {
        let system = |what: &str, e: std::io::Error| Error::System {
            context: format!("rank {rank}: Ethernet listener on {ip}: {what}"),
            source: e,
        };
        let listener =
            TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| system("binding", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| system("making it non-blocking", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| system("reading its address", e))?;
        tracing::debug!(rank, %addr, "Ethernet listener bound");
        Ok(EthernetEndpoint {
            listener,
            addr,
            context: ReceiverContext {
                rank,
                registry,
                failures,
                frame_timeout: timeout,
                staging: None,
            },
            receivers: Mutex::new(Vec::new()),
        })
    }

    /// The same endpoint, whose receivers reach this rank's memory through `staging` (a
    /// GPU's memory; see `ethernet_staging.rs`).
    pub(crate) fn staged(mut self, staging: Option<Arc<dyn Staging>>) -> Self {
        self.context.staging = staging;
        self
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The table admitted connections write into.
    pub fn registry(&self) -> &Arc<EthernetRegistry> {
        &self.context.registry
    }

    /// Waits (at most the endpoint's limit) for `peer` to connect presenting `token`, then
    /// admits the connection: a receiver thread applies its frames from then on. Other
    /// connections meanwhile are told why and closed.
    ///
    /// # Errors
    /// [`Error::Timeout`] if `peer` did not connect with the token in time; the socket
    /// failed; too many admitted connections.
    pub fn accept(&self, peer: u32, token: &[u8; TOKEN_BYTES]) -> Result<()> {
        let rank = self.context.rank;
        let timeout = self.context.frame_timeout;
        let deadline = Instant::now() + timeout;
        let system = |what: &str, e: std::io::Error| Error::System {
            context: format!("rank {rank}: Ethernet connection from peer {peer}: {what}"),
            source: e,
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!(
                        "rank {rank}: Ethernet connection from peer {peer} presenting its token"
                    ),
                    after: timeout,
                });
            }
            let (stream, from) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.wait_readable(left);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(system("accepting", e)),
            };
            match self.admit(&stream, peer, token, deadline) {
                Ok(()) => {
                    let mut receivers = self.receivers.lock();
                    receivers.retain(|r| !r.is_finished());
                    if receivers.len() >= MAX_RECEIVERS {
                        let why = format!("more than {MAX_RECEIVERS} Ethernet connections");
                        let _ = send_frame(&stream, &Message::error(&why), &[]);
                        return Err(Error::InvalidUsage(format!("rank {rank}: {why}")));
                    }
                    send_frame(&stream, &Message::Welcome, &[])
                        .map_err(|e| system("welcoming", e))?;
                    receivers.push(Receiver::spawn(stream, peer, self.context.clone())?);
                    tracing::debug!(rank, peer, %from, "Ethernet connection admitted");
                    return Ok(());
                }
                Err(why) => {
                    tracing::warn!(
                        rank,
                        %from,
                        "Ethernet connection refused while waiting for peer {peer}: {why}"
                    );
                    let _ = send_frame(&stream, &Message::error(&why), &[]);
                }
            }
        }
    }

    /// Reads the first frame of `stream` and checks it is `peer`'s Hello to us with
    /// `token`.
    fn admit(
        &self,
        stream: &TcpStream,
        peer: u32,
        token: &[u8; TOKEN_BYTES],
        deadline: Instant,
    ) -> Result<(), String> {
        // Accepted sockets inherit nothing from the listener's non-blocking mode on Linux,
        // but say so anyway: reads below rely on the read timeout.
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.set_read_timeout(Some(READ_TICK)))
            .and_then(|()| stream.set_write_timeout(Some(self.context.frame_timeout)))
            .map_err(|e| format!("socket setup: {e}"))?;
        let hello_by = deadline.min(Instant::now() + HELLO_TIMEOUT);
        let first = read_header(&mut &*stream, || Instant::now() < hello_by, || hello_by)
            .map_err(|e| e.to_string())?;
        let rank = self.context.rank;
        match first {
            ReadOutcome::Frame(Message::Hello {
                from,
                to,
                token: presented,
            }) => {
                // Compared in full whatever differs first, so the time taken says nothing
                // about the token.
                let same = presented
                    .iter()
                    .zip(token)
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0;
                if !same || from != peer || to != rank {
                    return Err(format!(
                        "Hello from rank {from} to rank {to} with a token this rank did not \
                         hand out for that pair (expected peer {peer} to rank {rank})"
                    ));
                }
                Ok(())
            }
            ReadOutcome::Frame(other) => {
                Err(format!("first frame {} is not a Hello", other.kind()))
            }
            ReadOutcome::Closed => Err("closed before its Hello".into()),
            ReadOutcome::Stopped => Err(format!("no Hello within {HELLO_TIMEOUT:?}")),
        }
    }

    /// Waits until the listener has a connection to accept, or `left` passes.
    fn wait_readable(&self, left: Duration) {
        readable(&self.listener, left.min(Duration::from_millis(100)));
    }
}

impl std::fmt::Debug for EthernetEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthernetEndpoint")
            .field("rank", &self.context.rank)
            .field("addr", &self.addr)
            .field("receivers", &self.receivers.lock().len())
            .finish()
    }
}
