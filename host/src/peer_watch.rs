//! Watching the processes of peers on this node: a peer whose process ends mid-run stops
//! this rank's kernels at once, with an error naming it, instead of at their wait limit.
//!
//! The communicator watches the process of every peer whose memory it maps over host IPC,
//! through a pidfd opened while the mapping is made (the peer is alive then, and a pidfd
//! never names a later process that reuses the pid). One thread polls the pidfds. When a
//! peer's process ends, the peer either said goodbye first through the out-of-band
//! exchange ([`PeerWatch::say_goodbye`], when its communicator was dropped), or it died:
//! then the failure is recorded with the proxy, which raises this rank's stop word (every
//! device wait ends with `Aborted`), and the next `check` reports it naming the peer.
//!
//! Looking for the goodbye is an out-of-band receive: it returns at once when the goodbye
//! arrived, and when the dead peer's exchange connection is closed; otherwise it ends at the
//! exchange's own deadline, which bounds how late a death is reported.

use crate::out_of_band::OutOfBand;
use oxccl_proxy::{FailureSink, ProxyError};
use parking_lot::Mutex;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::process::{Pid, PidfdFlags};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Out-of-band tag of a goodbye (distinct from the communicator's setup tags).
pub(crate) const TAG_GOODBYE: u64 = 6 << 56;

/// How often the watching thread looks whether it should stop.
const TICK: Duration = Duration::from_millis(100);

/// Longest a dropped watch waits for its thread (which may be inside a receive).
const JOIN_LIMIT: Duration = Duration::from_secs(1);

/// The watch of one rank.
pub(crate) struct PeerWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    rank: u32,
    oob: Arc<dyn OutOfBand>,
    failures: FailureSink,
    /// The peers watched, and the peers ever watched (goodbyes go to those).
    peers: Mutex<Peers>,
    /// Set when the watch is dropped: the thread ends at its next tick.
    stop: AtomicBool,
}

#[derive(Default)]
struct Peers {
    /// Processes still alive when last polled: (peer, pid, pidfd).
    alive: Vec<(u32, u32, Arc<OwnedFd>)>,
    /// Every peer ever watched.
    known: Vec<u32>,
}

impl PeerWatch {
    /// A watch of no peer yet; its thread starts with the first.
    pub(crate) fn new(rank: u32, oob: Arc<dyn OutOfBand>, failures: FailureSink) -> Self {
        PeerWatch {
            shared: Arc::new(Shared {
                rank,
                oob,
                failures,
                peers: Mutex::new(Peers::default()),
                stop: AtomicBool::new(false),
            }),
            thread: None,
        }
    }

    /// Watches `peer`'s process `pid` (nothing for this process itself, or a peer already
    /// watched). A process that cannot be watched (already gone) counts as lost.
    pub(crate) fn watch(&mut self, peer: u32, pid: u32) {
        if pid == std::process::id() {
            return;
        }
        {
            let mut peers = self.shared.peers.lock();
            if peers.known.contains(&peer) {
                return;
            }
            peers.known.push(peer);
            let opened = Pid::from_raw(pid as i32)
                .ok_or(rustix::io::Errno::SRCH)
                .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()));
            match opened {
                Ok(fd) => peers.alive.push((peer, pid, Arc::new(fd))),
                Err(e) => {
                    tracing::warn!(rank = self.shared.rank, peer, pid, %e, "cannot watch a peer");
                    return;
                }
            }
        }
        if self.thread.is_none() {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("oxccl-watch-r{}", self.shared.rank))
                .spawn(move || run(&shared));
            match spawned {
                Ok(thread) => self.thread = Some(thread),
                Err(e) => tracing::warn!(rank = self.shared.rank, %e, "no peer watch thread"),
            }
        }
    }

    /// Tells every watched peer this rank ends on purpose, so its watch does not report
    /// this process's end as a death. Best effort: a peer already gone is skipped.
    pub(crate) fn say_goodbye(&self) {
        let known = self.shared.peers.lock().known.clone();
        for peer in known {
            let _ = self.shared.oob.send(peer, TAG_GOODBYE, Vec::new());
        }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        // Relaxed: the flag carries no data.
        self.shared.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + JOIN_LIMIT;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                // Inside a receive bounded by the exchange's deadline: it ends by itself.
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
    }
}

/// The thread: polls the pidfds until the watch is dropped.
fn run(shared: &Shared) {
    // A fraction of a second, which always converts.
    let tick = Timespec::try_from(TICK).unwrap_or_default();
    // Relaxed: see `PeerWatch::drop`.
    while !shared.stop.load(Ordering::Relaxed) {
        let alive = shared.peers.lock().alive.clone();
        if alive.is_empty() {
            std::thread::sleep(TICK);
            continue;
        }
        let mut fds: Vec<PollFd<'_>> = alive
            .iter()
            .map(|(_, _, fd)| PollFd::new(&**fd, PollFlags::IN))
            .collect();
        match rustix::event::poll(&mut fds, Some(&tick)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::warn!(rank = shared.rank, %e, "peer watch: poll failed; stopped");
                return;
            }
        }
        // A pidfd is readable once its process has ended.
        let ended: Vec<(u32, u32)> = alive
            .iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|((peer, pid, _), _)| (*peer, *pid))
            .collect();
        drop(fds);
        for (peer, pid) in ended {
            shared.peers.lock().alive.retain(|(p, _, _)| *p != peer);
            let goodbye = shared.oob.recv(peer, TAG_GOODBYE);
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            match goodbye {
                Ok(_) => tracing::debug!(rank = shared.rank, peer, "peer ended after a goodbye"),
                Err(e) => shared.failures.record(ProxyError::PeerLost {
                    rank: shared.rank,
                    peer,
                    transport: "host-ipc",
                    message: format!(
                        "peer {peer}'s process {pid} ended without a goodbye (the exchange \
                         says: {e})"
                    ),
                }),
            }
        }
    }
}
