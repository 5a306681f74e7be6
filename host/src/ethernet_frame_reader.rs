//! The reading end of an Ethernet connection: its socket and a buffer of the bytes read
//! from it and not consumed yet.
//!
//! Reads through [`std::io::Read`] behave as a `BufReader`'s: from the buffer while it
//! holds bytes, else one `recv` that fills it (or, for a read at least as large as the
//! buffer, straight into the caller's memory), waiting as the socket's read timeout says.
//!
//! What a `BufReader` cannot do, [`FrameReader::read_arrived`] does: read what has arrived
//! *behind* the bytes already buffered, without waiting. A thread that must not wait on
//! the network (a kernel thread applying frames while it waits; see
//! `ethernet_receive_assist.rs`) then learns whether the next frame is whole from one
//! `recv`, which also moves it into the buffer, instead of peeking at the queue's first
//! bytes, asking the queue's length and reading them again (three system calls a frame).
//! Bytes read so are the connection's, kept in its buffer until consumed: a frame read in
//! part stays there for whoever reads the connection next.

use std::io::{self, Read};
use std::net::TcpStream;

/// What a read of the bytes that have arrived found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrived {
    /// This many bytes (at least one), appended to the buffer; `drained` when they were
    /// fewer than the room there was, so the socket held no more at that moment.
    Bytes { read: usize, drained: bool },
    /// Nothing has arrived (or the buffer has no room left).
    Nothing,
    /// The peer closed the connection.
    Ended,
    /// The socket reported an error; reading the connection reports it again.
    Failed,
}

/// A connection's socket (its reading half) and its read buffer.
///
/// Invariant: `start <= end <= buffer.len()`; `buffer[start..end]` holds the bytes read from
/// the socket and not consumed, in the order they came.
pub(crate) struct FrameReader {
    stream: TcpStream,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
}

impl FrameReader {
    /// A reader of `stream` with a buffer of `capacity` bytes (at least one).
    pub(crate) fn with_capacity(capacity: usize, stream: TcpStream) -> Self {
        FrameReader {
            stream,
            buffer: vec![0; capacity.max(1)].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The bytes read and not consumed yet.
    pub(crate) fn buffer(&self) -> &[u8] {
        &self.buffer[self.start..self.end]
    }

    /// How many bytes the buffer holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.buffer.len()
    }

    /// Consumes the first `n` buffered bytes (all of them, if fewer are buffered).
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// The socket, for reads that bypass the buffer and for queries.
    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Appends to the buffer what has arrived on the socket, without waiting: one `recv`
    /// into all the room there is, the buffered bytes first moved to its front (so a frame
    /// no larger than the buffer fits behind them once it has all arrived).
    pub(crate) fn read_arrived(&mut self) -> Arrived {
        if self.start > 0 {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.buffer.len() - self.end;
        if room == 0 {
            return Arrived::Nothing;
        }
        loop {
            let got = rustix::net::recv(
                &self.stream,
                &mut self.buffer[self.end..],
                rustix::net::RecvFlags::DONTWAIT,
            );
            return match got {
                Ok((0, _)) => Arrived::Ended,
                Ok((read, _)) => {
                    // `recv` never reports more than the room it was given.
                    let read = read.min(room);
                    self.end += read;
                    Arrived::Bytes {
                        read,
                        drained: read < room,
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => Arrived::Nothing,
                Err(_) => Arrived::Failed,
            };
        }
    }
}

impl Read for FrameReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.start == self.end {
            if out.len() >= self.buffer.len() {
                return (&self.stream).read(out);
            }
            let n = (&self.stream).read(&mut self.buffer)?;
            self.start = 0;
            self.end = n.min(self.buffer.len());
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buffer[self.start..self.start + n]);
        self.consume(n);
        Ok(n)
    }
}

/// A connected pair of loopback TCP sockets, for tests: (sending end, receiving end).
#[cfg(test)]
pub(crate) fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (receiver, _) = listener.accept().unwrap();
    (sender, receiver)
}

#[cfg(test)]
mod tests {
    use super::{Arrived, FrameReader, loopback_pair};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let (sender, receiver) = loopback_pair();
        receiver
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        (sender, receiver)
    }

