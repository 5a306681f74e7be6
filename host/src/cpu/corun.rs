//! Kernel threads of several streams taking turns on one host thread (co-running).
//!
//! Two ranks of one process whose one-thread kernels wait for each other (a ping-pong, a
//! small collective) each run their kernel thread on their own host thread (see
//! [`super::inline`]). Where the process has fewer cores than threads with work (the two
//! kernel threads and the proxy threads that carry their signals, on a 2-core machine),
//! those threads hand the cores to each other through the OS at every wait: each hand-off
//! is a yield and a context switch, some 0.7 µs on a 2-core VM, several per round trip. A
//! GPU runs both kernels at once; the emulator gets closest by running them on one OS
//! thread as coroutines that take turns at their waits (a coroutine switch costs tens of
//! nanoseconds), leaving the other cores to the proxies.
//!
//! Who: the streams of devices that communicators run on (a rank's device; see
//! `Communicator::new`); other devices' kernel threads keep their own host threads.
//!
//! How: the first thread (a host thread in `synchronize`, or a pool thread that took the
//! launch first) about to run a one-thread kernel thread while the policy wants kernel
//! threads to take turns ([`wanted`]) opens the process's *runner* ([`open`]). Another
//! thread about to run one finds the runner open and instead *donates* its kernel thread
//! ([`donate`]), with a stack; a host thread then waits for its launch to
//! complete as it would for a pool thread. Each thread tries to open the runner first and
//! donates only if it could not ([`place`]), each under the registry's lock: two threads
//! about to run kernel threads at the same moment (two ranks launching at once) then always
//! end up runner and guest, never both apart (donating first, both could find no runner,
//! and one then run apart from the runner the other opened, for the whole launch). The
//! runner takes donations at its next wait and from then on switches kernel threads at
//! every wait (the wait hook of [`super::inline`]). When its own kernel thread returns (or passes its host's deadline)
//! the runner closes, and every kernel thread it still holds goes to a pool thread of its
//! own, as a kernel thread suspended at the deadline does: no kernel thread ever waits for
//! the runner's host code.
//!
//! When: [`CorunPolicy`], from `OXCCL_CPU_CORUN`. By default (`auto`) a kernel thread is
//! donated only when it would make more threads want a core than the process has cores:
//! the kernel threads running (the runner's among them) and the proxy threads that execute
//! triggers themselves and stay hot between them (those serving a FIFO without proxy
//! assist; [`oxccl_proxy::proxy_thread::unassisted_threads`]), plus itself; and only
//! while the kernel threads alone fit the cores (see [`auto_wants`]: three or more ranks'
//! kernel threads co-run on 2 cores were several times slower than apart). Where cores
//! are enough, each kernel thread keeps its own and they run in parallel, as on a GPU: two
//! ranks' port all-reduce of 64 KiB-4 MiB on 2 cores with proxy assist (its kernel threads
//! executing their own triggers, the proxy parked) took 1.3-3 times as long co-run, their
//! element-wise work done on one core instead of two. Counting the proxy threads polling
//! at the moment of the launch instead left a ping-pong without assist apart for whole
//! launches, when its proxy happened to be parked between them.
//!
//! And for how long: a kernel thread whose turns run kernel code longer than
//! [`TURN_LIMIT`] (two timed turns in a row) computes more than it waits; the runner then
//! closes, its guests go to pool threads, and that kernel runs apart for [`SOLO_FOR`].
//!
//! A kernel thread that never waits keeps its turn until it returns, as it would keep its
//! core (a kernel that spins without the device library's waits starves the others until
//! the runner's deadline moves them to pool threads).

use super::inline::Stack;
use super::launch::Launch;
use super::stream::CpuStream;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU8, AtomicUsize, Ordering};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// When kernel threads of different streams take turns on one host thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CorunPolicy {
    /// When one more kernel thread would make more threads want a core than there are
    /// cores (see the module docs).
    Auto,
    /// Whenever another host thread runs a one-thread kernel thread (tests, and machines
    /// busy with other work).
    Always,
    /// Never: each host thread runs its own kernel thread.
    Never,
}

impl CorunPolicy {
    /// The policy `OXCCL_CPU_CORUN` names (`auto`, `always`, `never`; unset: `auto`); an
    /// unknown name is logged and taken as `auto`.
    pub(crate) fn from_env() -> Self {
        match std::env::var("OXCCL_CPU_CORUN").as_deref() {
            Err(_) | Ok("auto") => CorunPolicy::Auto,
            Ok("always") => CorunPolicy::Always,
            Ok("never") => CorunPolicy::Never,
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "OXCCL_CPU_CORUN is not auto, always or never; taking auto"
                );
                CorunPolicy::Auto
            }
        }
    }
}

