//! The Ethernet transport's wire format: versioned, length-prefixed frames whose header is
//! postcard, followed (for writes only) by a payload of a bounded length.
//!
//! ```text
//! frame   = header_len: u16 little-endian | header (header_len bytes) | payload
//! header  = version: u16 (postcard varint) | Message (postcard; the variant index is the kind)
//! payload = exactly `len` bytes after a `Write { len, .. }`, none after any other message
//! ```
//!
//! Invariants a reader keeps, whatever the bytes:
//! - the header length is checked against [`MAX_HEADER_BYTES`] before it is read, into a
//!   fixed buffer: a header costs no allocation beyond an [`Message::Error`]'s short text;
//! - the version is decoded on its own first, so a peer of another version is reported as
//!   such, not as garbage; a header must decode to exactly one message, nothing left over;
//! - a write's payload length is checked against [`MAX_CHUNK_BYTES`] (and by the receiver
//!   against the registration it names) before any payload byte is read: larger writes
//!   travel as several frames, so a connection's memory is bounded by one chunk;
//! - no input panics.
//!
//! Who sends what: the connecting side (the one whose proxy writes) sends
//! [`Message::Hello`] first, then writes, signals and flushes; the accepting side (the one
//! whose memory is written) answers [`Message::Welcome`], [`Message::FlushAck`]s, and an
//! [`Message::Error`] right before it closes a connection whose frame it refused. TCP keeps
//! the order, so a signal or flush acknowledgement follows every write sent before it. A
//! connecting side that closes on purpose sends [`Message::Goodbye`] last: a connection
//! that ends without one lost its peer mid-run (its process ended), which the accepting
//! side reports.

use rustix::io::Errno;
use rustix::net::{SendAncillaryBuffer, SendFlags};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{self, IoSlice, Read};
use std::net::TcpStream;
use std::time::Instant;

/// Version of the Ethernet wire format; both ends of a connection must speak the same.
pub const WIRE_VERSION: u16 = 2;

/// Bytes of the length prefix of every frame.
pub const LENGTH_PREFIX_BYTES: usize = 2;

/// Longest header a frame may carry.
pub const MAX_HEADER_BYTES: usize = 256;

/// Longest payload of one write frame; a larger write is sent as several frames.
pub const MAX_CHUNK_BYTES: u32 = 256 << 10;

/// Bytes of the token a connecting side presents in its [`Message::Hello`].
pub const TOKEN_BYTES: usize = 16;

/// Longest text an [`Message::Error`] carries (longer text is cut).
pub const MAX_ERROR_TEXT_BYTES: usize = 200;

/// Longest encoded frame without its payload.
pub const MAX_FRAME_HEADER_BYTES: usize = LENGTH_PREFIX_BYTES + MAX_HEADER_BYTES;

/// Everything that travels on an Ethernet connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Connector → acceptor, first frame: who connects, to whom, and the token the
    /// acceptor handed out for this connection through the authenticated out-of-band
    /// exchange.
    Hello {
        /// Rank of the connector.
        from: u32,
        /// Rank the connector means to reach.
        to: u32,
        /// The token the acceptor expects.
        token: [u8; TOKEN_BYTES],
    },
    /// Acceptor → connector: admitted; frames may flow.
    Welcome,
    /// Connector → acceptor: `len` bytes follow, for bytes `offset..offset + len` of the
    /// acceptor's registration `id`.
    Write {
        /// The acceptor's registration id.
        id: u32,
        /// Byte offset inside the registration.
        offset: u64,
        /// Payload bytes that follow (at most [`MAX_CHUNK_BYTES`]).
        len: u32,
    },
    /// Connector → acceptor: store `value` with release semantics into the 8-byte aligned
    /// u64 at `offset` of registration `id` (a semaphore), after every earlier write.
    Signal {
        /// The acceptor's registration id.
        id: u32,
        /// Byte offset inside the registration.
        offset: u64,
        /// The value to store.
        value: u64,
    },
    /// Connector → acceptor: answer with `FlushAck { seq }` once every earlier frame is
    /// applied.
    Flush {
        /// Sequence number, echoed.
        seq: u64,
    },
    /// Acceptor → connector: every frame before `Flush { seq }` is applied.
    FlushAck {
        /// The flush's sequence number.
        seq: u64,
    },
    /// Either side: the connection is being closed, and why.
    Error {
        /// What was refused (at most [`MAX_ERROR_TEXT_BYTES`]).
        reason: String,
    },
    /// Connector → acceptor, last frame: the connection is closed on purpose (its
    /// communicator is dropped); no frame follows. Added in wire version 2.
    Goodbye,
}

