//! The InfiniBand / RoCE connection (feature `ib`): one reliable-connected queue pair per
//! peer pair and direction, driven by the proxy.
//!
//! - `write` posts RDMA WRITEs from this rank's registered memory (its local key found in
//!   the [`IbDevice`]'s registrations) to the peer's, at the address and remote key the
//!   peer's registration carries ([`MemoryRegion::rdma`]), at most [`MAX_WRITE_BYTES`]
//!   each. The peer's device refuses anything outside that registration.
//! - `update_and_sync` posts an atomic fetch-and-add of the difference between the new
//!   value and the last one this connection gave that counter (the proxy raises a counter
//!   only upward, and one connection raises each), as MSCCL++'s IB connection does. The
//!   responder executes the requests of one reliable connection in order, so the counter
//!   moves after every earlier WRITE has been placed.
//! - `flush` waits until every posted request has completed, at most the communicator's
//!   wait limit.
//!
//! Every request is signalled, and at most [`MAX_OUTSTANDING`] are in flight: a post past
//! that first waits for completions, under the same limit. A peer that dies or stops
//! answering makes the requests complete with an error (retries exceeded) after the queue
//! pair's retries (about half a second with [`ACK_TIMEOUT`] and [`RETRIES`]) or the wait
//! limit, whichever is first; the error names the peer and the completion status. The first
//! failure breaks the connection for good: every later call returns it.

use crate::error::{Error, Result};
use crate::ib_device::{IbDevice, mtu_of, verbs_error, with_causes};
use crate::ib_wire::{IbEndpoint, MAX_24_BIT};
use oxccl_proxy::{Connection, MemoryRegion, ProxyError, RdmaKey};
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, GenericCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType,
    SetScatterGatherEntry, WorkRequestFlags,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Most requests in flight on one connection.
pub const MAX_OUTSTANDING: u32 = 256;

/// Largest RDMA WRITE posted at once (a request carries at most 2^31 bytes).
pub const MAX_WRITE_BYTES: u64 = 1 << 30;

/// Local ACK timeout exponent: 4.096 µs × 2^14 ≈ 67 ms before a request is retried.
pub const ACK_TIMEOUT: u8 = 14;

/// Retries of a request the peer does not acknowledge (the most verbs allow).
pub const RETRIES: u8 = 7;

/// Hop limit of a global route.
const HOP_LIMIT: u8 = 255;

/// A connection to a peer through an RDMA device.
pub struct IbConnection {
    rank: u32,
    peer: u32,
    timeout: Duration,
    device: Arc<IbDevice>,
    cq: Arc<BasicCompletionQueue>,
    /// Where the atomics' old values land (never read): registered with the device.
    atomic_result: Arc<AtomicU64>,
    atomic_lkey: u32,
    state: Mutex<State>,
}

struct State {
    qp: BasicQueuePair,
    posted: u64,
    completed: u64,
    /// The last value this connection gave each of the peer's counters, by address.
    counters: HashMap<u64, u64>,
    broken: Option<String>,
}

impl std::fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .field("device", &self.device.name())
            .finish()
    }
}

