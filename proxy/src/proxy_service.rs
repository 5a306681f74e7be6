//! The proxy service: one FIFO, the host thread that drains it (its own, or the process's
//! shared one: see [`crate::proxy_thread`]), and the tables that turn a trigger's ids into
//! a connection, memories and a semaphore.
//!
//! Every trigger is checked before anything is written: known channel id, known memory
//! ids, source memory owned by this rank and destination memory owned by the channel's
//! peer, both ranges inside the registered sizes, defined type bits. A refused trigger
//! writes nothing, stops its channel (later triggers of that channel are skipped, and each
//! skip marks the channel failed again, so a `flush` on it reports the failure instead of
//! success), records the failure in the channel's abort record and the rank's stop word (so
//! kernels waiting on the rank stop), and is kept: the next [`ProxyService::check`] returns
//! it, naming rank, channel, peer, id and range.
//!
//! A position a pusher claimed but never published (its push gave up) would stop the
//! proxy at that position forever, for every channel. The proxy notices when the position
//! stays unpublished past the wait limit, reports [`ProxyError::FifoStalled`] naming it,
//! raises the stop word, and then parks instead of spinning on it.
//!
//! The thread polls, then yields, then parks (announcing it in the FIFO head, so the next
//! push rings its doorbell), so an idle proxy costs no core on the CPU backend. A FIFO whose
//! pushers cannot ring a doorbell (GPU threads; [`IdlePolicy::Poll`]) is polled, then
//! looked at between naps instead (see [`crate::idle_policy`]). With
//! [`ProxyConfig::assist`] (CPU backend), a kernel thread that pushes drains the FIFO itself
//! when no one else is draining it: the consumer is a lock that the proxy thread and
//! assisting threads take in turn, so triggers still execute one at a time, in order,
//! through the same checks.
//!
//! The service keeps every region and connection it was given (and whatever they keep
//! alive) until it is dropped, and its FIFO cells as long as any handle holder keeps a share
//! of them ([`ProxyService::fifo_cells`]).

use crate::connection::{Connection, Signal};
use crate::consumer_pacing;
use crate::error::{ProxyError, Refusal, Side};
use crate::fifo::{Fifo, FifoCells, MappedFifoCells};
use crate::host_cell::HostCell;
use crate::idle_policy::{IdlePolicy, PollSchedule};
use crate::memory_region::MemoryRegion;
use crate::proxy_thread::{self, Member, ProxyThread, STALL_CHECK_EVERY};
use oxccl_device::DeviceError;
use oxccl_device::abort::{AbortReason, AbortRecord};
use oxccl_device::error::DeviceOp;
use oxccl_device::fifo::{MAX_MEMORY_IDS, MAX_SEMAPHORE_IDS, ProxyTrigger, trigger_type};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Errors kept for [`ProxyService::check`]; later ones are counted, not kept.
const MAX_KEPT_ERRORS: usize = 16;
/// The site a failure of the FIFO itself (not of one channel) is recorded under in the
/// rank's stop word.
pub const FIFO_SITE: u32 = u32::MAX;

/// The site a refused inbound connection (a peer's bad frame, see [`FailureSink`]) is
/// recorded under in the rank's stop word.
pub const INBOUND_SITE: u32 = u32::MAX - 3;

/// Settings of a proxy service.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// This rank, for messages and ownership checks.
    pub rank: u32,
    /// FIFO slots (a power of two).
    pub fifo_size: u32,
    /// Limit of every device wait on handles built for this service; also how long a
    /// claimed FIFO position may stay unpublished before the proxy reports the FIFO stalled,
    /// and how long [`ProxyService::stop`] waits for the thread. Never zero.
    pub wait_timeout: Duration,
    /// Let pushing kernel threads of the CPU emulator execute triggers when the consumer is
    /// free (see the module docs). Needs the doorbell: no effect under
    /// [`IdlePolicy::Poll`], as on a GPU.
    pub assist: bool,
    /// How the thread waits when the FIFO is empty: [`IdlePolicy::Doorbell`] (the
    /// default) only where every pusher is a host thread.
    pub idle: IdlePolicy,
    /// Serve the FIFO from the process's one shared proxy thread (see
    /// [`crate::proxy_thread`]) instead of a thread of its own: for the in-process ranks of
    /// a machine with fewer cores than they have busy threads. Only a FIFO with a doorbell
    /// ([`IdlePolicy::Doorbell`]) and no `cpus`; others always get their own thread.
    pub share_thread: bool,
    /// The CPUs the proxy thread runs on (those near the GPU, on a multi-socket machine);
    /// `None` or empty: wherever the scheduler puts it. A placement the system refuses is
    /// logged, not fatal.
    pub cpus: Option<Vec<usize>>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            rank: 0,
            fifo_size: 512,
            wait_timeout: Duration::from_secs(30),
            assist: true,
            idle: IdlePolicy::Doorbell,
            share_thread: false,
            cpus: None,
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
    /// Signals sent so far. Only the consumer (whoever holds it) writes it, so a load and a
    /// store do; a locked add right before the semaphore's store would wait for that
    /// store's cache miss.
    outbound: AtomicU64,
    stopped: AtomicBool,
    /// Where the channel's first failure goes (the channel's kernels read it too).
    record: HostCell<AbortRecord>,
}

