//! Kernel threads run by the host thread that waits for them.
//!
//! A host thread in `synchronize` has nothing to do but wait; handing a kernel thread to a
//! pool thread and waiting for it costs two thread hand-offs (a few microseconds, tens where
//! a parked thread must be woken on an idle core of a virtual machine). So the waiting
//! thread may run one kernel thread itself ([`run`]): on a stack of its own (a coroutine),
//! not on the caller's, because `synchronize` must return at its deadline whatever the
//! kernel does. At a wait of the kernel thread past that deadline ([`spin_pause`] calls the
//! hook installed here), the kernel thread is suspended and returned as [`Suspended`]; a
//! pool thread resumes it ([`Suspended::finish`]) and the host thread returns its timeout,
//! as it would if a pool thread had run the kernel thread from the start.
//!
//! The thread that opened the process's runner (see [`super::corun`]; a host thread, or a
//! pool thread with no deadline) also runs the kernel threads other threads donate to it,
//! each on a coroutine of its own: at every wait of the running one the hook suspends it
//! ([`Pause::Turn`]) and the next one runs until its own next wait ([`take_turns`]). When the host's own kernel thread returns
//! or is late, those still running go to pool threads as [`Suspended`]. A kernel thread
//! suspended at one of the device library's waits leaves what it waits for (an
//! [`Awaited`], a test of one word): the runner tests it in place of resuming the kernel
//! thread for a poll, and resumes it once the test holds, or after [`SKIPS`] polls in a row
//! (so that its own loop still looks at its deadline and its rank's stop word).
//!
//! Who touches what: the host thread that runs [`run`] owns its coroutines until they
//! return or it hands them over; after that, the one pool thread given a [`Suspended`] owns
//! it. The thread-locals here belong to the host thread running [`run`] and are read only
//! by its wait hook, before the kernel thread can move.
//!
//! A kernel thread that never waits cannot be suspended: it holds its host thread until it
//! returns, past the deadline if it must (a kernel that spins on a flag without
//! `spin_pause`, or waits with anything but the device library's waits, does that). Nor is
//! one suspended while it unwinds (see [`due`]); and a host thread that is itself unwinding
//! runs none (`synchronize` from a drop during a panic only waits).
//!
//! Thread-locals: a kernel thread's frames may continue on another OS thread after any
//! wait, and the compiler may keep a thread-local's address across calls within one
//! function. So every function here (and in the device arch layer) that reaches a
//! thread-local is never inlined and returns before any wait (see [`install`]); kernel code
//! must not use thread-locals of its own (a GPU has none either).
//!
//! [`spin_pause`]: oxccl_device::arch::spin_pause

use super::corun::{self, Donation, Runner};
use super::launch::Launch;
use super::pool::{WORKER_STACK, pool};
use super::stream::CpuStream;
pub(crate) use corosensei::stack::DefaultStack as Stack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use oxccl_device::arch::Awaited;
use oxccl_device::arch::host::{attach, detach, set_wait_hook, time_given_up};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Why a kernel thread run here stopped at a wait.
///
/// The emulator's context of the kernel thread (its indices, block barrier and last
/// failure) stays on the coroutine's own stack while it is suspended, in the frame of
/// [`wait_hook`], which takes it off the OS thread before suspending and puts it on
/// whichever OS thread resumes the coroutine: nothing of it is moved at a switch. Carried
/// out and back in the coroutine's yield and resume values, some 100 bytes were copied
/// four times a turn: a co-run memory ping-pong took 0.18 µs a round trip, against 0.11
/// with the context kept in place.
#[derive(Clone, Copy)]
pub(crate) enum Pause {
    /// Past the host's deadline: it moves to a pool thread.
    Late,
    /// Its turn is over: another kernel thread taking turns here (see [`super::corun`])
    /// runs until its next wait. With what the wait waits for, where it says.
    Turn(Option<Awaited>),
}

/// A coroutine running one kernel thread: it yields why it stopped.
type KernelCoroutine = Coroutine<(), Pause, (), Stack>;
type KernelYielder = Yielder<(), Pause>;

/// Polls in a row a runner makes with a suspended kernel thread's [`Awaited`] in place of
/// resuming it; the next turn resumes it, and its own wait loop polls once more, which
/// looks at its deadline and stop word every so many polls, and counts towards the host's
/// deadline in [`due`].
const SKIPS: u32 = 8;

