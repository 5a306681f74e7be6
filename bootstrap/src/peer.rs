//! One peer of a rank: its connection, and the messages received from it that no `recv`
//! has claimed yet.
//!
//! Contract:
//! - A pair of ranks shares exactly one connection, dialled by whichever side needs it
//!   first (in collectives, the lower rank). When both dial at once, the lower rank's dial
//!   wins: the lower rank refuses the higher one's with `DialRace` while it is dialling
//!   or has dialled itself, and the higher rank admits the lower one's even while
//!   dialling; the loser then waits for the winner's connection. `connecting` and `conn` are checked and set under
//!   the slot lock, by the dialling thread and by the acceptor alike, so the two decisions
//!   cannot cross. One connection per pair keeps the messages of each direction in order
//!   and the socket count at one per pair.
//! - At most one thread reads the socket at a time (`reading`). A frame carrying another
//!   tag than the reader wants goes to `pending` and wakes every waiter, so concurrent
//!   `recv`s of different tags never steal or lose each other's messages.
//! - `pending` is bounded in bytes and messages; past the bound the peer is marked failed
//!   (`Overflow`) instead of growing.
//! - A failure (bad frame, overflow, closed connection) is sticky: messages already pending
//!   can still be received, anything else gets the failure.
//! - Every wait takes a deadline.
//! - The locks are `parking_lot`'s, which do not poison: every update under them is a
//!   single assignment or push, so the state stays consistent across a panic in another
//!   thread, and one thread's panic must not become a panic in every other.

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use rustix::io::Errno;
use rustix::net::SendFlags;

use crate::error::{Error, Peer};
use crate::frame::{self, Body, FrameError, Message, RejectReason, Tag};
use crate::net::{DeadlineReader, remaining};

/// One authenticated connection to a peer.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    /// Whether a writer holds the connection. A flag rather than a `MutexGuard`, so a
    /// helper thread can finish a write and hand the connection back (see [`WriteTicket`]).
    writing: Mutex<bool>,
    writer_done: Condvar,
}

/// Why a write failed.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The deadline passed.
    TimedOut,
    /// The connection is gone.
    Closed,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        // Bootstrap messages are small and latency-bound: never wait for Nagle.
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            writing: Mutex::new(false),
            writer_done: Condvar::new(),
        })
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Takes the right to write, so frames of two threads never interleave; waits for the
    /// current writer until `deadline`.
    pub(crate) fn writer(&self, deadline: Instant) -> Result<WriteTicket<'_>, WriteError> {
        let mut busy = self.writing.lock();
        while *busy {
            if remaining(deadline).is_none() {
                return Err(WriteError::TimedOut);
            }
            self.writer_done.wait_until(&mut busy, deadline);
        }
        *busy = true;
        Ok(WriteTicket { conn: self })
    }

    /// Shuts the connection down both ways, so the peer sees the end at once even if this
    /// `Conn` is still referenced somewhere.
    pub(crate) fn close(&self) {
        // Already closed is fine.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The right to write to a connection; released on drop, from whichever thread holds it
/// then (it is `Send`, so a helper thread can finish a large write).
pub(crate) struct WriteTicket<'a> {
    conn: &'a Conn,
}

impl WriteTicket<'_> {
    /// Writes as much of `buf` as the socket buffer takes without blocking; returns how
    /// many bytes that was.
    pub(crate) fn write_nonblocking(&self, buf: &[u8]) -> Result<usize, WriteError> {
        let mut done = 0;
        while done < buf.len() {
            let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
            match rustix::net::send(&self.conn.stream, &buf[done..], flags) {
                Ok(0) => return Err(WriteError::Closed),
                Ok(n) => done += n,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => {}
                Err(_) => return Err(WriteError::Closed),
            }
        }
        Ok(done)
    }

    /// Writes all of `buf`, blocking until `deadline`. A write cut short by the deadline
    /// closes the connection: the peer must see a close, not half a frame followed by the
    /// next one.
    pub(crate) fn write_all(&self, buf: &[u8], deadline: Instant) -> Result<(), WriteError> {
        if buf.is_empty() {
            return Ok(());
        }
        let Some(left) = remaining(deadline) else {
            self.conn.close();
            return Err(WriteError::TimedOut);
        };
        if self.conn.stream.set_write_timeout(Some(left)).is_err() {
            return Err(WriteError::Closed);
        }
        let mut w = &self.conn.stream;
        match frame::write_frame(&mut w, buf) {
            Ok(()) => Ok(()),
            Err(e) if frame::is_timeout(&e) => {
                self.conn.close();
                Err(WriteError::TimedOut)
            }
            Err(_) => Err(WriteError::Closed),
        }
    }
}

impl Drop for WriteTicket<'_> {
    fn drop(&mut self) {
        *self.conn.writing.lock() = false;
        self.conn.writer_done.notify_one();
    }
}