/// A one-thread kernel thread given to the runner, claimed by its donor (no one else runs
/// it), with a stack to run it on.
pub(crate) struct Donation {
    pub(crate) stream: Arc<CpuStream>,
    pub(crate) launch: Arc<Launch>,
    pub(crate) index: u32,
    pub(crate) stack: Stack,
}

/// Two timed turns in a row longer than this (kernel code run, not counting a wait's
/// yields and sleeps) end co-running for the runner's launch: the kernel thread that took
/// them computes more than it waits, and the others are better off on cores of their own.
/// A polling turn takes some 0.1 µs; one turn alone may be the OS taking the core mid-turn.
pub(crate) const TURN_LIMIT: Duration = Duration::from_micros(5);

/// How long a kernel whose turn passed [`TURN_LIMIT`] runs apart (neither runner nor
/// guest) before it is given turns again.
const SOLO_FOR: Duration = Duration::from_millis(50);

/// The process's runner, the donations it has not taken yet, and the kernels that run
/// apart for now.
struct Registry {
    runner: Option<ThreadId>,
    inbox: Vec<Donation>,
    /// Kernels (their `KernelInfo` addresses) that took a turn longer than [`TURN_LIMIT`],
    /// and until when they run apart; a few at most (entries past their time are dropped
    /// when one is added).
    solo: Vec<(usize, Instant)>,
}

impl Registry {
    fn apart(&self, launch: &Launch) -> bool {
        let kernel = kernel_key(launch);
        self.solo
            .iter()
            .any(|&(k, until)| k == kernel && Instant::now() < until)
    }

    /// Whether a runner on another thread than `me` would take a thread of `launch`.
    fn takes(&self, me: ThreadId, launch: &Launch) -> bool {
        self.runner.is_some_and(|r| r != me) && !self.apart(launch)
    }
}

/// Whether a kernel thread of `launch` (of `stream`) may take turns at
/// all: the only thread of its launch, on a device that allows it.
fn may_take_turns(stream: &CpuStream, launch: &Launch) -> bool {
    launch.total_threads() == 1 && stream.device.corun.load(Ordering::Relaxed)
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    runner: None,
    inbox: Vec::new(),
    solo: Vec::new(),
});

/// What identifies a launch's kernel in [`Registry::solo`].
pub(crate) fn kernel_key(launch: &Launch) -> usize {
    launch.kernel as *const _ as usize
}

/// Raised (Release) when the inbox gets a donation; the runner's waits read it (Relaxed, a
/// shared cache line that changes once per donation) and take the inbox under its lock.
static MAIL: AtomicBool = AtomicBool::new(false);

/// Shards of [`RUNNING`].
const RUNNING_SHARDS: usize = 16;

/// Kernel threads running in this process now (see [`KernelThreadCount`]): the sum of the
/// shards, each counted by the threads that start kernel threads on it. One count shared by
/// every thread made two ranks launching on two cores at once pass its cache line between
/// them three times a launch (count, uncount, and the placement's read); on the 2-rank
/// 8-byte all-reduce, [`place`] took 4.6 % of all samples, nearly all on its first load of
/// that line.
static RUNNING: [CachePadded<AtomicIsize>; RUNNING_SHARDS] =
    [const { CachePadded::new(AtomicIsize::new(0)) }; RUNNING_SHARDS];

/// The sum of [`RUNNING`]'s shards (a hint: the shards are read one after another).
fn running() -> usize {
    let sum: isize = RUNNING.iter().map(|s| s.load(Ordering::Relaxed)).sum();
    sum.max(0) as usize
}

/// The shard of [`RUNNING`] the calling thread counts on: threads take shards in turn.
/// Never inlined, as every function that names a thread-local in the emulator (see
/// `inline.rs`: a kernel thread taking turns may go on on another host thread).
#[inline(never)]
fn running_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % RUNNING_SHARDS;
    }
    SHARD.with(|s| *s)
}

/// The policy: 0 not read yet, else 1 + the [`CorunPolicy`] index.
static POLICY: AtomicU8 = AtomicU8::new(0);

/// The policy in force (from `OXCCL_CPU_CORUN` on first use, unless set).
pub(crate) fn policy() -> CorunPolicy {
    match POLICY.load(Ordering::Relaxed) {
        1 => CorunPolicy::Auto,
        2 => CorunPolicy::Always,
        3 => CorunPolicy::Never,
        _ => {
            let policy = CorunPolicy::from_env();
            set_policy(policy);
            policy
        }
    }
}

/// Sets the policy for the rest of the process (the environment is not read again).
pub(crate) fn set_policy(policy: CorunPolicy) {
    let code = match policy {
        CorunPolicy::Auto => 1,
        CorunPolicy::Always => 2,
        CorunPolicy::Never => 3,
    };
    POLICY.store(code, Ordering::Relaxed);
}

