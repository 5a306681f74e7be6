//! The proxy service: one FIFO, one host thread that drains it, and the tables that turn a
//! trigger's ids into a connection, memories and a semaphore.
//!
//! Every trigger is checked before anything is written: known channel id, known memory
//! ids, source memory owned by this rank and destination memory owned by the channel's
//! peer, both ranges inside the registered sizes, defined type bits. A refused trigger
//! writes nothing, stops its channel (later triggers of that channel are skipped), raises
//! the service's abort flag so kernels waiting on it stop, and is recorded: the next
//! [`ProxyService::check`] returns it, naming rank, channel, peer, id and range.
//!
//! The thread polls, then yields, then parks (announcing it in the FIFO head, so the next
//! push rings its doorbell), so an idle proxy costs no core on the CPU backend. With [`ProxyConfig::assist`] (CPU backend),
//! a kernel thread that pushes drains the FIFO itself when no one else is draining it: the
//! consumer is a lock that the proxy thread and assisting threads take in turn, so triggers
//! still execute one at a time, in order, through the same checks.

use crate::connection::Connection;
use crate::consumer_pacing;
use crate::error::{ProxyError, Refusal, Side};
use crate::fifo::{Fifo, FifoCells};
use crate::memory_region::MemoryRegion;
use oxccl_device::DeviceError;
use oxccl_device::fifo::{
    FifoDeviceHandle, MAX_MEMORY_IDS, MAX_SEMAPHORE_IDS, ProxyTrigger, trigger_type,
};
use oxccl_device::wait::{AbortReason, WaitPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Errors kept for [`ProxyService::check`]; later ones are counted, not kept.
const MAX_KEPT_ERRORS: usize = 16;
/// Polls that spin before the proxy starts yielding.
const SPIN_POLLS: u32 = 2048;
/// Polls (after spinning) that yield before the proxy parks.
const YIELD_POLLS: u32 = 4096;
/// Longest park: a second guard behind the doorbell.
const PARK_TIMEOUT: Duration = Duration::from_millis(5);

/// Settings of a proxy service.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// This rank, for messages and ownership checks.
    pub rank: u32,
    /// FIFO slots (a power of two).
    pub fifo_size: u32,
    /// Limit of every device wait on handles this service builds (0: none).
    pub wait_timeout: Duration,
    /// Let pushing kernel threads of the CPU emulator execute triggers when the consumer is
    /// free (see the module docs). No effect on the GPU, whose doorbell is never rung.
    pub assist: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            rank: 0,
            fifo_size: 512,
            wait_timeout: Duration::from_secs(30),
            assist: true,
        }
    }
}

/// Id of a memory registered with a proxy service (what triggers name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryId(pub u32);

/// Id of a channel (semaphore) registered with a proxy service (what triggers name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SemaphoreId(pub u32);

struct Channel {
    connection: Arc<dyn Connection>,
    /// The peer's inbound counter of this channel's semaphore.
    remote_inbound: MemoryRegion,
    /// Signals sent so far (written by the proxy thread only).
    outbound: AtomicU64,
    stopped: AtomicBool,
}

#[derive(Default)]
struct Tables {
    memories: Vec<MemoryRegion>,
    channels: Vec<Channel>,
}

struct Shared {
    rank: u32,
    tables: RwLock<Tables>,
    /// The abort flag every handle of this service carries; `AbortReason` encoding.
    abort: AtomicU64,
    errors: Mutex<(Vec<ProxyError>, u64)>,
    stop: AtomicBool,
}

impl Shared {
    fn record(&self, error: ProxyError) {
        tracing::error!(%error, "proxy");
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.0.len() < MAX_KEPT_ERRORS {
            errors.0.push(error);
        } else {
            errors.1 += 1;
        }
    }

