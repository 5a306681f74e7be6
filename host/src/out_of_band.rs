//! Out-of-band exchange: how ranks swap handles before any channel exists.
//!
//! [`Communicator`](crate::Communicator) needs only this trait; it is implemented over the
//! TCP bootstrap ([`BootstrapExchange`]) for ranks as processes and by [`InProcessExchange`]
//! for ranks as threads of one process. Every call has a deadline.

use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tagged point-to-point messages and collectives among the ranks of a job.
pub trait OutOfBand: Send + Sync {
    /// This rank.
    fn rank(&self) -> u32;
    /// Number of ranks.
    fn size(&self) -> u32;
    /// Sends `data` to `peer` under `tag`; does not wait for the receiver.
    ///
    /// # Errors
    /// Unknown peer, or the transport failed.
    fn send(&self, peer: u32, tag: u64, data: Vec<u8>) -> Result<()>;
    /// Receives the next message from `peer` under `tag`.
    ///
    /// # Errors
    /// Unknown peer, the deadline passed, or the transport failed.
    fn recv(&self, peer: u32, tag: u64) -> Result<Vec<u8>>;
    /// Every rank's `data`, indexed by rank.
    ///
    /// # Errors
    /// As `send`/`recv`.
    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>>;
    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// As `send`/`recv`.
    fn barrier(&self) -> Result<()> {
        self.all_gather(Vec::new()).map(drop)
    }
    /// Whether every rank of the job runs on this node. Unknown counts as no.
    fn single_node(&self) -> bool {
        false
    }
    /// The address at which peers reach this rank, for the listeners of network transports;
    /// `None` for the loopback address.
    fn local_ip(&self) -> Option<IpAddr> {
        None
    }
}

/// Tags at or above this value are reserved for the exchange's own collectives.
pub const RESERVED_TAG_BASE: u64 = 1 << 63;

/// Messages in order, by (from, to, tag).
type Queues = HashMap<(u32, u32, u64), VecDeque<Vec<u8>>>;

#[derive(Default)]
struct Mailbox {
    queues: Mutex<Post>,
    arrived: Condvar,
}

/// The messages in flight, and why the job stopped, if it did.
#[derive(Default)]
struct Post {
    queues: Queues,
    /// Set by [`InProcessExchange::abort`]: every receive ends with this.
    aborted: Option<String>,
}

/// The exchange among ranks that are threads of one process.
#[derive(Clone)]
pub struct InProcessExchange {
    rank: u32,
    size: u32,
    mailbox: Arc<Mailbox>,
    timeout: Duration,
    collective_seq: Arc<Mutex<u64>>,
}

impl InProcessExchange {
    /// One exchange per rank of an `size`-rank job, all sharing one mailbox; every receive
    /// waits at most `timeout`.
    pub fn group(size: u32, timeout: Duration) -> Vec<InProcessExchange> {
        let mailbox = Arc::new(Mailbox::default());
        (0..size)
            .map(|rank| InProcessExchange {
                rank,
                size,
                mailbox: mailbox.clone(),
                timeout,
                collective_seq: Arc::new(Mutex::new(0)),
            })
            .collect()
    }

    /// This exchange's rank.
    pub fn rank_id(&self) -> u32 {
        self.rank
    }

    /// Ends every receive of the group, waiting or to come, with [`Error::Aborted`] saying
    /// `why` (the first reason is kept): what a job does when one of its ranks failed, so
    /// the others stop waiting for it at once instead of at their deadlines.
    pub fn abort(&self, why: String) {
        let mut post = self.mailbox.queues.lock();
        post.aborted.get_or_insert(why);
        self.mailbox.arrived.notify_all();
    }

    fn check_peer(&self, peer: u32) -> Result<()> {
        if peer >= self.size {
            return Err(Error::InvalidUsage(format!(
                "rank {}: peer {peer} out of range for {} ranks",
                self.rank, self.size
            )));
        }
        Ok(())
    }
}

impl OutOfBand for InProcessExchange {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn send(&self, peer: u32, tag: u64, data: Vec<u8>) -> Result<()> {
        self.check_peer(peer)?;
        let mut post = self.mailbox.queues.lock();
        post.queues
            .entry((self.rank, peer, tag))
            .or_default()
            .push_back(data);
        self.mailbox.arrived.notify_all();
        Ok(())
    }

