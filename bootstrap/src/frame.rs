//! The wire format: length-prefixed postcard frames, each carrying the protocol version.
//!
//! ```text
//! frame   = len: u32 little-endian | payload (1 ..= limit bytes)
//! payload = version: u32 (postcard varint) | Message (postcard; the variant index is the kind)
//! ```
//!
//! Invariants the decoder keeps, whatever the bytes:
//! - the length is checked against the limit before any payload byte is read, and the
//!   payload buffer grows only as bytes actually arrive, so a peer claiming 4 GiB and
//!   sending 10 bytes costs 10 bytes;
//! - the version is decoded on its own before the message, so a peer of another version is
//!   reported as `expected protocol vN, peer sent vM`, not as garbage;
//! - a payload must decode to exactly one message with no trailing bytes;
//! - no input panics; allocations are bounded by the frame length plus serde's cautious
//!   preallocation cap (1 MiB).
//!
//! Handshake frames are read with [`HANDSHAKE_MAX_FRAME_BYTES`], so a connection that has
//! not proved the secret cannot make this rank allocate more than that.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Version of the bootstrap wire protocol; both ends of a connection must speak the same.
pub const PROTOCOL_VERSION: u32 = 1;

/// Limit on frames read before the peer has proved the secret.
pub(crate) const HANDSHAKE_MAX_FRAME_BYTES: usize = 512;

/// Longest host name a rank may report (POSIX `HOST_NAME_MAX` is 255 at most).
pub(crate) const MAX_HOSTNAME_BYTES: usize = 255;

/// Bytes of a handshake nonce.
pub(crate) const NONCE_BYTES: usize = 16;

/// Bytes of a handshake MAC (HMAC-SHA256).
pub(crate) const MAC_BYTES: usize = 32;

const HEADER_BYTES: usize = 4;

/// First buffer size for a payload; it grows with the bytes that arrive, never with the
/// length the peer claims.
const FIRST_READ_BYTES: usize = 64 << 10;

/// Everything that travels on a bootstrap connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Message {
    /// Connector → acceptor, first frame.
    Hello(Hello),
    /// Acceptor → connector: its nonce and its proof of the secret.
    Challenge(Challenge),
    /// Connector → acceptor: its proof of the secret.
    Proof(Proof),
    /// Acceptor → connector: authenticated and admitted; data may flow.
    Welcome,
    /// Either side: the handshake failed, and why.
    Reject(RejectReason),
    /// After the handshake: one tagged message.
    Data {
        /// Which exchange the message belongs to.
        tag: Tag,
        /// The content.
        body: Body,
    },
}

impl Message {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Challenge(_) => "Challenge",
            Message::Proof(_) => "Proof",
            Message::Welcome => "Welcome",
            Message::Reject(_) => "Reject",
            Message::Data { .. } => "Data",
        }
    }
}

/// First frame of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hello {
    /// Rank of the connector.
    pub(crate) from: u32,
    /// Rank the connector means to reach.
    pub(crate) to: u32,
    /// World size the connector was started with.
    pub(crate) size: u32,
    /// Connector's fresh random nonce.
    pub(crate) nonce: [u8; NONCE_BYTES],
}

/// Acceptor's answer to a `Hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Challenge {
    /// Acceptor's fresh random nonce.
    pub(crate) nonce: [u8; NONCE_BYTES],
    /// HMAC over both nonces and the hello fields, with the acceptor's label.
    pub(crate) mac: [u8; MAC_BYTES],
}

/// Connector's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Proof {
    /// HMAC over both nonces and the hello fields, with the connector's label.
    pub(crate) mac: [u8; MAC_BYTES],
}

/// Why one side refused a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RejectReason {
    /// The other side's proof did not verify.
    WrongSecret,
    /// The other side's frames carry another version.
    VersionMismatch {
        /// The refusing side's version.
        expected: u32,
    },
    /// A handshake frame did not decode or came out of order.
    Malformed,
    /// The connector meant to reach another rank (stale address).
    WrongRank {
        /// The refusing side's rank.
        rank: u32,
    },
    /// The two sides were started with different world sizes.
    SizeMismatch {
        /// The refusing side's world size.
        size: u32,
    },
    /// The connector's rank is out of range or equals the acceptor's.
    BadRank,
    /// Another process already joined with this rank.
    AlreadyJoined,
    /// Both ranks of the pair dialled at once; the lower rank's connection is the one kept.
    DialRace,
    /// The acceptor is shutting down.
    ShuttingDown,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::WrongSecret => f.write_str("wrong bootstrap secret"),
            RejectReason::VersionMismatch { expected } => {
                write!(f, "protocol version mismatch (it speaks v{expected})")
            }
            RejectReason::Malformed => f.write_str("malformed handshake"),
            RejectReason::WrongRank { rank } => {
                write!(
                    f,
                    "reached rank {rank}, not the rank asked for (stale address?)"
                )
            }
            RejectReason::SizeMismatch { size } => write!(
                f,
                "world size mismatch: it was started with {size} ranks (check WORLD_SIZE / launcher)"
            ),
            RejectReason::BadRank => f.write_str("rank out of range"),
            RejectReason::AlreadyJoined => {
                f.write_str("another process already joined with this rank (duplicate RANK?)")
            }
            RejectReason::DialRace => {
                f.write_str("both sides dialled at once; the lower rank's connection is kept")
            }
            RejectReason::ShuttingDown => f.write_str("shutting down"),
        }
    }
}