/// Tests of its [`Awaited`] a runner makes for one wait in all, after which that wait is
/// resumed at every turn again, as without them. The wait's back-off counts only its own
/// polls: it goes on to yield the core (and then sleep) after so many of them, whether or
/// not tests came between. Without this bound, a wait for a thread that needs this core
/// would spin up to [`SKIPS`] + 1 times as long before its first yield; with it, it spins
/// at most this many tests longer (a few microseconds).
const PROBES_PER_WAIT: u32 = 256;

/// Stacks kept for the next kernel threads run here, at most this many: mapping a 2 MiB
/// stack per run would cost more than the hand-off it saves.
const SPARE_STACKS: usize = 4;

/// A kernel thread stopped (or not yet started) on the host thread that ran it, to be
/// finished by a pool thread.
pub(crate) struct Suspended {
    coroutine: KernelCoroutine,
    stream: Arc<CpuStream>,
    launch: Arc<Launch>,
}

// SAFETY: the coroutine's stack holds the frames of one kernel thread (the launch's
// `run_thread` and the kernel below it), suspended inside `spin_pause`, or none yet. Kernel
// code is device code: it holds parameters, raw pointers to device memory and atomics, all
// `Send`, and no thread-locals (see `oxccl_device::arch::host`); the emulator's own
// thread-local context is in the suspended frame of `wait_hook`, which puts it on the pool
// thread before the kernel thread continues. The host thread that suspended it never
// touches the coroutine again.
unsafe impl Send for Suspended {}

impl Suspended {
    /// A donated kernel thread, not started, on its donation's stack.
    pub(crate) fn fresh(donation: Donation) -> Self {
        let Donation {
            stream,
            launch,
            index,
            stack,
        } = donation;
        Suspended {
            coroutine: kernel_coroutine(&launch, index, stack),
            stream,
            launch,
        }
    }

    /// Runs the kernel thread to its end on the calling (pool) thread; returns its stream
    /// and launch, whose thread the caller then reports done.
    pub(crate) fn finish(self) -> (Arc<CpuStream>, Arc<Launch>) {
        let Suspended {
            mut coroutine,
            stream,
            launch,
        } = self;
        // A pool thread installs no wait hook, so the kernel thread runs to its end; the
        // loop only guards against a hook installed by mistake.
        while let CoroutineResult::Yield(_) = coroutine.resume(()) {}
        recycle(coroutine.into_stack());
        (stream, launch)
    }
}

/// Gives `suspended` to a pool thread to finish; if none can be had, finishes it here.
pub(crate) fn to_pool(suspended: Suspended) {
    if let Err(failed) = pool().resume(suspended) {
        let (suspended, err) = *failed;
        tracing::error!(
            stream = suspended.stream.id,
            %err,
            "no thread to move a kernel thread to; it ends here"
        );
        let (stream, launch) = suspended.finish();
        stream.thread_done(launch);
    }
}

/// The coroutine of thread `index` of `launch`, on `stack`.
fn kernel_coroutine(launch: &Arc<Launch>, index: u32, stack: Stack) -> KernelCoroutine {
    let launch = launch.clone();
    KernelCoroutine::with_stack(stack, move |yielder, _| {
        enter_inline(yielder);
        launch.run_thread(index);
    })
}

/// One kernel thread taking turns on the runner's host thread.
struct Turn {
    coroutine: KernelCoroutine,
    /// Its stream and launch, for a donated one (the host's own is reported by the caller
    /// of [`run`]).
    donated: Option<(Arc<CpuStream>, Arc<Launch>)>,
    /// Its coroutine's yielder, once it has run (null before).
    yielder: *const KernelYielder,
    /// Whether its last timed turn ran longer than [`corun::TURN_LIMIT`] (its next turn
    /// is timed too).
    suspect: bool,
    /// What the wait it is suspended at waits for, if it says.
    awaited: Option<Awaited>,
    /// Turns skipped in a row because `awaited` did not hold.
    skipped: u32,
    /// Tests of `awaited` for the current wait (see [`PROBES_PER_WAIT`]).
    probed: u32,
}

