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
//! Who touches what: the host thread that runs [`run`] owns the coroutine until it returns
//! or suspends; after a suspension, the one pool thread given the [`Suspended`] owns it. The
//! thread-locals here belong to the host thread running [`run`] and are read only by its
//! wait hook, before the kernel thread can move.
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

use super::launch::Launch;
use super::pool::WORKER_STACK;
use super::stream::CpuStream;
pub(crate) use corosensei::stack::DefaultStack as Stack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use oxccl_device::arch::host::{DetachedContext, attach, detach, set_wait_hook};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

/// A coroutine running one kernel thread: resumed with the context the kernel thread
/// continues with (none at its start), it yields the context it was suspended with.
type KernelCoroutine = Coroutine<Option<DetachedContext>, DetachedContext, (), Stack>;

/// Stacks kept for the next kernel threads run here, at most this many: mapping a 2 MiB
/// stack per run would cost more than the hand-off it saves.
const SPARE_STACKS: usize = 4;

/// A kernel thread suspended at a wait on the host thread that ran it, to be finished by a
/// pool thread.
pub(crate) struct Suspended {
    coroutine: KernelCoroutine,
    stream: Arc<CpuStream>,
    launch: Arc<Launch>,
    context: DetachedContext,
}

// SAFETY: the coroutine's stack holds the frames of one kernel thread (the launch's
// `run_thread` and the kernel below it), suspended inside `spin_pause`. Kernel code is device
// code: it holds parameters, raw pointers to device memory and atomics, all `Send`, and no
// thread-locals (see `oxccl_device::arch::host`); the emulator's own thread-local context
// travels in `context` and is put on the pool thread before the kernel thread continues.
// The host thread that suspended it never touches the coroutine again.
unsafe impl Send for Suspended {}

impl Suspended {
    /// Runs the kernel thread to its end on the calling (pool) thread; returns its stream
    /// and launch, whose thread the caller then reports done.
    pub(crate) fn finish(self) -> (Arc<CpuStream>, Arc<Launch>) {
        let Suspended {
            mut coroutine,
            stream,
            launch,
            context,
        } = self;
        let mut context = Some(context);
        // A pool thread installs no wait hook, so the kernel thread runs to its end; the
        // loop only guards against a hook installed by mistake.
        while let CoroutineResult::Yield(again) = coroutine.resume(context.take()) {
            context = Some(again);
        }
        recycle(coroutine.into_stack());
        (stream, launch)
    }
}

/// Runs thread `index` of `launch` (of `stream`) on the calling thread, on `stack`, until
/// it returns (`Ok`, with the stack for the next one), or until it waits past `deadline`,
/// where it is suspended and returned (`Err`).
///
/// The caller has claimed thread `index` (no other thread runs it) and reports it done
/// once it returns here or in [`Suspended::finish`].
pub(crate) fn run(
    stream: &Arc<CpuStream>,
    launch: &Arc<Launch>,
    index: u32,
    stack: Stack,
    deadline: Option<Instant>,
) -> Result<Stack, Box<Suspended>> {
    let kernel_launch = launch.clone();
    let mut coroutine = KernelCoroutine::with_stack(stack, move |yielder, _| {
        enter_inline(yielder);
        kernel_launch.run_thread(index);
    });
    let previous = install(deadline);
    let outcome = coroutine.resume(None);
    uninstall(previous);
    match outcome {
        CoroutineResult::Return(()) => Ok(coroutine.into_stack()),
        CoroutineResult::Yield(context) => Err(Box::new(Suspended {
            coroutine,
            stream: stream.clone(),
            launch: launch.clone(),
            context,
        })),
    }
}

/// A stack for [`run`]: a spare one, else a new one (`None` if it cannot be mapped).
pub(crate) fn stack() -> Option<Stack> {
    if let Some(stack) = SPARES.lock().pop() {
        return Some(stack);
    }
    Stack::new(WORKER_STACK).ok()
}