/// The id tables, as one immutable snapshot: registrations publish a new snapshot and bump
/// [`Shared::generation`]; the consumer keeps its own copy and looks at the generation (a
/// plain load) before executing, so the hot path takes no lock.
#[derive(Default, Clone)]
struct Tables {
    /// By id; `None` where a memory was removed (its id is free for the next one).
    memories: Vec<Option<MemoryRegion>>,
    channels: Vec<Arc<Channel>>,
}

/// The FIFO's consumer and its copy of the tables: what whoever drains holds.
pub(crate) struct Consumer {
    fifo: Fifo,
    tables: Arc<Tables>,
    generation: u64,
}

impl Consumer {
    /// The tables as of now (a new snapshot only if a registration happened).
    fn refresh(&mut self, shared: &Shared) {
        // Acquire: pairs with the Release bump in `register`, so the snapshot read after it
        // is at least that new.
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.tables = shared.tables.lock().clone();
            self.generation = generation;
        }
    }
}

pub(crate) struct Shared {
    rank: u32,
    /// The latest snapshot of the tables, replaced whole by each registration.
    tables: Mutex<Arc<Tables>>,
    /// Bumped after each new snapshot.
    generation: AtomicU64,
    /// The rank's stop word, raised by the first failure of any channel; every device wait
    /// of the rank's handles watches it.
    stop_word: HostCell<AtomicU64>,
    errors: Mutex<(Vec<ProxyError>, u64)>,
    /// Set by `stop`: the thread drains what is published, then lets the service go.
    pub(crate) shutdown: AtomicBool,
    /// Whether a proxy thread serves the service: set by `start`, cleared (Release) by the
    /// thread once it has let the service go.
    pub(crate) attached: AtomicBool,
    /// Set by [`ProxyService::expect_triggers`]: a polling thread is hot again from now.
    expecting: AtomicBool,
    wait_timeout: Duration,
}

impl Shared {
    fn record(&self, error: ProxyError) {
        tracing::error!(%error, "proxy");
        let mut errors = self.errors.lock();
        if errors.0.len() < MAX_KEPT_ERRORS {
            errors.0.push(error);
        } else {
            errors.1 += 1;
        }
    }

    /// Raises the stop word alone (a failure with no channel record to carry it).
    fn raise_stop(&self, error: DeviceError, site: u32) {
        let word = AbortReason::encode(error, DeviceOp::Unknown, site);
        // Relaxed: the word carries no data; a kernel seeing it late only stops late.
        let _ = self
            .stop_word
            .compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Records failures of the rank's transports that no trigger carries (what a receiver
/// refused from a peer) with the proxy's own: [`ProxyService::check`] reports them, and
/// the rank's stop word is raised, so kernels waiting for that peer stop instead of
/// waiting out their limit.
#[derive(Clone)]
pub struct FailureSink {
    shared: Arc<Shared>,
}

impl FailureSink {
    /// Records `error` and raises the rank's stop word under [`INBOUND_SITE`] (unless a
    /// failure already did).
    pub fn record(&self, error: ProxyError) {
        // Recorded before it is raised, so a host that sees the stop finds the reason.
        self.shared.record(error);
        self.shared.raise_stop(DeviceError::Aborted, INBOUND_SITE);
    }
}

impl std::fmt::Debug for FailureSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailureSink")
            .field("rank", &self.shared.rank)
            .finish()
    }
}

/// Wakes a polling proxy thread ahead of a kernel's triggers (see
/// [`ProxyService::expect_triggers`]); does nothing for a parked one.
#[derive(Clone)]
pub struct ProxyWaker {
    shared: Arc<Shared>,
    /// The polling thread, if the service polls and had started.
    thread: Option<std::thread::Thread>,
}

impl ProxyWaker {
    /// A kernel that pushes triggers is about to run: a napping thread polls hot again.
    pub fn expect_triggers(&self) {
        if let Some(thread) = &self.thread {
            // Release: pairs with the thread's Acquire swap; nothing rides on it but the flag.
            self.shared.expecting.store(true, Ordering::Release);
            thread.unpark();
        }
    }
}

impl std::fmt::Debug for ProxyWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyWaker")
            .field("rank", &self.shared.rank)
            .field("polling", &self.thread.is_some())
            .finish()
    }
}

