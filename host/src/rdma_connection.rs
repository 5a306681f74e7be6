//! An RDMA connection as the proxy drives it, over any [`SendQueue`]: what it posts for a
//! `put`, a `signal` and a `flush`, how many requests it keeps in flight, and how every wait
//! for them is bounded. The InfiniBand / RoCE transport runs it over a verbs queue pair
//! (`ib_connection.rs`, feature `ib`); the tests here run it over a queue that applies its
//! requests to memory, so its logic is tested without an RDMA device.
//!
//! - `write` posts RDMA WRITEs from this rank's registered memory (its local key found by
//!   [`LocalKeys`]) to the peer's, at the address and remote key the peer's registration
//!   carries ([`MemoryRegion::rdma`]), at most [`RdmaLimits::max_write`] bytes each. The
//!   peer's device refuses anything outside that registration.
//! - `update_and_sync` posts an atomic fetch-and-add of the difference between the new
//!   value and the last one this connection gave that counter (the proxy raises a counter
//!   only upward, and one connection raises each), as MSCCL++'s IB connection does. The
//!   responder executes the requests of one reliable connection in order, so the counter
//!   moves after every earlier WRITE has been placed.
//! - `flush` waits until every posted request has completed, at most the wait limit.
//!
//! Every request is signalled, and at most [`RdmaLimits::max_outstanding`] are in flight: a
//! post past that first waits for completions, under the same limit. A request that
//! completes with an error breaks the connection for good, naming the peer and the status;
//! every later call returns it.

use crate::error::Result;
use oxccl_proxy::{Connection, MemoryRegion, ProxyError, RdmaKey};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Bytes of this rank's memory a request reads or writes, and the local key of the
/// registration holding them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalBytes {
    /// Address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// The registration's local key.
    pub lkey: u32,
}

/// A request that completed: its id, and why it failed, if it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The id it was posted with.
    pub id: u64,
    /// The failure (status and what it means), or `None` for success.
    pub failure: Option<String>,
}

/// The send side of a reliable connection: what [`RdmaConnection`] posts, and its
/// completions. Every request is signalled (completes with a [`Completion`]).
pub trait SendQueue: Send {
    /// Posts an RDMA WRITE, request `id`, of `local` to the peer's memory at `remote`.
    ///
    /// # Safety
    /// `local` stays allocated and registered until the request completes.
    ///
    /// # Errors
    /// The queue refused the request.
    unsafe fn post_write(
        &mut self,
        id: u64,
        local: LocalBytes,
        remote: RdmaKey,
    ) -> std::result::Result<(), String>;

    /// Posts an atomic fetch-and-add of `add` to the peer's u64 at `remote`, request `id`;
    /// the old value lands in `result` (8 bytes).
    ///
    /// # Safety
    /// `result` stays allocated and registered until the request completes.
    ///
    /// # Errors
    /// The queue refused the request.
    unsafe fn post_fetch_add(
        &mut self,
        id: u64,
        result: LocalBytes,
        remote: RdmaKey,
        add: u64,
    ) -> std::result::Result<(), String>;

    /// Appends the completions there are now to `done` (none is no error).
    ///
    /// # Errors
    /// Polling itself failed.
    fn poll(&mut self, done: &mut Vec<Completion>) -> std::result::Result<(), String>;
}

/// Finds the local key of the registration holding a range of this rank's memory.
pub trait LocalKeys: Send + Sync {
    /// The local key of the registration holding `len` bytes at `addr`, if one does.
    fn local_key(&self, addr: u64, len: u64) -> Option<u32>;
}

/// How much a connection puts in one request, and keeps in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaLimits {
    /// Most requests in flight (the queue pair's send queue depth).
    pub max_outstanding: u32,
    /// Largest RDMA WRITE (a request carries at most 2^31 bytes).
    pub max_write: u64,
}

impl Default for RdmaLimits {
    fn default() -> Self {
        RdmaLimits {
            max_outstanding: 256,
            max_write: 1 << 30,
        }
    }
}

