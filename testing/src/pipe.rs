//! Reading one pipe of a child on a thread of its own, keeping the last bytes.
//!
//! The thread reads until end of file (the child and everything that inherited the pipe
//! have closed it) or an error, so the child never blocks on a full pipe however much it
//! writes. Memory stays bounded: only the last `limit` bytes are kept, and the bytes
//! dropped before them are counted. The caller takes what has arrived by a deadline,
//! whether or not the pipe has ended.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Instant;

use parking_lot::Mutex;

/// Bytes read at a time.
const CHUNK_BYTES: usize = 64 << 10;

/// The last bytes of a pipe, and how many came before them.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    /// At most the reader's limit.
    pub(crate) bytes: VecDeque<u8>,
    /// Bytes dropped from the front to keep `bytes` within the limit.
    pub(crate) dropped: u64,
}

impl Tail {
    fn push(&mut self, chunk: &[u8], limit: usize) {
        self.bytes.extend(chunk);
        if self.bytes.len() > limit {
            let excess = self.bytes.len() - limit;
            self.bytes.drain(..excess);
            self.dropped += excess as u64;
        }
    }
}

/// A pipe being read by its own thread.
pub(crate) struct PipeReader {
    tail: Arc<Mutex<Tail>>,
    /// Disconnects when the thread ends (end of file or error).
    ended: mpsc::Receiver<()>,
}

impl PipeReader {
    /// Starts a thread named `name` reading `pipe`, keeping its last `limit` bytes.
    ///
    /// # Errors
    /// The error of spawning the thread.
    pub(crate) fn spawn(
        name: String,
        mut pipe: impl Read + Send + 'static,
        limit: usize,
    ) -> io::Result<Self> {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (tx, ended) = mpsc::channel::<()>();
        let shared = tail.clone();
        thread::Builder::new().name(name).spawn(move || {
            // Dropped when this thread ends, which is how `finish` learns it has.
            let _ended = tx;
            let mut chunk = vec![0u8; CHUNK_BYTES];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => shared.lock().push(&chunk[..n], limit),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        })?;
        Ok(PipeReader { tail, ended })
    }

    /// Waits until the pipe ends or `until` passes, then takes what was read. The flag
    /// says whether the pipe ended; if not, the thread is left to drain it.
    pub(crate) fn finish(self, until: Instant) -> (Tail, bool) {
        let left = until.saturating_duration_since(Instant::now());
        let ended = matches!(
            self.ended.recv_timeout(left),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        (std::mem::take(&mut *self.tail.lock()), ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Guards against the kept bytes growing past the limit, losing the end of the output
    /// (where a failing child prints its panic) instead of its start, or miscounting what
    /// was dropped.
    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail::default();
        t.push(b"0123", 6);
        t.push(b"456", 6);
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), b"123456");
        assert_eq!(t.dropped, 1);
        t.push(b"abcdefghij", 6);
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), b"efghij");
        assert_eq!(t.dropped, 11);
    }

    /// Guards against `finish` waiting past its deadline for a pipe that never ends, or
    /// losing what was read before it.
    #[test]
    fn finish_returns_at_the_deadline() {
        let (r, mut w) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut w, b"partial").unwrap();
        let reader = PipeReader::spawn("pipe-test".into(), r, 1 << 10).unwrap();
        // Wait (bounded) for the thread to read what is there; the pipe stays open.
        let read_by = Instant::now() + Duration::from_secs(10);
        while reader.tail.lock().bytes.len() < 7 && Instant::now() < read_by {
            thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        let (tail, ended) = reader.finish(Instant::now() + Duration::from_millis(200));
        assert!(!ended);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(tail.bytes.iter().copied().collect::<Vec<_>>(), b"partial");
        drop(w);
    }
}