/// One FIFO and its proxy thread, with the id tables triggers refer to.
pub struct ProxyService {
    shared: Arc<Shared>,
    config: ProxyConfig,
    /// The FIFO's consumer: held by whoever executes triggers (proxy thread or assistant).
    consumer: Arc<Mutex<Consumer>>,
    cells: Arc<FifoCells>,
    thread: Option<ServiceThread>,
}

/// The thread that serves a started service.
enum ServiceThread {
    /// Its own, polling a FIFO no one can wake ([`IdlePolicy::Poll`]).
    Polling(JoinHandle<()>),
    /// A thread of doorbell FIFOs: its own (`own`), or the process's shared one.
    Serving {
        door: Arc<ProxyThread>,
        own: Option<JoinHandle<()>>,
    },
}

impl ProxyService {
    /// A service with an empty FIFO on the heap (with a doorbell under
    /// [`IdlePolicy::Doorbell`], without one under [`IdlePolicy::Poll`]); call
    /// [`Self::start`] to run its thread.
    ///
    /// # Errors
    /// An invalid FIFO size, or a zero wait limit (which would mean waits without a deadline).
    pub fn new(config: ProxyConfig) -> Result<Self, ProxyError> {
        let fifo = match config.idle {
            IdlePolicy::Doorbell => Fifo::new(config.fifo_size)?,
            IdlePolicy::Poll(_) => Fifo::without_doorbell(config.fifo_size)?,
        };
        Self::over(config, fifo, HostCell::new(AtomicU64::new(0)))
    }

    /// A service over a FIFO whose cells a backend placed (pinned, device-mapped host
    /// memory on a GPU: see [`crate::fifo`]), with the rank's stop word in `stop_word` (zero,
    /// where the kernels reach it: see [`HostCell`]); `config.fifo_size` must be the cells'
    /// size, and `config.idle` must poll (no GPU can ring a doorbell).
    ///
    /// # Errors
    /// As [`Self::new`], a policy that does not poll, a size other than the cells', or what
    /// [`Fifo::from_mapped`] refuses.
    ///
    /// # Safety
    /// [`Fifo::from_mapped`]'s contract for `cells`.
    pub unsafe fn with_mapped_fifo(
        config: ProxyConfig,
        cells: MappedFifoCells,
        stop_word: HostCell<AtomicU64>,
    ) -> Result<Self, ProxyError> {
        if config.idle == IdlePolicy::Doorbell || cells.device.size != config.fifo_size {
            return Err(ProxyError::InvalidUsage(format!(
                "rank {}: a mapped FIFO of {} slots needs a proxy configured for {} slots \
                 that polls (IdlePolicy::Poll), not {:?}",
                config.rank, cells.device.size, config.fifo_size, config.idle
            )));
        }
        // SAFETY: the caller's contract.
        let fifo = unsafe { Fifo::from_mapped(cells)? };
        Self::over(config, fifo, stop_word)
    }

    fn over(
        config: ProxyConfig,
        fifo: Fifo,
        stop_word: HostCell<AtomicU64>,
    ) -> Result<Self, ProxyError> {
        if config.wait_timeout.is_zero() {
            return Err(ProxyError::InvalidUsage(format!(
                "rank {}: a wait limit of zero would let device waits wait forever; give \
                 every wait a deadline (the default is 30 s)",
                config.rank
            )));
        }
        let shared = Arc::new(Shared {
            rank: config.rank,
            tables: Mutex::new(Arc::new(Tables::default())),
            generation: AtomicU64::new(0),
            stop_word,
            errors: Mutex::new((Vec::new(), 0)),
            shutdown: AtomicBool::new(false),
            attached: AtomicBool::new(false),
            expecting: AtomicBool::new(false),
            wait_timeout: config.wait_timeout,
        });
        let cells = fifo.cells();
        let consumer = Consumer {
            fifo,
            tables: Arc::new(Tables::default()),
            generation: 0,
        };
        let service = ProxyService {
            cells: cells.clone(),
            consumer: Arc::new(Mutex::new(consumer)),
            shared,
            config,
            thread: None,
        };
        if let (true, Some(doorbell)) = (service.config.assist, cells.doorbell()) {
            // Weak: the doorbell lives in the FIFO cells the consumer owns; a strong
            // reference would keep both alive forever.
            let (consumer, shared) = (
                Arc::downgrade(&service.consumer),
                Arc::downgrade(&service.shared),
            );
            doorbell.set_assist(Box::new(move || {
                match (consumer.upgrade(), shared.upgrade()) {
                    (Some(consumer), Some(shared)) => drain(&consumer, &shared).is_some(),
                    _ => false,
                }
            }));
        }
        Ok(service)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.config.rank
    }

    /// The limit of every device wait on handles built for this service.
    pub fn wait_timeout(&self) -> Duration {
        self.config.wait_timeout
    }

    /// The rank's stop word (see the module docs), for the wait policies of its handles.
    pub fn stop_word(&self) -> HostCell<AtomicU64> {
        self.shared.stop_word.clone()
    }

