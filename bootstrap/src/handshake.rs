//! Mutual authentication of a new connection, before any data frame is read.
//!
//! ```text
//! connector                                   acceptor
//!   Hello { from, to, size, nonce_c }   ──▶     checks the frame's protocol version
//!                                       ◀──   Challenge { nonce_a, mac_a }
//!   verifies mac_a
//!   Proof { mac_c }                     ──▶     verifies mac_c, then rank and size
//!                                       ◀──   Welcome (or Reject { reason })
//! mac_x = HMAC-SHA256(secret, label_x | version | from | to | size | nonce_c | nonce_a)
//! ```
//!
//! - Both sides prove the secret, each over a fresh nonce of the other, so neither a
//!   recorded proof nor a proof reflected from the other direction (different label) can be
//!   replayed. The secret itself never goes on the wire.
//! - Handshake frames are read with a 512-byte limit; a connection that has not proved the
//!   secret cannot make this rank allocate more, and is dropped at its deadline: every read
//!   of the handshake shares that one deadline, however the peer spaces its bytes.
//! - Every frame carries the protocol version; a peer of another version is refused with a
//!   `VersionMismatch` naming both versions, on both sides.
//! - MACs are compared in constant time (`Mac::verify_slice`).

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::{Error, Peer, Result};
use crate::frame::{
    self, Challenge, FrameError, HANDSHAKE_MAX_FRAME_BYTES, Hello, MAC_BYTES, Message, NONCE_BYTES,
    Proof, RejectReason,
};
use crate::net::{DeadlineReader, remaining};
use crate::unique_id::Secret;

type HmacSha256 = Hmac<Sha256>;

const ACCEPTOR_LABEL: &[u8] = b"oxccl-bootstrap acceptor proof";
const CONNECTOR_LABEL: &[u8] = b"oxccl-bootstrap connector proof";

/// What this side knows about itself during a handshake.
pub(crate) struct Local<'a> {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) secret: &'a Secret,
    pub(crate) version: u32,
    /// Span of the deadline, for the timeout error's message.
    pub(crate) timeout: Duration,
}

/// How a dial that authenticated ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Dialed {
    /// Admitted: data may flow.
    Welcome,
    /// The peer (the lower rank) is dialling us at the same time; its connection is the
    /// one the pair keeps, so wait for it instead.
    Raced,
}

/// The connector's half: proves the secret to rank `to` and checks its proof.
///
/// # Errors
/// `WrongSecret` if the acceptor's proof does not verify or it refused ours,
/// `VersionMismatch`, `Rejected` with the acceptor's reason, `Timeout` at `deadline`,
/// `PeerClosed`, `MalformedFrame`.
pub(crate) fn connect(
    stream: &TcpStream,
    me: &Local<'_>,
    to: usize,
    deadline: Instant,
) -> Result<Dialed> {
    let peer = Peer::Rank(to);
    let op = "handshake";
    let nonce_c = nonce()?;
    let hello = Hello {
        from: me.rank as u32,
        to: to as u32,
        size: me.size as u32,
        nonce: nonce_c,
    };
    send(stream, me, peer, &Message::Hello(hello.clone()), deadline)?;
    let challenge = match recv(stream, me, peer, deadline, op)? {
        Message::Challenge(c) => c,
        Message::Reject(reason) => return Err(rejected(me, peer, reason)),
        other => {
            return Err(malformed(
                me,
                peer,
                format!("expected Challenge, got {}", other.kind()),
            ));
        }
    };
    let expected = mac(me, ACCEPTOR_LABEL, &hello, &challenge.nonce)?;
    if expected.verify_slice(&challenge.mac).is_err() {
        // Tell the acceptor, so its log says why; the result does not matter any more.
        let _ = send(
            stream,
            me,
            peer,
            &Message::Reject(RejectReason::WrongSecret),
            deadline,
        );
        return Err(Error::WrongSecret {
            rank: me.rank,
            peer,
        });
    }
    let proof = mac(me, CONNECTOR_LABEL, &hello, &challenge.nonce)?;
    let proof = Proof {
        mac: proof.finalize().into_bytes().into(),
    };
    send(stream, me, peer, &Message::Proof(proof), deadline)?;
    match recv(stream, me, peer, deadline, op)? {
        Message::Welcome => Ok(Dialed::Welcome),
        Message::Reject(RejectReason::DialRace) => Ok(Dialed::Raced),
        Message::Reject(reason) => Err(rejected(me, peer, reason)),
        other => Err(malformed(
            me,
            peer,
            format!("expected Welcome, got {}", other.kind()),
        )),
    }
}