impl Message {
    /// Short name of the kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Welcome => "Welcome",
            Message::Write { .. } => "Write",
            Message::Signal { .. } => "Signal",
            Message::Flush { .. } => "Flush",
            Message::FlushAck { .. } => "FlushAck",
            Message::Error { .. } => "Error",
            Message::Goodbye => "Goodbye",
        }
    }

    /// An [`Message::Error`] with `reason` cut to [`MAX_ERROR_TEXT_BYTES`] (at a character
    /// boundary).
    pub fn error(reason: &str) -> Message {
        let mut end = reason.len().min(MAX_ERROR_TEXT_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Message::Error {
            reason: reason[..end].to_owned(),
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The stream ended inside a frame.
    #[error("truncated frame: the connection ended after {got} of {wanted} bytes of its {part}")]
    Truncated {
        /// Header or payload.
        part: &'static str,
        /// Bytes that arrived.
        got: usize,
        /// Bytes the frame needs.
        wanted: usize,
    },
    /// A header longer than [`MAX_HEADER_BYTES`], or empty.
    #[error("header of {len} bytes (allowed: 1..={MAX_HEADER_BYTES})")]
    HeaderLength {
        /// The claimed length.
        len: usize,
    },
    /// A write payload longer than [`MAX_CHUNK_BYTES`].
    #[error("write of {len} bytes in one frame (at most {MAX_CHUNK_BYTES})")]
    PayloadTooLong {
        /// The claimed length.
        len: u64,
    },
    /// The frame carries another wire version.
    #[error("wire version {got}; this build speaks version {WIRE_VERSION}")]
    Version {
        /// The version in the frame.
        got: u16,
    },
    /// The header does not decode to one message.
    #[error("malformed header: {0}")]
    Malformed(String),
    /// A frame did not arrive completely before the deadline.
    #[error("a frame did not arrive completely in time ({got} of {wanted} bytes of its {part})")]
    Stalled {
        /// Header or payload.
        part: &'static str,
        /// Bytes that arrived.
        got: usize,
        /// Bytes the frame needs.
        wanted: usize,
    },
    /// The peer's end of the connection is gone without a clean close (reset or aborted):
    /// its process ended with bytes unread, or its host dropped the connection.
    #[error("the peer reset the connection: {0}")]
    Reset(String),
    /// The socket failed.
    #[error("socket: {0}")]
    Io(String),
}

/// Whether a socket error means the peer's end is gone (reset, aborted, or a broken pipe)
/// rather than a local failure.
pub fn peer_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// The error of a failed socket read.
fn read_failed(error: &io::Error) -> WireError {
    if peer_gone(error) {
        WireError::Reset(error.to_string())
    } else {
        WireError::Io(error.to_string())
    }
}

/// Encodes `message` as a frame (length prefix and header; a write's payload goes after
/// it) into `out`; returns the frame's length.
///
/// # Errors
/// [`WireError::HeaderLength`] if the header would not fit [`MAX_HEADER_BYTES`] (an
/// [`Message::Error`] whose text was not cut by [`Message::error`]).
pub fn encode(
    message: &Message,
    out: &mut [u8; MAX_FRAME_HEADER_BYTES],
) -> Result<usize, WireError> {
    let (prefix, header) = out.split_at_mut(LENGTH_PREFIX_BYTES);
    let too_long = |_| WireError::HeaderLength {
        len: MAX_HEADER_BYTES + 1,
    };
    let len = postcard::to_slice(&(WIRE_VERSION, message), header)
        .map_err(too_long)?
        .len();
    prefix.copy_from_slice(&(len as u16).to_le_bytes());
    Ok(LENGTH_PREFIX_BYTES + len)
}

/// Decodes a header (the bytes after the length prefix).
///
/// # Errors
/// Another version, bytes that are not one message, a write longer than
/// [`MAX_CHUNK_BYTES`], an error text longer than [`MAX_ERROR_TEXT_BYTES`].
pub fn decode_header(header: &[u8]) -> Result<Message, WireError> {
    let (version, rest) = postcard::take_from_bytes::<u16>(header)
        .map_err(|e| WireError::Malformed(format!("version: {e}")))?;
    if version != WIRE_VERSION {
        return Err(WireError::Version { got: version });
    }
    let (message, rest) = postcard::take_from_bytes::<Message>(rest)
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes after a {} message",
            rest.len(),
            message.kind()
        )));
    }
    match &message {
        Message::Write { len, .. } if *len > MAX_CHUNK_BYTES => {
            return Err(WireError::PayloadTooLong {
                len: u64::from(*len),
            });
        }
        Message::Error { reason } if reason.len() > MAX_ERROR_TEXT_BYTES => {
            return Err(WireError::Malformed(format!(
                "an error text of {} bytes (at most {MAX_ERROR_TEXT_BYTES})",
                reason.len()
            )));
        }
        _ => {}
    }
    Ok(message)
}