    /// Where failures found outside the proxy thread go (a transport's receiver refusing a
    /// peer's frame): the next [`Self::check`] reports them.
    pub fn failure_sink(&self) -> FailureSink {
        FailureSink {
            shared: self.shared.clone(),
        }
    }

    /// The FIFO's cells, for its device handles; a share keeps them alive.
    pub fn fifo_cells(&self) -> Arc<FifoCells> {
        self.cells.clone()
    }

    /// Registers a memory; triggers name it by the returned id (the lowest free one). The
    /// service keeps the region (and what it keeps alive) until it is dropped or the id
    /// removed.
    ///
    /// # Errors
    /// More than [`MAX_MEMORY_IDS`] memories.
    pub fn add_memory(&self, region: MemoryRegion) -> Result<MemoryId, ProxyError> {
        self.register(|t| {
            let free = t.memories.iter().position(Option::is_none);
            let id = free.unwrap_or(t.memories.len());
            if id >= MAX_MEMORY_IDS as usize {
                return Err(ProxyError::InvalidUsage(format!(
                    "rank {}: more than {MAX_MEMORY_IDS} memories registered with one proxy",
                    self.config.rank
                )));
            }
            match free {
                Some(_) => t.memories[id] = Some(region),
                None => t.memories.push(Some(region)),
            }
            Ok(MemoryId(id as u32))
        })
    }

    /// Removes memory `id`: triggers that name it from now on are refused as naming an
    /// unknown memory, and a later [`Self::add_memory`] may take the id. The region is
    /// dropped once the proxy has moved to the new tables (it stops naming it between two
    /// triggers, never in the middle of one). The caller makes sure that no trigger naming
    /// it is still queued (the kernels that pushed them have completed and waited for them).
    ///
    /// # Errors
    /// An id that names no memory.
    pub fn remove_memory(&self, id: MemoryId) -> Result<(), ProxyError> {
        self.register(|t| match t.memories.get_mut(id.0 as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(ProxyError::InvalidUsage(format!(
                "rank {}: memory id {} is not registered with this proxy",
                self.config.rank, id.0
            ))),
        })
    }

    /// Applies `change` to a copy of the tables and publishes it as the new snapshot.
    fn register<R>(
        &self,
        change: impl FnOnce(&mut Tables) -> Result<R, ProxyError>,
    ) -> Result<R, ProxyError> {
        let mut latest = self.shared.tables.lock();
        let mut tables = Tables::clone(&latest);
        let made = change(&mut tables)?;
        *latest = Arc::new(tables);
        // Release: pairs with the consumer's Acquire in `Consumer::refresh`.
        self.shared.generation.fetch_add(1, Ordering::Release);
        Ok(made)
    }