/// The acceptor's half up to the verdict: checks the version, proves the secret, verifies
/// the connector's proof, rank and size. Returns the connector's rank; the caller then
/// admits it with [`welcome`] or refuses it with [`reject`].
///
/// # Errors
/// As [`connect`]; every failure has already been reported to the connector with a
/// `Reject` where the protocol allows it.
pub(crate) fn accept(
    stream: &TcpStream,
    me: &Local<'_>,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<usize> {
    let peer = Peer::Addr(addr);
    let hello = match recv(stream, me, peer, deadline, "handshake") {
        Ok(Message::Hello(h)) => h,
        Ok(other) => {
            reject(stream, me, RejectReason::Malformed, deadline);
            return Err(malformed(
                me,
                peer,
                format!("expected Hello, got {}", other.kind()),
            ));
        }
        Err(e) => {
            let reason = match &e {
                Error::VersionMismatch { .. } => Some(RejectReason::VersionMismatch {
                    expected: me.version,
                }),
                Error::MalformedFrame { .. } | Error::FrameTooLarge { .. } => {
                    Some(RejectReason::Malformed)
                }
                _ => None,
            };
            if let Some(reason) = reason {
                reject(stream, me, reason, deadline);
            }
            return Err(e);
        }
    };
    let nonce_a = nonce()?;
    let mac_a = mac(me, ACCEPTOR_LABEL, &hello, &nonce_a)?;
    let challenge = Challenge {
        nonce: nonce_a,
        mac: mac_a.finalize().into_bytes().into(),
    };
    send(stream, me, peer, &Message::Challenge(challenge), deadline)?;
    let proof = match recv(stream, me, peer, deadline, "handshake")? {
        Message::Proof(p) => p,
        Message::Reject(reason) => return Err(rejected(me, peer, reason)),
        other => {
            reject(stream, me, RejectReason::Malformed, deadline);
            return Err(malformed(
                me,
                peer,
                format!("expected Proof, got {}", other.kind()),
            ));
        }
    };
    let expected = mac(me, CONNECTOR_LABEL, &hello, &nonce_a)?;
    if expected.verify_slice(&proof.mac).is_err() {
        reject(stream, me, RejectReason::WrongSecret, deadline);
        return Err(Error::WrongSecret {
            rank: me.rank,
            peer,
        });
    }
    // Authenticated from here on; now the claims are worth checking.
    let verdict = if hello.size as usize != me.size {
        Some(RejectReason::SizeMismatch {
            size: me.size as u32,
        })
    } else if hello.to as usize != me.rank {
        Some(RejectReason::WrongRank {
            rank: me.rank as u32,
        })
    } else if hello.from as usize >= me.size || hello.from as usize == me.rank {
        Some(RejectReason::BadRank)
    } else {
        None
    };
    if let Some(reason) = verdict {
        let e = Error::Rejected {
            rank: me.rank,
            peer,
            reason: format!(
                "we refused it: {reason} (it claims rank {} of {})",
                hello.from, hello.size
            ),
        };
        reject(stream, me, reason, deadline);
        return Err(e);
    }
    Ok(hello.from as usize)
}

