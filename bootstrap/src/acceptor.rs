//! The acceptor: one thread per rank accepts connections on the rank's listener and runs
//! each handshake on a short-lived thread of its own.
//!
//! Contract:
//! - At most [`MAX_CONCURRENT_HANDSHAKES`] handshakes run at once, each bounded by the
//!   handshake deadline, so a stray connection that never speaks costs one slot for that
//!   long and stalls nobody; a thousand ranks dialling the root at once are served in
//!   parallel.
//! - A connection is admitted to its peer slot only after the peer proved the secret and
//!   the admission rules of `peer.rs` (one connection per pair) allow it; everything else
//!   is refused, logged and counted (`Bootstrap::rejected_connections`).
//! - `Inner::shutdown` (set by `Bootstrap::drop`) stops the loop; [`Acceptor::stop`] wakes
//!   it and waits a bounded time for it to end.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::bootstrap::Inner;
use crate::error::{Error, Result};
use crate::frame::RejectReason;
use crate::handshake;
use crate::net;
use crate::peer::{Conn, Refused};

/// Most handshakes the acceptor of one rank runs at once.
pub const MAX_CONCURRENT_HANDSHAKES: usize = 64;

/// How many refusal reasons a rank remembers.
const REJECTIONS_KEPT: usize = 16;

const ACCEPTOR_STACK_BYTES: usize = 128 << 10;
const HANDSHAKE_STACK_BYTES: usize = 256 << 10;

/// The accepting thread of one rank.
pub(crate) struct Acceptor {
    handle: JoinHandle<()>,
    /// Disconnects when the thread exits. (In a `Mutex` only to make `Bootstrap` `Sync`;
    /// it is used once, by `stop`.)
    exited: Mutex<mpsc::Receiver<()>>,
}

impl Acceptor {
    /// Starts accepting on `inner.listener`.
    pub(crate) fn spawn(inner: Arc<Inner>) -> Result<Self> {
        let rank = inner.rank;
        let (tx, exited) = mpsc::channel::<()>();
        let handle = thread::Builder::new()
            .name(format!("oxccl-bootstrap-accept-{rank}"))
            .stack_size(ACCEPTOR_STACK_BYTES)
            .spawn(move || {
                // Dropped when this thread ends, which is how `stop` learns it has.
                let _exit = tx;
                accept_loop(&inner);
            })
            .map_err(|e| Error::system(format!("rank {rank}: spawning the acceptor thread"), e))?;
        Ok(Acceptor {
            handle,
            exited: Mutex::new(exited),
        })
    }

    /// Wakes the thread out of `accept` and waits (bounded) for it to end. The caller has
    /// set `inner.shutdown`.
    pub(crate) fn stop(self, inner: &Inner) {
        let exited_rx = self.exited.into_inner();
        // shutdown(2) on a listening socket wakes a blocked accept() on Linux; a connection
        // to ourselves wakes it elsewhere.
        let _ = rustix::net::shutdown(&inner.listener, rustix::net::Shutdown::Both);
        let mut exited = exited_rx.recv_timeout(Duration::from_millis(100));
        if exited == Err(mpsc::RecvTimeoutError::Timeout) {
            if let Ok(addr) = inner.listener.local_addr() {
                let _ = TcpStream::connect_timeout(&net::dialable(addr), Duration::from_secs(1));
            }
            exited = exited_rx.recv_timeout(Duration::from_secs(1));
        }
        if exited == Err(mpsc::RecvTimeoutError::Disconnected) {
            let _ = self.handle.join();
        } else {
            // Never hang in drop: leave the thread; it exits at its next wakeup.
            tracing::warn!(
                "rank {}: bootstrap acceptor did not stop; leaving it",
                inner.rank
            );
        }
    }
}

/// Refused connections: how many, and the last few reasons.
#[derive(Default)]
pub(crate) struct Rejections {
    count: u64,
    recent: std::collections::VecDeque<String>,
}

impl Rejections {
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn recent(&self) -> Vec<String> {
        self.recent.iter().cloned().collect()
    }
}

