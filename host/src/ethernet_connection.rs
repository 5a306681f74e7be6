//! The Ethernet connection: the proxy sends a peer's writes and signals over TCP, and the
//! peer's receiver (`ethernet_receiver.rs`) applies them to its memory.
//!
//! Memory of the peer is named by the peer's registration id
//! ([`MemoryRegion::registration_id`]), never by an address: the peer resolves it against
//! its own table. `write` sends the bytes in frames of at most [`MAX_CHUNK_BYTES`] and
//! returns once the socket took them; `update_and_sync` sends a signal after them (TCP
//! keeps the order, and the receiver applies frames in order); `flush` sends a flush and
//! waits, at most the communicator's wait limit, for its acknowledgement, which the peer
//! sends once everything before it is applied. Every send waits at most that limit too.
//! A put with its signal (`write_and_signal`) sends the signal's frame with the last chunk
//! in one `sendmsg`: one system call and, under `TCP_NODELAY`, one segment where it fits,
//! instead of three calls (header, payload, signal).
//!
//! Where this rank's memory is a GPU's, each chunk of a write is first copied out of the
//! device into the connection's stager's pinned buffer, then sent from there (see
//! `ethernet_staging.rs`).
//!
//! The first failure breaks the connection for good (a frame may be half sent): every
//! later call returns it. A connection that ends or is reset under a send or a flush without
//! the peer's reason is the peer lost ([`ProxyError::PeerLost`]), the same error the rank's
//! receiver reports when the peer's half closes without a goodbye: a survivor says the same
//! thing whichever of its threads noticed first.

use crate::error::{Error, Result};
use crate::ethernet::lost_peer;
use crate::ethernet_receive_assist::assist_until_readable;
use crate::ethernet_staging::Stager;
use crate::ethernet_wire::{
    MAX_CHUNK_BYTES, Message, ReadOutcome, TOKEN_BYTES, WireError, peer_gone, read_header,
    send_frame, send_frames,
};
use oxccl_proxy::connection::Signal;
use oxccl_proxy::{Connection, MemoryRegion, ProxyError};
use parking_lot::Mutex;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long a socket read waits before the caller looks at its deadline again.
const READ_TICK: Duration = Duration::from_millis(50);

/// How long a failed send looks for the peer's reason (an error frame) before reporting
/// the socket's.
const REASON_WAIT: Duration = Duration::from_millis(200);

/// A connection to a peer over TCP; the sending half of one direction of a peer pair.
#[derive(Debug)]
pub struct EthernetConnection {
    rank: u32,
    peer: u32,
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    stream: TcpStream,
    /// Sequence number of the last flush.
    flushes: u64,
    /// Why the connection is unusable, once it is.
    broken: Option<Broken>,
    /// Where the source of a write is copied to before it is sent, if the host cannot read
    /// it at its address.
    stager: Option<Box<dyn Stager>>,
}

/// Why a connection is unusable.
#[derive(Debug)]
struct Broken {
    why: String,
    /// The peer's end went away (closed or reset without a reason): the peer is lost.
    peer_gone: bool,
}

/// Why the peer's reply did not come.
enum NoReply {
    /// The connection ended or was reset without an error frame: the peer is gone.
    Gone(String),
    /// The peer refused, did not answer in time, or the socket failed here.
    Failed(String),
}

impl std::fmt::Display for NoReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoReply::Gone(why) | NoReply::Failed(why) => f.write_str(why),
        }
    }
}

