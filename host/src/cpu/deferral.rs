//! Launches left for the host thread that will synchronize them, and the thread that
//! starts those no host thread comes for.
//!
//! A launch on an idle stream used to go to a pool worker at once, and the launching host
//! thread, in `synchronize` a moment later, mostly took it back and ran it itself (see
//! [`super::stream`]): a hand-off and a take-back through the pool's lock and the worker's
//! cache lines, and often a worker woken from its park, for a kernel no worker ran. In a
//! two-rank loop of small all-reduces each synchronized in turn, that was a fifth of a
//! call (the pool's dispatch alone some 18 % of a rank thread's time).
//!
//! Now such a launch is *deferred*: left for a helper as if one were waiting, no worker
//! told. The `synchronize` that follows runs it on its host thread. A launch that nobody
//! synchronizes soon (a host that launches, then waits on something else: a bootstrap
//! barrier, another stream, a buffer's drop) must still run, as a GPU's kernel does: the
//! *starter* thread looks at every stream's deferred launch once a period and dispatches
//! to the pool one it saw deferred at its previous look as well, so a deferred launch
//! waits at most about two periods for a worker. A deferred launch keeps its stream
//! alive until it is claimed or dispatched (a stream dropped right after a launch still
//! runs it, as before).
//!
//! The period adapts to whether the starter is needed: it halves (to [`MIN_PERIOD`]) at
//! each look that had to start a launch, and doubles (to [`MAX_PERIOD`]) at each look
//! that had not. Each look wakes a thread, some microseconds of CPU on a virtual machine
//! and a rank's core taken for that long: looking every 200 µs made two ranks' loops of
//! small all-reduces 10 % slower, although their `synchronize` came for every deferred
//! launch. A program whose launches wait for the starter (a host that launches, then
//! waits for a peer's bootstrap message) has them started within two short periods after
//! the first few.
//!
//! One host thread that launches on several streams and then synchronizes them one by
//! one (a thread driving several ranks, as a single-threaded NCCL program drives its
//! devices) must not leave a kernel waiting for another's deferred launch: a thread keeps
//! at most one launch deferred (deferring another, on another stream, starts the one
//! before), and a thread about to wait starts its deferred launch on any other stream
//! (`synchronize` of another stream, a bootstrap barrier).
//!
//! The starter costs nothing while no launch is deferred: after [`QUIET_FOR`] without one
//! it parks until a deferral wakes it. The handshake: a deferring thread publishes its
//! launch in the stream's deferral word, then reads whether the starter is awake, and
//! wakes it if not; the starter, before it parks, says it is asleep, then reads every
//! deferral word once more (all four accesses `SeqCst`, so one side always sees the
//! other's store).
//!
//! `OXCCL_CPU_DEFER=never` turns deferral off (every launch on an idle stream goes to the
//! pool at once, as before).

use super::stream::CpuStream;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Shortest time between two looks of the starter (while it keeps having to start
/// launches).
const MIN_PERIOD: Duration = Duration::from_micros(100);

/// Longest time between two looks (while every deferred launch it sees is claimed by a
/// host thread): a launch that then comes to need the starter waits at most twice this.
const MAX_PERIOD: Duration = Duration::from_millis(4);

/// How long the starter goes on looking after the last deferred launch it saw, before it
/// parks until the next deferral.
const QUIET_FOR: Duration = Duration::from_millis(50);

/// A stream's deferral word: the number (1-based, in enqueue order) of its launch that is
/// deferred, or 0.
pub(crate) type DeferralWord = Arc<CachePadded<AtomicU64>>;

/// A new stream's deferral word, 0.
pub(crate) fn new_word() -> DeferralWord {
    Arc::new(CachePadded::new(AtomicU64::new(0)))
}

/// Whether launches may be deferred in this process (`OXCCL_CPU_DEFER`, read once:
/// `never` turns it off; anything else, or unset, leaves it on).
pub(crate) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| match std::env::var("OXCCL_CPU_DEFER").as_deref() {
        Ok("never") => false,
        Err(_) | Ok("auto") => true,
        Ok(other) => {
            tracing::warn!(
                value = other,
                "OXCCL_CPU_DEFER is not auto or never; taking auto"
            );
            true
        }
    })
}

std::thread_local! {
    /// The launch this thread deferred last, while it may still be deferred: its stream
    /// and its number.
    static OWN: Cell<Option<(Weak<CpuStream>, u64)>> = const { Cell::new(None) };
}

/// Notes that this thread deferred launch `number` of `stream`; the launch it deferred
/// before, on another stream, is started now (see the module docs). Never inlined: it
/// reaches a thread-local (see `inline::install`).
#[inline(never)]
pub(crate) fn note_own(stream: &Arc<CpuStream>, number: u64) {
    let before = OWN.replace(Some((Arc::downgrade(stream), number)));
    start_unless_on(before, Some(stream));
}

/// Starts the launch this thread deferred last, if it is still deferred and not on
/// `except` (whose `synchronize` is about to run it): called before this thread waits.
/// Never inlined (see [`note_own`]).
#[inline(never)]
pub(crate) fn start_own(except: Option<&Arc<CpuStream>>) {
    start_unless_on(OWN.take(), except);
}