/// Admits an accepted connection.
///
/// # Errors
/// The write's errors (`Timeout`, `PeerClosed`, `System`).
pub(crate) fn welcome(
    stream: &TcpStream,
    me: &Local<'_>,
    peer: usize,
    deadline: Instant,
) -> Result<()> {
    send(stream, me, Peer::Rank(peer), &Message::Welcome, deadline)
}

/// Refuses a connection, best effort: the peer may already be gone.
pub(crate) fn reject(stream: &TcpStream, me: &Local<'_>, reason: RejectReason, deadline: Instant) {
    // The peer is not waiting for us to succeed; the reason only makes its error clearer.
    let _ = send(
        stream,
        me,
        Peer::Rank(me.rank),
        &Message::Reject(reason),
        deadline,
    );
}

fn mac(
    me: &Local<'_>,
    label: &[u8],
    hello: &Hello,
    nonce_a: &[u8; NONCE_BYTES],
) -> Result<HmacSha256> {
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(me.secret.as_bytes())
        .map_err(|e| Error::Internal(format!("HMAC key: {e}")))?;
    m.update(&(label.len() as u32).to_le_bytes());
    m.update(label);
    m.update(&me.version.to_le_bytes());
    m.update(&hello.from.to_le_bytes());
    m.update(&hello.to.to_le_bytes());
    m.update(&hello.size.to_le_bytes());
    m.update(&hello.nonce);
    m.update(nonce_a);
    Ok(m)
}

const _: () = assert!(MAC_BYTES == 32, "HMAC-SHA256 output");