/// What a frame read found instead of a frame.
#[derive(Debug)]
pub enum ReadOutcome {
    /// A header, decoded.
    Frame(Message),
    /// The stream ended cleanly between frames.
    Closed,
    /// `idle` said to stop while no frame had begun.
    Stopped,
}

/// Reads the next frame's header from `reader`, which must time out its reads (a socket
/// with a read timeout) so that waits stay bounded.
///
/// Between frames it waits as long as `idle()` returns `true` (it is asked after every
/// read that timed out with nothing of a frame read); once a frame has begun, it must
/// complete by `deadline()` (asked when the frame begins), else [`WireError::Stalled`].
///
/// # Errors
/// A malformed, oversized or truncated header, or the socket failed.
pub fn read_header(
    reader: &mut impl Read,
    mut idle: impl FnMut() -> bool,
    deadline: impl Fn() -> Instant,
) -> Result<ReadOutcome, WireError> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let mut got = 0;
    let mut frame_deadline = None;
    while got < prefix.len() {
        match reader.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(ReadOutcome::Closed),
            Ok(0) => {
                return Err(WireError::Truncated {
                    part: "length prefix",
                    got,
                    wanted: prefix.len(),
                });
            }
            Ok(n) => {
                got += n;
                frame_deadline.get_or_insert_with(&deadline);
            }
            Err(e) if timed_out(&e) => match frame_deadline {
                None if !idle() => return Ok(ReadOutcome::Stopped),
                None => {}
                Some(at) if Instant::now() >= at => {
                    return Err(WireError::Stalled {
                        part: "length prefix",
                        got,
                        wanted: prefix.len(),
                    });
                }
                Some(_) => {}
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_failed(&e)),
        }
    }
    let len = u16::from_le_bytes(prefix) as usize;
    if len == 0 || len > MAX_HEADER_BYTES {
        return Err(WireError::HeaderLength { len });
    }
    let mut header = [0u8; MAX_HEADER_BYTES];
    let at = frame_deadline.unwrap_or_else(&deadline);
    read_exact_by(reader, &mut header[..len], at, "header")?;
    decode_header(&header[..len]).map(ReadOutcome::Frame)
}

/// Fills `buf` from `reader` by `deadline`; `part` names what is read, for errors.
///
/// # Errors
/// The stream ended ([`WireError::Truncated`]), the deadline passed
/// ([`WireError::Stalled`]), or the socket failed.
pub fn read_exact_by(
    reader: &mut impl Read,
    buf: &mut [u8],
    deadline: Instant,
    part: &'static str,
) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(WireError::Truncated {
                    part,
                    got,
                    wanted: buf.len(),
                });
            }
            Ok(n) => got += n,
            Err(e) if timed_out(&e) => {
                if Instant::now() >= deadline {
                    return Err(WireError::Stalled {
                        part,
                        got,
                        wanted: buf.len(),
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_failed(&e)),
        }
    }
    Ok(())
}

