//! The sockets of a process's Ethernet receivers as one `epoll` set: which of them have
//! something to read, in one system call whose cost does not grow with their number.
//!
//! Why not `poll`: it takes a reference to every socket's file and asks each socket for its
//! state at every call, and waiting threads look many times a message. With four ranks as
//! processes over Ethernet (three sockets each), `poll` and those per-socket steps took a
//! quarter of all CPU time; `epoll_wait` only reads the set's list of ready sockets, which
//! the sockets themselves keep up to date as data arrive.
//!
//! Level-triggered: a socket is reported at every call while it has unread bytes (or its
//! end, or an error), so a socket left out of one call (more ready than the caller asked
//! about) is reported at the next.

use rustix::event::Timespec;
use rustix::event::epoll::{self, CreateFlags, Event, EventData, EventFlags};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

/// An `epoll` set of sockets, each under a token of the caller's.
pub(crate) struct ReadySet {
    epoll: OwnedFd,
}

impl ReadySet {
    /// An empty set.
    ///
    /// # Errors
    /// The system refused an `epoll` instance (descriptors exhausted, say).
    pub(crate) fn new() -> io::Result<Self> {
        Ok(ReadySet {
            epoll: epoll::create(CreateFlags::CLOEXEC)?,
        })
    }

    /// Adds `socket`, reported as `token` while it has something to read.
    ///
    /// # Errors
    /// The system refused it (the socket is in the set already, say).
    pub(crate) fn add(&self, socket: impl AsFd, token: u64) -> io::Result<()> {
        epoll::add(
            &self.epoll,
            socket,
            EventData::new_u64(token),
            EventFlags::IN,
        )?;
        Ok(())
    }

    /// Removes `socket` (closing every descriptor of a socket removes it too).
    ///
    /// # Errors
    /// `socket` was not in the set.
    pub(crate) fn remove(&self, socket: impl AsFd) -> io::Result<()> {
        epoll::delete(&self.epoll, socket)?;
        Ok(())
    }

    /// The tokens of sockets that have something to read now, at most `tokens.len()` of
    /// them, into `tokens`; how many. Never waits.
    ///
    /// # Errors
    /// The call failed (interrupted, say): the caller cannot tell which sockets are ready.
    pub(crate) fn ready(&self, tokens: &mut [u64]) -> io::Result<usize> {
        const MOST: usize = 64;
        let mut events = [const { MaybeUninit::<Event>::uninit() }; MOST];
        let room = tokens.len().min(MOST);
        let (found, _) = epoll::wait(&self.epoll, &mut events[..room], Some(&Timespec::default()))?;
        for (token, event) in tokens.iter_mut().zip(found.iter()) {
            *token = event.data.u64();
        }
        Ok(found.len())
    }
}

#[cfg(test)]
mod tests {
    use super::ReadySet;
    use crate::ethernet_frame_reader::loopback_pair as pair;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    /// The tokens `set` reports, sorted, once they are `expected` (loopback delivers at
    /// once, but not necessarily before `write` returns), or after five seconds.
    fn ready_when(set: &ReadySet, expected: &[u64]) -> Vec<u64> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut tokens = [0u64; 8];
            let n = set.ready(&mut tokens).unwrap();
            let mut found = tokens[..n].to_vec();
            found.sort_unstable();
            if found == expected || Instant::now() >= deadline {
                return found;
            }
        }
    }

    /// Guards what the receivers' looks rely on: exactly the sockets with unread bytes are
    /// reported, under their tokens, as long as bytes are left (level-triggered), an end
    /// of stream too; a removed socket never; a caller asking about fewer sockets than are
    /// ready gets that many, and the others at its next call.
    #[test]
    fn exactly_the_sockets_with_something_to_read_are_reported() {
        let set = ReadySet::new().unwrap();
        let (mut a_out, mut a_in) = pair();
        let (mut b_out, b_in) = pair();
        set.add(&a_in, 7).unwrap();
        set.add(&b_in, 9).unwrap();
        assert_eq!(ready_when(&set, &[]), Vec::<u64>::new(), "nothing was sent");
        a_out.write_all(b"ab").unwrap();
        assert_eq!(ready_when(&set, &[7]), vec![7]);
        let mut one = [0u8; 1];
        a_in.read_exact(&mut one).unwrap();
        assert_eq!(ready_when(&set, &[7]), vec![7], "a byte is left");
        a_in.read_exact(&mut one).unwrap();
        b_out.write_all(b"c").unwrap();
        assert_eq!(ready_when(&set, &[9]), vec![9]);
        a_out.write_all(b"d").unwrap();
        assert_eq!(ready_when(&set, &[7, 9]), vec![7, 9]);
        let mut first = [0u64; 1];
        assert_eq!(set.ready(&mut first).unwrap(), 1);
        assert_eq!(ready_when(&set, &[7, 9]), vec![7, 9], "left out, then lost");
        set.remove(&b_in).unwrap();
        assert_eq!(
            ready_when(&set, &[7]),
            vec![7],
            "a removed socket was reported"
        );
        a_in.read_exact(&mut one).unwrap();
        drop(a_out);
        assert_eq!(
            ready_when(&set, &[7]),
            vec![7],
            "an end of stream is something to read"
        );
        assert!(set.remove(&b_in).is_err(), "removed twice");
    }
}