/// Which exchange a data message belongs to; `recv` matches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) enum Tag {
    /// A user `send`/`recv` tag.
    User(u64),
    /// A rank's address, sent to the root at init.
    Join,
    /// The address table, sent by the root at init.
    Table,
    /// Round `round` of the collective numbered `seq`.
    Coll {
        /// Collective sequence number (all ranks call collectives in the same order).
        seq: u64,
        /// Round within the collective.
        round: u32,
    },
}

/// Content of a data message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Body {
    /// Opaque bytes (send/recv, broadcast, barrier tokens, ring steps).
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Several ranks' contributions (all-gather rounds).
    Blocks(Vec<Block>),
    /// A rank's address and host name.
    Join(RankInfo),
    /// Every rank's address and host name, by rank.
    Table(Vec<RankInfo>),
}

/// One rank's all-gather contribution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Block {
    /// The rank it came from.
    pub(crate) rank: u32,
    /// Its bytes.
    #[serde(with = "serde_bytes")]
    pub(crate) data: Vec<u8>,
}

/// Where a rank listens and on which host it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RankInfo {
    /// The address peers dial.
    pub(crate) listen: SocketAddr,
    /// Host name (groups ranks into nodes).
    pub(crate) hostname: String,
}

/// Why a frame could not be read or decoded; turned into an `Error` with rank and peer by
/// the caller, which knows them.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// The peer closed the connection inside a frame.
    Truncated {
        /// Bytes of the frame (header included) received.
        got: usize,
        /// Bytes the frame should have had.
        want: usize,
    },
    /// The length prefix is above the limit.
    TooLarge {
        /// Claimed payload length.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// The frame carries another protocol version.
    VersionMismatch {
        /// The version found.
        got: u32,
    },
    /// The payload does not decode to one message.
    Malformed(String),
    /// The read deadline passed; `partial` if some bytes of the frame were consumed (the
    /// stream is then out of step and must be dropped).
    TimedOut {
        /// Whether part of the frame was consumed.
        partial: bool,
    },
    /// Another I/O error.
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::Truncated { got, want } => {
                write!(
                    f,
                    "connection closed inside a frame ({got} of {want} bytes)"
                )
            }
            FrameError::TooLarge { len, limit } => {
                write!(f, "frame of {len} bytes exceeds the limit of {limit} bytes")
            }
            FrameError::VersionMismatch { got } => write!(f, "frame of protocol v{got}"),
            FrameError::Malformed(why) => f.write_str(why),
            FrameError::TimedOut { partial } => {
                if *partial {
                    f.write_str("timed out inside a frame")
                } else {
                    f.write_str("timed out")
                }
            }
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Encodes `msg` as one frame (length prefix included) of protocol `version`.
///
/// # Errors
/// [`FrameError::TooLarge`] if the payload would exceed `limit`.
pub(crate) fn encode(version: u32, msg: &Message, limit: usize) -> Result<Vec<u8>, FrameError> {
    let buf = vec![0u8; HEADER_BYTES];
    let buf = postcard::to_extend(&version, buf)
        .map_err(|e| FrameError::Malformed(format!("cannot encode version: {e}")))?;
    let mut buf = postcard::to_extend(msg, buf)
        .map_err(|e| FrameError::Malformed(format!("cannot encode {}: {e}", msg.kind())))?;
    let len = buf.len() - HEADER_BYTES;
    if len > limit || u32::try_from(len).is_err() {
        return Err(FrameError::TooLarge {
            len: len as u64,
            limit,
        });
    }
    buf[..HEADER_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(buf)
}

/// Decodes one payload (the bytes after the length prefix).
///
/// # Errors
/// [`FrameError::VersionMismatch`] if the version differs from `version`,
/// [`FrameError::Malformed`] if the bytes are not exactly one message.
pub(crate) fn decode_payload(payload: &[u8], version: u32) -> Result<Message, FrameError> {
    let (got, rest) = postcard::take_from_bytes::<u32>(payload)
        .map_err(|e| FrameError::Malformed(format!("no protocol version: {e}")))?;
    if got != version {
        return Err(FrameError::VersionMismatch { got });
    }
    let (msg, rest) = postcard::take_from_bytes::<Message>(rest)
        .map_err(|e| FrameError::Malformed(format!("undecodable message: {e}")))?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after a {} message",
            rest.len(),
            msg.kind()
        )));
    }
    Ok(msg)
}