    fn recv(&self, peer: u32, tag: u64) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let deadline = Instant::now() + self.timeout;
        let mut post = self.mailbox.queues.lock();
        loop {
            if let Some(msg) = post
                .queues
                .get_mut(&(peer, self.rank, tag))
                .and_then(VecDeque::pop_front)
            {
                return Ok(msg);
            }
            if let Some(why) = &post.aborted {
                return Err(Error::Aborted(format!(
                    "rank {}: waiting for a message from rank {peer}: {why}",
                    self.rank
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "rank {}: message from rank {peer} (tag {tag:#x})",
                        self.rank
                    ),
                    after: self.timeout,
                });
            }
            self.mailbox.arrived.wait_for(&mut post, deadline - now);
        }
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let tag = {
            let mut seq = self.collective_seq.lock();
            *seq += 1;
            RESERVED_TAG_BASE | *seq
        };
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            self.send(peer, tag, data.clone())?;
        }
        (0..self.size)
            .map(|peer| {
                if peer == self.rank {
                    Ok(data.clone())
                } else {
                    self.recv(peer, tag)
                }
            })
            .collect()
    }

    fn single_node(&self) -> bool {
        true
    }
}

/// The exchange over `oxccl_bootstrap`'s authenticated TCP bootstrap: ranks in separate
/// processes, on one node or several.
pub struct BootstrapExchange {
    bootstrap: oxccl_bootstrap::Bootstrap,
}

impl BootstrapExchange {
    /// Wraps a joined bootstrap.
    pub fn new(bootstrap: oxccl_bootstrap::Bootstrap) -> Self {
        BootstrapExchange { bootstrap }
    }

    /// The bootstrap (local rank, host name, launcher, ...).
    pub fn bootstrap(&self) -> &oxccl_bootstrap::Bootstrap {
        &self.bootstrap
    }
}

impl OutOfBand for BootstrapExchange {
    fn rank(&self) -> u32 {
        self.bootstrap.rank() as u32
    }

    fn size(&self) -> u32 {
        self.bootstrap.size() as u32
    }

    fn send(&self, peer: u32, tag: u64, data: Vec<u8>) -> Result<()> {
        Ok(self.bootstrap.send(peer as usize, tag, &data)?)
    }

    fn recv(&self, peer: u32, tag: u64) -> Result<Vec<u8>> {
        Ok(self.bootstrap.recv(peer as usize, tag)?)
    }

    fn all_gather(&self, data: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        Ok(self.bootstrap.all_gather(&data)?)
    }

    fn barrier(&self) -> Result<()> {
        Ok(self.bootstrap.barrier()?)
    }

    fn single_node(&self) -> bool {
        self.bootstrap.local_size() == self.bootstrap.size()
    }

    fn local_ip(&self) -> Option<IpAddr> {
        let ip = self.bootstrap.listen_addr().ip();
        (!ip.is_unspecified()).then_some(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a receive that waits forever for a peer that never sends.
    #[test]
    fn recv_times_out_naming_the_peer() {
        let group = InProcessExchange::group(2, Duration::from_millis(20));
        let err = group[0].recv(1, 5).unwrap_err();
        assert!(
            matches!(&err, Error::Timeout { what, .. } if what.contains("rank 1")),
            "{err}"
        );
    }

    /// Guards against ranks left waiting for a rank that failed: an abort ends receives at
    /// once, saying why, instead of at their deadline.
    #[test]
    fn abort_ends_receives_at_once() {
        let group = InProcessExchange::group(3, Duration::from_secs(30));
        let waiter = {
            let me = group[0].clone();
            std::thread::spawn(move || me.recv(2, 9))
        };
        std::thread::sleep(Duration::from_millis(20));
        let started = Instant::now();
        group[2].abort("rank 2 failed".into());
        let err = waiter.join().unwrap().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(&err, Error::Aborted(why) if why.contains("rank 2 failed")),
            "{err}"
        );
        assert!(matches!(group[1].recv(0, 1), Err(Error::Aborted(_))));
    }

    /// Guards against messages of different tags or senders being mixed up.
    #[test]
    fn tags_keep_messages_apart() {
        let group = InProcessExchange::group(3, Duration::from_secs(5));
        group[1].send(0, 7, b"seven".to_vec()).unwrap();
        group[2].send(0, 7, b"two".to_vec()).unwrap();
        group[1].send(0, 8, b"eight".to_vec()).unwrap();
        assert_eq!(group[0].recv(1, 8).unwrap(), b"eight");
        assert_eq!(group[0].recv(2, 7).unwrap(), b"two");
        assert_eq!(group[0].recv(1, 7).unwrap(), b"seven");
        assert!(group[0].send(3, 0, vec![]).is_err());
    }
}