/// Sends `message` on `stream` and then `payload` (a write's bytes, else empty), whole,
/// within the stream's write timeout per send. `MSG_NOSIGNAL`: a peer that closed gives an
/// error, never a `SIGPIPE` that would kill a program which did not ignore it.
///
/// # Errors
/// The header does not encode, or the socket failed or timed out (the frame may then be
/// partly sent: the connection is unusable).
pub fn send_frame(stream: &TcpStream, message: &Message, payload: &[u8]) -> io::Result<()> {
    send_frames(stream, &[(message, payload)])
}

/// Most frames [`send_frames`] sends at once.
pub const MAX_FRAMES_AT_ONCE: usize = 2;

/// Sends each `(message, payload)` of `frames` as [`send_frame`] would, in order, all in one
/// `sendmsg` where the socket takes them whole (a write's frame and the signal after it
/// leave in one system call and, under `TCP_NODELAY`, one segment where they fit).
///
/// # Errors
/// As [`send_frame`]; more than [`MAX_FRAMES_AT_ONCE`] frames is an `InvalidInput` error.
pub fn send_frames(stream: &TcpStream, frames: &[(&Message, &[u8])]) -> io::Result<()> {
    if frames.len() > MAX_FRAMES_AT_ONCE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} frames at once, at most {MAX_FRAMES_AT_ONCE}",
                frames.len()
            ),
        ));
    }
    let mut headers = [[0u8; MAX_FRAME_HEADER_BYTES]; MAX_FRAMES_AT_ONCE];
    let mut lengths = [0usize; MAX_FRAMES_AT_ONCE];
    for (i, (message, _)) in frames.iter().enumerate() {
        lengths[i] = encode(message, &mut headers[i]).map_err(io::Error::other)?;
    }
    let mut slices = [IoSlice::new(&[]); 2 * MAX_FRAMES_AT_ONCE];
    let mut count = 0;
    for (i, (_, payload)) in frames.iter().enumerate() {
        for part in [&headers[i][..lengths[i]], payload] {
            if !part.is_empty() {
                slices[count] = IoSlice::new(part);
                count += 1;
            }
        }
    }
    send_all(stream, &mut slices[..count])
}