fn record_rejection(inner: &Inner, why: String) {
    tracing::warn!("rank {}: refused a bootstrap connection: {why}", inner.rank);
    let mut r = inner.rejections.lock();
    r.count += 1;
    if r.recent.len() == REJECTIONS_KEPT {
        r.recent.pop_front();
    }
    r.recent.push_back(why);
}

fn accept_loop(inner: &Arc<Inner>) {
    loop {
        let accepted = inner.listener.accept();
        // Pairs with the Release store in `Bootstrap::drop`.
        if inner.shutdown.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok((stream, addr)) => spawn_handshake(inner, stream, addr),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // Out of file descriptors, most likely: back off instead of spinning.
                tracing::warn!("rank {}: accept failed: {e}", inner.rank);
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Runs the handshake of one incoming connection on its own thread, at most
/// [`MAX_CONCURRENT_HANDSHAKES`] at a time.
fn spawn_handshake(inner: &Arc<Inner>, stream: TcpStream, addr: SocketAddr) {
    {
        let mut n = inner.handshakes.lock();
        while *n >= MAX_CONCURRENT_HANDSHAKES {
            // Each handshake ends by its own deadline, so this wait is bounded too.
            inner
                .handshakes_cv
                .wait_for(&mut n, Duration::from_millis(100));
            // Pairs with the Release store in `Bootstrap::drop`.
            if inner.shutdown.load(Ordering::Acquire) {
                return;
            }
        }
        *n += 1;
    }
    let worker = inner.clone();
    let spawned = thread::Builder::new()
        .name(format!("oxccl-bootstrap-handshake-{}", inner.rank))
        .stack_size(HANDSHAKE_STACK_BYTES)
        .spawn(move || {
            handshake_one(&worker, stream, addr);
            *worker.handshakes.lock() -= 1;
            worker.handshakes_cv.notify_one();
        });
    if let Err(e) = spawned {
        // The connection went down with the closure; the peer sees it close and retries.
        *inner.handshakes.lock() -= 1;
        record_rejection(
            inner,
            format!("{addr}: cannot spawn a handshake thread: {e}"),
        );
    }
}

/// The acceptor's side of one connection: handshake, then admission.
fn handshake_one(inner: &Inner, stream: TcpStream, addr: SocketAddr) {
    let span = inner.handshake_span();
    let deadline = Instant::now() + span;
    let me = inner.local(span);
    let peer = match handshake::accept(&stream, &me, addr, deadline) {
        Ok(p) => p,
        Err(e) => return record_rejection(inner, format!("{addr}: {e}")),
    };
    // Pairs with the Release store in `Bootstrap::drop`.
    if inner.shutdown.load(Ordering::Acquire) {
        handshake::reject(&stream, &me, RejectReason::ShuttingDown, deadline);
        return;
    }
    let conn = match Conn::new(stream) {
        Ok(c) => Arc::new(c),
        Err(e) => return record_rejection(inner, format!("rank {peer} from {addr}: {e}")),
    };
    let admitted = inner.slot(peer).admit(conn.clone(), peer > inner.rank, || {
        handshake::welcome(conn.stream(), &me, peer, deadline)
    });
    match admitted {
        Ok(()) => tracing::debug!("rank {}: accepted rank {peer} from {addr}", inner.rank),
        Err(Refused::Reject(RejectReason::DialRace)) => {
            handshake::reject(conn.stream(), &me, RejectReason::DialRace, deadline);
            // Normal: both sides dialled at once, and ours is the connection kept.
            tracing::debug!(
                "rank {}: dial race with rank {peer}; keeping ours",
                inner.rank
            );
        }
        Err(Refused::Reject(reason)) => {
            handshake::reject(conn.stream(), &me, reason.clone(), deadline);
            record_rejection(inner, format!("rank {peer} from {addr}: {reason}"));
        }
        Err(Refused::Failed(e)) => record_rejection(inner, format!("rank {peer} from {addr}: {e}")),
    }
}
