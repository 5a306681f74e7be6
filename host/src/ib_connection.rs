//! The InfiniBand / RoCE connection (feature `ib`): one reliable-connected queue pair per
//! peer pair and direction, set up through the bootstrap ([`connect`]), driven by the proxy
//! as an [`RdmaConnection`] (what a `put`, a `signal` and a `flush` post, how many requests
//! are in flight, how every wait is bounded: see `rdma_connection.rs`) over the queue pair's
//! send queue and its completion queue ([`VerbsQueue`]).
//!
//! A peer that dies or stops answering makes the requests complete with an error (retries
//! exceeded) after the queue pair's retries (about half a second with [`ACK_TIMEOUT`] and
//! [`RETRIES`]) or the wait limit, whichever is first; the error names the peer and says
//! so.

use crate::error::{Error, Result};
use crate::ib_device::{IbDevice, mtu_of, verbs_error, with_causes};
use crate::ib_wire::{IbEndpoint, MAX_24_BIT};
use crate::rdma_connection::{
    Completion, LocalBytes, LocalKeys, RdmaConnection, RdmaLimits, SendQueue,
};
use oxccl_proxy::RdmaKey;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, GenericCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType,
    SetScatterGatherEntry, WorkRequestFlags,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Most requests in flight on one connection (the send queue's depth).
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
pub type IbConnection = RdmaConnection<VerbsQueue>;

/// A verbs queue pair's send side and its completion queue, as [`RdmaConnection`] posts to
/// them.
pub struct VerbsQueue {
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
}

impl SendQueue for VerbsQueue {
    unsafe fn post_write(
        &mut self,
        id: u64,
        local: LocalBytes,
        remote: RdmaKey,
    ) -> std::result::Result<(), String> {
        let mut guard = self.qp.start_post_send();
        let request = guard
            .construct_wr(id, WorkRequestFlags::Signaled)
            .setup_write(remote.rkey, remote.addr);
        // SAFETY: forwarded contract: `local` stays allocated and registered under its key
        // until the request completes.
        unsafe { request.setup_sge(local.lkey, local.addr, local.len) };
        guard
            .post()
            .map_err(|e| format!("ibv_post_send: {}", with_causes(&e)))
    }

    unsafe fn post_fetch_add(
        &mut self,
        id: u64,
        result: LocalBytes,
        remote: RdmaKey,
        add: u64,
    ) -> std::result::Result<(), String> {
        let mut guard = self.qp.start_post_send();
        let request = guard
            .construct_wr(id, WorkRequestFlags::Signaled)
            .setup_atomic_fetch_add(remote.rkey, remote.addr, add);
        // SAFETY: forwarded contract, for the 8 bytes the old value lands in.
        unsafe { request.setup_sge(result.lkey, result.addr, result.len) };
        guard
            .post()
            .map_err(|e| format!("ibv_post_send: {}", with_causes(&e)))
    }

    fn poll(&mut self, done: &mut Vec<Completion>) -> std::result::Result<(), String> {
        let poller = match self.cq.start_poll() {
            Ok(poller) => poller,
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(()),
            Err(e) => return Err(format!("ibv_poll_cq failed: {}", with_causes(&e))),
        };
        for completion in poller {
            let status = completion.status();
            let failure = (status != WorkCompletionStatus::Success as u32).then(|| {
                let meaning = if status == WorkCompletionStatus::RetryCounterExceededError as u32 {
                    ": the peer does not answer (dead, or unreachable)"
                } else {
                    ""
                };
                format!(
                    "{} (vendor error {:#x}){meaning}",
                    status_name(status),
                    completion.vendor_err()
                )
            });
            done.push(Completion {
                id: completion.wr_id(),
                failure,
            });
        }
        Ok(())
    }
}

impl LocalKeys for IbDevice {
    fn local_key(&self, addr: u64, len: u64) -> Option<u32> {
        IbDevice::local_key(self, addr, len)
    }
}

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
) -> Result<IbConnection> {
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
    let atomic_lkey = device
        .register(
            atomic_result.as_ptr() as u64,
            8,
            false,
            atomic_result.clone(),
        )?
        .local;
    tracing::info!(
        rank,
        peer,
        device = device.name(),
        qp = mine.qp_number,
        "RDMA connection up"
    );
    RdmaConnection::new(
        rank,
        peer,
        VerbsQueue { qp, cq },
        device,
        atomic_result,
        atomic_lkey,
        RdmaLimits {
            max_outstanding: MAX_OUTSTANDING,
            max_write: MAX_WRITE_BYTES,
        },
        timeout,
    )
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