/// Runs thread `index` of `launch` (of `stream`) on the calling thread, on `stack`, until
/// it returns (`Ok`, with the stack for the next one), or until it waits past `deadline`,
/// where it is suspended and returned (`Err`). Meanwhile, if this thread opened the
/// process's runner (`runner`, from [`corun::place`] for this launch), kernel threads
/// donated by other host threads take turns with it at every wait; those not finished
/// when it returns or is suspended go to pool threads.
///
/// The caller has claimed thread `index` (no other thread runs it) and reports it done
/// once it returns here or in [`Suspended::finish`].
pub(crate) fn run(
    stream: &Arc<CpuStream>,
    launch: &Arc<Launch>,
    index: u32,
    stack: Stack,
    deadline: Option<Instant>,
    runner: Option<corun::Runner>,
) -> Result<Stack, Box<Suspended>> {
    // Taken by reference, not moved in and out of `take_turns`: each move of a `Turn` is
    // a copy of some 180 bytes, and there were several a launch.
    let mut own = Turn::new(kernel_coroutine(launch, index, stack), None);
    let previous = install(deadline, runner.is_some());
    let late = take_turns(&mut own, launch, runner.as_ref());
    uninstall(previous);
    // Closing the runner sends donations it never took to pool threads.
    drop(runner);
    if late {
        return Err(Box::new(Suspended {
            coroutine: own.coroutine,
            stream: stream.clone(),
            launch: launch.clone(),
        }));
    }
    Ok(own.coroutine.into_stack())
}

/// Runs `own` (a thread of `launch`) and the kernel threads donated to `runner` in turns
/// until `own` returns or one of them waits past the host's deadline; donated threads not
/// finished by then go to pool threads, as they do as soon as a turn passes
/// [`corun::TURN_LIMIT`] (the runner then closes, and `own` runs on alone). Returns whether
/// `own` is late (suspended, to be resumed elsewhere) rather than returned.
fn take_turns(own: &mut Turn, launch: &Launch, runner: Option<&Runner>) -> bool {
    let Some(runner) = runner else {
        // Not the runner: no guest can come, and the own thread's waits end no turn, only
        // its deadline (the guests' queue and its thread-local were some 5 % of an empty
        // launch and its `synchronize`).
        loop {
            match own.step() {
                Step::Returned => return false,
                Step::Late => return true,
                Step::Turn => {}
            }
        }
    };
    // This thread's queue of guests, empty between calls: reused, so taking turns does not
    // allocate.
    let mut guests = take_guest_queue();
    // Turns so far, for timing one in `TIME_EVERY`.
    let mut turns = 0u32;
    let mut timed = |suspect: bool| {
        turns = turns.wrapping_add(1);
        (suspect || turns.is_multiple_of(TIME_EVERY)).then(TurnClock::start)
    };
    let outcome = loop {
        if corun::mail() {
            runner.take_mail(|d| {
                let coroutine = kernel_coroutine(&d.launch, d.index, d.stack);
                guests.push_back(Turn::new(coroutine, Some((d.stream, d.launch))));
            });
        }
        set_turns(!guests.is_empty());
        // Alone, the own thread waits in its own loop, not in turns.
        if guests.is_empty() || !own.skip() {
            // Turns are timed only while there are others to take them.
            let began = if guests.is_empty() {
                None
            } else {
                timed(own.suspect)
            };
            let step = own.step();
            if let Some(began) = began
                && own.judge(began)
            {
                run_apart(runner, corun::kernel_key(launch), &mut guests);
            }
            match step {
                Step::Returned => break false,
                Step::Late => break true,
                Step::Turn => {}
            }
        }
        // Each guest once, in place (a `Turn` is some 200 bytes: rotating the queue moved
        // each twice a turn), then the own thread again.
        let mut late = false;
        let mut i = 0;
        while i < guests.len() {
            let guest = &mut guests[i];
            if guest.skip() {
                i += 1;
                continue;
            }
            let kernel = guest.donated.as_ref().map(|(_, l)| corun::kernel_key(l));
            let began = timed(guest.suspect);
            let step = guest.step();
            let long = began.is_some_and(|b| guest.judge(b));
            match step {
                Step::Returned => {
                    if let Some(guest) = guests.remove(i) {
                        recycle(guest.coroutine.into_stack());
                        if let Some((stream, launch)) = guest.donated {
                            stream.thread_done(launch);
                        }
                    }
                }
                Step::Turn => i += 1,
                Step::Late => {
                    // The host's deadline passed while a guest ran: the own kernel
                    // thread is late too; the guest goes to a pool thread with the rest.
                    late = true;
                    break;
                }
            }
            if long {
                let kernel = kernel.unwrap_or_else(|| corun::kernel_key(launch));
                run_apart(runner, kernel, &mut guests);
                break;
            }
        }
        if late {
            break true;
        }
    };
    set_turns(false);
    evict(&mut guests);
    keep_guest_queue(guests);
    outcome
}