fn nonce() -> Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).map_err(|e| {
        Error::system(
            "reading the OS random source",
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(n)
}

fn send(
    stream: &TcpStream,
    me: &Local<'_>,
    peer: Peer,
    msg: &Message,
    deadline: Instant,
) -> Result<()> {
    let frame = frame::encode(me.version, msg, HANDSHAKE_MAX_FRAME_BYTES)
        .map_err(|e| Error::Internal(format!("handshake frame does not encode: {e}")))?;
    let Some(left) = remaining(deadline) else {
        return Err(timeout(me, peer));
    };
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| Error::system(format!("rank {}: setting a write timeout", me.rank), e))?;
    let mut w = stream;
    frame::write_frame(&mut w, &frame).map_err(|e| {
        if frame::is_timeout(&e) {
            timeout(me, peer)
        } else {
            Error::PeerClosed {
                rank: me.rank,
                peer,
            }
        }
    })
}

fn recv(
    stream: &TcpStream,
    me: &Local<'_>,
    peer: Peer,
    deadline: Instant,
    op: &'static str,
) -> Result<Message> {
    // One deadline for every read of the frame: with a timeout per read, a peer sending a
    // byte at a time would hold this handshake (and its acceptor slot) indefinitely.
    let mut r = DeadlineReader::new(stream, deadline);
    match frame::read_frame(&mut r, HANDSHAKE_MAX_FRAME_BYTES, me.version) {
        Ok((msg, _)) => Ok(msg),
        Err(FrameError::TimedOut { .. }) => {
            Err(Error::timeout(me.rank, op, peer_ranks(peer), me.timeout))
        }
        Err(e) => Err(frame_error(me, peer, e)),
    }
}

/// Turns a frame error on a handshake connection into the crate's error.
pub(crate) fn frame_error(me: &Local<'_>, peer: Peer, e: FrameError) -> Error {
    match e {
        FrameError::Closed | FrameError::Truncated { .. } | FrameError::Io(_) => {
            Error::PeerClosed {
                rank: me.rank,
                peer,
            }
        }
        FrameError::TooLarge { len, limit } => Error::FrameTooLarge {
            rank: me.rank,
            peer,
            len,
            limit,
        },
        FrameError::VersionMismatch { got } => Error::VersionMismatch {
            rank: me.rank,
            peer,
            expected: me.version,
            got,
        },
        e @ (FrameError::Malformed(_) | FrameError::TimedOut { .. }) => {
            malformed(me, peer, e.to_string())
        }
    }
}

fn rejected(me: &Local<'_>, peer: Peer, reason: RejectReason) -> Error {
    match reason {
        RejectReason::WrongSecret => Error::WrongSecret {
            rank: me.rank,
            peer,
        },
        reason => Error::Rejected {
            rank: me.rank,
            peer,
            reason: reason.to_string(),
        },
    }
}

fn malformed(me: &Local<'_>, peer: Peer, reason: String) -> Error {
    Error::MalformedFrame {
        rank: me.rank,
        peer,
        reason,
    }
}

fn timeout(me: &Local<'_>, peer: Peer) -> Error {
    Error::timeout(me.rank, "handshake", peer_ranks(peer), me.timeout)
}

fn peer_ranks(peer: Peer) -> Vec<usize> {
    match peer {
        Peer::Rank(r) => vec![r],
        Peer::Addr(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    fn pair() -> (TcpStream, TcpStream, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, addr) = l.accept().unwrap();
        (c, a, addr)
    }

    fn run(
        c_secret: Secret,
        c_version: u32,
        c_size: usize,
        a_secret: Secret,
    ) -> (Result<()>, Result<usize>) {
        let (c, a, addr) = pair();
        let deadline = Instant::now() + Duration::from_secs(5);
        let acc = thread::spawn(move || {
            let me = Local {
                rank: 0,
                size: 4,
                secret: &a_secret,
                version: frame::PROTOCOL_VERSION,
                timeout: Duration::from_secs(5),
            };
            let r = accept(&a, &me, addr, deadline);
            if let Ok(peer) = r {
                welcome(&a, &me, peer, deadline).unwrap();
            }
            r
        });
        let me = Local {
            rank: 2,
            size: c_size,
            secret: &c_secret,
            version: c_version,
            timeout: Duration::from_secs(5),
        };
        let rc = connect(&c, &me, 0, deadline).map(|d| assert_eq!(d, Dialed::Welcome));
        (rc, acc.join().unwrap())
    }

    // Guards against the happy path failing (the two halves disagreeing on the MAC input).
    #[test]
    fn same_secret_is_admitted() {
        let s = Secret::from_bytes([7; 16]);
        let (c, a) = run(s.clone(), frame::PROTOCOL_VERSION, 4, s);
        c.unwrap();
        assert_eq!(a.unwrap(), 2);
    }

    // Guards against a connection without the secret being admitted, on either side.
    #[test]
    fn different_secret_fails_both_sides() {
        let (c, a) = run(
            Secret::from_bytes([1; 16]),
            frame::PROTOCOL_VERSION,
            4,
            Secret::from_bytes([2; 16]),
        );
        assert!(matches!(c, Err(Error::WrongSecret { .. })), "{c:?}");
        assert!(a.is_err(), "{a:?}");
    }

    // Guards against a version mismatch being reported as garbage or as a bad secret.
    #[test]
    fn other_version_names_both_versions() {
        let s = Secret::from_bytes([7; 16]);
        let (c, a) = run(s.clone(), 9, 4, s);
        let c = c.unwrap_err();
        assert!(
            matches!(
                c,
                Error::VersionMismatch {
                    expected: 9,
                    got: 1,
                    ..
                }
            ),
            "{c:?}"
        );
        assert!(
            c.to_string().contains("expected protocol v9, peer sent v1"),
            "{c}"
        );
        let a = a.unwrap_err();
        assert!(
            matches!(
                a,
                Error::VersionMismatch {
                    expected: 1,
                    got: 9,
                    ..
                }
            ),
            "{a:?}"
        );
    }

    // Guards against ranks of differently sized jobs joining each other.
    #[test]
    fn size_mismatch_is_refused_with_reason() {
        let s = Secret::from_bytes([7; 16]);
        let (c, a) = run(s.clone(), frame::PROTOCOL_VERSION, 5, s);
        let c = c.unwrap_err();
        assert!(c.to_string().contains("world size mismatch"), "{c}");
        assert!(matches!(a, Err(Error::Rejected { .. })));
    }
}