/// Starts deferred launch `own` (a stream and a number) unless it is on `except`.
fn start_unless_on(own: Option<(Weak<CpuStream>, u64)>, except: Option<&Arc<CpuStream>>) {
    let Some((stream, number)) = own else {
        return;
    };
    if except.is_some_and(|e| std::ptr::eq(Arc::as_ptr(e), stream.as_ptr())) {
        return;
    }
    if let Some(stream) = stream.upgrade() {
        stream.start_deferred(number);
    }
}

/// One stream as the starter sees it.
struct Watched {
    word: DeferralWord,
    stream: Weak<CpuStream>,
}

/// The starter: the streams it watches and whether it is awake.
struct Starter {
    streams: Mutex<Vec<Watched>>,
    /// Whether the starter is looking (or about to); false while it is parked for good.
    awake: CachePadded<AtomicBool>,
    thread: OnceLock<Thread>,
}

fn starter() -> &'static Starter {
    static STARTER: OnceLock<Starter> = OnceLock::new();
    STARTER.get_or_init(|| Starter {
        streams: Mutex::new(Vec::new()),
        awake: CachePadded::new(AtomicBool::new(false)),
        thread: OnceLock::new(),
    })
}

/// Has the starter watch `stream`, whose deferral word is `word` (once, when the stream is
/// made).
pub(crate) fn watch(stream: &Arc<CpuStream>, word: &DeferralWord) {
    let mut streams = starter().streams.lock();
    // Dropped streams are also let go here, not only by the starter's looks: a process
    // that makes many streams while the starter sleeps keeps a list as long as its live
    // ones, give or take a factor of two.
    if streams.len() >= 64 && streams.len().is_power_of_two() {
        streams.retain(|w| w.stream.strong_count() > 0);
    }
    streams.push(Watched {
        word: word.clone(),
        stream: Arc::downgrade(stream),
    });
}

/// Stops the starter watching `stream` (tests: its deferred launches then run only where
/// a host thread's own rules start them).
#[cfg(test)]
pub(crate) fn unwatch(stream: &Arc<CpuStream>) {
    starter()
        .streams
        .lock()
        .retain(|w| !std::ptr::eq(w.stream.as_ptr(), Arc::as_ptr(stream)));
}

/// Called by a thread that just deferred a launch (its number in the stream's word, with
/// `SeqCst`): wakes the starter if it is parked for good, starting it on first use.
///
/// Returns false if the starter cannot be started (no thread can be spawned): the caller
/// then dispatches its launch itself.
pub(crate) fn deferred() -> bool {
    let s = starter();
    // SeqCst: the deferring side of the handshake (see the module docs).
    if s.awake.load(Ordering::SeqCst) || s.awake.swap(true, Ordering::SeqCst) {
        return true;
    }
    if let Some(thread) = s.thread.get() {
        thread.unpark();
        return true;
    }
    spawn(s)
}

/// Starts the starter thread (the first deferral of the process); false if it cannot be.
fn spawn(s: &'static Starter) -> bool {
    static SPAWN: Mutex<()> = Mutex::new(());
    let _one = SPAWN.lock();
    if s.thread.get().is_some() {
        return true;
    }
    match std::thread::Builder::new()
        .name("oxccl-starter".into())
        .spawn(move || run(s))
    {
        Ok(handle) => {
            let _ = s.thread.set(handle.thread().clone());
            true
        }
        Err(err) => {
            tracing::error!(%err, "no thread to start deferred launches; launches go to the pool at once");
            s.awake.store(false, Ordering::SeqCst);
            false
        }
    }
}

/// The starter thread.
fn run(s: &'static Starter) {
    // The deferred launch of each watched stream at the last look (by the word's address).
    let mut seen: Vec<(usize, u64)> = Vec::new();
    let mut period = MIN_PERIOD;
    let mut last_seen = Instant::now();
    loop {
        let mut now: Vec<(usize, u64)> = Vec::new();
        let mut to_start: Vec<(Arc<CpuStream>, u64)> = Vec::new();
        {
            let mut streams = s.streams.lock();
            // A stream dropped (and not kept alive by a deferred launch) is watched no more.
            streams.retain(|w| w.stream.strong_count() > 0);
            for w in streams.iter() {
                // SeqCst: the starter's side of the handshake.
                let number = w.word.load(Ordering::SeqCst);
                if number == 0 {
                    continue;
                }
                let key = Arc::as_ptr(&w.word) as usize;
                now.push((key, number));
                if seen.contains(&(key, number))
                    && let Some(stream) = w.stream.upgrade()
                {
                    to_start.push((stream, number));
                }
            }
        }
        // Outside the list's lock: starting takes the stream's own lock.
        let started = !to_start.is_empty();
        for (stream, number) in to_start {
            stream.start_deferred(number);
        }
        period = if started {
            (period / 2).max(MIN_PERIOD)
        } else {
            (period * 2).min(MAX_PERIOD)
        };
        if !now.is_empty() {
            last_seen = Instant::now();
        }
        seen = now;
        if last_seen.elapsed() >= QUIET_FOR {
            // SeqCst: the starter's side of the handshake: asleep first, then one more look.
            s.awake.store(false, Ordering::SeqCst);
            let pending = s
                .streams
                .lock()
                .iter()
                .any(|w| w.word.load(Ordering::SeqCst) != 0);
            if pending {
                s.awake.store(true, Ordering::SeqCst);
            } else {
                // Until a deferral wakes it (a spurious return only costs a look).
                std::thread::park();
                s.awake.store(true, Ordering::SeqCst);
            }
            last_seen = Instant::now();
            continue;
        }
        std::thread::park_timeout(period);
    }
}