/// This thread's (empty) queue of guests, with the capacity it grew to.
#[inline(never)]
fn take_guest_queue() -> VecDeque<Turn> {
    GUESTS.with(Cell::take)
}

/// Keeps `guests` (emptied) for this thread's next [`take_turns`].
#[inline(never)]
fn keep_guest_queue(guests: VecDeque<Turn>) {
    debug_assert!(guests.is_empty());
    GUESTS.with(|g| g.set(guests));
}

/// One turn in this many is timed against [`corun::TURN_LIMIT`]: a clock read costs some
/// 25 ns here, as much as a turn of a kernel thread that only polls, and a kernel thread
/// that computes more than it waits takes long turns often enough to be caught by one.
const TIME_EVERY: u32 = 8;

/// When a timed turn began, and the time its thread had given up in waits by then.
#[derive(Clone, Copy)]
struct TurnClock {
    at: Instant,
    given_up: std::time::Duration,
}

impl TurnClock {
    fn start() -> Self {
        TurnClock {
            at: Instant::now(),
            given_up: time_given_up(),
        }
    }

    /// How long the turn ran kernel code: its time less what its waits spent yielding the
    /// core or asleep (a kernel thread whose wait sleeps is waiting, not computing).
    fn ran(self) -> std::time::Duration {
        self.at
            .elapsed()
            .saturating_sub(time_given_up().saturating_sub(self.given_up))
    }
}

/// Ends co-running after long turns of `kernel` (see [`corun::kernel_key`]): the runner
/// closes and keeps that kernel apart for a while, the host's own kernel thread runs on
/// alone, and `guests` go to pool threads.
fn run_apart(runner: &Runner, kernel: usize, guests: &mut VecDeque<Turn>) {
    runner.close_after_long_turn(kernel);
    stop_turns();
    evict(guests);
}

/// Sends every donated kernel thread in `guests` to a pool thread of its own.
fn evict(guests: &mut VecDeque<Turn>) {
    for guest in guests.drain(..) {
        if let Some((stream, launch)) = guest.donated {
            to_pool(Suspended {
                coroutine: guest.coroutine,
                stream,
                launch,
            });
        }
    }
}

/// What one turn of a kernel thread ended with.
enum Step {
    Returned,
    Late,
    Turn,
}

impl Turn {
    /// A kernel thread on `coroutine`, not started yet; `donated` names the stream and
    /// launch of a donated one.
    fn new(coroutine: KernelCoroutine, donated: Option<(Arc<CpuStream>, Arc<Launch>)>) -> Self {
        Turn {
            coroutine,
            donated,
            yielder: std::ptr::null(),
            suspect: false,
            awaited: None,
            skipped: 0,
            probed: 0,
        }
    }

    /// Whether this turn is skipped: the kernel thread is suspended at a wait that said
    /// what it waits for ([`Awaited`]), that does not hold yet, and fewer than [`SKIPS`]
    /// turns in a row (and [`PROBES_PER_WAIT`] for this wait) were skipped.
    fn skip(&mut self) -> bool {
        let Some(awaited) = self.awaited else {
            return false;
        };
        if self.skipped >= SKIPS || self.probed >= PROBES_PER_WAIT {
            return false;
        }
        // SAFETY: `awaited` is set from the suspension the coroutine is in (`step`), and
        // cleared before it is resumed: the wait that gave it, and the handle whose memory
        // it names, are live until then.
        if unsafe { awaited.holds() } {
            return false;
        }
        self.skipped += 1;
        self.probed += 1;
        true
    }

    /// Whether the turn timed by `clock` (just ended) makes this kernel thread one to run
    /// apart: its second timed turn in a row that ran kernel code longer than
    /// [`corun::TURN_LIMIT`] (one alone may be the OS taking the core mid-turn).
    fn judge(&mut self, clock: TurnClock) -> bool {
        let long = clock.ran() > corun::TURN_LIMIT;
        let apart = long && self.suspect;
        self.suspect = long;
        apart
    }

