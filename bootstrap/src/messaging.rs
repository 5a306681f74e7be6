//! Messages between ranks: tagged point-to-point `send`/`recv`, and the framing, sending
//! and receiving the collectives are built on.
//!
//! Point-to-point messages are matched by `(peer, tag)` and may interleave with
//! collectives freely; a message to oneself is queued locally. Every call has a deadline of
//! `Config::timeout` from its start.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Peer, Result};
use crate::frame::{self, Body, FrameError, Message, Tag};
use crate::peer::{Recv, WriteError};

impl Bootstrap {
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

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.inner.size {
            return Err(Error::InvalidUsage(format!(
                "rank {}: peer {peer} out of range (size {})",
                self.inner.rank, self.inner.size
            )));
        }
        Ok(())
    }

    pub(crate) fn encode(&self, msg: &Message, to: usize) -> Result<Vec<u8>> {
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

    pub(crate) fn send_frame(
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
}

fn body_bytes(body: &Body) -> usize {
    match body {
        Body::Bytes(b) => b.len(),
        Body::Blocks(bs) => bs.iter().map(|b| b.data.len() + 8).sum(),
        Body::Join(_) | Body::Table(_) => 0,
    }
}