    /// Reads what has arrived until `want` bytes are buffered (loopback delivers at once,
    /// but not necessarily before `write` returns), for at most five seconds.
    fn read_until_buffered(reader: &mut FrameReader, want: usize) -> Vec<Arrived> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        while reader.buffer().len() < want && Instant::now() < deadline {
            seen.push(reader.read_arrived());
        }
        seen
    }

    /// Guards what a waiting thread relies on: bytes that have arrived are appended behind
    /// the unconsumed ones (a partial frame stays whole in order), a read with nothing
    /// there returns at once, and the buffered bytes are then read back through `Read`,
    /// in order, before anything newer.
    #[test]
    fn arrived_bytes_join_the_buffered_ones_in_order() {
        let (mut sender, receiver) = pair();
        let mut reader = FrameReader::with_capacity(16, receiver);
        let started = Instant::now();
        assert_eq!(reader.read_arrived(), Arrived::Nothing);
        assert!(started.elapsed() < Duration::from_secs(1), "it waited");
        sender.write_all(b"abcdef").unwrap();
        read_until_buffered(&mut reader, 6);
        reader.consume(2);
        sender.write_all(b"ghij").unwrap();
        read_until_buffered(&mut reader, 8);
        assert_eq!(reader.buffer(), b"cdefghij");
        let mut out = [0u8; 5];
        reader.read_exact(&mut out).unwrap();
        assert_eq!(&out, b"cdefg");
        sender.write_all(b"kl").unwrap();
        let mut rest = [0u8; 5];
        reader.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"hijkl");
        assert!(reader.buffer().is_empty());
    }

    /// Guards the room a read of what has arrived has: consumed bytes are reclaimed first,
    /// so a frame as large as the buffer fits once the bytes before it are consumed; a full
    /// buffer reads nothing (and says so) rather than failing; `drained` tells a read that
    /// emptied the socket from one that filled the room.
    #[test]
    fn the_buffer_is_reclaimed_and_never_overfilled() {
        let (mut sender, receiver) = pair();
        let mut reader = FrameReader::with_capacity(8, receiver);
        sender.write_all(b"0123456789").unwrap();
        read_until_buffered(&mut reader, 8);
        assert_eq!(reader.buffer(), b"01234567");
        assert_eq!(reader.read_arrived(), Arrived::Nothing);
        reader.consume(6);
        let seen = read_until_buffered(&mut reader, 4);
        assert_eq!(reader.buffer(), b"6789");
        assert!(
            seen.contains(&Arrived::Bytes {
                read: 2,
                drained: true
            }),
            "{seen:?}"
        );
        reader.consume(4);
        sender.write_all(b"abcdefghij").unwrap();
        let seen = read_until_buffered(&mut reader, 8);
        assert!(
            seen.iter()
                .any(|a| matches!(a, Arrived::Bytes { drained: false, .. })),
            "{seen:?}"
        );
        assert_eq!(reader.capacity(), 8);
    }

    /// Guards the end of a connection: a read of what has arrived reports it (not
    /// "nothing"), after the bytes sent before it.
    #[test]
    fn a_closed_connection_reads_as_ended_after_its_bytes() {
        let (mut sender, receiver) = pair();
        let mut reader = FrameReader::with_capacity(64, receiver);
        sender.write_all(b"last").unwrap();
        drop(sender);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut outcome = reader.read_arrived();
        while outcome != Arrived::Ended && Instant::now() < deadline {
            outcome = reader.read_arrived();
        }
        assert_eq!(outcome, Arrived::Ended);
        assert_eq!(reader.buffer(), b"last");
    }
}