impl EthernetConnection {
    /// Connects this rank (`rank`) to `peer`'s listener at `addr` and presents `token` (what
    /// the peer handed out for this connection through the out-of-band exchange). Retries a
    /// refused connect until `timeout`; every later send or wait is bounded by `timeout`
    /// too. Call [`Self::wait_welcome`] before using it.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no connection could be made in time, [`Error::System`] if the
    /// socket failed.
    pub fn connect(
        rank: u32,
        peer: u32,
        addr: SocketAddr,
        token: [u8; TOKEN_BYTES],
        timeout: Duration,
    ) -> Result<Self> {
        let what = format!("rank {rank}: Ethernet connection to peer {peer} at {addr}");
        let system = |e: std::io::Error| Error::System {
            context: what.clone(),
            source: e,
        };
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(1);
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: what.clone(),
                    after: timeout,
                });
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(stream) => break stream,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    std::thread::sleep(backoff.min(left));
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                Err(e) => return Err(system(e)),
            }
        };
        // Signals and flushes are small frames that must leave at once.
        stream.set_nodelay(true).map_err(system)?;
        stream.set_read_timeout(Some(READ_TICK)).map_err(system)?;
        stream.set_write_timeout(Some(timeout)).map_err(system)?;
        send_frame(
            &stream,
            &Message::Hello {
                from: rank,
                to: peer,
                token,
            },
            &[],
        )
        .map_err(system)?;
        Ok(EthernetConnection {
            rank,
            peer,
            timeout,
            state: Mutex::new(State {
                stream,
                flushes: 0,
                broken: None,
                stager: None,
            }),
        })
    }

    /// The same connection, sending writes through `stager` (the source is a GPU's memory;
    /// see `ethernet_staging.rs`).
    pub(crate) fn staged(self, stager: Option<Box<dyn Stager>>) -> Self {
        self.state.lock().stager = stager;
        self
    }

    /// Waits (at most the connection's limit) for the peer to admit the connection.
    ///
    /// # Errors
    /// The peer refused (its reason is given), closed, or did not answer in time.
    pub fn wait_welcome(&self) -> Result<()> {
        let mut state = self.state.lock();
        match self.read_reply(&mut state) {
            Ok(Message::Welcome) => Ok(()),
            Ok(other) => Err(self.setup_error(format!("answered {} to its Hello", other.kind()))),
            Err(why) => Err(self.setup_error(why.to_string())),
        }
    }

    fn setup_error(&self, why: String) -> Error {
        Error::InvalidUsage(format!(
            "rank {}: Ethernet connection to peer {}: {why}",
            self.rank, self.peer
        ))
    }

    /// The next frame the peer sends back, within the limit; an error frame or a closed
    /// connection is an error saying so.
    fn read_reply(&self, state: &mut State) -> Result<Message, NoReply> {
        let deadline = Instant::now() + self.timeout;
        assist_until_readable(&state.stream, deadline);
        let outcome = read_header(
            &mut &state.stream,
            || Instant::now() < deadline,
            || deadline,
        );
        match outcome {
            Ok(ReadOutcome::Frame(Message::Error { reason })) => {
                Err(NoReply::Failed(format!("the peer refused: {reason}")))
            }
            Ok(ReadOutcome::Frame(message)) => Ok(message),
            Ok(ReadOutcome::Closed) => Err(NoReply::Gone(
                "the peer closed the connection without an answer".into(),
            )),
            Ok(ReadOutcome::Stopped) => Err(NoReply::Failed(format!(
                "no answer within {:?}",
                self.timeout
            ))),
            Err(e @ WireError::Reset(_)) => Err(NoReply::Gone(e.to_string())),
            Err(e) => Err(NoReply::Failed(e.to_string())),
        }
    }

    /// Sends one frame, and `trailer` (a frame without payload) after it in the same system
    /// call; a failure breaks the connection, with the peer's reason if it sent one.
    fn send(
        &self,
        state: &mut State,
        message: &Message,
        payload: &[u8],
        trailer: Option<&Message>,
    ) -> Result<(), ProxyError> {
        if let Some(broken) = &state.broken {
            return Err(self.broken_earlier(broken));
        }
        let sent = match trailer {
            None => send_frame(&state.stream, message, payload),
            Some(t) => send_frames(&state.stream, &[(message, payload), (t, &[])]),
        };
        if let Err(e) = sent {
            return Err(match self.peer_reason(state) {
                Some(reason) => self.breaks(
                    state,
                    format!("sending {message}: the peer refused: {reason}"),
                ),
                None => self.mark_broken(state, format!("sending {message}: {e}"), peer_gone(&e)),
            });
        }
        Ok(())
    }

    /// The reason in an error frame the peer sent before closing, if one comes soon.
    fn peer_reason(&self, state: &mut State) -> Option<String> {
        let deadline = Instant::now() + REASON_WAIT;
        loop {
            match read_header(
                &mut &state.stream,
                || Instant::now() < deadline,
                || deadline,
            ) {
                Ok(ReadOutcome::Frame(Message::Error { reason })) => return Some(reason),
                // A flush acknowledgement still in flight: look behind it.
                Ok(ReadOutcome::Frame(_)) => {}
                _ => return None,
            }
        }
    }

    /// Breaks the connection for good on a failure of this side or the peer's refusal.
    fn breaks(&self, state: &mut State, why: String) -> ProxyError {
        self.mark_broken(state, why, false)
    }

    /// Breaks the connection for good because the peer's end is gone.
    fn loses(&self, state: &mut State, why: String) -> ProxyError {
        self.mark_broken(state, why, true)
    }

    fn mark_broken(&self, state: &mut State, why: String, peer_gone: bool) -> ProxyError {
        let _ = state.stream.shutdown(std::net::Shutdown::Both);
        let error = self.failure(&why, peer_gone);
        state.broken = Some(Broken { why, peer_gone });
        error
    }

    /// What a call on a connection broken by an earlier one returns.
    fn broken_earlier(&self, broken: &Broken) -> ProxyError {
        let why = format!("the connection broke earlier: {}", broken.why);
        self.failure(&why, broken.peer_gone)
    }

    fn failure(&self, why: &str, peer_gone: bool) -> ProxyError {
        if peer_gone {
            lost_peer(self.rank, self.peer, why)
        } else {
            ProxyError::Transport(why.to_owned())
        }
    }
}