/// This machine's cores (as the process may use them), read once.
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Counts a kernel thread as running while it lives: one per `Launch::run_thread`. It
/// uncounts on the shard it counted on, whichever thread drops it.
pub(crate) struct KernelThreadCount {
    shard: usize,
}

impl KernelThreadCount {
    pub(crate) fn start() -> Self {
        let shard = running_shard();
        RUNNING[shard].fetch_add(1, Ordering::Relaxed);
        KernelThreadCount { shard }
    }
}

impl Drop for KernelThreadCount {
    fn drop(&mut self) {
        RUNNING[self.shard].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether one more kernel thread should take turns with the runner's instead of getting
/// a host thread of its own.
fn wanted() -> bool {
    match policy() {
        CorunPolicy::Always => true,
        CorunPolicy::Never => false,
        // The count includes the runner's kernel thread, counted even before it has begun
        // (a runner runs one, and a donation is only asked of a runner: two ranks
        // launching at once would otherwise each see none running, and run apart for the
        // whole launch); the one to place makes one more.
        CorunPolicy::Auto => auto_wants(
            running,
            oxccl_proxy::proxy_thread::unassisted_threads(),
            cores(),
        ),
    }
}

/// The `auto` policy: whether one more kernel thread, with `running` kernel threads
/// running and `proxies` proxy threads executing triggers themselves, should take turns on
/// a machine of `cores` cores: where the kernel threads fit the cores on their own, but
/// not with the proxies.
///
/// `running` includes the runner's kernel thread, counted even before it has begun (a
/// runner runs one, and a donation is only asked of a runner: two ranks launching at once
/// would otherwise each see none running, and run apart for the whole launch); the one to
/// place makes one more.
///
/// Why not also where the kernel threads alone are more than the cores: a runner then runs
/// three or more of them on one core while their host threads, waiting for them, and the
/// kernel threads running apart compete for the other. Four ranks in one process on 2
/// cores took 28-45 µs an all-reduce of 8 B-32 KiB co-run that way, 6-13 µs each kernel
/// thread on its own host thread; three ranks 8-19 µs against 3.4-7.6, eight 92-130
/// against 12-24 (`collectives --ranks N`, with `OXCCL_CPU_CORUN=auto` and `never`, in
/// turns). Two ranks whose proxies execute their triggers (a ping-pong without proxy
/// assist, 0.21 µs a round trip co-run, 3.4 µs apart) are what co-running is for.
///
/// `running` is asked only where it decides: with no such proxy the kernel threads fit the
/// cores or not on their own, and never take turns.
fn auto_wants(running: impl FnOnce() -> usize, proxies: usize, cores: usize) -> bool {
    if proxies == 0 {
        return false;
    }
    let kernels = running().max(1) + 1;
    kernels <= cores && kernels + proxies > cores
}

/// Where a kernel thread that a thread claimed runs (see [`place`]).
pub(crate) enum Placement {
    /// On the claiming thread, which is now the process's runner: others' kernel threads
    /// take turns with it (run it with [`super::inline::run`], handing the runner over).
    Runner(Runner),
    /// On the runner of another thread, which reports it done: the claiming thread waits
    /// for its launch as for a pool thread's.
    Donated,
    /// On the claiming thread, alone.
    Alone,
}

/// Where thread `index` of `launch` (of `stream`), claimed by the calling thread (a host
/// thread in `synchronize` or a pool thread), runs: alone if it may not take turns or the
/// policy does not want it to now ([`wanted`]); else this thread opens the runner if it
/// can, else donates the kernel thread to the runner, else runs it alone. Runner first,
/// each step under the registry's lock: two threads about to run kernel threads at the
/// same moment then end up runner and guest (see the module docs).
///
/// The policy is asked before the runner is opened too: every one-thread launch used to
/// open and close the runner, three takes of the registry's lock, which every rank's
/// thread shares; with two ranks on two cores (where no one donates) that was some 0.1 µs
/// of a 0.5 µs small all-reduce. A thread that finds co-running wanted later opens the
/// runner itself.
pub(crate) fn place(stream: &Arc<CpuStream>, launch: &Arc<Launch>, index: u32) -> Placement {
    if !may_take_turns(stream, launch) || !wanted() {
        return Placement::Alone;
    }
    if let Some(runner) = open(launch) {
        Placement::Runner(runner)
    } else if donate(stream, launch, index).is_ok() {
        Placement::Donated
    } else {
        Placement::Alone
    }
}

/// Gives thread `index` of one-thread `launch` (of `stream`), claimed by the caller, to the
/// runner, if there is one on another thread; else hands it back. (Whether it may and
/// should take turns, [`place`] asked.)
///
/// On `Ok` the runner completes the thread (reports it done); the caller waits for its
/// launch as for a pool thread's.
fn donate(stream: &Arc<CpuStream>, launch: &Arc<Launch>, index: u32) -> Result<(), ()> {
    // Cheap look first: most calls find no runner (the stack is got outside the lock).
    let me = std::thread::current().id();
    if !REGISTRY.lock().takes(me, launch) {
        return Err(());
    }
    let Some(stack) = super::inline::stack() else {
        return Err(());
    };
    let mut registry = REGISTRY.lock();
    if !registry.takes(me, launch) {
        drop(registry);
        super::inline::recycle(stack);
        return Err(());
    }
    registry.inbox.push(Donation {
        stream: stream.clone(),
        launch: launch.clone(),
        index,
        stack,
    });
    // Release: with the inbox's lock, the runner that sees it finds the donation.
    MAIL.store(true, Ordering::Release);
    Ok(())
}

/// The runner of this process, held by the host thread that opened it; closed by
/// [`Runner::close`] or when dropped: no more donations, and those not taken yet go to pool
/// threads.
pub(crate) struct Runner {
    me: ThreadId,
    closed: Cell<bool>,
    _not_send: core::marker::PhantomData<*const ()>,
}

/// Makes the calling host thread the process's runner, if there is none and `launch`
/// (whose kernel thread is about to run here) does not run apart for now. (Whether its
/// kernel thread may and should take turns, [`place`] asked.)
fn open(launch: &Launch) -> Option<Runner> {
    let mut registry = REGISTRY.lock();
    if registry.runner.is_some() || registry.apart(launch) {
        return None;
    }
    let me = std::thread::current().id();
    registry.runner = Some(me);
    Some(Runner {
        me,
        closed: Cell::new(false),
        _not_send: core::marker::PhantomData,
    })
}

/// Whether a donation waits for the runner (read at its waits).
#[inline]
pub(crate) fn mail() -> bool {
    MAIL.load(Ordering::Relaxed)
}

impl Runner {
    /// Hands each donation given since the last call to `take` (none once closed), under
    /// the registry's lock; the inbox keeps its capacity, so donations do not allocate.
    pub(crate) fn take_mail(&self, mut take: impl FnMut(Donation)) {
        if self.closed.get() {
            return;
        }
        let mut registry = REGISTRY.lock();
        MAIL.store(false, Ordering::Relaxed);
        registry.inbox.drain(..).for_each(&mut take);
    }

    /// Closes the runner after a turn of `kernel` (see [`kernel_key`]) took longer than
    /// [`TURN_LIMIT`]: that kernel runs apart for a while.
    pub(crate) fn close_after_long_turn(&self, kernel: usize) {
        {
            let mut registry = REGISTRY.lock();
            let now = Instant::now();
            registry.solo.retain(|&(_, until)| until > now);
            registry.solo.push((kernel, now + SOLO_FOR));
        }
        self.close();
    }

    /// No more donations; those not taken yet go to pool threads.
    pub(crate) fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        {
            let mut registry = REGISTRY.lock();
            if registry.runner != Some(self.me) {
                return;
            }
            registry.runner = None;
            MAIL.store(false, Ordering::Relaxed);
        }
        // One at a time, each out of the lock (a pool thread may be spawned for it); no
        // donation comes in meanwhile, there being no runner. The inbox keeps its capacity.
        while let Some(donation) = {
            let mut registry = REGISTRY.lock();
            registry.inbox.pop()
        } {
            super::inline::to_pool(super::inline::Suspended::fresh(donation));
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::auto_wants;

    /// Guards the `auto` policy: kernel threads take turns where they fit the cores only
    /// without the proxies that execute triggers, and not where they are more than the
    /// cores on their own (three or more kernel threads of one process on 2 cores co-run
    /// were several times slower than apart), nor where everything fits.
    #[test]
    fn auto_co_runs_only_where_the_proxies_tip_the_cores() {
        // Two ranks on 2 cores, each with an unassisted proxy: the second kernel thread
        // (the first counted even before it runs) takes turns.
        assert!(auto_wants(|| 0, 2, 2));
        assert!(auto_wants(|| 1, 1, 2));
        // Two ranks with proxy assist: the kernel threads have a core each, whatever runs
        // (the count, a read of every shard, is not asked for).
        assert!(!auto_wants(|| 1, 0, 2));
        assert!(!auto_wants(
            || unreachable!("the count is not needed"),
            0,
            2
        ));
        // A third or fourth rank's kernel thread on 2 cores: apart, proxies or not.
        assert!(!auto_wants(|| 2, 0, 2));
        assert!(!auto_wants(|| 3, 0, 2));
        assert!(!auto_wants(|| 2, 2, 2));
        // Cores enough for kernel threads and proxies.
        assert!(!auto_wants(|| 1, 2, 8));
        assert!(auto_wants(|| 3, 5, 8));
    }
}