    /// Runs the kernel thread until its next wait that ends its turn, its deadline, or its
    /// end.
    fn step(&mut self) -> Step {
        set_yielder(self.yielder);
        // What the wait waited for is not tested once it goes on (it may end, and its
        // handle with it).
        let before = self.awaited.take();
        self.skipped = 0;
        match self.coroutine.resume(()) {
            CoroutineResult::Return(()) => Step::Returned,
            CoroutineResult::Yield(Pause::Late) => Step::Late,
            CoroutineResult::Yield(Pause::Turn(awaited)) => {
                self.yielder = yielder();
                if awaited != before {
                    // Another wait than the one suspended at before.
                    self.probed = 0;
                }
                self.awaited = awaited;
                Step::Turn
            }
        }
    }
}

/// A stack for [`run`]: the one this thread kept, else a spare one of the process, else a
/// new one (`None` if it cannot be mapped). Never inlined (see [`install`]).
///
/// Each thread keeps the last stack it gave back for itself: the process's spares are
/// behind one lock, which the ranks' host threads took at every launch, all at once in a
/// collective (a few percent of a small all-reduce's time in that lock's cache line alone).
#[inline(never)]
pub(crate) fn stack() -> Option<Stack> {
    if let Some(stack) = KEPT_STACK.with(Cell::take) {
        return Some(stack);
    }
    if let Some(stack) = SPARES.lock().pop() {
        return Some(stack);
    }
    Stack::new(WORKER_STACK).ok()
}

/// Keeps `stack` for this thread's next [`stack`], or for the process's if this thread
/// keeps one already, or unmaps it if enough are kept. Never inlined (see [`install`]).
#[inline(never)]
pub(crate) fn recycle(stack: Stack) {
    let Some(older) = KEPT_STACK.with(|k| k.replace(Some(stack))) else {
        return;
    };
    let mut spares = SPARES.lock();
    if spares.len() < SPARE_STACKS {
        spares.push(older);
    }
}

/// Whether the calling thread is running a kernel thread of its own (inside [`run`]).
#[inline(never)]
pub(crate) fn running_here() -> bool {
    !YIELDER.with(Cell::get).is_null()
}

static SPARES: Mutex<Vec<Stack>> = Mutex::new(Vec::new());

/// How often (in waits) the wait hook reads the clock.
const CLOCK_EVERY: u32 = 32;

std::thread_local! {
    /// The stack this thread last gave back (see [`stack`]), unmapped when the thread ends.
    static KEPT_STACK: Cell<Option<Stack>> = const { Cell::new(None) };
    /// Waits of the kernel threads this thread ran in [`run`], for [`CLOCK_EVERY`].
    static WAITS: Cell<u32> = const { Cell::new(0) };
    /// The deadline of the kernel thread this thread runs in [`run`].
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The yielder of the coroutine this thread runs in [`run`] (null outside one).
    static YIELDER: Cell<*const KernelYielder> = const { Cell::new(std::ptr::null()) };
    /// What this thread is to the kernel threads it runs (see [`Hosting`]).
    static HOSTING: Cell<Hosting> = const { Cell::new(Hosting::Not) };
    /// The runner's queue of guests, kept empty between its calls of [`take_turns`].
    static GUESTS: Cell<VecDeque<Turn>> = const { Cell::new(VecDeque::new()) };
}

/// What a host thread is to the kernel threads it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hosting {
    /// Runs none (outside [`run`]; pool threads).
    Not,
    /// Runs its own, alone.
    Own,
    /// The process's runner, running its own alone so far: its waits look for donations.
    Runner,
    /// The runner, with donated kernel threads: every wait ends a turn.
    Turns,
}

/// What [`install`] replaced on the calling thread, for [`uninstall`].
struct Installed {
    hook: Option<oxccl_device::arch::host::WaitHook>,
    deadline: Option<Instant>,
    hosting: Hosting,
}

/// Makes the calling (host) thread's waits call [`wait_hook`], sets the deadline past
/// which it suspends the kernel thread it runs, and says whether it is the runner.
///
/// Never inlined, as every function here that reaches a thread-local: the compiler takes a
/// thread-local's address to be the same for the whole of a function, and may compute it
/// once and keep it across calls; a function whose frame is on a kernel thread's stack when
/// it moves to another OS thread would then read the old thread's variable. Keeping each
/// access in a small function that returns before any wait makes that impossible, whatever
/// inlines the rest (a source rule checks it: the test `thread_locals_only_in_never_inlined_fns`
/// of `xtask`).
#[inline(never)]
fn install(deadline: Option<Instant>, runner: bool) -> Installed {
    let hosting = if runner {
        Hosting::Runner
    } else {
        Hosting::Own
    };
    Installed {
        hook: set_wait_hook(Some(wait_hook)),
        deadline: DEADLINE.with(|d| d.replace(deadline)),
        hosting: HOSTING.with(|h| h.replace(hosting)),
    }
}