impl IbConnection {
    /// A queue pair from this rank to `peer` on `device`, connected to the peer's: sends
    /// this end's [`IbEndpoint`] through `exchange`, which returns the peer's (checked), and
    /// brings the queue pair to ready-to-send. `timeout` bounds every later wait.
    ///
    /// # Errors
    /// [`Error::Verbs`] where the device refuses a step (naming it); what `exchange`
    /// returns.
    pub fn connect(
        device: Arc<IbDevice>,
        peer: u32,
        timeout: Duration,
        exchange: impl FnOnce(&IbEndpoint) -> Result<IbEndpoint>,
    ) -> Result<Self> {
        let rank = device.rank();
        let what = format!("RDMA connection to peer {peer} on {}", device.name());
        let fail = |call: &'static str| {
            let what = what.clone();
            move |e: &dyn std::error::Error| verbs_error(rank, &what, call, e)
        };
        let cq = device
            .context()
            .create_cq_builder()
            .setup_cqe(2 * MAX_OUTSTANDING)
            .build()
            .map_err(|e| fail("ibv_create_cq")(&e))?;
        let mut qp = device
            .protection_domain()
            .create_qp_builder()
            .setup_qp_type(QueuePairType::ReliableConnection)
            .setup_max_send_wr(MAX_OUTSTANDING)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(GenericCompletionQueue::from(cq.clone()))
            .setup_recv_cq(GenericCompletionQueue::from(cq.clone()))
            .build()
            .map_err(|e| fail("ibv_create_qp")(&e))?;
        let mut init = QueuePairAttribute::new();
        init.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(device.port())
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteAtomic,
            );
        qp.modify(&init)
            .map_err(|e| fail("ibv_modify_qp (INIT)")(&e))?;
        let mut psn = [0u8; 4];
        getrandom::fill(&mut psn).map_err(|e| Error::System {
            context: format!("rank {rank}: {what}: drawing a packet sequence number"),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mine = device.endpoint(qp.qp_number(), u32::from_le_bytes(psn) & MAX_24_BIT);
        let theirs = exchange(&mine)?;
        let mut route = AddressHandleAttribute::new();
        route
            .setup_dest_lid(theirs.lid)
            .setup_service_level(0)
            .setup_port(device.port());
        if theirs.global {
            route.setup_grh(
                &Gid { raw: theirs.gid },
                0,
                device.gid_index(),
                HOP_LIMIT,
                0,
            );
        }
        let mut ready_to_receive = QueuePairAttribute::new();
        ready_to_receive
            .setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu_of(mine.path_mtu(&theirs)))
            .setup_dest_qp_num(theirs.qp_number)
            .setup_rq_psn(theirs.psn)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&route);
        qp.modify(&ready_to_receive)
            .map_err(|e| fail("ibv_modify_qp (RTR)")(&e))?;
        let mut ready_to_send = QueuePairAttribute::new();
        ready_to_send
            .setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(mine.psn)
            .setup_timeout(ACK_TIMEOUT)
            .setup_retry_cnt(RETRIES)
            .setup_rnr_retry(RETRIES)
            .setup_max_read_atomic(1);
        qp.modify(&ready_to_send)
            .map_err(|e| fail("ibv_modify_qp (RTS)")(&e))?;
        let atomic_result = Arc::new(AtomicU64::new(0));
        let atomic_lkey = {
            let addr = atomic_result.as_ptr() as u64;
            device.register(addr, 8, false, atomic_result.clone())?;
            device
                .local_key(addr, 8)
                .ok_or_else(|| Error::Internal("an RDMA registration vanished".into()))?
        };
        tracing::info!(
            rank,
            peer,
            device = device.name(),
            qp = mine.qp_number,
            "RDMA connection up"
        );
        Ok(IbConnection {
            rank,
            peer,
            timeout,
            device,
            cq,
            atomic_result,
            atomic_lkey,
            state: Mutex::new(State {
                qp,
                posted: 0,
                completed: 0,
                counters: HashMap::new(),
                broken: None,
            }),
        })
    }

    /// Takes every completion there is; the first that failed breaks the connection.
    fn reap(&self, state: &mut State) -> std::result::Result<(), String> {
        let poller = match self.cq.start_poll() {
            Ok(poller) => poller,
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(()),
            Err(e) => return Err(format!("ibv_poll_cq failed: {}", with_causes(&e))),
        };
        for completion in poller {
            state.completed += 1;
            if completion.status() != WorkCompletionStatus::Success as u32 {
                return Err(format!(
                    "request {} completed with {} (vendor error {:#x}){}",
                    completion.wr_id(),
                    status_name(completion.status()),
                    completion.vendor_err(),
                    if completion.status() == WorkCompletionStatus::RetryCounterExceededError as u32
                    {
                        ": the peer does not answer (dead, or unreachable)"
                    } else {
                        ""
                    }
                ));
            }
        }
        Ok(())
    }

    /// Waits until at most `in_flight` requests are outstanding, at most the wait limit.
    fn drain_to(&self, state: &mut State, in_flight: u64, what: &str) -> Result<(), ProxyError> {
        let started = Instant::now();
        let mut polls = 0u32;
        while state.posted - state.completed > in_flight {
            if let Err(why) = self.reap(state) {
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

    fn breaks(&self, state: &mut State, why: String) -> ProxyError {
        let why = format!("RDMA connection to peer {}: {why}", self.peer);
        state.broken = Some(why.clone());
        ProxyError::Transport(why)
    }

    /// Checks the connection is usable and makes room for one more request.
    fn room(&self, state: &mut State, what: &str) -> Result<(), ProxyError> {
        if let Some(why) = &state.broken {
            return Err(ProxyError::Transport(format!(
                "the connection broke earlier: {why}"
            )));
        }
        self.drain_to(state, u64::from(MAX_OUTSTANDING) - 1, what)
    }

    /// Posts one signalled request built by `build`.
    fn post(
        &self,
        state: &mut State,
        what: &str,
        build: impl FnOnce(&mut <BasicQueuePair as QueuePair>::Guard<'_>, u64),
    ) -> Result<(), ProxyError> {
        self.room(state, what)?;
        let id = state.posted;
        let mut guard = state.qp.start_post_send();
        build(&mut guard, id);
        if let Err(e) = guard.post() {
            return Err(self.breaks(
                state,
                format!("{what}: ibv_post_send failed: {}", with_causes(&e)),
            ));
        }
        state.posted += 1;
        Ok(())
    }
}

/// The name of a completion status (its number, for one this build does not know: the
/// library's own conversion panics on those).
fn status_name(status: u32) -> String {
    use WorkCompletionStatus as S;
    [
        S::Success,
        S::LocalLengthError,
        S::LocalQueuePairOperationError,
        S::LocalProtectionError,
        S::WorkRequestFlushedError,
        S::BadResponseError,
        S::LocalAccessError,
        S::RemoteInvalidRequestError,
        S::RemoteAccessError,
        S::RemoteOperationError,
        S::RetryCounterExceededError,
        S::ResponderNotReadyRetryCounterExceededError,
        S::RemoteAbortedError,
        S::FatalError,
        S::ResponseTimeoutError,
        S::GeneralError,
    ]
    .into_iter()
    .find(|known| *known as u32 == status)
    .map_or_else(|| format!("status {status}"), |known| format!("{known:?}"))
}

/// Where the peer's region `region` is written.
fn rdma_key(region: &MemoryRegion) -> Result<RdmaKey, ProxyError> {
    region.rdma.ok_or_else(|| {
        ProxyError::InvalidUsage(format!(
            "memory of rank {} carries no RDMA key: it is not reachable over InfiniBand / RoCE",
            region.owner_rank
        ))
    })
}

impl Connection for IbConnection {
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), ProxyError> {
        let key = rdma_key(dst)?;
        let local = src.address(src_off)?;
        let lkey = self.device.local_key(local, bytes).ok_or_else(|| {
            ProxyError::InvalidUsage(format!(
                "{bytes} bytes at offset {src_off} of rank {}'s memory are not registered with \
                 RDMA device {}",
                self.rank,
                self.device.name()
            ))
        })?;
        let mut state = self.state.lock();
        let mut done = 0;
        while done < bytes {
            let chunk = (bytes - done).min(MAX_WRITE_BYTES);
            let remote = key.addr + dst_off + done;
            let from = local + done;
            self.post(&mut state, "RDMA write", |guard, id| {
                let request = guard
                    .construct_wr(id, WorkRequestFlags::Signaled)
                    .setup_write(key.rkey, remote);
                // SAFETY: `from..from + chunk` lies in a registration of this device (its
                // local key was found for the whole range), which keeps the memory alive
                // until the device is dropped; the proxy checked the range against the
                // region, and `chunk` is at most 2^30, so it fits a u32.
                unsafe { request.setup_sge(lkey, from, chunk as u32) };
            })?;
            done += chunk;
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> Result<(), ProxyError> {
        let key = rdma_key(dst)?;
        if !dst.contains(dst_off, 8) || !(key.addr + dst_off).is_multiple_of(8) {
            return Err(ProxyError::InvalidUsage(format!(
                "semaphore at offset {dst_off} of rank {}'s {}-byte region is out of bounds or \
                 misaligned",
                dst.owner_rank, dst.size
            )));
        }
        let remote = key.addr + dst_off;
        let mut state = self.state.lock();
        let last = state.counters.get(&remote).copied().unwrap_or(0);
        let add = value.wrapping_sub(last);
        let result = self.atomic_result.as_ptr() as u64;
        let lkey = self.atomic_lkey;
        self.post(&mut state, "RDMA atomic add", |guard, id| {
            let request = guard
                .construct_wr(id, WorkRequestFlags::Signaled)
                .setup_atomic_fetch_add(key.rkey, remote, add);
            // SAFETY: the 8 bytes at `result` are the connection's own atomic cell,
            // registered with the device under `lkey` and alive as long as the connection.
            unsafe { request.setup_sge(lkey, result, 8) };
        })?;
        state.counters.insert(remote, value);
        Ok(())
    }

    fn flush(&self) -> Result<(), ProxyError> {
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
