//! The thread that drains the FIFOs of one or more proxy services whose pushers ring a
//! doorbell (the CPU backend's), and the process's shared one.
//!
//! A service has a thread of its own, or (with [`crate::ProxyConfig::share_thread`]) joins
//! the one thread of its process that serves every service joined to it: the in-process
//! ranks of a job then have one proxy thread between them, not one each. On a machine
//! with fewer cores than busy threads that is what keeps the proxy work off the kernels'
//! cores: with two ranks on two cores, two proxy threads beside the kernels handed the
//! cores back and forth by yielding at every signal (a two-rank port ping-pong without
//! assist took 3.5-8 µs a round trip with its kernel threads taking turns on one core, the
//! two proxy threads sharing the other: 66 000-80 000 involuntary switches each over the
//! timed runs, as long runnable-but-waiting as running); one thread polling both FIFOs
//! never waits for another proxy.
//!
//! The thread serves its members in turn: each poll drains every member's FIFO; it stays
//! hot after executing anything (spinning while that pays off, then yielding), and parks
//! only when every member's FIFO is empty, announcing it in every FIFO's head, so a push
//! to any of them rings the doorbell that wakes it ([`FifoCells::park_consumers`]). A
//! member stops being served when its service stops: the thread drains what was published
//! and lets it go; a shared thread with no members left ends, and the next service to join
//! starts another.

use crate::consumer_pacing;
use crate::fifo::FifoCells;
use crate::proxy_service::{Consumer, Shared, SpinBudget, StallWatch, drain, drain_held};
use parking_lot::lock_api::ArcMutexGuard;
use parking_lot::{Mutex, RawMutex};
use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Idle polls (without assist) before the proxy thread parks, the first [`SpinBudget`] of
/// them spinning and the rest yielding the core: a few milliseconds at most, after which it
/// waits for a push to wake it.
const YIELD_POLLS: u32 = 4096;
/// Longest the thread yields between polls before it parks, whatever [`YIELD_POLLS`] says.
const MAX_YIELDING: Duration = Duration::from_millis(5);
/// First park of an idle spell: a second guard behind the doorbell (a push to a parked
/// proxy wakes it; the timeout only bounds what the doorbell could miss, and paces the
/// stall watch).
const PARK_TIMEOUT: Duration = Duration::from_millis(5);
/// Longest park: each park of an idle spell that finds no work doubles the next, up to
/// this, so a communicator with nothing to do wakes its proxy 20 times a second, not 200.
const MAX_PARK_TIMEOUT: Duration = Duration::from_millis(50);
/// Idle polls between two looks for a stalled FIFO. The look reads the FIFO head, whose
/// cache line every push modifies: reading it on every poll took the line from the pushing
/// thread on every trigger (about 120 ns more per round trip on a 2-core x86 machine). A
/// stall is only reported after a whole wait limit, so a look every few thousand polls
/// (microseconds) loses nothing.
pub(crate) const STALL_CHECK_EVERY: u32 = 4096;

/// Members a proxy thread looks at without allocating when it parks (more still work).
const MEMBERS_INLINE: usize = 8;

/// One service as a proxy thread serves it.
pub(crate) struct Member {
    pub(crate) consumer: Arc<Mutex<Consumer>>,
    pub(crate) cells: Arc<FifoCells>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) assist: bool,
}

/// A proxy thread's door for services joining it.
pub(crate) struct ProxyThread {
    /// Services that joined and are not served yet.
    joining: Mutex<Vec<Member>>,
    /// Raised (Release) when `joining` gets one; the thread reads it at every poll.
    mail: AtomicBool,
    /// The OS thread, to wake it when a service joins.
    thread: std::sync::OnceLock<Thread>,
    /// Whether the thread is counted in [`unassisted_threads`].
    counted_unassisted: AtomicBool,
}