/// A connection to a peer over a [`SendQueue`] (see the module docs).
pub struct RdmaConnection<Q> {
    rank: u32,
    peer: u32,
    timeout: Duration,
    limits: RdmaLimits,
    keys: Arc<dyn LocalKeys>,
    /// Where the atomics' old values land (never read), registered.
    atomic_result: Arc<AtomicU64>,
    atomic_lkey: u32,
    state: Mutex<State<Q>>,
}

struct State<Q> {
    queue: Q,
    posted: u64,
    completed: u64,
    /// The last value this connection gave each of the peer's counters, by address.
    counters: HashMap<u64, u64>,
    broken: Option<String>,
    done: Vec<Completion>,
}

impl<Q> std::fmt::Debug for RdmaConnection<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Where the peer's region `region` is written.
fn rdma_key(region: &MemoryRegion) -> std::result::Result<RdmaKey, ProxyError> {
    region.rdma.ok_or_else(|| {
        ProxyError::InvalidUsage(format!(
            "memory of rank {} carries no RDMA key: it is not reachable over InfiniBand / RoCE",
            region.owner_rank
        ))
    })
}

impl<Q: SendQueue> RdmaConnection<Q> {
    /// A connection of rank `rank` to `peer` over `queue` (connected), finding local keys
    /// through `keys`; atomics' old values land in `atomic_result` (registered under
    /// `atomic_lkey`). `timeout` bounds every wait.
    ///
    /// # Errors
    /// Limits that allow nothing in flight, or writes of no bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: u32,
        peer: u32,
        queue: Q,
        keys: Arc<dyn LocalKeys>,
        atomic_result: Arc<AtomicU64>,
        atomic_lkey: u32,
        limits: RdmaLimits,
        timeout: Duration,
    ) -> Result<Self> {
        if limits.max_outstanding == 0 || limits.max_write == 0 || limits.max_write > 1 << 31 {
            return Err(crate::Error::InvalidUsage(format!(
                "rank {rank}: RDMA limits {limits:?} allow no request, or one verbs cannot carry"
            )));
        }
        Ok(RdmaConnection {
            rank,
            peer,
            timeout,
            limits,
            keys,
            atomic_result,
            atomic_lkey,
            state: Mutex::new(State {
                queue,
                posted: 0,
                completed: 0,
                counters: HashMap::new(),
                broken: None,
                done: Vec::new(),
            }),
        })
    }

    /// Takes every completion there is; the first that failed breaks the connection.
    fn reap(state: &mut State<Q>) -> std::result::Result<(), String> {
        state.done.clear();
        state.queue.poll(&mut state.done)?;
        state.completed += state.done.len() as u64;
        match state
            .done
            .iter()
            .find_map(|c| c.failure.as_ref().map(|f| (c.id, f)))
        {
            Some((id, failure)) => Err(format!("request {id} completed with {failure}")),
            None => Ok(()),
        }
    }

    /// Waits until at most `in_flight` requests are outstanding, at most the wait limit.
    fn drain_to(
        &self,
        state: &mut State<Q>,
        in_flight: u64,
        what: &str,
    ) -> std::result::Result<(), ProxyError> {
        let started = Instant::now();
        let mut polls = 0u32;
        while state.posted - state.completed > in_flight {
            if let Err(why) = Self::reap(state) {
                return Err(self.breaks(state, why));
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(64) {
                if started.elapsed() >= self.timeout {
                    let why = format!(
                        "{what}: {} requests still incomplete after {:?}",
                        state.posted - state.completed,
                        self.timeout
                    );
                    return Err(self.breaks(state, why));
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    fn breaks(&self, state: &mut State<Q>, why: String) -> ProxyError {
        let why = format!("RDMA connection to peer {}: {why}", self.peer);
        state.broken = Some(why.clone());
        ProxyError::Transport(why)
    }

    /// Checks the connection is usable and makes room for one more request.
    fn room(&self, state: &mut State<Q>, what: &str) -> std::result::Result<(), ProxyError> {
        if let Some(why) = &state.broken {
            return Err(ProxyError::Transport(format!(
                "the connection broke earlier: {why}"
            )));
        }
        self.drain_to(state, u64::from(self.limits.max_outstanding) - 1, what)
    }

    /// Posts one request with `post`, given its id, once there is room.
    fn post(
        &self,
        state: &mut State<Q>,
        what: &str,
        post: impl FnOnce(&mut Q, u64) -> std::result::Result<(), String>,
    ) -> std::result::Result<(), ProxyError> {
        self.room(state, what)?;
        let id = state.posted;
        if let Err(e) = post(&mut state.queue, id) {
            return Err(self.breaks(state, format!("{what}: posting failed: {e}")));
        }
        state.posted += 1;
        Ok(())
    }
}

impl<Q: SendQueue> Connection for RdmaConnection<Q> {
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> std::result::Result<(), ProxyError> {
        let key = rdma_key(dst)?;
        let local = src.address(src_off)?;
        let lkey = self.keys.local_key(local, bytes).ok_or_else(|| {
            ProxyError::InvalidUsage(format!(
                "{bytes} bytes at offset {src_off} of rank {}'s memory are not registered with \
                 its RDMA device",
                self.rank
            ))
        })?;
        let mut state = self.state.lock();
        let mut done = 0;
        while done < bytes {
            let len = (bytes - done).min(self.limits.max_write);
            let local = LocalBytes {
                addr: local + done,
                // At most `max_write`, which `new` bounds by 2^31.
                len: len as u32,
                lkey,
            };
            let remote = RdmaKey {
                addr: key.addr + dst_off + done,
                rkey: key.rkey,
            };
            self.post(&mut state, "RDMA write", |queue, id| {
                // SAFETY: `local` lies in a registration of this rank's device (its key was
                // found for the whole range), which keeps the memory registered and
                // allocated until the device is dropped, after its connections; the proxy
                // checked the range against the region.
                unsafe { queue.post_write(id, local, remote) }
            })?;
            done += len;
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> std::result::Result<(), ProxyError> {
        let key = rdma_key(dst)?;
        let aligned = key
            .addr
            .checked_add(dst_off)
            .is_some_and(|a| a.is_multiple_of(8));
        if !dst.contains(dst_off, 8) || !aligned {
            return Err(ProxyError::InvalidUsage(format!(
                "semaphore at offset {dst_off} of rank {}'s {}-byte region is out of bounds or \
                 misaligned",
                dst.owner_rank, dst.size
            )));
        }
        let remote = RdmaKey {
            addr: key.addr + dst_off,
            rkey: key.rkey,
        };
        let mut state = self.state.lock();
        let last = state.counters.get(&remote.addr).copied().unwrap_or(0);
        let add = value.wrapping_sub(last);
        let result = LocalBytes {
            addr: self.atomic_result.as_ptr() as u64,
            len: 8,
            lkey: self.atomic_lkey,
        };
        self.post(&mut state, "RDMA atomic add", |queue, id| {
            // SAFETY: the 8 bytes at `result` are the connection's own atomic cell,
            // registered under `atomic_lkey` and alive as long as the connection.
            unsafe { queue.post_fetch_add(id, result, remote, add) }
        })?;
        state.counters.insert(remote.addr, value);
        Ok(())
    }

    fn flush(&self) -> std::result::Result<(), ProxyError> {
        let mut state = self.state.lock();
        if let Some(why) = &state.broken {
            return Err(ProxyError::Transport(format!(
                "the connection broke earlier: {why}"
            )));
        }
        self.drain_to(&mut state, 0, "RDMA flush")
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn transport(&self) -> &'static str {
        "ib"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A queue that applies its requests to memory when polled (as a responder would, in
    /// order), completing at most `per_poll` a poll, failing request `fail`, never
    /// completing anything when `stalled`; it checks the remote key and that no more than
    /// `limit` requests are ever in flight.
    struct MemoryQueue {
        rkey: u32,
        limit: usize,
        per_poll: usize,
        fail: Option<u64>,
        stalled: bool,
        pending: VecDeque<(u64, Op)>,
        most_in_flight: Arc<AtomicU64>,
    }

    enum Op {
        Write(LocalBytes, RdmaKey),
        Add(RdmaKey, u64),
    }

    impl MemoryQueue {
        fn new(rkey: u32, limit: usize) -> (Self, Arc<AtomicU64>) {
            let most = Arc::new(AtomicU64::new(0));
            let queue = MemoryQueue {
                rkey,
                limit,
                per_poll: 3,
                fail: None,
                stalled: false,
                pending: VecDeque::new(),
                most_in_flight: most.clone(),
            };
            (queue, most)
        }

        fn push(&mut self, id: u64, op: Op) -> std::result::Result<(), String> {
            if self.pending.len() >= self.limit {
                return Err(format!(
                    "{} requests in flight, the queue holds {}",
                    self.pending.len(),
                    self.limit
                ));
            }
            self.pending.push_back((id, op));
            self.most_in_flight.fetch_max(
                self.pending.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            Ok(())
        }
    }

    impl SendQueue for MemoryQueue {
        unsafe fn post_write(
            &mut self,
            id: u64,
            local: LocalBytes,
            remote: RdmaKey,
        ) -> std::result::Result<(), String> {
            self.push(id, Op::Write(local, remote))
        }

        unsafe fn post_fetch_add(
            &mut self,
            id: u64,
            _result: LocalBytes,
            remote: RdmaKey,
            add: u64,
        ) -> std::result::Result<(), String> {
            self.push(id, Op::Add(remote, add))
        }

        fn poll(&mut self, done: &mut Vec<Completion>) -> std::result::Result<(), String> {
            if self.stalled {
                return Ok(());
            }
            for _ in 0..self.per_poll {
                let Some((id, op)) = self.pending.pop_front() else {
                    break;
                };
                let failure = if Some(id) == self.fail {
                    Some("RemoteAccessError".to_string())
                } else {
                    match op {
                        Op::Write(local, remote) => {
                            assert_eq!(remote.rkey, self.rkey);
                            // SAFETY: the tests' buffers, alive for the whole test.
                            unsafe {
                                std::ptr::copy(
                                    local.addr as usize as *const u8,
                                    remote.addr as usize as *mut u8,
                                    local.len as usize,
                                )
                            };
                        }
                        Op::Add(remote, add) => {
                            assert_eq!(remote.rkey, self.rkey);
                            // SAFETY: an aligned u64 of the tests' buffers.
                            let cell =
                                unsafe { AtomicU64::from_ptr(remote.addr as usize as *mut u64) };
                            cell.fetch_add(add, std::sync::atomic::Ordering::Release);
                        }
                    }
                    None
                };
                done.push(Completion { id, failure });
            }
            Ok(())
        }
    }

    /// Every range of `buffer` registered under key 7.
    struct Registered(u64, u64);

    impl LocalKeys for Registered {
        fn local_key(&self, addr: u64, len: u64) -> Option<u32> {
            (addr >= self.0 && addr + len <= self.0 + self.1).then_some(7)
        }
    }

    const RKEY: u32 = 0x5eed;

    fn connection(
        queue: MemoryQueue,
        src: &[u8],
        limits: RdmaLimits,
        timeout: Duration,
    ) -> RdmaConnection<MemoryQueue> {
        let keys = Arc::new(Registered(src.as_ptr() as u64, src.len() as u64));
        RdmaConnection::new(
            0,
            1,
            queue,
            keys,
            Arc::new(AtomicU64::new(0)),
            9,
            limits,
            timeout,
        )
        .unwrap()
    }

    fn regions(src: &[u8], dst: &mut [u8]) -> (MemoryRegion, MemoryRegion) {
        let src = MemoryRegion::new(0, src.as_ptr() as u64, src.len() as u64);
        let key = RdmaKey {
            addr: dst.as_mut_ptr() as u64,
            rkey: RKEY,
        };
        let dst = MemoryRegion::new(1, 0, dst.len() as u64).with_rdma_key(key);
        (dst, src)
    }

    /// Guards against a put cut into requests at the wrong places (each at most the
    /// largest write, the last one the rest), a signal that does not leave the counter at
    /// the value given (the atomic adds the difference to the last value), more requests in
    /// flight than the queue holds, and a flush that returns before everything completed.
    #[test]
    fn puts_signals_and_flushes_land_whole_and_in_order() {
        let limits = RdmaLimits {
            max_outstanding: 4,
            max_write: 1000,
        };
        let (queue, most) = MemoryQueue::new(RKEY, 4);
        let src: Vec<u8> = (0..10_007u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut words = vec![0u64; (10_007 + 64) / 8];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let (dst_region, src_region) = regions(&src, dst);
        let c = connection(queue, &src, limits, Duration::from_secs(5));
        c.write(&dst_region, 0, &src_region, 0, 10_007).unwrap();
        // The counter: 8 aligned bytes after the data.
        let counter = (10_007u64).next_multiple_of(8);
        for value in [1, 3, 3, 10] {
            c.update_and_sync(&dst_region, counter, value).unwrap();
        }
        c.flush().unwrap();
        assert_eq!(&dst[..10_007], &src[..]);
        let at = counter as usize;
        assert_eq!(u64::from_ne_bytes(dst[at..at + 8].try_into().unwrap()), 10);
        assert!(most.load(std::sync::atomic::Ordering::Relaxed) <= 4);
        assert_eq!(
            c.state.lock().posted,
            11 + 4,
            "10 writes of 1000, one of 7, 4 adds"
        );
    }

    /// Guards against a request that failed at the peer going unnoticed: the flush reports
    /// it with the peer and the status, and every later call says the connection broke.
    #[test]
    fn a_failed_request_breaks_the_connection() {
        let (mut queue, _) = MemoryQueue::new(RKEY, 8);
        queue.fail = Some(1);
        let src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let (dst_region, src_region) = regions(&src, &mut dst);
        let c = connection(queue, &src, RdmaLimits::default(), Duration::from_secs(5));
        c.write(&dst_region, 0, &src_region, 0, 8).unwrap();
        c.write(&dst_region, 8, &src_region, 8, 8).unwrap();
        let err = c.flush().unwrap_err().to_string();
        assert!(
            err.contains("peer 1") && err.contains("RemoteAccessError"),
            "{err}"
        );
        let later = c
            .write(&dst_region, 0, &src_region, 0, 8)
            .unwrap_err()
            .to_string();
        assert!(later.contains("broke earlier"), "{later}");
    }

    /// Guards against a wait without a deadline: requests that never complete (a peer that
    /// stopped answering) end the flush, and a post that waits for room, at the limit.
    #[test]
    fn requests_that_never_complete_end_at_the_limit() {
        let (mut queue, _) = MemoryQueue::new(RKEY, 2);
        queue.stalled = true;
        let limits = RdmaLimits {
            max_outstanding: 2,
            max_write: 8,
        };
        let src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let (dst_region, src_region) = regions(&src, &mut dst);
        let c = connection(queue, &src, limits, Duration::from_millis(50));
        let started = Instant::now();
        // Three requests of 8 bytes, two in flight at most: the third waits for room.
        let err = c
            .write(&dst_region, 0, &src_region, 0, 24)
            .unwrap_err()
            .to_string();
        assert!(err.contains("incomplete after"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Guards against writing from memory the device does not know (its local key would be
    /// garbage), to memory without a remote key, or a misaligned or out-of-range counter:
    /// each refused before anything is posted.
    #[test]
    fn unregistered_unkeyed_and_misplaced_requests_are_refused() {
        let (queue, most) = MemoryQueue::new(RKEY, 8);
        let src = vec![1u8; 64];
        let other = [2u8; 64];
        let mut words = [0u64; 8];
        let (dst_region, src_region) = regions(&src, bytemuck::cast_slice_mut(&mut words));
        let c = connection(queue, &src, RdmaLimits::default(), Duration::from_secs(5));
        let foreign = MemoryRegion::new(0, other.as_ptr() as u64, 64);
        let err = c.write(&dst_region, 0, &foreign, 0, 8).unwrap_err();
        assert!(err.to_string().contains("not registered"), "{err}");
        let unkeyed = MemoryRegion::new(1, 0, 64);
        let err = c.write(&unkeyed, 0, &src_region, 0, 8).unwrap_err();
        assert!(err.to_string().contains("no RDMA key"), "{err}");
        for offset in [4, 64] {
            let err = c.update_and_sync(&dst_region, offset, 1).unwrap_err();
            assert!(
                err.to_string().contains("out of bounds or misaligned"),
                "{err}"
            );
        }
        c.flush().unwrap();
        assert_eq!(most.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