/// The peer's registration id of `region`, which names it on the wire.
fn remote_id(region: &MemoryRegion) -> Result<u32, ProxyError> {
    region.registration_id.ok_or_else(|| {
        ProxyError::InvalidUsage(format!(
            "memory of rank {} carries no Ethernet registration id",
            region.owner_rank
        ))
    })
}

/// The frame that carries `signal`.
fn signal_frame(signal: Signal<'_>) -> Result<Message, ProxyError> {
    Ok(Message::Signal {
        id: remote_id(signal.dst)?,
        offset: signal.dst_off,
        value: signal.value,
    })
}

impl EthernetConnection {
    /// Sends `bytes` of `src` (this rank's memory) at `src_off` to `dst` (the peer's) at
    /// `dst_off`, in frames of at most a chunk; `then`, if any, is sent with the last of them
    /// in the same system call (a put's signal).
    fn send_write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
        then: Option<&Message>,
    ) -> Result<(), ProxyError> {
        let id = remote_id(dst)?;
        let from = src.address(src_off)?;
        let mut state = self.state.lock();
        if bytes == 0 {
            // No write frame for an empty put (as before), only what follows it.
            return match then {
                Some(message) => self.send(&mut state, message, &[], None),
                None => Ok(()),
            };
        }
        let mut done = 0;
        loop {
            let len = (bytes - done).min(MAX_CHUNK_BYTES as u64);
            let header = Message::Write {
                id,
                offset: dst_off + done,
                len: len as u32,
            };
            let last = done + len == bytes;
            let trailer = if last { then } else { None };
            if let Some(mut stager) = state.stager.take() {
                // SAFETY: as below; `len` is at most a chunk.
                let copied = unsafe { stager.copy_out(from + done, len as usize) };
                let sent = match copied {
                    Ok(()) => {
                        let payload = &stager.buffer()[..len as usize];
                        self.send(&mut state, &header, payload, trailer)
                    }
                    Err(e) => Err(self.breaks(&mut state, format!("staging a write: {e}"))),
                };
                state.stager = Some(stager);
                sent?;
            } else {
                // SAFETY: the proxy checked the source range against the source's
                // registered size; registered memory stays allocated while channels using
                // it exist (the region holds a share). Kernels leave a put's source alone
                // until it is flushed (the channel's contract).
                let payload = unsafe {
                    std::slice::from_raw_parts((from + done) as usize as *const u8, len as usize)
                };
                self.send(&mut state, &header, payload, trailer)?;
            }
            done += len;
            if last {
                return Ok(());
            }
        }
    }
}

impl Connection for EthernetConnection {
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), ProxyError> {
        self.send_write(dst, dst_off, src, src_off, bytes, None)
    }

    fn write_and_signal(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
        signal: Signal<'_>,
    ) -> Result<(), ProxyError> {
        let signal = signal_frame(signal)?;
        self.send_write(dst, dst_off, src, src_off, bytes, Some(&signal))
    }

    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> Result<(), ProxyError> {
        let signal = signal_frame(Signal {
            dst,
            dst_off,
            value,
        })?;
        let mut state = self.state.lock();
        self.send(&mut state, &signal, &[], None)
    }

    fn flush(&self) -> Result<(), ProxyError> {
        let mut state = self.state.lock();
        state.flushes += 1;
        let seq = state.flushes;
        self.send(&mut state, &Message::Flush { seq }, &[], None)?;
        match self.read_reply(&mut state) {
            Ok(Message::FlushAck { seq: acked }) if acked == seq => Ok(()),
            Ok(other) => {
                let why = format!("answered {other} to Flush {{ seq {seq} }}");
                Err(self.breaks(&mut state, why))
            }
            Err(NoReply::Gone(why)) => Err(self.loses(&mut state, format!("flush {seq}: {why}"))),
            Err(NoReply::Failed(why)) => {
                Err(self.breaks(&mut state, format!("flush {seq}: {why}")))
            }
        }
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn transport(&self) -> &'static str {
        "ethernet"
    }
}

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        let state = self.state.lock();
        // The peer's receiver reports a connection that ends without a goodbye as this
        // rank lost mid-run. A broken connection has nothing to say goodbye on; the send
        // waits at most the socket's write limit (the communicator's wait limit).
        if state.broken.is_none() {
            let _ = send_frame(&state.stream, &Message::Goodbye, &[]);
        }
        let _ = state.stream.shutdown(std::net::Shutdown::Both);
    }
}