impl ProxyThread {
    /// Spawns a proxy thread serving `first`, named `name`; `place` runs on it first.
    pub(crate) fn spawn(
        name: String,
        first: Member,
        shared_by_process: bool,
        place: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<(Arc<ProxyThread>, std::thread::JoinHandle<()>)> {
        let unassisted = !first.assist;
        let door = Arc::new(ProxyThread {
            joining: Mutex::new(vec![first]),
            mail: AtomicBool::new(true),
            thread: std::sync::OnceLock::new(),
            counted_unassisted: AtomicBool::new(false),
        });
        // Counted before any kernel can push to it, not when the thread first runs: see
        // `count_unassisted`.
        door.count_unassisted(unassisted);
        let served = door.clone();
        let handle = std::thread::Builder::new().name(name).spawn(move || {
            place();
            serve(&served, shared_by_process);
        })?;
        let _ = door.thread.set(handle.thread().clone());
        Ok((door, handle))
    }

    /// Adds `member`, waking the thread.
    fn join(&self, member: Member) {
        if !member.assist {
            self.count_unassisted(true);
        }
        self.joining.lock().push(member);
        // Release: pairs with the Acquire swap in `serve`; the list's lock orders the rest.
        self.mail.store(true, Ordering::Release);
        self.wake();
    }

    /// Counts the thread in [`unassisted_threads`] if `unassisted` (it serves, or is about
    /// to serve, a FIFO without assist), else not.
    ///
    /// A service joining without assist is counted at once, by the joining thread: counted
    /// only once the proxy thread took it in (when it first ran, for a new thread), a
    /// kernel launched in between found no such thread and ran apart for its whole launch
    /// instead of taking turns (the emulator decides at a launch whether its kernel thread
    /// takes turns, and opens the process's runner only where it would).
    fn count_unassisted(&self, unassisted: bool) {
        // Relaxed: a count the emulator's placement reads as a hint.
        if self.counted_unassisted.swap(unassisted, Ordering::Relaxed) != unassisted {
            if unassisted {
                UNASSISTED.fetch_add(1, Ordering::Relaxed);
            } else {
                UNASSISTED.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Wakes the thread if parked.
    pub(crate) fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// Proxy threads of this process that serve a FIFO without assist (see
/// [`unassisted_threads`]).
static UNASSISTED: AtomicUsize = AtomicUsize::new(0);

/// How many proxy threads of this process serve at least one FIFO without assist: threads
/// that execute every trigger themselves and stay hot between triggers, so they want a core
/// while kernels push (a FIFO with assist has its triggers executed by the pushing kernel
/// threads, and its thread parks as soon as the ring is empty). The CPU emulator counts
/// them among the threads that want a core.
pub fn unassisted_threads() -> usize {
    UNASSISTED.load(Ordering::Relaxed)
}

/// Takes a proxy thread out of [`unassisted_threads`] when its `serve` ends, however it
/// ends (a panic included).
struct UncountAtEnd<'a>(&'a ProxyThread);

impl Drop for UncountAtEnd<'_> {
    fn drop(&mut self) {
        self.0.count_unassisted(false);
    }
}

/// The process's shared proxy thread, while it has members.
static SHARED_THREAD: Mutex<Option<Arc<ProxyThread>>> = Mutex::new(None);

/// Serves `member` from the process's shared proxy thread, starting it if there is none.
pub(crate) fn join_shared(member: Member) -> std::io::Result<Arc<ProxyThread>> {
    let mut shared = SHARED_THREAD.lock();
    if let Some(door) = shared.as_ref() {
        door.join(member);
        return Ok(door.clone());
    }
    // Detached: the thread ends when its last member leaves (each member's service waits
    // for that through its `attached` flag).
    let (door, _handle) = ProxyThread::spawn("oxccl-proxy".into(), member, true, || {})?;
    *shared = Some(door.clone());
    Ok(door)
}

/// A member and the thread's state of it.
struct Served {
    member: Member,
    /// Held while the thread is hot, for a member without assist.
    held: Option<ArcMutexGuard<RawMutex, Consumer>>,
    watch: StallWatch,
    stalled: bool,
}

/// The proxy thread: drain, execute, release every member's FIFO in turn; back off when
/// all are idle; let a member go once its service stops; end when none is left.
///
/// Without assist nobody else drains a FIFO, so the thread holds its consumer while it
/// polls (taking and releasing a lock on every poll costs two locked instructions, which also wait
/// for the thread's last store to a peer's semaphore). After executing something it polls
/// on, spinning as long as that pays off ([`SpinBudget`]) and then yielding the core between
/// polls, then parks. It used to spin 2048 polls first, with
/// the same kind of evidence against it: in the two-rank ping-pong both proxy threads spun
/// through each round trip (about 800 ms of CPU each over 15 000 round trips) while the
/// kernel threads, whose turn it mostly was, waited for a core (about 800 ms runnable but
/// not running each): 48 µs a round trip. Yielding instead, whichever thread has the next
/// step gets a core within a switch: 3.2 µs.
///
/// With assist the pushing kernel threads execute their own triggers, and the proxy thread
/// only catches what they leave (a push whose assist found the consumer taken): it parks as
/// soon as the ring is empty, and never stays hot. It used to stay hot like the unassisted
/// thread, and that made the emulator bimodal. A proxy thread woken by its park timeout
/// would sometimes find a trigger in flight and execute it. It then spun, and while it
/// spun it held the consumer on most polls, so pushers' assists failed. It executed their
/// triggers and stayed hot as long as they kept coming. A two-rank ping-pong on 2 cores
/// then had one proxy thread owning a core (242 ms of CPU over 5 timed runs, 89
/// involuntary switches). The two kernel threads shared the other core and handed it over
/// by yielding on every round trip (100 457 involuntary switches each, 122 ms runnable but
/// waiting): 2.4 µs a round trip instead of 0.39, for the life of the process
/// (`pingpong --processes 12 --thread-stats`). Parked, the proxy thread takes no core
/// from the ranks.
fn serve(door: &ProxyThread, shared_by_process: bool) {
    let mut members: Vec<Served> = Vec::new();
    let mut spin = SpinBudget::default();
    let mut idle = 0u32;
    let mut park_timeout = PARK_TIMEOUT;
    // When the current idle spell started yielding, if it has.
    let mut yielding_since: Option<Instant> = None;
    let mut unassisted = false;
    let _uncounted_at_end = UncountAtEnd(door);
    loop {
        // Acquire: pairs with the Release in `join`.
        if door.mail.swap(false, Ordering::Acquire) {
            members.extend(door.joining.lock().drain(..).map(|member| Served {
                member,
                held: None,
                watch: StallWatch::default(),
                stalled: false,
            }));
            unassisted = members.iter().any(|s| !s.member.assist);
            door.count_unassisted(unassisted);
        }
        let mut executed_any = false;
        // Whether an empty FIFO is looked at for a stall this poll (the idle polls counted
        // so far, this one included).
        let stall_look = idle.saturating_add(1).is_multiple_of(STALL_CHECK_EVERY);
        let mut i = 0;
        while i < members.len() {
            let s = &mut members[i];
            let (consumer, shared) = (&s.member.consumer, &*s.member.shared);
            // Stay hot only after executing something ourselves. `None` means a kernel
            // thread is assisting: that is its work, and spinning beside it would take its
            // core.
            let drained = match s.held.as_mut() {
                Some(held) => Some(drain_held(held, shared)),
                None if s.member.assist => drain(consumer, shared),
                None => {
                    let mut guard = consumer.lock_arc();
                    let drained = drain_held(&mut guard, shared);
                    s.held = Some(guard);
                    Some(drained)
                }
            };
            if let Some(executed @ 1..) = drained {
                executed_any = true;
                s.stalled = false;
                consumer_pacing::after_drain(executed);
                i += 1;
                continue;
            }
            // Acquire: pairs with the Release in `stop`. The drain above found the ring
            // empty after `stop` was possibly set; it executed everything published before.
            if shared.shutdown.load(Ordering::Acquire) && drained == Some(0) {
                let gone = members.swap_remove(i);
                drop(gone.held);
                // Release: the service's `stop` reads it with Acquire, after which nothing
                // of its FIFO is touched here.
                gone.member.shared.attached.store(false, Ordering::Release);
                unassisted = members.iter().any(|s| !s.member.assist);
                // A service joining meanwhile counted itself, and is taken in (and the
                // count set again) at the next look at the mail.
                door.count_unassisted(unassisted);
                continue;
            }
            if drained == Some(0) && (s.stalled || stall_look) {
                s.stalled = s.watch.idle(&s.member.cells, shared);
            }
            i += 1;
        }
        if members.is_empty() && leave(door, shared_by_process) {
            return;
        }
        if executed_any {
            spin.work_found_after(idle);
            idle = 0;
            yielding_since = None;
            park_timeout = PARK_TIMEOUT;
            continue;
        }
        idle = idle.saturating_add(1);
        // How long the thread stays hot after its last execution: not at all if every
        // member has assist.
        let yield_polls = if unassisted { YIELD_POLLS } else { 0 };
        let all_stalled = !members.is_empty() && members.iter().all(|s| s.stalled);
        if idle < yield_polls && !all_stalled {
            if idle <= spin.polls() {
                std::hint::spin_loop();
                continue;
            }
            // Yielding: bounded in time too, since each yield may give the core away for
            // a whole time slice where other threads want it (with two busy loops beside
            // it on 2 cores, 4096 yields took longer than 5 s).
            let since = *yielding_since.get_or_insert_with(Instant::now);
            if since.elapsed() < MAX_YIELDING {
                std::thread::yield_now();
                continue;
            }
        }
        yielding_since = None;
        // Leaving the hot phase: let go of the consumers, so nothing waits on a thread
        // that is about to park.
        for s in &mut members {
            s.held = None;
        }
        let stop = || {
            door.mail.load(Ordering::Relaxed)
                || members
                    .iter()
                    .any(|s| s.member.shared.shutdown.load(Ordering::Acquire))
        };
        // On the stack: a park refused (a claimed position not published yet, an assistant
        // draining) is tried again at once, so this runs in a loop while kernels push.
        let rings: SmallVec<[(&FifoCells, bool); MEMBERS_INLINE]> = members
            .iter()
            .map(|s| (&*s.member.cells, s.stalled))
            .collect();
        if !FifoCells::park_consumers(&rings, park_timeout, stop) {
            // A position is claimed but not executed yet (its pusher is about to publish,
            // or an assistant is draining), or a member is stopping or joining: not the
            // moment to park.
            std::thread::yield_now();
            continue;
        }
        // Parked, and the next drain may find nothing again: the next park is longer.
        park_timeout = (park_timeout * 2).min(MAX_PARK_TIMEOUT);
    }
}

/// Whether a proxy thread with no members ends now: its own service's thread does; the
/// shared one does unless a service joined meanwhile (decided under the process's lock, so
/// a service joining later starts a new one).
fn leave(door: &ProxyThread, shared_by_process: bool) -> bool {
    if !shared_by_process {
        return true;
    }
    let mut shared = SHARED_THREAD.lock();
    if door.mail.load(Ordering::Acquire) {
        return false;
    }
    if shared
        .as_ref()
        .is_some_and(|d| std::ptr::eq(Arc::as_ptr(d), door))
    {
        *shared = None;
    }
    true
}