    fn raise(&self, error: DeviceError, channel: u32) {
        let value = AbortReason::encode(error, channel);
        // Relaxed: the flag carries no data; a kernel seeing it late only stops late.
        let _ = self
            .abort
            .compare_exchange(0, value, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// One FIFO and its proxy thread, with the id tables triggers refer to.
pub struct ProxyService {
    shared: Arc<Shared>,
    config: ProxyConfig,
    /// The FIFO's consumer: held by whoever executes triggers (proxy thread or assistant).
    consumer: Arc<Mutex<Fifo>>,
    cells: Arc<FifoCells>,
    handle: FifoDeviceHandle,
    thread: Option<JoinHandle<()>>,
}

impl ProxyService {
    /// A service with an empty FIFO; call [`Self::start`] to run its thread.
    ///
    /// # Errors
    /// An invalid FIFO size.
    pub fn new(config: ProxyConfig) -> Result<Self, ProxyError> {
        let fifo = Fifo::new(config.fifo_size)?;
        let shared = Arc::new(Shared {
            rank: config.rank,
            tables: RwLock::new(Tables::default()),
            abort: AtomicU64::new(0),
            errors: Mutex::new((Vec::new(), 0)),
            stop: AtomicBool::new(false),
        });
        let cells = fifo.cells();
        let mut service = ProxyService {
            cells: cells.clone(),
            handle: FifoDeviceHandle::default(),
            consumer: Arc::new(Mutex::new(fifo)),
            shared,
            config,
            thread: None,
        };
        service.handle = lock(&service.consumer).device_handle(service.wait_policy(0));
        if service.config.assist {
            // Weak: the doorbell lives in the FIFO cells the consumer owns; a strong
            // reference would keep both alive forever.
            let (consumer, shared) = (
                Arc::downgrade(&service.consumer),
                Arc::downgrade(&service.shared),
            );
            cells
                .doorbell()
                .set_assist(Box::new(move || assist(&consumer, &shared)));
        }
        Ok(service)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.config.rank
    }

    /// The wait policy of handles of this service, for channel `site`.
    pub fn wait_policy(&self, site: u32) -> WaitPolicy {
        WaitPolicy {
            abort_flag: &self.shared.abort as *const AtomicU64 as u64,
            timeout_ns: self.config.wait_timeout.as_nanos().min(u64::MAX as u128) as u64,
            site,
            reserved: 0,
        }
    }

    /// The kernel-side handle of the FIFO, its waits tagged with channel `site`.
    pub fn fifo_device_handle(&self, site: u32) -> FifoDeviceHandle {
        FifoDeviceHandle {
            wait: self.wait_policy(site),
            ..self.handle
        }
    }

    /// Registers a memory; triggers name it by the returned id.
    ///
    /// # Errors
    /// More than [`MAX_MEMORY_IDS`] memories.
    pub fn add_memory(&self, region: MemoryRegion) -> Result<MemoryId, ProxyError> {
        let mut t = self
            .shared
            .tables
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if t.memories.len() >= MAX_MEMORY_IDS as usize {
            return Err(ProxyError::InvalidUsage(format!(
                "rank {}: more than {MAX_MEMORY_IDS} memories registered with one proxy",
                self.config.rank
            )));
        }
        t.memories.push(region);
        Ok(MemoryId(t.memories.len() as u32 - 1))
    }

    /// Registers a channel: `connection` to its peer and the peer's inbound semaphore counter
    /// (`remote_inbound`, 8 bytes at offset 0). Triggers name it by the returned id.
    ///
    /// # Errors
    /// More than [`MAX_SEMAPHORE_IDS`] channels, or a semaphore region that is not the
    /// connection's peer's or is smaller than 8 bytes.
    pub fn add_channel(
        &self,
        connection: Arc<dyn Connection>,
        remote_inbound: MemoryRegion,
    ) -> Result<SemaphoreId, ProxyError> {
        if remote_inbound.owner_rank != connection.peer() || remote_inbound.size < 8 {
            return Err(ProxyError::InvalidUsage(format!(
                "rank {}: semaphore of rank {} ({} bytes) does not fit a channel to peer {}",
                self.config.rank,
                remote_inbound.owner_rank,
                remote_inbound.size,
                connection.peer()
            )));
        }
        let mut t = self
            .shared
            .tables
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if t.channels.len() >= MAX_SEMAPHORE_IDS as usize {
            return Err(ProxyError::InvalidUsage(format!(
                "rank {}: more than {MAX_SEMAPHORE_IDS} channels on one proxy",
                self.config.rank
            )));
        }
        t.channels.push(Channel {
            connection,
            remote_inbound,
            outbound: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        });
        Ok(SemaphoreId(t.channels.len() as u32 - 1))
    }

    /// Starts the proxy thread (once).
    ///
    /// # Errors
    /// Already started, or the OS refused the thread.
    pub fn start(&mut self) -> Result<(), ProxyError> {
        if self.thread.is_some() {
            return Err(ProxyError::InvalidUsage(
                "proxy service already started".into(),
            ));
        }
        self.shared.stop.store(false, Ordering::Release);
        let (consumer, shared, cells) = (
            self.consumer.clone(),
            self.shared.clone(),
            self.cells.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("oxccl-proxy-r{}", self.config.rank))
            .spawn(move || run(&consumer, &cells, &shared))
            .map_err(|e| ProxyError::Thread(e.to_string()))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Stops the proxy thread after it has executed every trigger already published.
    ///
    /// # Errors
    /// The thread panicked.
    pub fn stop(&mut self) -> Result<(), ProxyError> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // Wake it if parked; the doorbell is in the FIFO cells we share.
            self.cells.doorbell().wake_sleeper();
            thread
                .join()
                .map_err(|_| ProxyError::Thread("proxy thread panicked".into()))?;
        }
        Ok(())
    }

    /// The first errors recorded since the last call, if any (then cleared).
    ///
    /// # Errors
    /// The first recorded error; the rest are logged.
    pub fn check(&self) -> Result<(), ProxyError> {
        let mut errors = self.shared.errors.lock().unwrap_or_else(|p| p.into_inner());
        let (kept, dropped) = (std::mem::take(&mut errors.0), std::mem::take(&mut errors.1));
        match kept.into_iter().next() {
            Some(first) => Err(first),
            None if dropped > 0 => Err(ProxyError::More { dropped }),
            None => Ok(()),
        }
    }

    /// The raised abort flag, decoded, if any kernel or the proxy raised it.
    pub fn abort_reason(&self) -> Option<AbortReason> {
        AbortReason::decode(self.shared.abort.load(Ordering::Relaxed))
    }

    /// Lowers the abort flag (after the error was handled and kernels have stopped).
    pub fn clear_abort(&self) {
        self.shared.abort.store(0, Ordering::Relaxed);
    }

    /// The peer of channel `id`, if known.
    pub fn channel_peer(&self, id: SemaphoreId) -> Option<u32> {
        let t = self.shared.tables.read().unwrap_or_else(|p| p.into_inner());
        t.channels.get(id.0 as usize).map(|c| c.connection.peer())
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn lock(consumer: &Mutex<Fifo>) -> std::sync::MutexGuard<'_, Fifo> {
    consumer.lock().unwrap_or_else(|p| p.into_inner())
}

/// Executes every published trigger if the consumer is free; `None` if someone else holds it.
fn drain(consumer: &Mutex<Fifo>, shared: &Shared) -> Option<u64> {
    let mut fifo = match consumer.try_lock() {
        Ok(f) => f,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    let mut executed = 0;
    while let Some(trigger) = fifo.poll() {
        execute(shared, trigger);
        fifo.pop();
        executed += 1;
    }
    Some(executed)
}

/// The doorbell's assist: drain on the ringing kernel thread. True if the consumer was free
/// (so the published trigger has been executed, by us or by the holder we raced with).
fn assist(consumer: &Weak<Mutex<Fifo>>, shared: &Weak<Shared>) -> bool {
    match (consumer.upgrade(), shared.upgrade()) {
        (Some(consumer), Some(shared)) => drain(&consumer, &shared).is_some(),
        _ => false,
    }
}

/// The proxy thread: drain, execute, release; back off when idle.
fn run(consumer: &Mutex<Fifo>, cells: &FifoCells, shared: &Shared) {
    let mut idle = 0u32;
    loop {
        // Stay hot only after executing something ourselves. `None` means a kernel thread
        // is assisting: that is its work, and spinning beside it would take its core.
        if let Some(executed @ 1..) = drain(consumer, shared) {
            idle = 0;
            consumer_pacing::after_drain(executed);
            continue;
        }
        // Acquire: pairs with the Release in `stop`. The drain above found the ring empty
        // after `stop` was possibly set; one more drain catches triggers published before it.
        if shared.stop.load(Ordering::Acquire) {
            if drain(consumer, shared) == Some(0) {
                return;
            }
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < SPIN_POLLS {
            std::hint::spin_loop();
        } else if idle < SPIN_POLLS + YIELD_POLLS {
            std::thread::yield_now();
        } else if !cells.park_consumer(PARK_TIMEOUT, || shared.stop.load(Ordering::Acquire)) {
            // A position is claimed but not executed yet (its pusher is about to publish, or
            // an assistant is draining): not the moment to park.
            std::thread::yield_now();
        }
    }
}

/// Checks `trigger` and carries it out; refusals and failures are recorded.
fn execute(shared: &Shared, trigger: ProxyTrigger) {
    let f = trigger.decode();
    let t = shared.tables.read().unwrap_or_else(|p| p.into_inner());
    let refuse = |channel: u32, peer: Option<u32>, refusal: Refusal| {
        let code = match refusal {
            Refusal::OutOfBounds { .. } => DeviceError::OutOfBounds,
            _ => DeviceError::InvalidArgument,
        };
        shared.raise(code, channel);
        shared.record(ProxyError::TriggerRefused {
            rank: shared.rank,
            channel,
            peer,
            refusal,
        });
    };
    let Some(channel) = t.channels.get(f.semaphore_id as usize) else {
        refuse(
            f.semaphore_id,
            None,
            Refusal::UnknownChannel { id: f.semaphore_id },
        );
        return;
    };
    // Relaxed: only this thread writes `stopped`.
    if channel.stopped.load(Ordering::Relaxed) {
        return;
    }
    let peer = channel.connection.peer();
    let stop_with = |refusal: Refusal| {
        channel.stopped.store(true, Ordering::Relaxed);
        refuse(f.semaphore_id, Some(peer), refusal);
    };
    if f.kind == 0 || f.kind & !trigger_type::ALL != 0 {
        return stop_with(Refusal::InvalidType { bits: f.kind });
    }
    if f.kind & trigger_type::DATA != 0 {
        let lookup =
            |side: Side, id: u32, owner: u32, offset: u64| -> Result<&MemoryRegion, Refusal> {
                let region = t
                    .memories
                    .get(id as usize)
                    .ok_or(Refusal::UnknownMemory { side, id })?;
                if region.owner_rank != owner {
                    return Err(Refusal::WrongRank {
                        side,
                        id,
                        owner: region.owner_rank,
                        expected: owner,
                    });
                }
                if !region.contains(offset, f.size) {
                    return Err(Refusal::OutOfBounds {
                        side,
                        id,
                        offset,
                        end: offset.saturating_add(f.size),
                        size: region.size,
                    });
                }
                Ok(region)
            };
        let checked = lookup(Side::Src, f.src_memory_id, shared.rank, f.src_offset)
            .and_then(|src| Ok((src, lookup(Side::Dst, f.dst_memory_id, peer, f.dst_offset)?)));
        let (src, dst) = match checked {
            Ok(pair) => pair,
            Err(refusal) => return stop_with(refusal),
        };
        if let Err(e) = channel
            .connection
            .write(dst, f.dst_offset, src, f.src_offset, f.size)
        {
            return fail(shared, channel, f.semaphore_id, e);
        }
    }
    if f.kind & trigger_type::FLAG != 0 {
        let value = channel.outbound.fetch_add(1, Ordering::Relaxed) + 1;
        if let Err(e) = channel
            .connection
            .update_and_sync(&channel.remote_inbound, 0, value)
        {
            return fail(shared, channel, f.semaphore_id, e);
        }
    }
    if f.kind & trigger_type::SYNC != 0
        && let Err(e) = channel.connection.flush()
    {
        fail(shared, channel, f.semaphore_id, e);
    }
}

fn fail(shared: &Shared, channel: &Channel, id: u32, error: ProxyError) {
    channel.stopped.store(true, Ordering::Relaxed);
    shared.raise(DeviceError::Aborted, id);
    shared.record(ProxyError::Connection {
        rank: shared.rank,
        peer: channel.connection.peer(),
        transport: channel.connection.transport(),
        channel: id,
        message: error.to_string(),
    });
}