/// Keeps `stack` for a later [`run`], or unmaps it if enough are kept already.
pub(crate) fn recycle(stack: Stack) {
    let mut spares = SPARES.lock();
    if spares.len() < SPARE_STACKS {
        spares.push(stack);
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
    /// Waits of the kernel threads this thread ran in [`run`], for [`CLOCK_EVERY`].
    static WAITS: Cell<u32> = const { Cell::new(0) };
    /// The deadline of the kernel thread this thread runs in [`run`].
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The yielder of the coroutine this thread runs in [`run`] (null outside one).
    static YIELDER: Cell<*const Yielder<Option<DetachedContext>, DetachedContext>> =
        const { Cell::new(std::ptr::null()) };
}

/// What [`install`] replaced on the calling thread, for [`uninstall`].
struct Installed {
    hook: Option<oxccl_device::arch::host::WaitHook>,
    deadline: Option<Instant>,
}

/// Makes the calling (host) thread's waits call [`wait_hook`] and sets the deadline past
/// which it suspends the kernel thread it runs.
///
/// Never inlined, as every function here that reaches a thread-local: the compiler takes a
/// thread-local's address to be the same for the whole of a function, and may compute it
/// once and keep it across calls; a function whose frame is on a kernel thread's stack when
/// it moves to another OS thread would then read the old thread's variable. Keeping each
/// access in a small function that returns before any wait makes that impossible, whatever
/// inlines the rest (a source rule checks it: the test `thread_locals_only_in_never_inlined_fns`
/// of `xtask`).
#[inline(never)]
fn install(deadline: Option<Instant>) -> Installed {
    Installed {
        hook: set_wait_hook(Some(wait_hook)),
        deadline: DEADLINE.with(|d| d.replace(deadline)),
    }
}

/// Undoes [`install`] once the coroutine returned or suspended: the thread is no longer
/// running a kernel thread of its own.
#[inline(never)]
fn uninstall(previous: Installed) {
    DEADLINE.with(|d| d.set(previous.deadline));
    YIELDER.with(|y| y.set(std::ptr::null()));
    set_wait_hook(previous.hook);
}

/// Records the running coroutine's yielder for [`wait_hook`]; runs on the host thread, in
/// the coroutine, before the kernel thread starts. Never inlined (see [`install`]).
#[inline(never)]
fn enter_inline(yielder: &Yielder<Option<DetachedContext>, DetachedContext>) {
    YIELDER.with(|y| y.set(yielder));
}

/// The yielder to suspend with, if the kernel thread run here is past its deadline (and
/// not unwinding: a thread that suspends mid-panic would leave this thread's panic count
/// raised for good).
#[inline(never)]
fn due() -> Option<&'static Yielder<Option<DetachedContext>, DetachedContext>> {
    let deadline = DEADLINE.with(Cell::get)?;
    // The clock every `CLOCK_EVERY` waits: reading it at each spin of a short wait cost
    // about 5% of a 1 KiB all-reduce.
    if !WAITS
        .with(|w| w.replace(w.get().wrapping_add(1)))
        .is_multiple_of(CLOCK_EVERY)
    {
        return None;
    }
    let yielder = YIELDER.with(Cell::get);
    if yielder.is_null() || Instant::now() < deadline || std::thread::panicking() {
        return None;
    }
    // SAFETY: `YIELDER` is set by the coroutine this thread is running, whose yielder lives
    // until it returns; it is cleared as soon as `resume` returns in `run`, and the hook
    // runs only inside that `resume`.
    Some(unsafe { &*yielder })
}

/// The wait hook of a host thread running a kernel thread: past the deadline, suspends it
/// (taking the emulator's context off this thread), and, once resumed on a pool thread,
/// puts the context there.
fn wait_hook() {
    let Some(yielder) = due() else {
        return;
    };
    let back = yielder.suspend(detach());
    // Now on the pool thread that resumed the coroutine.
    if let Some(context) = back {
        attach(context);
    }
}

#[cfg(test)]
mod tests;