/// Limits applied when reading a peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_frame_bytes: usize,
    pub(crate) version: u32,
    pub(crate) max_pending_bytes: usize,
    pub(crate) max_pending_messages: usize,
}

/// Why a peer can no longer be read (cloneable, so every waiter can get it).
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    Closed,
    Malformed(String),
    TooLarge { len: u64, limit: usize },
    Version { got: u32 },
    Overflow { bytes: usize, messages: usize },
}

impl Failure {
    pub(crate) fn to_error(&self, rank: usize, peer: usize, version: u32) -> Error {
        let peer = Peer::Rank(peer);
        match self {
            Failure::Closed => Error::PeerClosed { rank, peer },
            Failure::Malformed(reason) => Error::MalformedFrame {
                rank,
                peer,
                reason: reason.clone(),
            },
            Failure::TooLarge { len, limit } => Error::FrameTooLarge {
                rank,
                peer,
                len: *len,
                limit: *limit,
            },
            Failure::Version { got } => Error::VersionMismatch {
                rank,
                peer,
                expected: version,
                got: *got,
            },
            Failure::Overflow { bytes, messages } => Error::Overflow {
                rank,
                peer,
                bytes: *bytes,
                messages: *messages,
            },
        }
    }

    fn from_frame(e: FrameError) -> Self {
        match e {
            FrameError::Closed | FrameError::Io(_) => Failure::Closed,
            FrameError::Truncated { got, want } => Failure::Malformed(format!(
                "connection closed inside a frame ({got} of {want} bytes)"
            )),
            FrameError::TooLarge { len, limit } => Failure::TooLarge { len, limit },
            FrameError::VersionMismatch { got } => Failure::Version { got },
            e @ (FrameError::Malformed(_) | FrameError::TimedOut { .. }) => {
                Failure::Malformed(e.to_string())
            }
        }
    }
}

/// Outcome of [`PeerSlot::recv`].
pub(crate) enum Recv {
    Got(Body),
    TimedOut,
    Failed(Failure),
}

/// Outcome of [`PeerSlot::sender`].
pub(crate) enum Sender {
    /// Send on this connection.
    Ready(Arc<Conn>),
    /// No connection yet and this thread should dial; call
    /// [`PeerSlot::finish_connect`] afterwards, whatever happens.
    MustConnect,
    TimedOut,
    Failed(Failure),
}

/// Outcome of [`PeerSlot::admit`] when the connection is not admitted.
pub(crate) enum Refused {
    /// Refuse with this reason.
    Reject(RejectReason),
    /// The welcome could not be sent.
    Failed(Error),
}

#[derive(Default)]
struct State {
    conn: Option<Arc<Conn>>,
    /// Whether `conn` is one this rank dialled (rather than admitted).
    dialled: bool,
    connecting: bool,
    reading: bool,
    pending: VecDeque<(Tag, Body, usize)>,
    pending_bytes: usize,
    failed: Option<Failure>,
}

impl State {
    fn push(&mut self, tag: Tag, body: Body, bytes: usize, limits: &Limits) -> Result<(), Failure> {
        if self.pending.len() >= limits.max_pending_messages
            || self.pending_bytes.saturating_add(bytes) > limits.max_pending_bytes
        {
            return Err(Failure::Overflow {
                bytes: self.pending_bytes.saturating_add(bytes),
                messages: self.pending.len() + 1,
            });
        }
        self.pending.push_back((tag, body, bytes));
        self.pending_bytes += bytes;
        Ok(())
    }

    fn take(&mut self, tag: Tag) -> Option<Body> {
        let i = self.pending.iter().position(|(t, _, _)| *t == tag)?;
        let (_, body, bytes) = self.pending.remove(i)?;
        self.pending_bytes -= bytes;
        Some(body)
    }

    fn fail(&mut self, f: Failure) {
        if self.failed.is_none() {
            self.failed = Some(f);
        }
        // Stop reading a peer that broke the protocol; it sees the close.
        if let Some(c) = &self.conn {
            c.close();
        }
    }
}

/// Connection and unclaimed messages of one peer.
#[derive(Default)]
pub(crate) struct PeerSlot {
    state: Mutex<State>,
    cv: Condvar,
}

impl PeerSlot {
    /// Waits for the message tagged `tag`, reading the peer's connection as needed.
    pub(crate) fn recv(&self, tag: Tag, deadline: Instant, limits: &Limits) -> Recv {
        let mut st = self.state.lock();
        loop {
            if let Some(body) = st.take(tag) {
                return Recv::Got(body);
            }
            if let Some(f) = &st.failed {
                return Recv::Failed(f.clone());
            }
            if remaining(deadline).is_none() {
                return Recv::TimedOut;
            }
            if let (false, Some(conn)) = (st.reading, st.conn.clone()) {
                st.reading = true;
                drop(st);
                let got = read_one(&conn, deadline, limits);
                st = self.state.lock();
                st.reading = false;
                match got {
                    Read::Frame(t, body, bytes) => {
                        if let Err(f) = st.push(t, body, bytes, limits) {
                            st.fail(f);
                        }
                    }
                    Read::Nothing => {}
                    Read::Failed(f) => st.fail(f),
                }
                // Wake waiters for the frame just queued, and one of them to read next.
                self.cv.notify_all();
                continue;
            }
            self.cv.wait_until(&mut st, deadline);
        }
    }