/// Undoes [`install`] once the coroutines returned or suspended: the thread is no longer
/// running a kernel thread of its own.
#[inline(never)]
fn uninstall(previous: Installed) {
    DEADLINE.with(|d| d.set(previous.deadline));
    YIELDER.with(|y| y.set(std::ptr::null()));
    HOSTING.with(|h| h.set(previous.hosting));
    set_wait_hook(previous.hook);
}

/// Says whether the runner has donated kernel threads (every wait then ends a turn).
/// Never inlined (see [`install`]).
#[inline(never)]
fn set_turns(guests: bool) {
    HOSTING.with(|h| {
        if matches!(h.get(), Hosting::Runner | Hosting::Turns) {
            h.set(if guests {
                Hosting::Turns
            } else {
                Hosting::Runner
            });
        }
    });
}

/// Ends co-running on this thread: its own kernel thread runs on alone, its waits no
/// longer end turns. Never inlined (see [`install`]).
#[inline(never)]
fn stop_turns() {
    HOSTING.with(|h| {
        if matches!(h.get(), Hosting::Runner | Hosting::Turns) {
            h.set(Hosting::Own);
        }
    });
}

/// Makes `yielder` (null: none yet) the one [`wait_hook`] suspends with, before a
/// coroutine is resumed here. Never inlined (see [`install`]).
#[inline(never)]
fn set_yielder(yielder: *const KernelYielder) {
    YIELDER.with(|y| y.set(yielder));
}

/// The yielder of the coroutine that yielded last here. Never inlined (see [`install`]).
#[inline(never)]
fn yielder() -> *const KernelYielder {
    YIELDER.with(Cell::get)
}

/// Records the running coroutine's yielder for [`wait_hook`]; runs in the coroutine, before
/// the kernel thread starts, on a host thread in [`run`] (a donated kernel thread started
/// on a pool thread has no hook, and records nothing). Never inlined (see [`install`]).
#[inline(never)]
fn enter_inline(yielder: &KernelYielder) {
    if HOSTING.with(Cell::get) != Hosting::Not {
        YIELDER.with(|y| y.set(yielder));
    }
}

/// Whether the kernel thread run here stops at this wait, and why: past its deadline, or
/// to let another kernel thread take its turn; never while unwinding (a thread that
/// suspends mid-panic would leave this thread's panic count raised for good).
#[inline(never)]
fn due() -> Option<(&'static KernelYielder, bool)> {
    let turn = match HOSTING.with(Cell::get) {
        Hosting::Turns => true,
        Hosting::Runner => corun::mail(),
        Hosting::Own | Hosting::Not => false,
    };
    // The clock every `CLOCK_EVERY` waits: reading it at each spin of a short wait cost
    // about 5% of a 1 KiB all-reduce.
    let late = DEADLINE.with(Cell::get).is_some_and(|deadline| {
        WAITS
            .with(|w| w.replace(w.get().wrapping_add(1)))
            .is_multiple_of(CLOCK_EVERY)
            && Instant::now() >= deadline
    });
    if !turn && !late {
        return None;
    }
    let yielder = YIELDER.with(Cell::get);
    if yielder.is_null() || std::thread::panicking() {
        return None;
    }
    // SAFETY: `YIELDER` is set for the coroutine this thread is running, whose yielder
    // lives until it returns; it is cleared as soon as `run` ends, and the hook runs only
    // inside a `resume` of `run`.
    Some((unsafe { &*yielder }, late))
}

/// The wait hook of a host thread running kernel threads: past the deadline, suspends the
/// running one (taking the emulator's context off this thread), and, once resumed on a
/// pool thread, puts the context there; between turns, suspends it the same way until the
/// runner resumes it here.
fn wait_hook(awaited: Option<Awaited>) -> bool {
    let Some((yielder, late)) = due() else {
        return false;
    };
    // Kept in this frame, on the coroutine's stack, while it is suspended (see [`Pause`]).
    let context = detach();
    yielder.suspend(match late {
        true => Pause::Late,
        false => Pause::Turn(awaited),
    });
    // Now on the thread that resumed the coroutine.
    attach(context);
    true
}

#[cfg(test)]
mod tests;
