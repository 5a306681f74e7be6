//! Sockets: listeners with a backlog sized for a thousand ranks, connects that retry until
//! a deadline, reads that stop at a deadline, and the host name ranks are grouped by.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};

use crate::error::{Error, Result};

/// Listen backlog. `std` uses 128, which drops SYNs when a thousand ranks dial the root
/// at once and costs each dropped one a second of retransmission; the kernel caps this at
/// `net.core.somaxconn` (4096 by default on current Linux).
const LISTEN_BACKLOG: i32 = 4096;

/// A bound root listener, made by [`UniqueId::listen`](crate::UniqueId::listen) and
/// consumed by [`Bootstrap::init_root`](crate::Bootstrap::init_root) on rank 0.
#[derive(Debug)]
pub struct RootListener {
    pub(crate) listener: TcpListener,
    addr: SocketAddr,
}

impl RootListener {
    /// Binds `addr` (port 0 picks a free port).
    ///
    /// # Errors
    /// [`Error::System`] if the socket cannot be bound.
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        let listener = bind_listener(addr).map_err(|e| {
            Error::system(format!("binding the bootstrap root listener on {addr}"), e)
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::system("reading the root listener's address", e))?;
        Ok(RootListener {
            listener,
            addr: bound,
        })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A TCP listener on `addr` with `SO_REUSEADDR` (a restarted job can rebind its port while
/// old connections linger in `TIME_WAIT`), close-on-exec, and a large backlog.
pub(crate) fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let fd = bound_socket(addr)?;
    rustix::net::listen(&fd, LISTEN_BACKLOG)?;
    Ok(TcpListener::from(fd))
}

/// A TCP socket bound to `addr` as [`bind_listener`] binds it (`SO_REUSEADDR`,
/// close-on-exec), not listening yet.
pub(crate) fn bound_socket(addr: SocketAddr) -> io::Result<std::os::fd::OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    Ok(fd)
}

/// The unspecified address of `addr`'s family (`0.0.0.0` or `::`).
pub(crate) fn unspecified_like(addr: &SocketAddr) -> IpAddr {
    match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// The loopback address of `ip`'s family, for reaching a listener bound to an unspecified
/// address from this host.
pub(crate) fn dialable(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        let ip = match addr {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        SocketAddr::new(ip, addr.port())
    } else {
        addr
    }
}

/// Whether a connect error may go away by itself (the peer's listener is not up yet, or
/// its backlog overflowed), so the connect should be retried until the deadline.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::Interrupted
            | io::ErrorKind::AddrNotAvailable
    )
}

/// Connects to `addr`, retrying transient failures with backoff until `deadline`.
/// Returns `Ok(None)` when the deadline passes.
pub(crate) fn connect(addr: SocketAddr, deadline: Instant) -> io::Result<Option<TcpStream>> {
    let mut backoff = Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(Some(s));
            }
            Err(e) if transient(&e) => {
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The smallest positive timeout until `deadline`, or `None` if it has passed. The OS takes
/// a zero socket timeout as "block forever", so zero is never returned.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.max(Duration::from_millis(1)))
}

/// Reads a blocking socket without blocking past `deadline`: each read is non-blocking,
/// and an empty socket is polled for the time left. The deadline is shared by every read,
/// so a peer sending one byte at a time cannot stretch a frame past it. (Socket timeouts
/// would cost a `setsockopt` per frame and bound each read, not the frame.)
pub(crate) struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl<'a> DeadlineReader<'a> {
    /// Reads `stream` until `deadline`; a read past it fails with `TimedOut`.
    pub(crate) fn new(stream: &'a TcpStream, deadline: Instant) -> Self {
        DeadlineReader { stream, deadline }
    }
}

impl io::Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match rustix::net::recv(self.stream, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(Errno::AGAIN) => {
                    let Some(left) = remaining(self.deadline) else {
                        return Err(io::ErrorKind::TimedOut.into());
                    };
                    let mut fds = [PollFd::new(self.stream, PollFlags::IN)];
                    match rustix::event::poll(&mut fds, Some(&timespec(left))) {
                        Ok(_) | Err(Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec::try_from(d).unwrap_or(Timespec {
        tv_sec: i64::from(i32::MAX),
        tv_nsec: 0,
    })
}

/// The OS host name, used to group ranks into nodes.
pub(crate) fn hostname() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        truncate_to_bytes(name, crate::frame::MAX_HOSTNAME_BYTES)
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate_to_bytes(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