    /// Queues a message this rank sends to itself.
    pub(crate) fn push_local(
        &self,
        tag: Tag,
        body: Body,
        bytes: usize,
        limits: &Limits,
    ) -> Result<(), Failure> {
        let mut st = self.state.lock();
        st.push(tag, body, bytes, limits)?;
        self.cv.notify_all();
        Ok(())
    }

    /// The connection to send on; if there is none, either tells this thread to dial
    /// (`initiate`, and nobody else is dialling) or waits for one to appear.
    pub(crate) fn sender(&self, initiate: bool, deadline: Instant) -> Sender {
        let mut st = self.state.lock();
        loop {
            if let Some(f) = &st.failed {
                return Sender::Failed(f.clone());
            }
            if let Some(c) = &st.conn {
                return Sender::Ready(c.clone());
            }
            if initiate && !st.connecting {
                st.connecting = true;
                return Sender::MustConnect;
            }
            if remaining(deadline).is_none() {
                return Sender::TimedOut;
            }
            self.cv.wait_until(&mut st, deadline);
        }
    }

    /// Ends a dial that [`PeerSlot::sender`] asked for, registering its connection if it
    /// produced one. Returns the connection to send on, if there is one now.
    pub(crate) fn finish_connect(&self, conn: Option<Arc<Conn>>) -> Option<Arc<Conn>> {
        let mut st = self.state.lock();
        st.connecting = false;
        if let Some(conn) = conn {
            if st.conn.is_none() && st.failed.is_none() {
                st.conn = Some(conn);
                st.dialled = true;
            } else {
                // Cannot happen while the dial-race rule holds; never keep two.
                conn.close();
            }
        }
        self.cv.notify_all();
        st.conn.clone()
    }

    /// Admits a connection the acceptor authenticated from `peer`, then runs `welcome`
    /// (which must tell the peer it is in) and makes the connection visible — in that
    /// order and under the lock, so no frame of ours reaches the peer before its `Welcome`.
    ///
    /// Refused with `DialRace` if `peer` is the higher rank and this rank is dialling it or
    /// has dialled it (the two dials crossed; the lower rank's is kept), and with
    /// `AlreadyJoined` if the pair has a connection the peer dialled (a second process
    /// claiming the same rank).
    pub(crate) fn admit(
        &self,
        conn: Arc<Conn>,
        peer_is_higher: bool,
        welcome: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Refused> {
        let mut st = self.state.lock();
        if st.failed.is_some() {
            return Err(Refused::Reject(RejectReason::ShuttingDown));
        }
        if peer_is_higher && (st.connecting || (st.conn.is_some() && st.dialled)) {
            return Err(Refused::Reject(RejectReason::DialRace));
        }
        if st.conn.is_some() {
            return Err(Refused::Reject(RejectReason::AlreadyJoined));
        }
        welcome().map_err(Refused::Failed)?;
        st.conn = Some(conn);
        st.dialled = false;
        self.cv.notify_all();
        Ok(())
    }

    /// Waits until the peer has a connection; `false` if `deadline` passes first.
    pub(crate) fn wait_connected(&self, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        loop {
            if st.conn.is_some() {
                return true;
            }
            if remaining(deadline).is_none() {
                return false;
            }
            self.cv.wait_until(&mut st, deadline);
        }
    }

    /// Whether the peer has a working connection now.
    pub(crate) fn is_connected(&self) -> bool {
        let st = self.state.lock();
        st.conn.is_some() && st.failed.is_none()
    }

    /// Closes the connection and fails the slot, waking its waiters.
    pub(crate) fn close(&self) {
        let mut st = self.state.lock();
        st.fail(Failure::Closed);
        self.cv.notify_all();
    }
}

enum Read {
    Frame(Tag, Body, usize),
    Nothing,
    Failed(Failure),
}

/// Reads one data frame from `conn`, waiting until `deadline`.
fn read_one(conn: &Conn, deadline: Instant, limits: &Limits) -> Read {
    let mut r = DeadlineReader::new(conn.stream(), deadline);
    match frame::read_frame(&mut r, limits.max_frame_bytes, limits.version) {
        Ok((Message::Data { tag, body }, bytes)) => Read::Frame(tag, body, bytes),
        Ok((other, _)) => Read::Failed(Failure::Malformed(format!(
            "unexpected {} message after the handshake",
            other.kind()
        ))),
        // Nothing of a frame arrived before the deadline.
        Err(FrameError::TimedOut { partial: false }) => Read::Nothing,
        Err(e) => Read::Failed(Failure::from_frame(e)),
    }
}