/// Sends every byte of `slices`, resuming after partial sends, within the stream's write
/// timeout for the whole of them: a peer that takes a frame a few bytes at a time makes
/// each `sendmsg` return within the timeout, so the frame's own deadline is what bounds
/// the send (at most twice the timeout in all, the last blocked call included).
fn send_all(stream: &TcpStream, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    let start = Instant::now();
    let mut limit = None;
    while !slices.is_empty() {
        let sent = rustix::net::sendmsg(
            stream,
            slices,
            &mut SendAncillaryBuffer::default(),
            SendFlags::NOSIGNAL,
        );
        match sent {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                IoSlice::advance_slices(&mut slices, n);
                if slices.is_empty() {
                    break;
                }
                // Only a send that did not go whole in one call asks for the timeout.
                let limit = match limit {
                    Some(known) => known,
                    None => *limit.insert(stream.write_timeout()?),
                };
                if limit.is_some_and(|t| start.elapsed() > t) {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer did not take the frame within the write timeout",
                    ));
                }
            }
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer took no bytes within the write timeout",
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a read error is a socket read timeout (which Linux reports as `WouldBlock`).
fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::Write { id, offset, len } => {
                write!(f, "Write {{ id {id}, bytes {offset}..+{len} }}")
            }
            Message::Signal { id, offset, value } => {
                write!(f, "Signal {{ id {id}, offset {offset}, value {value} }}")
            }
            Message::Hello { from, to, .. } => write!(f, "Hello {{ from {from}, to {to} }}"),
            other => write!(f, "{other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn frame(message: &Message) -> Vec<u8> {
        let mut out = [0u8; MAX_FRAME_HEADER_BYTES];
        let n = encode(message, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn read(bytes: &[u8]) -> Result<ReadOutcome, WireError> {
        let far = Instant::now() + Duration::from_secs(5);
        read_header(&mut &bytes[..], || true, || far)
    }

    /// Guards against a message that does not survive the trip, or a header that may grow
    /// past its fixed buffer.
    #[test]
    fn every_message_round_trips() {
        let all = [
            Message::Hello {
                from: 3,
                to: u32::MAX,
                token: [0xab; TOKEN_BYTES],
            },
            Message::Welcome,
            Message::Write {
                id: u32::MAX,
                offset: u64::MAX,
                len: MAX_CHUNK_BYTES,
            },
            Message::Signal {
                id: 1,
                offset: u64::MAX,
                value: u64::MAX,
            },
            Message::Flush { seq: u64::MAX },
            Message::FlushAck { seq: 0 },
            Message::error(&"é".repeat(MAX_ERROR_TEXT_BYTES)),
            Message::Goodbye,
        ];
        for m in all {
            match read(&frame(&m)) {
                Ok(ReadOutcome::Frame(back)) => assert_eq!(back, m),
                other => panic!("{m:?}: {other:?}"),
            }
        }
    }

    /// A loopback TCP connection whose sending end has a 4 KiB send buffer and `timeout` to
    /// write, its receiving end `receive_buffer` bytes to receive, if given.
    fn small_buffered_pair(
        timeout: Duration,
        receive_buffer: Option<usize>,
    ) -> (TcpStream, TcpStream) {
        let (sender, receiver) = crate::ethernet_frame_reader::loopback_pair();
        rustix::net::sockopt::set_socket_send_buffer_size(&sender, 4096).unwrap();
        if let Some(bytes) = receive_buffer {
            rustix::net::sockopt::set_socket_recv_buffer_size(&receiver, bytes).unwrap();
        }
        sender.set_write_timeout(Some(timeout)).unwrap();
        (sender, receiver)
    }

    /// Guards against frames sent together that arrive out of order, cut or merged where the
    /// socket took them in pieces: a whole chunk and a signal through a small send buffer,
    /// read slowly, come back as the two frames with every payload byte.
    #[test]
    fn frames_sent_together_arrive_whole_and_in_order() {
        let (sender, receiver) = small_buffered_pair(Duration::from_secs(20), None);
        let payload: Vec<u8> = (0..MAX_CHUNK_BYTES)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let write = Message::Write {
            id: 3,
            offset: 40,
            len: MAX_CHUNK_BYTES,
        };
        let signal = Message::Signal {
            id: 4,
            offset: 0,
            value: 9,
        };
        let (w, s) = (write.clone(), signal.clone());
        let reader = std::thread::spawn(move || {
            let far = Instant::now() + Duration::from_secs(20);
            let mut stream = &receiver;
            let first = read_header(&mut stream, || true, || far).unwrap();
            let mut got = vec![0u8; MAX_CHUNK_BYTES as usize];
            for piece in got.chunks_mut(4096) {
                std::thread::sleep(Duration::from_micros(50));
                read_exact_by(&mut stream, piece, far, "payload").unwrap();
            }
            let second = read_header(&mut stream, || true, || far).unwrap();
            (first, got, second)
        });
        send_frames(&sender, &[(&w, &payload), (&s, &[])]).unwrap();
        let (first, got, second) = reader.join().unwrap();
        assert!(matches!(first, ReadOutcome::Frame(m) if m == write));
        assert!(got == payload, "payload bytes differ");
        assert!(matches!(second, ReadOutcome::Frame(m) if m == signal));
        let three = [(&signal, &[][..]); MAX_FRAMES_AT_ONCE + 1];
        assert_eq!(
            send_frames(&sender, &three).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    /// Guards against a peer that holds a sender by taking a frame a few bytes at a time:
    /// each `sendmsg` then makes progress within the write timeout, but the frame as a whole
    /// must be sent within it too, or the send fails as timed out.
    #[test]
    fn a_frame_taken_too_slowly_times_out() {
        let limit = Duration::from_millis(200);
        let (sender, receiver) = small_buffered_pair(limit, Some(16 << 10));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reading = stop.clone();
        let trickle = std::thread::spawn(move || {
            let mut sip = [0u8; 4096];
            let begun = Instant::now();
            while !reading.load(std::sync::atomic::Ordering::Relaxed)
                && begun.elapsed() < Duration::from_secs(5)
            {
                if (&receiver).read(&mut sip).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        let payload = vec![7u8; MAX_CHUNK_BYTES as usize];
        let write = Message::Write {
            id: 1,
            offset: 0,
            len: MAX_CHUNK_BYTES,
        };
        let start = Instant::now();
        let sent = send_frame(&sender, &write, &payload);
        let took = start.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        trickle.join().unwrap();
        let error = sent.expect_err("a frame taken a few bytes at a time was sent");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert!(
            took < limit * 3,
            "gave up after {took:?}, the limit being {limit:?}"
        );
    }

    /// Guards against a peer's bytes being trusted: an empty or oversized header length, a
    /// header of another version, garbage, trailing bytes, a write longer than a chunk, an
    /// error text longer than allowed, a frame cut short; each is an error, none panics.
    #[test]
    fn bad_frames_are_refused() {
        assert!(matches!(read(&[]), Ok(ReadOutcome::Closed)));
        assert!(matches!(read(&[1]), Err(WireError::Truncated { .. })));
        assert!(matches!(
            read(&[0, 0]),
            Err(WireError::HeaderLength { len: 0 })
        ));
        let long = (MAX_HEADER_BYTES as u16 + 1).to_le_bytes();
        assert!(matches!(read(&long), Err(WireError::HeaderLength { .. })));
        let mut other = frame(&Message::Welcome);
        other[2] = WIRE_VERSION as u8 + 1;
        let got = WIRE_VERSION + 1;
        assert!(matches!(read(&other), Err(WireError::Version { got: g }) if g == got));
        assert!(matches!(
            read(&[3, 0, WIRE_VERSION as u8, 99, 0]),
            Err(WireError::Malformed(_))
        ));
        let mut trailing = frame(&Message::Welcome);
        trailing[0] += 1;
        trailing.push(0);
        assert!(matches!(read(&trailing), Err(WireError::Malformed(_))));
        let big = frame(&Message::Write {
            id: 0,
            offset: 0,
            len: MAX_CHUNK_BYTES + 1,
        });
        assert!(matches!(read(&big), Err(WireError::PayloadTooLong { .. })));
        let long_error = frame(&Message::Error {
            reason: "x".repeat(MAX_ERROR_TEXT_BYTES + 1),
        });
        assert!(matches!(read(&long_error), Err(WireError::Malformed(_))));
        let cut = frame(&Message::Flush { seq: 7 });
        assert!(matches!(
            read(&cut[..cut.len() - 1]),
            Err(WireError::Truncated { part: "header", .. })
        ));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use std::time::Duration;

    fn arb_message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (any::<u32>(), any::<u32>(), any::<[u8; TOKEN_BYTES]>())
                .prop_map(|(from, to, token)| Message::Hello { from, to, token }),
            Just(Message::Welcome),
            (any::<u32>(), any::<u64>(), 0..=MAX_CHUNK_BYTES)
                .prop_map(|(id, offset, len)| Message::Write { id, offset, len }),
            (any::<u32>(), any::<u64>(), any::<u64>())
                .prop_map(|(id, offset, value)| Message::Signal { id, offset, value }),
            any::<u64>().prop_map(|seq| Message::Flush { seq }),
            any::<u64>().prop_map(|seq| Message::FlushAck { seq }),
            ".{0,80}".prop_map(|reason| Message::error(&reason)),
            Just(Message::Goodbye),
        ]
    }

    fn frame(message: &Message) -> Vec<u8> {
        let mut out = [0u8; MAX_FRAME_HEADER_BYTES];
        let n = encode(message, &mut out).unwrap();
        out[..n].to_vec()
    }

    /// Whether a decoded message keeps the bounds the format promises its readers.
    fn within_bounds(message: &Message) -> bool {
        match message {
            Message::Write { len, .. } => *len <= MAX_CHUNK_BYTES,
            Message::Error { reason } => reason.len() <= MAX_ERROR_TEXT_BYTES,
            _ => true,
        }
    }

    /// A socket that hands out `bytes` in the pieces `steps` say (0: a read that times out),
    /// then either ends the stream or times out forever.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        steps: Vec<usize>,
        step: usize,
        ends: bool,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let left = self.bytes.len() - self.at;
            if left == 0 {
                return if self.ends {
                    Ok(0)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            let piece = self.steps[self.step % self.steps.len()];
            self.step += 1;
            if piece == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = piece.min(left).min(buf.len());
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn read_from(reader: &mut impl Read, deadline: Instant) -> Result<ReadOutcome, WireError> {
        read_header(reader, || true, || deadline)
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Guards against a panic on any bytes a peer sends, or a message decoded from them
        /// that breaks the bounds readers rely on (a chunk, an error text).
        #[test]
        fn arbitrary_bytes_are_an_error_or_a_bounded_message(
            bytes in vec(any::<u8>(), 0..MAX_FRAME_HEADER_BYTES + 8),
        ) {
            match read_from(&mut &bytes[..], far()) {
                Ok(ReadOutcome::Frame(message)) => prop_assert!(within_bounds(&message)),
                Ok(ReadOutcome::Closed) => prop_assert!(bytes.is_empty()),
                Ok(ReadOutcome::Stopped) => prop_assert!(false, "stopped while never idle"),
                Err(_) => {}
            }
        }

        /// Guards against the same on headers of this version, which reach the message
        /// decoder (random bytes rarely carry the right version). Every prefix of the bytes
        /// is a header: a header must decode to exactly one message, which random bytes of
        /// one length rarely do.
        #[test]
        fn arbitrary_headers_are_an_error_or_a_bounded_message(
            kind in 0u8..10,
            body in vec(any::<u8>(), 0..MAX_HEADER_BYTES - 2),
        ) {
            let mut header = vec![WIRE_VERSION as u8, kind];
            header.extend_from_slice(&body);
            for len in 1..=header.len() {
                if let Ok(message) = decode_header(&header[..len]) {
                    prop_assert!(within_bounds(&message), "{:?}", message);
                }
            }
        }

        /// Guards against encoder and decoder drifting apart for any field values, and
        /// against a frame read wrongly when it arrives in pieces between read timeouts.
        #[test]
        fn messages_round_trip_whatever_the_pieces(
            message in arb_message(),
            steps in vec(0usize..8, 1..8),
        ) {
            let bytes = frame(&message);
            prop_assume!(steps.iter().any(|&s| s > 0));
            let mut reader = Trickle { bytes, at: 0, steps, step: 0, ends: true };
            match read_from(&mut reader, far()) {
                Ok(ReadOutcome::Frame(back)) => prop_assert_eq!(back, message),
                other => prop_assert!(false, "{:?}", other),
            }
        }

        /// Guards against a frame cut short being taken for a frame, or waited on forever:
        /// a stream that ends inside it is `Truncated`, one that goes quiet inside it is
        /// `Stalled` at the deadline.
        #[test]
        fn cut_frames_are_truncated_or_stalled(message in arb_message(), cut in any::<usize>()) {
            let whole = frame(&message);
            let cut = 1 + cut % (whole.len() - 1);
            let ended = read_from(&mut &whole[..cut], far());
            prop_assert!(matches!(ended, Err(WireError::Truncated { .. })), "{:?}", ended);
            let mut quiet = Trickle {
                bytes: whole[..cut].to_vec(),
                at: 0,
                steps: vec![cut],
                step: 0,
                ends: false,
            };
            let stalled = read_from(&mut quiet, Instant::now());
            prop_assert!(matches!(stalled, Err(WireError::Stalled { .. })), "{:?}", stalled);
        }

        /// Guards against a corrupted frame (bit flips in lengths, kinds and fields) causing
        /// a panic or a message outside the bounds.
        #[test]
        fn corrupted_frames_are_an_error_or_a_bounded_message(
            message in arb_message(),
            flips in vec((any::<usize>(), 1u8..), 1..4),
        ) {
            let mut bytes = frame(&message);
            for (at, mask) in flips {
                let i = at % bytes.len();
                bytes[i] ^= mask;
            }
            if let Ok(ReadOutcome::Frame(back)) = read_from(&mut &bytes[..], far()) {
                prop_assert!(within_bounds(&back));
            }
        }
    }
}