    /// Registers a channel: `connection` to its peer, the peer's inbound semaphore counter
    /// (`remote_inbound`, 8 bytes at offset 0) and the channel's abort `record`. Triggers
    /// name it by the returned id, which is also the site its failures are recorded under.
    ///
    /// # Errors
    /// More than [`MAX_SEMAPHORE_IDS`] channels, or a semaphore region that is not the
    /// connection's peer's or is smaller than 8 bytes.
    pub fn add_channel(
        &self,
        connection: Arc<dyn Connection>,
        remote_inbound: MemoryRegion,
        record: HostCell<AbortRecord>,
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
        self.register(|t| {
            if t.channels.len() >= MAX_SEMAPHORE_IDS as usize {
                return Err(ProxyError::InvalidUsage(format!(
                    "rank {}: more than {MAX_SEMAPHORE_IDS} channels on one proxy",
                    self.config.rank
                )));
            }
            t.channels.push(Arc::new(Channel {
                connection,
                remote_inbound,
                outbound: AtomicU64::new(0),
                stopped: AtomicBool::new(false),
                record,
            }));
            Ok(SemaphoreId(t.channels.len() as u32 - 1))
        })
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
        self.shared.shutdown.store(false, Ordering::Release);
        self.shared.attached.store(true, Ordering::Relaxed);
        let (consumer, shared, cells) = (
            self.consumer.clone(),
            self.shared.clone(),
            self.cells.clone(),
        );
        let (rank, cpus) = (self.config.rank, self.config.cpus.clone());
        let name = format!("oxccl-proxy-r{rank}");
        let thread = match self.config.idle {
            IdlePolicy::Poll(schedule) => std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    place_thread(rank, cpus.as_deref());
                    run_polling(&consumer, &cells, &shared, &schedule);
                })
                .map(ServiceThread::Polling),
            // The constructors give a ring a doorbell exactly when the policy parks.
            IdlePolicy::Doorbell => {
                let member = Member {
                    consumer,
                    cells,
                    shared,
                    assist: self.config.assist,
                };
                if self.config.share_thread && cpus.as_ref().is_none_or(Vec::is_empty) {
                    proxy_thread::join_shared(member)
                        .map(|door| ServiceThread::Serving { door, own: None })
                } else {
                    ProxyThread::spawn(name, member, false, move || {
                        place_thread(rank, cpus.as_deref())
                    })
                    .map(|(door, own)| ServiceThread::Serving {
                        door,
                        own: Some(own),
                    })
                }
            }
        }
        .map_err(|e| {
            self.shared.attached.store(false, Ordering::Relaxed);
            ProxyError::Thread(e.to_string())
        })?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Stops serving the FIFO after every trigger already published has executed, waiting
    /// at most the wait limit: the service's own thread ends; the shared thread lets the
    /// service go.
    ///
    /// # Errors
    /// The thread panicked, or did not let the service go within the limit (it is then left
    /// to end by itself, detached).
    pub fn stop(&mut self) -> Result<(), ProxyError> {
        self.shared.shutdown.store(true, Ordering::Release);
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        // Wake it if parked or napping.
        let wake = || match &thread {
            ServiceThread::Polling(own) => own.thread().unpark(),
            ServiceThread::Serving { door, .. } => door.wake(),
        };
        let done = || match &thread {
            ServiceThread::Polling(own) => own.is_finished(),
            // Acquire: pairs with the thread's Release once it let the service go.
            ServiceThread::Serving { own, .. } => {
                !self.shared.attached.load(Ordering::Acquire)
                    && own.as_ref().is_none_or(JoinHandle::is_finished)
            }
        };
        wake();
        let deadline = Instant::now() + self.config.wait_timeout;
        while !done() {
            if Instant::now() >= deadline {
                return Err(ProxyError::Thread(format!(
                    "rank {}: the proxy thread did not stop within {:?} (a connection call \
                     that does not return?); it is left running",
                    self.config.rank, self.config.wait_timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
            wake();
        }
        let own = match thread {
            ServiceThread::Polling(own) => Some(own),
            ServiceThread::Serving { own, .. } => own,
        };
        match own {
            Some(own) => own
                .join()
                .map_err(|_| ProxyError::Thread("proxy thread panicked".into())),
            None => Ok(()),
        }
    }

    /// Tells a polling proxy ([`IdlePolicy::Poll`]) that a kernel which pushes triggers is
    /// about to run: a napping thread wakes now and polls hot again, so the kernel's first
    /// trigger is not left to wait out a nap. Cheap (a flag and an unpark); nothing to do
    /// under [`IdlePolicy::Doorbell`], whose pushes wake the thread themselves, or before
    /// [`Self::start`].
    pub fn expect_triggers(&self) {
        self.waker().expect_triggers();
    }

    /// What [`Self::expect_triggers`] does, for whoever prepares a launch without the
    /// service at hand (a channel handing out its device handle). Take it after
    /// [`Self::start`]: one taken before wakes nothing.
    pub fn waker(&self) -> ProxyWaker {
        let polling = matches!(self.config.idle, IdlePolicy::Poll(_));
        ProxyWaker {
            shared: self.shared.clone(),
            thread: self
                .thread
                .as_ref()
                .filter(|_| polling)
                .and_then(|t| match t {
                    ServiceThread::Polling(own) => Some(own.thread().clone()),
                    ServiceThread::Serving { .. } => None,
                }),
        }
    }

    /// The first errors recorded since the last call, if any (then cleared).
    ///
    /// # Errors
    /// The first recorded error; the rest are logged.
    pub fn check(&self) -> Result<(), ProxyError> {
        let mut errors = self.shared.errors.lock();
        let (kept, dropped) = (std::mem::take(&mut errors.0), std::mem::take(&mut errors.1));
        match kept.into_iter().next() {
            Some(first) => Err(first),
            None if dropped > 0 => Err(ProxyError::More { dropped }),
            None => Ok(()),
        }
    }

    /// The rank's first failure, decoded from the stop word, if any was raised.
    pub fn stop_reason(&self) -> Option<AbortReason> {
        AbortReason::decode(self.shared.stop_word.load(Ordering::Relaxed))
    }

    /// Lowers the stop word (after the failure was reported and kernels have stopped).
    pub fn clear_stop(&self) {
        self.shared.stop_word.store(0, Ordering::Relaxed);
    }

    /// Raises the stop word from the host with `error` at `site`, unless a failure already
    /// did: kernels of this rank stop waiting (a peer failed, the job is ending).
    pub fn raise_stop(&self, error: DeviceError, site: u32) {
        self.shared.raise_stop(error, site);
    }

    /// The peer of channel `id`, if known.
    pub fn channel_peer(&self, id: SemaphoreId) -> Option<u32> {
        let t = self.shared.tables.lock().clone();
        t.channels.get(id.0 as usize).map(|c| c.connection.peer())
    }

    /// Whether channel `id` has been stopped by a refused trigger or a failed connection.
    pub fn channel_stopped(&self, id: SemaphoreId) -> bool {
        let t = self.shared.tables.lock().clone();
        t.channels
            .get(id.0 as usize)
            .is_some_and(|c| c.stopped.load(Ordering::Relaxed))
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "stopping the proxy");
        }
    }
}

/// Runs the calling (proxy) thread on `cpus`, if given and not empty; a refusal is logged.
fn place_thread(rank: u32, cpus: Option<&[usize]>) {
    let Some(cpus) = cpus.filter(|c| !c.is_empty()) else {
        return;
    };
    let mut set = rustix::thread::CpuSet::new();
    for &cpu in cpus
        .iter()
        .filter(|&&c| c < rustix::thread::CpuSet::MAX_CPU)
    {
        set.set(cpu);
    }
    match rustix::thread::sched_setaffinity(None, &set) {
        Ok(()) => tracing::info!(rank, ?cpus, "proxy thread placed"),
        Err(e) => tracing::warn!(rank, ?cpus, error = %e, "proxy thread not placed"),
    }
}

/// Executes every published trigger if the consumer is free; `None` if someone else holds it.
pub(crate) fn drain(consumer: &Mutex<Consumer>, shared: &Shared) -> Option<u64> {
    let mut held = consumer.try_lock()?;
    Some(drain_held(&mut held, shared))
}

/// Executes every published trigger with the consumer held.
pub(crate) fn drain_held(consumer: &mut Consumer, shared: &Shared) -> u64 {
    let Some(mut trigger) = consumer.fifo.poll() else {
        return 0;
    };
    consumer.refresh(shared);
    let mut executed = 0;
    loop {
        execute(shared, &consumer.tables, trigger);
        consumer.fifo.pop();
        executed += 1;
        match consumer.fifo.poll() {
            Some(next) => trigger = next,
            None => return executed,
        }
    }
}

/// Watches for a claimed FIFO position that is never published.
#[derive(Default)]
pub(crate) struct StallWatch {
    /// The executed count when the current wait began, and when it began.
    since: Option<(u64, Instant)>,
    /// Reported: the position that will not come.
    stalled_at: Option<u64>,
}

impl StallWatch {
    /// Called when a drain found nothing to execute: notes how long a claimed position has
    /// stayed unpublished, and reports it once past the wait limit. Returns whether the
    /// FIFO is stalled (so the consumer may park although a position is claimed).
    pub(crate) fn idle(&mut self, cells: &FifoCells, shared: &Shared) -> bool {
        let executed = cells.executed();
        // A head in device memory cannot be watched: the pusher that gave up reports it.
        let Some(claimed) = cells.claimed() else {
            return false;
        };
        if claimed <= executed {
            self.since = None;
            self.stalled_at = None;
            return false;
        }
        if self.stalled_at == Some(executed) {
            return true;
        }
        match self.since {
            Some((at, started)) if at == executed => {
                if started.elapsed() >= shared.wait_timeout {
                    self.stalled_at = Some(executed);
                    shared.record(ProxyError::FifoStalled {
                        rank: shared.rank,
                        position: executed,
                        waited: started.elapsed(),
                    });
                    shared.raise_stop(DeviceError::Aborted, FIFO_SITE);
                    return true;
                }
            }
            _ => {
                self.since = Some((executed, Instant::now()));
                self.stalled_at = None;
            }
        }
        false
    }
}

/// The proxy thread of a ring no one can wake ([`IdlePolicy::Poll`]): drain, execute,
/// release; when idle, poll (spinning as long as that pays off, then yielding the core)
/// through the schedule's hot spell, then nap between polls, each nap that finds nothing
/// longer than the last, up to the schedule's ceiling. Nobody else drains (no doorbell, so
/// no assist): the thread holds the consumer for its whole life, and never touches the
/// FIFO head beyond reading it where it is host memory (the stall watch).
fn run_polling(
    consumer: &Mutex<Consumer>,
    cells: &FifoCells,
    shared: &Shared,
    schedule: &PollSchedule,
) {
    let mut held = consumer.lock();
    let mut spin = SpinBudget::default();
    let mut state = schedule.start();
    let mut napping = false;
    let mut idle = 0u32;
    let mut watch = StallWatch::default();
    // Until when the host said triggers are coming and none has come yet: no nap then.
    let mut expected_until: Option<Instant> = None;
    loop {
        let executed = drain_held(&mut held, shared);
        if executed > 0 {
            spin.work_found_after(idle);
            idle = 0;
            state.work_found(schedule);
            napping = false;
            expected_until = None;
            consumer_pacing::after_drain(executed);
            continue;
        }
        // Acquire: pairs with the Release in `stop`; one more drain catches triggers
        // published before it.
        if shared.shutdown.load(Ordering::Acquire) {
            if drain_held(&mut held, shared) == 0 {
                return;
            }
            continue;
        }
        idle = idle.saturating_add(1);
        // Acquire: pairs with the Release in `expect_triggers`.
        if shared.expecting.swap(false, Ordering::Acquire) {
            // Hot from the start: spin first, as after a trigger, and no nap until the
            // first trigger comes (a launch can take a while on a loaded machine), for
            // [`EXPECTATION_WINDOW`] at most.
            state.work_found(schedule);
            napping = false;
            idle = 0;
            expected_until = Instant::now().checked_add(EXPECTATION_WINDOW);
        }
        if napping {
            // One empty poll per nap: a poll, a look for a stall and a nap are all an idle
            // proxy costs (spinning or yielding between naps cost 70 µs of CPU a nap on a
            // 2-core VM, 3 % of a core at 1 ms naps). A park, so `expect_triggers` can end
            // it early.
            watch.idle(cells, shared);
            std::thread::park_timeout(state.next_nap(schedule).unwrap_or(schedule.max_nap));
            continue;
        }
        if idle.is_multiple_of(STALL_CHECK_EVERY) {
            watch.idle(cells, shared);
        }
        if idle <= spin.polls() {
            std::hint::spin_loop();
            continue;
        }
        // Past the spin budget: look at the clock (every few polls, not on each), and
        // yield the core while hot; the hot spell over, nap.
        if idle.is_multiple_of(POLLS_PER_CLOCK_LOOK) {
            let now = Instant::now();
            if expected_until.is_some_and(|until| now >= until) {
                expected_until = None;
            }
            if expected_until.is_none()
                && let Some(nap) = state.next_nap(schedule)
            {
                napping = true;
                std::thread::park_timeout(nap);
                continue;
            }
        }
        std::thread::yield_now();
    }
}

/// How long a polling proxy thread told that triggers are coming
/// ([`ProxyService::expect_triggers`]) keeps from napping while none has come: its hot spell
/// may be shorter than a launch takes on a loaded machine (the first trigger then waited a
/// whole nap). Bounded, so a launch that never pushes costs the core's idle time for this
/// long at most (the thread yields meanwhile).
const EXPECTATION_WINDOW: Duration = Duration::from_millis(100);

/// Idle polls between two looks at the clock of a polling proxy thread past its spin budget.
const POLLS_PER_CLOCK_LOOK: u32 = 16;

/// How many idle polls the proxy thread (without assist) spins before it starts yielding:
/// as many as keep paying off.
///
/// Spinning catches a trigger that comes within a few hundred nanoseconds without a system
/// call (a kernel thread that pushes and waits for the answer, with a core each: about 290
/// ns a round trip spinning 32 polls, 350 yielding at once). When the next trigger comes
/// only after the kernels have had their turn (a ping-pong between two ranks on two cores),
/// every poll spent spinning is time a kernel thread waits for the core: 3.5 µs a round trip
/// spinning 32 polls, 3.0 yielding at once. So the budget doubles (to at least
/// [`Self::RESTART`]) when work came while spinning, and halves when it came only after
/// yielding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinBudget(u32);

impl SpinBudget {
    /// Most polls spun.
    const MAX: u32 = 256;
    /// What a budget that pays off grows back to at least.
    const RESTART: u32 = 8;

    /// Idle polls to spin: at least one, so that a budget run down to nothing can learn
    /// that spinning pays off again.
    pub(crate) fn polls(self) -> u32 {
        self.0.max(1)
    }

    /// Adapts to work found after `idle` empty polls.
    pub(crate) fn work_found_after(&mut self, idle: u32) {
        self.0 = if idle <= self.polls() {
            (self.0 * 2).clamp(Self::RESTART, Self::MAX)
        } else {
            self.0 / 2
        };
    }
}

impl Default for SpinBudget {
    fn default() -> Self {
        SpinBudget(32)
    }
}

/// Checks `trigger` against the tables `t` and carries it out; refusals and failures are
/// recorded.
fn execute(shared: &Shared, t: &Tables, trigger: ProxyTrigger) {
    let f = trigger.decode();
    let detail = [f.dst_offset, f.src_offset, f.size];
    // Every failure below is recorded before it is raised: a kernel stopped by the raise
    // lets its host check the communicator, which must then find the reason (with the
    // raise first, a host could see only that the channel stopped).
    let Some(channel) = t.channels.get(f.semaphore_id as usize) else {
        shared.record(ProxyError::TriggerRefused {
            rank: shared.rank,
            channel: f.semaphore_id,
            peer: None,
            refusal: Refusal::UnknownChannel { id: f.semaphore_id },
        });
        shared.raise_stop(DeviceError::InvalidArgument, f.semaphore_id);
        return;
    };
    let raise = |error: DeviceError| {
        channel.record.raise(
            Some(&shared.stop_word),
            f.semaphore_id,
            error,
            DeviceOp::PortPut,
            detail,
        );
    };
    // Relaxed: only the consumer writes `stopped`.
    if channel.stopped.load(Ordering::Relaxed) {
        // Skipped, not executed: make sure a flush waiting for it learns so, even if the
        // host has reported and lowered the channel's first failure meanwhile.
        raise(DeviceError::Aborted);
        return;
    }
    let peer = channel.connection.peer();
    let stop_with = |refusal: Refusal| {
        channel.stopped.store(true, Ordering::Relaxed);
        let error = match refusal {
            Refusal::OutOfBounds { .. } => DeviceError::OutOfBounds,
            _ => DeviceError::InvalidArgument,
        };
        shared.record(ProxyError::TriggerRefused {
            rank: shared.rank,
            channel: f.semaphore_id,
            peer: Some(peer),
            refusal,
        });
        raise(error);
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
                    .and_then(Option::as_ref)
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
        let written = if f.kind & trigger_type::FLAG != 0 {
            // A put with its signal: given to the connection together, which may send them
            // at once.
            let signal = Signal {
                dst: &channel.remote_inbound,
                dst_off: 0,
                value: next_signal(channel),
            };
            let c = &channel.connection;
            c.write_and_signal(dst, f.dst_offset, src, f.src_offset, f.size, signal)
        } else {
            channel
                .connection
                .write(dst, f.dst_offset, src, f.src_offset, f.size)
        };
        if let Err(e) = written {
            return fail(shared, channel, f.semaphore_id, e);
        }
    } else if f.kind & trigger_type::FLAG != 0 {
        let value = next_signal(channel);
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

/// The value the channel's next signal stores into the peer's semaphore (one more than the
/// last).
fn next_signal(channel: &Channel) -> u64 {
    // Relaxed: only the consumer reads and writes it (see `Channel::outbound`).
    let value = channel.outbound.load(Ordering::Relaxed) + 1;
    channel.outbound.store(value, Ordering::Relaxed);
    value
}

/// Stops `channel` after its connection failed with `error`: recorded first, then raised
/// (see `execute`).
fn fail(shared: &Shared, channel: &Channel, id: u32, error: ProxyError) {
    channel.stopped.store(true, Ordering::Relaxed);
    shared.record(match error {
        // Already names the rank, the peer and the transport; the same error the rank's
        // other threads report when they notice the loss first.
        lost @ ProxyError::PeerLost { .. } => lost,
        other => ProxyError::Connection {
            rank: shared.rank,
            peer: channel.connection.peer(),
            transport: channel.connection.transport(),
            channel: id,
            message: other.to_string(),
        },
    });
    channel.record.raise(
        Some(&shared.stop_word),
        id,
        DeviceError::Aborted,
        DeviceOp::Unknown,
        [0; 3],
    );
}

#[cfg(test)]
mod tests {
    use super::SpinBudget;

    /// Guards against a proxy thread of a service without assist being counted only once
    /// it first runs: a kernel launched before then was placed as if no thread served a
    /// FIFO without assist. The thread is held before it runs while the count is read.
    #[cfg(not(oxccl_loom))]
    #[test]
    fn a_thread_without_assist_is_counted_before_it_runs() {
        use super::{Member, ProxyConfig, ProxyService};
        use crate::proxy_thread::{ProxyThread, unassisted_threads};
        use std::sync::atomic::Ordering;
        let service = ProxyService::new(ProxyConfig {
            assist: false,
            ..Default::default()
        })
        .unwrap();
        let member = Member {
            consumer: service.consumer.clone(),
            cells: service.cells.clone(),
            shared: service.shared.clone(),
            assist: false,
        };
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (_door, thread) = ProxyThread::spawn("held-proxy".into(), member, false, move || {
            let _ = held.recv();
        })
        .unwrap();
        // Other tests' threads only add to the count; this one's must be in it already.
        let counted = unassisted_threads();
        release.send(()).unwrap();
        service.shared.shutdown.store(true, Ordering::Release);
        thread.join().unwrap();
        assert!(
            counted >= 1,
            "a thread without assist was not counted before it ran"
        );
    }

    /// Guards against a spin budget that keeps spinning while the work only ever comes after
    /// yields (taking a core from the threads that produce it), or that never spins again
    /// once work comes quickly.
    #[test]
    fn spin_budget_follows_where_work_is_found() {
        let mut b = SpinBudget::default();
        for _ in 0..10 {
            b.work_found_after(500);
        }
        assert_eq!(
            b.polls(),
            1,
            "work only after yields: spin as little as possible"
        );
        b.work_found_after(1);
        assert_eq!(
            b.polls(),
            SpinBudget::RESTART,
            "work on the first poll: spin again"
        );
        for _ in 0..10 {
            b.work_found_after(2);
        }
        assert_eq!(
            b.polls(),
            SpinBudget::MAX,
            "work while spinning: up to the cap"
        );
        b.work_found_after(SpinBudget::MAX + 1);
        assert_eq!(b.polls(), SpinBudget::MAX / 2);
    }
}