/// Reads one frame from `r`; returns the message and its payload length.
///
/// # Errors
/// [`FrameError::Closed`] on a clean end of stream before the frame, the other variants as
/// their docs say. Read timeouts of the underlying stream become [`FrameError::TimedOut`].
pub(crate) fn read_frame(
    r: &mut impl Read,
    limit: usize,
    version: u32,
) -> Result<(Message, usize), FrameError> {
    let mut header = [0u8; HEADER_BYTES];
    let mut got = 0;
    while got < HEADER_BYTES {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => {
                return Err(FrameError::Truncated {
                    got,
                    want: HEADER_BYTES,
                });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(FrameError::TimedOut { partial: got > 0 }),
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = check_len(header, limit)?;
    let mut payload = Vec::with_capacity(len.min(FIRST_READ_BYTES));
    // `take` + `read_to_end` grows the buffer with the bytes received, not the length claimed.
    match r.by_ref().take(len as u64).read_to_end(&mut payload) {
        Ok(_) => {}
        Err(e) if is_timeout(&e) => return Err(FrameError::TimedOut { partial: true }),
        Err(e) => return Err(FrameError::Io(e)),
    }
    if payload.len() < len {
        return Err(FrameError::Truncated {
            got: HEADER_BYTES + payload.len(),
            want: HEADER_BYTES + len,
        });
    }
    Ok((decode_payload(&payload, version)?, len))
}

/// Writes one encoded frame.
///
/// # Errors
/// The stream's I/O errors (a write timeout shows as `WouldBlock` or `TimedOut`).
pub(crate) fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}

/// Whether an I/O error is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` give `EAGAIN`).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn check_len(header: [u8; HEADER_BYTES], limit: usize) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header);
    if len as usize > limit {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            limit,
        });
    }
    if len == 0 {
        return Err(FrameError::Malformed("empty frame".into()));
    }
    Ok(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMIT: usize = 64 << 10;

    /// Decodes the frame at the start of `bytes`; returns it and the bytes it used.
    fn decode(bytes: &[u8], limit: usize, version: u32) -> Result<(Message, usize), FrameError> {
        let mut r = bytes;
        let (msg, _) = read_frame(&mut r, limit, version)?;
        Ok((msg, bytes.len() - r.len()))
    }

    fn sample_messages() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                from: 3,
                to: 0,
                size: 7,
                nonce: [9; NONCE_BYTES],
            }),
            Message::Challenge(Challenge {
                nonce: [1; NONCE_BYTES],
                mac: [2; MAC_BYTES],
            }),
            Message::Proof(Proof {
                mac: [3; MAC_BYTES],
            }),
            Message::Welcome,
            Message::Reject(RejectReason::SizeMismatch { size: 4 }),
            Message::Data {
                tag: Tag::User(u64::MAX),
                body: Body::Bytes(vec![1, 2, 3]),
            },
            Message::Data {
                tag: Tag::Coll { seq: 5, round: 2 },
                body: Body::Blocks(vec![Block {
                    rank: 1,
                    data: vec![7; 100],
                }]),
            },
            Message::Data {
                tag: Tag::Table,
                body: Body::Table(vec![RankInfo {
                    listen: "[::1]:80".parse().unwrap(),
                    hostname: "node-0".into(),
                }]),
            },
        ]
    }

    // Guards against an encoder/decoder disagreement on any message kind.
    #[test]
    fn round_trips_every_kind() {
        for msg in sample_messages() {
            let frame = encode(PROTOCOL_VERSION, &msg, LIMIT).unwrap();
            let (back, used) = decode(&frame, LIMIT, PROTOCOL_VERSION).unwrap();
            assert_eq!(back, msg);
            assert_eq!(used, frame.len());
            let (back, len) = read_frame(&mut &frame[..], LIMIT, PROTOCOL_VERSION).unwrap();
            assert_eq!(back, msg);
            assert_eq!(len + HEADER_BYTES, frame.len());
        }
    }

    // Guards against a frame of another version being reported as garbage instead of as a
    // version mismatch naming both versions.
    #[test]
    fn other_version_is_reported_as_such() {
        let frame = encode(7, &Message::Welcome, LIMIT).unwrap();
        assert!(matches!(
            decode(&frame, LIMIT, PROTOCOL_VERSION),
            Err(FrameError::VersionMismatch { got: 7 })
        ));
    }

    // Guards against trusting the length prefix: a 4 GiB claim must fail before any read.
    #[test]
    fn oversized_prefix_is_refused_before_reading() {
        let mut bytes = u32::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 16]);
        let mut r = &bytes[..];
        assert!(matches!(
            read_frame(&mut r, LIMIT, PROTOCOL_VERSION),
            Err(FrameError::TooLarge { len, .. }) if len == u64::from(u32::MAX)
        ));
        // Nothing after the header was consumed.
        assert_eq!(r.len(), 16);
        assert!(matches!(
            encode(
                PROTOCOL_VERSION,
                &Message::Data {
                    tag: Tag::User(0),
                    body: Body::Bytes(vec![0; LIMIT])
                },
                LIMIT
            ),
            Err(FrameError::TooLarge { .. })
        ));
    }

    // Guards against a short stream being taken for a complete frame, and against confusing
    // a clean close with a close inside a frame.
    #[test]
    fn truncation_and_close_are_told_apart() {
        let frame = encode(PROTOCOL_VERSION, &Message::Welcome, LIMIT).unwrap();
        assert!(matches!(
            read_frame(&mut &[][..], LIMIT, PROTOCOL_VERSION),
            Err(FrameError::Closed)
        ));
        for cut in 1..frame.len() {
            assert!(matches!(
                read_frame(&mut &frame[..cut], LIMIT, PROTOCOL_VERSION),
                Err(FrameError::Truncated { .. })
            ));
        }
    }

    // Guards against a frame that decodes but carries extra bytes being accepted (two
    // messages in one frame, or a smuggled payload).
    #[test]
    fn trailing_bytes_are_malformed() {
        let mut frame = encode(PROTOCOL_VERSION, &Message::Welcome, LIMIT).unwrap();
        frame.push(0);
        let len = (frame.len() - HEADER_BYTES) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(
            decode(&frame, LIMIT, PROTOCOL_VERSION),
            Err(FrameError::Malformed(_))
        ));
        let empty = 0u32.to_le_bytes();
        assert!(matches!(
            decode(&empty, LIMIT, PROTOCOL_VERSION),
            Err(FrameError::Malformed(_))
        ));
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let bytes = proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<[u8; 16]>()).prop_map(
                |(from, to, size, nonce)| Message::Hello(Hello {
                    from,
                    to,
                    size,
                    nonce
                })
            ),
            (any::<[u8; 16]>(), any::<[u8; 32]>())
                .prop_map(|(nonce, mac)| Message::Challenge(Challenge { nonce, mac })),
            (any::<u64>(), bytes.clone()).prop_map(|(t, b)| Message::Data {
                tag: Tag::User(t),
                body: Body::Bytes(b)
            }),
            (
                any::<u64>(),
                any::<u32>(),
                proptest::collection::vec((any::<u32>(), bytes), 0..8)
            )
                .prop_map(|(seq, round, blocks)| Message::Data {
                    tag: Tag::Coll { seq, round },
                    body: Body::Blocks(
                        blocks
                            .into_iter()
                            .map(|(rank, data)| Block { rank, data })
                            .collect()
                    ),
                }),
            ("[a-z0-9.-]{1,20}", any::<u16>()).prop_map(|(hostname, port)| Message::Data {
                tag: Tag::Join,
                body: Body::Join(RankInfo {
                    listen: SocketAddr::from(([10, 0, 0, 1], port)),
                    hostname,
                }),
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        // Guards against the decoder panicking on arbitrary bytes from the network.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes, LIMIT, PROTOCOL_VERSION);
            let _ = read_frame(&mut &bytes[..], LIMIT, PROTOCOL_VERSION);
        }

        // Guards against panics on payloads behind a valid length prefix (the decoder's
        // inner layers, which random bytes rarely reach).
        #[test]
        fn random_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 1..2048)) {
            let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
            frame.extend_from_slice(&payload);
            let _ = decode(&frame, LIMIT, PROTOCOL_VERSION);
            let mut versioned = vec![PROTOCOL_VERSION as u8];
            versioned.extend_from_slice(&payload);
            let _ = decode_payload(&versioned, PROTOCOL_VERSION);
        }

        // Guards against encode/decode drifting apart for any field values.
        #[test]
        fn arbitrary_messages_round_trip(msg in arb_message()) {
            let frame = encode(PROTOCOL_VERSION, &msg, LIMIT).unwrap();
            let (back, used) = decode(&frame, LIMIT, PROTOCOL_VERSION).unwrap();
            prop_assert_eq!(back, msg);
            prop_assert_eq!(used, frame.len());
        }

        // Guards against panics on valid frames with corrupted bytes (bit flips in counts
        // and lengths are what reach the deepest decoder paths).
        #[test]
        fn corrupted_frames_never_panic(
            msg in arb_message(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        ) {
            let mut frame = encode(PROTOCOL_VERSION, &msg, LIMIT).unwrap();
            for (at, x) in flips {
                let i = HEADER_BYTES + at % (frame.len() - HEADER_BYTES);
                frame[i] ^= x;
            }
            let _ = decode(&frame, LIMIT, PROTOCOL_VERSION);
        }

        // Guards against unbounded allocation: decoding any input must allocate at most
        // serde's 1 MiB preallocation cap plus a small multiple of the input.
        #[test]
        fn decoding_allocation_is_bounded(
            payload in proptest::collection::vec(any::<u8>(), 1..4096),
            kind in 0u8..6,
        ) {
            // Steer the random bytes into each message kind's decoder.
            let mut frame_payload = vec![PROTOCOL_VERSION as u8, kind];
            frame_payload.extend_from_slice(&payload);
            let mut frame = (frame_payload.len() as u32).to_le_bytes().to_vec();
            frame.extend_from_slice(&frame_payload);
            let peak = alloc_count::peak_during(|| {
                let _ = read_frame(&mut &frame[..], LIMIT, PROTOCOL_VERSION);
            });
            let bound = (1 << 20) + 64 * frame.len() + FIRST_READ_BYTES;
            prop_assert!(peak <= bound, "peak {} > bound {}", peak, bound);
        }
    }

    // Guards against the count/length fields inside a payload driving allocation: a tiny
    // frame claiming a huge vector must not allocate in proportion to the claim.
    #[test]
    fn huge_inner_counts_do_not_allocate() {
        // Data { tag: User(0), body: Blocks(len = 2^62) } with no blocks following.
        let mut payload = vec![PROTOCOL_VERSION as u8, 5, 0, 0, 1];
        payload.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f]);
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&payload);
        let peak = alloc_count::peak_during(|| {
            assert!(read_frame(&mut &frame[..], LIMIT, PROTOCOL_VERSION).is_err());
        });
        assert!(peak <= (1 << 20) + FIRST_READ_BYTES + 4096, "peak {peak}");
    }

    /// Counts the bytes the current thread has allocated and not freed, to bound the
    /// decoder's peak use. Only counts while enabled on this thread.
    mod alloc_count {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        struct Counting;

        thread_local! {
            static ON: Cell<bool> = const { Cell::new(false) };
            static CUR: Cell<usize> = const { Cell::new(0) };
            static PEAK: Cell<usize> = const { Cell::new(0) };
        }

        fn add(bytes: usize) {
            // `try_with`: during thread teardown the slots may be gone; counting stops then.
            let _ = ON.try_with(|on| {
                if on.get() {
                    let cur = CUR.with(|c| {
                        c.set(c.get() + bytes);
                        c.get()
                    });
                    PEAK.with(|p| p.set(p.get().max(cur)));
                }
            });
        }

        fn sub(bytes: usize) {
            let _ = ON.try_with(|on| {
                if on.get() {
                    CUR.with(|c| c.set(c.get().saturating_sub(bytes)));
                }
            });
        }

        // SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
        // `System`'s guarantees carry over; the counting touches only const-initialized
        // thread-locals without destructors, which never allocate.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                add(layout.size());
                // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract for `layout`.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                sub(layout.size());
                // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
                unsafe { System.dealloc(ptr, layout) }
            }

            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                add(new_size);
                sub(layout.size());
                // SAFETY: `ptr` was allocated by `System` with `layout`; the caller upholds
                // `realloc`'s contract for `new_size`.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        /// Peak bytes allocated by this thread while `f` runs.
        pub(super) fn peak_during(f: impl FnOnce()) -> usize {
            CUR.with(|c| c.set(0));
            PEAK.with(|p| p.set(0));
            ON.with(|on| on.set(true));
            f();
            ON.with(|on| on.set(false));
            PEAK.with(Cell::get)
        }
    }
}
