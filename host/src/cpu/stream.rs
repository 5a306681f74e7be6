//! One stream of the emulator: launches run one after the other, in enqueue order.
//!
//! A launch on an idle stream is left for the `synchronize` that likely follows it
//! (*deferred*, see [`super::deferral`]; a starter thread hands it to the pool if none
//! comes, and a second launch behind it hands it over at once); a launch on a busy stream
//! is queued, and the kernel thread that completes a launch starts the next one. No thread
//! belongs to a stream, so an idle stream costs nothing, and a launch that its host
//! synchronizes costs no hand-off at all.
//!
//! A host thread in `synchronize` *helps* until its launches are done or its deadline
//! passes: it runs kernel threads of the stream itself (see [`super::inline`]) instead of
//! waiting for pool threads to run them. It claims a thread of the running launch that no
//! worker has claimed yet, and, while it is registered as a helper (`helpers` in the
//! queue), a launch that becomes the running one is not dispatched to the pool but left
//! *for a helper*: the helper gives the launch's other threads to workers and runs one
//! itself. With nothing to claim (a worker runs the launch) it stays a helper and sleeps
//! until the stream completes a launch; the next one is then left for it. A helper that
//! stops helping (its launches are done, or its deadline passed) dispatches such a launch
//! if it was the last helper, so no launch waits for a helper that is gone; all of this
//! under the queue's lock.
//!
//! Counters: `submitted` (written by the enqueuing host thread, under `queue`) and
//! `completed` (written by the completing kernel thread, Release after the launch's
//! writes; read with Acquire by `synchronize`). Failures are kept in `error` until the
//! next `synchronize` takes them.

use super::corun::{self, Placement};
use super::deferral::{self, DeferralWord};
use super::launch::{FailureKind, Launch};
use super::pool::pool;
use super::{CpuDevice, Signal, inline};
use crate::Error;
use oxccl_device::launch::{KernelInfo, LaunchConfig};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most launches of a stream that may be enqueued and not complete; a launch beyond it
/// waits for room (see `CpuStream::make_room`).
pub(crate) const MAX_IN_FLIGHT: u64 = 1024;

/// Longest a launch waits for room in its stream's queue.
pub(crate) const ROOM_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Most completed launches a stream keeps for its next launches to reuse (see
/// [`Launch::new`]). A stream keeps the launches of its deepest queue so far, up to this:
/// calls enqueued back to back run ahead of their kernels, and with only a few kept, every
/// launch past them was allocated anew (and freed once run), in every burst of calls. At
/// some 600 bytes a launch, at most about 150 KiB a stream.
const SPARE_LAUNCHES: usize = 256;

/// A helper reads the clock (for its deadline) once every this many kernel threads it ran
/// (see `CpuStream::help`).
const HELP_CLOCK_EVERY: u32 = 8;

/// The shared state of one stream.
pub(crate) struct CpuStream {
    pub(crate) device: Arc<CpuDevice>,
    pub(crate) id: u64,
    queue: Mutex<Queue>,
    /// Launches enqueued so far.
    submitted: AtomicU64,
    /// Launches completed so far (never above `submitted`).
    completed: AtomicU64,
    /// Raised when `completed` grows.
    progress: Signal,
    /// The first failure since the last `synchronize`.
    error: Mutex<Option<Error>>,
    /// The number of the launch deferred now (see [`deferral`]), or 0; the starter thread
    /// reads it without the queue's lock.
    deferral: DeferralWord,
}

#[derive(Default)]
struct Queue {
    /// The launch whose threads are running (or left for a helper), if any.
    running: Option<Arc<Launch>>,
    /// Whether `running` was left for a helper to start, not dispatched (only while
    /// `helpers > 0`).
    for_helper: bool,
    /// Host threads helping in `synchronize`.
    helpers: u32,
    /// Launches waiting for `running` to complete, oldest first.
    pending: VecDeque<Arc<Launch>>,
    /// The stream itself while `running` is deferred (left for a helper that has not come
    /// yet; see [`deferral`]): a stream dropped meanwhile still runs it.
    keep_alive: Option<Arc<CpuStream>>,
    /// The launch completed last, until the next one completes: by then the kernel
    /// threads that ran it have let go of it, and it joins `spares`.
    retiring: Option<Arc<Launch>>,
    /// Completed launches, for the next launches to be made in (see [`Launch::new`]).
    spares: Vec<Arc<Launch>>,
}

/// A launch to dispatch once the queue's lock is released, and the stream's reference to
/// itself if that launch was deferred (see [`CpuStream::end_left`]).
#[derive(Default)]
struct Orphan {
    launch: Option<Arc<Launch>>,
    kept: Option<Arc<CpuStream>>,
}

impl Queue {
    /// Makes `next` the running launch; returns it if the caller must dispatch it, or
    /// leaves it for a helper if there is one.
    fn run_next(&mut self, next: Option<Arc<Launch>>) -> Option<Arc<Launch>> {
        self.running = next.clone();
        self.for_helper = next.is_some() && self.helpers > 0;
        if self.for_helper { None } else { next }
    }

    /// Keeps `completed` (the launch that just completed) for reuse, once the next one
    /// completes; drops what there is no room for.
    fn retire(&mut self, completed: Option<Arc<Launch>>) {
        if let Some(older) = std::mem::replace(&mut self.retiring, completed)
            && self.spares.len() < SPARE_LAUNCHES
        {
            self.spares.push(older);
        }
    }
}

impl CpuStream {
    /// A new stream of `device`, watched by the starter of deferred launches.
    pub(crate) fn new(device: Arc<CpuDevice>) -> Arc<Self> {
        let id = device.next_stream_id();
        let stream = Arc::new(Self {
            device,
            id,
            queue: Mutex::new(Queue::default()),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            progress: Signal::default(),
            error: Mutex::new(None),
            deferral: deferral::new_word(),
        });
        deferral::watch(&stream, &stream.deferral);
        stream
    }

    /// Copies the parameters and enqueues the launch; it starts now if the stream is idle.
    ///
    /// The caller has validated `config` and the parameter count.
    ///
    /// # Safety
    /// The i-th pointer of `params` must point to a valid value of the i-th parameter of
    /// `kernel`.
    pub(crate) unsafe fn launch(
        self: &Arc<Self>,
        kernel: &'static KernelInfo,
        config: LaunchConfig,
        params: &[*const c_void],
    ) -> crate::Result<()> {
        self.make_room()?;
        let mut deferred = 0;
        let to_start = {
            // One lock for the spare and the queue: each lock the host and the kernel
            // threads both take moves a cache line between cores, the larger part of a
            // launch's cost.
            let mut queue = self.queue.lock();
            let spare = queue.spares.pop();
            // SAFETY: forwarded contract.
            let launch = unsafe { Launch::new(kernel, config, params, spare)? };
            self.device.launch_enqueued();
            // Written only here, under the queue's lock: a load and a store, not a locked
            // instruction.
            let number = self.submitted.load(Ordering::Relaxed) + 1;
            self.submitted.store(number, Ordering::Relaxed);
            if queue.running.is_some() {
                queue.pending.push_back(launch);
                if queue.keep_alive.is_some() && queue.helpers == 0 {
                    // A launch behind a deferred one: this host enqueues on rather than
                    // synchronizing, so the deferred one goes to a worker now, to run
                    // while the host enqueues (two ranks' loops of small all-reduces
                    // without a synchronize each took 8-12 % longer with the launches left
                    // to the final `synchronize`).
                    self.end_left(&mut queue)
                } else {
                    Orphan::default()
                }
            } else if queue.helpers == 0 && deferral::enabled() {
                // Left for the `synchronize` that likely follows (see `deferral`).
                queue.running = Some(launch);
                queue.for_helper = true;
                queue.keep_alive = Some(self.clone());
                // SeqCst: the deferring side of the starter's handshake.
                self.deferral.store(number, Ordering::SeqCst);
                deferred = number;
                Orphan::default()
            } else {
                Orphan {
                    launch: queue.run_next(Some(launch)),
                    kept: None,
                }
            }
        };
        self.start_orphan(to_start);
        if deferred != 0 {
            deferral::note_own(self, deferred);
            if !deferral::deferred() {
                // No starter to rely on: to the pool now, as without deferral.
                self.start_deferred(deferred);
            }
        }
        Ok(())
    }

    /// Dispatches the deferred launch number `number` to the pool, if it is still deferred
    /// (no helper came for it, and none is waiting to): the starter's call, for a launch it
    /// saw deferred for a whole period.
    pub(crate) fn start_deferred(self: &Arc<Self>, number: u64) {
        let orphan = {
            let mut queue = self.queue.lock();
            // Relaxed: written under this lock.
            if !queue.for_helper
                || queue.helpers > 0
                || self.deferral.load(Ordering::Relaxed) != number
            {
                return;
            }
            self.end_left(&mut queue)
        };
        self.start_orphan(orphan);
    }

    /// Ends the running launch's being left for a helper (deferred or not): no helper
    /// will run it, so the caller must dispatch it once the queue's lock is released
    /// ([`Self::start_orphan`]).
    fn end_left(&self, queue: &mut Queue) -> Orphan {
        queue.for_helper = false;
        Orphan {
            kept: self.end_deferral(queue),
            launch: queue.running.clone(),
        }
    }

    /// Dispatches what [`Self::end_left`] (or the queue) handed over, outside the queue's
    /// lock, and drops the stream's reference to itself (not its last: the caller holds
    /// one).
    fn start_orphan(self: &Arc<Self>, orphan: Orphan) {
        let Orphan { launch, kept } = orphan;
        if let Some(launch) = launch {
            self.start(launch);
        }
        drop(kept);
    }

    /// Ends the deferral of the running launch, if it is deferred (it is being claimed or
    /// dispatched): returns the stream's reference to itself, for the caller to drop once
    /// the queue's lock is released.
    fn end_deferral(&self, queue: &mut Queue) -> Option<Arc<CpuStream>> {
        let kept = queue.keep_alive.take();
        if kept.is_some() {
            // Relaxed: the starter only dispatches after checking it again under the lock.
            self.deferral.store(0, Ordering::Relaxed);
        }
        kept
    }

    /// Waits, running kernel threads of the stream here, until fewer than
    /// [`MAX_IN_FLIGHT`] / 2 launches are not complete, if [`MAX_IN_FLIGHT`] are: the queue
    /// is bounded, as a GPU's is (a CUDA launch blocks while its stream's queue is full).
    /// Without the bound a loop of launches could run ahead of its kernels without limit,
    /// each queued launch holding its parameters.
    ///
    /// # Errors
    /// [`Error::Timeout`] if no room is made within [`ROOM_WAIT_LIMIT`]: a kernel that
    /// does not finish (the launch is not enqueued).
    fn make_room(self: &Arc<Self>) -> crate::Result<()> {
        let submitted = self.submitted.load(Ordering::Relaxed);
        // SeqCst: as in `synchronize`.
        if submitted.saturating_sub(self.completed.load(Ordering::SeqCst)) < MAX_IN_FLIGHT {
            return Ok(());
        }
        let target = submitted - MAX_IN_FLIGHT / 2;
        let started = Instant::now();
        let deadline = started.checked_add(ROOM_WAIT_LIMIT);
        let done = || self.completed.load(Ordering::SeqCst) >= target;
        self.help(target, deadline);
        if !self.progress.wait_for(target, done, deadline) {
            self.device.mark_stuck();
            return Err(Error::Timeout {
                what: format!(
                    "room in the launch queue ({MAX_IN_FLIGHT} launches not complete): {}",
                    self.describe_stuck()
                ),
                after: started.elapsed(),
            });
        }
        Ok(())
    }

    /// Reports a thread of `launch` done; the last one completes the launch, and starts the
    /// stream's next launch, if any.
    pub(crate) fn thread_done(self: &Arc<Self>, launch: Arc<Launch>) {
        if !launch.thread_done() {
            return;
        }
        if let Some(next) = self.finish(&launch) {
            self.start(next);
        }
    }

    /// As [`Self::thread_done`], for the pool worker that ran it: after a launch of one
    /// thread, a next launch of one thread is not handed to the pool but claimed for the
    /// worker to run at once (returned with its thread's index), as a GPU runs a stream's
    /// kernels back to back. Otherwise the worker is idle: `idle` puts it back on the
    /// pool's idle list *before* the thread is reported done, so that a launch the report
    /// starts finds it there instead of spawning another worker.
    pub(crate) fn thread_done_on_worker(
        self: &Arc<Self>,
        launch: Arc<Launch>,
        idle: impl FnOnce(),
    ) -> Option<(Arc<Launch>, u32)> {
        if launch.total_threads() != 1 {
            idle();
            self.thread_done(launch);
            return None;
        }
        if !launch.thread_done() {
            // Not reached: the only thread of a launch is its last.
            idle();
            return None;
        }
        let to_start = match self.finish(&launch) {
            Some(next) if next.total_threads() == 1 => match next.claim_thread() {
                Some(index) => return Some((next, index)),
                // A helper claimed it first (it is the running launch): it runs there.
                None => None,
            },
            other => other,
        };
        idle();
        if let Some(next) = to_start {
            self.start(next);
        }
        None
    }

    /// Waits for every launch enqueued before this call, at most `timeout`, then reports
    /// (and forgets) the first failure since the last call. Runs kernel threads of the
    /// stream on the calling thread while it waits (see the module docs).
    pub(crate) fn synchronize(self: &Arc<Self>, timeout: Duration) -> crate::Result<()> {
        let target = self.submitted.load(Ordering::Relaxed);
        // The coarse clock: a fine reading was a tenth of an empty launch's cost, at every
        // call; the deadline may then be a tick late, never early.
        let started = super::coarse_clock::now_or_later();
        let deadline = started.checked_add(timeout);
        // SeqCst: acquires the kernels' writes (pairs with the SeqCst increment in
        // `finish`), and is the waiter's half of the `Signal` handshake.
        let done = || self.completed.load(Ordering::SeqCst) >= target;
        if !done() {
            self.help(target, deadline);
        }
        if !self.progress.wait_for(target, done, deadline) {
            self.device.mark_stuck();
            return Err(Error::Timeout {
                what: self.describe_stuck(),
                after: started.elapsed(),
            });
        }
        match self.error.lock().take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Runs kernel threads of the stream on the calling thread until `target` launches have
    /// completed, or the deadline; then stops helping.
    fn help(self: &Arc<Self>, target: u64, deadline: Option<Instant>) {
        // A kernel thread that waits for its own stream (it cannot: it is not a host
        // thread) must not help, nor may a thread run two kernel threads at once. Nor may a
        // thread that is unwinding (a `synchronize` in a drop during a panic): a kernel
        // thread it ran could not be suspended at the deadline (see `inline::due`), and a
        // kernel that never finishes would hold `synchronize` for good.
        if inline::running_here() || std::thread::panicking() {
            return;
        }
        // This thread's deferred launch on another stream may be what ours waits for.
        deferral::start_own(Some(self));
        // Mapped on first use, kept across the kernel threads run here.
        let Some(mut stack) = inline::stack() else {
            return;
        };
        // Registered as a helper with the first claim, under the same lock (each lock the
        // host and the kernel threads both take is a locked instruction or two on a shared
        // line; two fewer were some 7 % of an empty launch and its `synchronize`).
        let mut joined = false;
        let mut ran: u32 = 0;
        loop {
            // Read before the claim: a launch completed after it (whose successor is then
            // left for this thread) ends the sleep below at once.
            // SeqCst: as in `done`.
            let seen = self.completed.load(Ordering::SeqCst);
            if seen >= target {
                break;
            }
            let claimed = self.claim_for_helper(!joined);
            joined = true;
            if let Some((launch, index)) = claimed {
                let runner = match corun::place(self, &launch, index) {
                    Placement::Runner(runner) => Some(runner),
                    Placement::Alone => None,
                    Placement::Donated => {
                        // The runner of the process runs it, taking turns with its own
                        // kernel thread; wait for it below as for a pool thread.
                        if !self.wait_past(seen, deadline) {
                            break;
                        }
                        continue;
                    }
                };
                match inline::run(self, &launch, index, stack, deadline, runner) {
                    Ok(back) => {
                        stack = back;
                        self.thread_done(launch);
                    }
                    Err(suspended) => {
                        // Past the deadline: a worker finishes the kernel thread, and
                        // `synchronize` reports the timeout.
                        inline::to_pool(*suspended);
                        self.stop_helping();
                        return;
                    }
                }
                // The clock once every `HELP_CLOCK_EVERY` kernel threads run here (a read
                // costs some 20-40 ns, 4 % of a small all-reduce's launch when it was read
                // after each): kernel threads that ran past the deadline without waiting
                // (one that waits is suspended there by its wait) end the help here, at
                // most that many of them late.
                ran = ran.wrapping_add(1);
                if ran.is_multiple_of(HELP_CLOCK_EVERY)
                    && deadline.is_some_and(|d| Instant::now() >= d)
                {
                    break;
                }
                continue;
            }
            // Nothing to run here: a pool thread runs the stream's launch (or has all of
            // its threads). Stay a helper, so that the launch after it is left for this
            // thread, and wait (polling, then asleep) until the stream completes a launch,
            // or the deadline. A helper that gave up after a while left the rest of a long
            // queue to the pool thread, which then competed for the cores with this thread
            // and with other ranks' threads.
            if !self.wait_past(seen, deadline) {
                break;
            }
        }
        inline::recycle(stack);
        if joined {
            self.stop_helping();
        }
    }

    /// Waits until more than `seen` launches have completed, or the deadline (then false).
    fn wait_past(&self, seen: u64, deadline: Option<Instant>) -> bool {
        let next = seen + 1;
        // SeqCst: as in `done`, and the waiter's half of the `Signal` handshake.
        let progressed = || self.completed.load(Ordering::SeqCst) >= next;
        self.progress.wait_for(next, progressed, deadline)
    }

    /// Completed launches kept for reuse now.
    #[cfg(test)]
    pub(crate) fn spare_launches(&self) -> usize {
        self.queue.lock().spares.len()
    }

    /// Host threads helping now.
    #[cfg(test)]
    pub(crate) fn helpers(&self) -> u32 {
        self.queue.lock().helpers
    }

    /// Unregisters a helper; the last one dispatches a launch left for helpers.
    fn stop_helping(self: &Arc<Self>) {
        let orphan = {
            let mut queue = self.queue.lock();
            queue.helpers -= 1;
            if queue.helpers == 0 && queue.for_helper {
                self.end_left(&mut queue)
            } else {
                Orphan::default()
            }
        };
        self.start_orphan(orphan);
    }

    /// A thread for a helper to run, claimed: one of the launch left for helpers (whose
    /// other threads go to workers), or the unclaimed thread of a running one-thread launch.
    /// With `join`, the calling thread registers as a helper first, under the same lock.
    fn claim_for_helper(self: &Arc<Self>, join: bool) -> Option<(Arc<Launch>, u32)> {
        let (launch, left_for_us, kept) = {
            let mut queue = self.queue.lock();
            if join {
                queue.helpers += 1;
            }
            let left_for_us = queue.for_helper;
            queue.for_helper = false;
            let kept = self.end_deferral(&mut queue);
            (queue.running.clone(), left_for_us, kept)
        };
        // The stream's reference to itself, if the launch was deferred (not its last: the
        // caller holds one).
        drop(kept);
        launch.and_then(|launch| {
            // Its other threads, if any, to workers (none for a one-thread launch: the
            // pool's dispatch of nothing still cost a few percent of a small launch).
            let others = launch.total_threads() - 1;
            if left_for_us && others > 0 && !self.dispatch(&launch, others) {
                // No thread of it runs: it is finished as failed, and the next one left
                // for a helper again (or dispatched, by `start`).
                if let Some(next) = self.finish(&launch) {
                    self.start(next);
                }
                return None;
            }
            // A dispatched launch only if it has one thread, whose task we take back from
            // its worker: a worker of a larger one would wake to find nothing, after the
            // next launch spawned another worker for want of it.
            if !left_for_us && launch.total_threads() != 1 {
                return None;
            }
            // Left for us: its other threads went to workers, one each, so one is left.
            let index = launch.claim_thread()?;
            if !left_for_us {
                pool().retract(&launch);
            }
            Some((launch, index))
        })
    }

    /// Dispatches all threads of `launch` to the pool; a launch that cannot start is
    /// finished as failed and the next one tried, in a loop rather than by recursion.
    fn start(self: &Arc<Self>, launch: Arc<Launch>) {
        let mut launch = launch;
        while !self.dispatch(&launch, launch.total_threads()) {
            match self.finish(&launch) {
                Some(next) => launch = next,
                None => return,
            }
        }
    }

    /// Gives `workers` threads of `launch` to the pool; if that fails, records why and
    /// returns false (no thread of the launch was given out).
    fn dispatch(self: &Arc<Self>, launch: &Arc<Launch>, workers: u32) -> bool {
        let Err(err) = pool().dispatch(self, launch, workers) else {
            return true;
        };
        self.record(Error::System {
            context: format!(
                "starting {} emulated threads for kernel `{}` on stream {} of cpu device {}",
                launch.total_threads(),
                launch.kernel.name,
                self.id,
                self.device.ordinal
            ),
            source: err,
        });
        false
    }

    /// Marks `launch` (the running one) complete; returns the next launch if the caller
    /// must dispatch it (else there is none, or it is left for a helper).
    fn finish(&self, launch: &Launch) -> Option<Arc<Launch>> {
        if let Some((kind, message)) = launch.failure() {
            let error = match kind {
                FailureKind::Panicked => Error::KernelFailed {
                    kernel: launch.kernel.name,
                    message,
                },
                FailureKind::Returned(error) => Error::KernelError {
                    kernel: launch.kernel.name,
                    error,
                    message,
                },
            };
            // One line per failed launch, however many of its threads failed (their panics
            // print nothing: see `super::quiet_kernel_panics`).
            tracing::error!(stream = self.id, device = self.device.ordinal, %error, "launch failed");
            self.record(error);
        }
        let next = {
            let mut queue = self.queue.lock();
            let next = queue.pending.pop_front();
            let completed = queue.running.take();
            let next = queue.run_next(next);
            queue.retire(completed);
            next
        };
        // SeqCst (a Release at least, pairing with `synchronize`): the Dekker pair of
        // `Signal::notify`.
        let completed = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        self.progress.notify_progress(completed);
        self.device.launch_completed();
        next
    }

    fn record(&self, err: Error) {
        let mut slot = self.error.lock();
        if slot.is_none() {
            *slot = Some(err);
        }
    }

    /// Names what a timed-out `synchronize` was waiting for.
    fn describe_stuck(&self) -> String {
        let queue = self.queue.lock();
        let head = format!("stream {} of cpu device {}", self.id, self.device.ordinal);
        match &queue.running {
            Some(launch) => {
                let (g, b) = (launch.config.grid, launch.config.block);
                let mut what = format!(
                    "{head}: kernel `{}` (grid {g}, block {b}) still has {} of {} threads running",
                    launch.kernel.name,
                    launch.remaining_threads(),
                    launch.total_threads()
                );
                if !queue.pending.is_empty() {
                    what.push_str(&format!(
                        "; {} more launches queued behind it",
                        queue.pending.len()
                    ));
                }
                what
            }
            None => format!("{head}: launches did not complete"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, Error, Stream};
    use oxccl_device::arch;
    use oxccl_device::error::DeviceError;
    use oxccl_device::kernel;
    use oxccl_device::launch::LaunchConfig;
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    /// Gates of the tests below, one each (tests run at the same time).
    static GATES: [AtomicBool; 8] = [const { AtomicBool::new(false) }; 8];

    /// Waits (with back-off) until gate `gate` opens.
    #[kernel]
    fn wait_for_gate(gate: u32) {
        let mut i = 0;
        while !GATES[gate as usize].load(Ordering::Acquire) {
            arch::spin_pause(i);
            i = i.saturating_add(1);
        }
    }

    /// Opens gate `gate` after `after`, from another thread.
    fn open_gate_after(gate: usize, after: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            std::thread::sleep(after);
            GATES[gate].store(true, Ordering::Release);
        })
    }

    fn stream_of(ordinal: usize) -> Stream {
        Device::cpu(ordinal).stream().unwrap()
    }

    /// Where each thread of `record_grid_ranks` ran, by grid rank, and how many arrived.
    static RANKS: Mutex<Vec<Option<ThreadId>>> = Mutex::new(Vec::new());
    static ARRIVED: AtomicU32 = AtomicU32::new(0);

    /// Records the OS thread of each grid rank; then waits until every thread of the grid
    /// has arrived, which only threads running at the same time can do.
    #[kernel]
    fn record_grid_ranks() {
        let rank = arch::thread_rank_in_grid() as usize;
        RANKS.lock()[rank] = Some(std::thread::current().id());
        let all = arch::grid_dim().volume() as u32 * arch::block_dim().volume() as u32;
        ARRIVED.fetch_add(1, Ordering::AcqRel);
        let mut i = 0;
        while ARRIVED.load(Ordering::Acquire) < all {
            arch::spin_pause(i);
            i = i.saturating_add(1);
        }
    }

    /// Guards against a launch left for the synchronizing thread running with wrong
    /// indices, running some of its threads one after another (they wait for each other
    /// here, so that would hang), or not running on the synchronizing thread at all.
    #[test]
    fn launch_left_for_the_synchronizing_thread_runs_there_with_all_its_threads() {
        *RANKS.lock() = vec![None; 6];
        let stream = stream_of(20);
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), 0).unwrap();
        record_grid_ranks::launch(&stream, LaunchConfig::grid(2).block(3)).unwrap();
        let opener = open_gate_after(0, Duration::from_millis(20));
        let cpu = stream.cpu_stream();
        cpu.synchronize(Duration::from_secs(30)).unwrap();
        opener.join().unwrap();
        let ranks: Vec<ThreadId> = RANKS.lock().iter().map(|r| r.unwrap()).collect();
        let me = std::thread::current().id();
        assert_eq!(ranks.iter().filter(|&&t| t == me).count(), 1, "{ranks:?}");
        let mut distinct = ranks.clone();
        distinct.sort_by_key(|t| format!("{t:?}"));
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            6,
            "threads of one launch shared an OS thread"
        );
    }

    static ORDER: Mutex<Vec<(u64, ThreadId)>> = Mutex::new(Vec::new());

    /// Does nothing.
    #[kernel]
    fn nothing() {}

    /// Appends `seq` and its OS thread to `ORDER`.
    #[kernel]
    fn append(seq: u64) {
        ORDER.lock().push((seq, std::thread::current().id()));
    }

    /// Guards against a burst of back-to-back launches allocating its launches anew each
    /// time: those of the deepest queue so far are kept (up to `SPARE_LAUNCHES`), so the
    /// next burst as deep reuses them. The burst queues behind a closed gate, so it is as
    /// deep as it is long.
    #[test]
    fn a_stream_keeps_the_launches_of_its_deepest_queue() {
        let stream = stream_of(0);
        let gate = 7;
        let burst = 100;
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), gate as u32).unwrap();
        for _ in 0..burst {
            nothing::launch(&stream, LaunchConfig::grid(1)).unwrap();
        }
        GATES[gate].store(true, Ordering::Release);
        stream.synchronize().unwrap();
        // The last launch to complete is kept apart until the next one completes.
        assert!(
            stream.cpu_stream().spare_launches() >= burst,
            "{} launches kept of a queue of {}",
            stream.cpu_stream().spare_launches(),
            burst + 1
        );
    }

    /// Guards against launches run by the synchronizing thread overtaking each other or
    /// the launch before them.
    #[test]
    fn launches_run_by_the_synchronizing_thread_stay_in_order() {
        let stream = stream_of(21);
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), 1).unwrap();
        for seq in 0..50 {
            append::launch(&stream, LaunchConfig::grid(1), seq).unwrap();
        }
        let opener = open_gate_after(1, Duration::from_millis(20));
        stream
            .cpu_stream()
            .synchronize(Duration::from_secs(30))
            .unwrap();
        opener.join().unwrap();
        let order = ORDER.lock().clone();
        assert_eq!(
            order.iter().map(|o| o.0).collect::<Vec<_>>(),
            (0..50).collect::<Vec<_>>()
        );
        let me = std::thread::current().id();
        assert!(order.iter().any(|o| o.1 == me), "none ran here");
    }

    /// Panics.
    #[kernel]
    fn panics() {
        panic!("gives up on purpose");
    }

    /// Returns an error.
    #[kernel]
    fn returns_an_error() -> Result<(), DeviceError> {
        Err(DeviceError::InvalidArgument)
    }

    /// Guards against failures of kernels run by the synchronizing thread going unreported
    /// (or taking the host thread down), and against the stream being unusable after.
    #[test]
    fn failures_of_kernels_run_by_the_synchronizing_thread_are_reported() {
        let stream = stream_of(22);
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), 2).unwrap();
        panics::launch(&stream, LaunchConfig::grid(1)).unwrap();
        let opener = open_gate_after(2, Duration::from_millis(20));
        match stream.cpu_stream().synchronize(Duration::from_secs(30)) {
            Err(Error::KernelFailed { kernel, message }) => {
                assert_eq!(kernel, "panics");
                assert!(message.contains("gives up on purpose"), "{message}");
            }
            other => panic!("expected KernelFailed, got {other:?}"),
        }
        opener.join().unwrap();
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), 4).unwrap();
        returns_an_error::launch(&stream, LaunchConfig::grid(1)).unwrap();
        let opener = open_gate_after(4, Duration::from_millis(20));
        match stream.cpu_stream().synchronize(Duration::from_secs(30)) {
            Err(Error::KernelError { kernel, error, .. }) => {
                assert_eq!(kernel, "returns_an_error");
                assert_eq!(error, DeviceError::InvalidArgument);
            }
            other => panic!("expected KernelError, got {other:?}"),
        }
        opener.join().unwrap();
        stream.synchronize().unwrap();
    }

    /// Released by `late_kernel_moves_to_a_worker_at_the_deadline` once it saw its timeout.
    static LATE_RELEASE: AtomicBool = AtomicBool::new(false);
    /// (thread index, OS thread before the wait, OS thread after it, index after it).
    static LATE: Mutex<Vec<(u32, ThreadId, ThreadId, u32)>> = Mutex::new(Vec::new());

    /// Waits for `LATE_RELEASE`, then records where it ran and its index again.
    #[kernel]
    fn late() {
        let before = (arch::thread_idx().x, std::thread::current().id());
        let mut i = 0;
        while !LATE_RELEASE.load(Ordering::Acquire) {
            arch::spin_pause(i);
            i = i.saturating_add(1);
        }
        let after = (std::thread::current().id(), arch::thread_idx().x);
        LATE.lock().push((before.0, before.1, after.0, after.1));
    }

    /// Guards against a kernel thread run by the synchronizing thread holding
    /// `synchronize` past its timeout, and against it losing its indices (or its progress)
    /// when a worker takes it over.
    #[test]
    fn late_kernel_moves_to_a_worker_at_the_deadline() {
        let mut stream = stream_of(23);
        stream.set_timeout(Duration::from_millis(300));
        wait_for_gate::launch(&stream, LaunchConfig::grid(1), 3).unwrap();
        late::launch(&stream, LaunchConfig::grid(1).block(2)).unwrap();
        let opener = open_gate_after(3, Duration::from_millis(20));
        let started = Instant::now();
        match stream.cpu_stream().synchronize(Duration::from_millis(300)) {
            Err(Error::Timeout { what, .. }) => assert!(what.contains("late"), "{what}"),
            other => panic!("expected Timeout, got {other:?}"),
        }
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        opener.join().unwrap();
        LATE_RELEASE.store(true, Ordering::Release);
        stream.set_timeout(Duration::from_secs(30));
        stream.synchronize().unwrap();
        let late = LATE.lock().clone();
        let me = std::thread::current().id();
        assert_eq!(late.len(), 2);
        for &(index, before, after, index_after) in &late {
            assert_eq!(index, index_after, "index changed across the move");
            assert_ne!(
                after, me,
                "still on the synchronizing thread after its timeout"
            );
            let _ = before;
        }
        assert_eq!(late.iter().filter(|l| l.1 == me).count(), 1, "{late:?}");
    }

    /// Guards against an unbounded launch queue: launches behind a kernel that waits wait
    /// for room once `MAX_IN_FLIGHT` are not complete, and all run once it finishes.
    #[test]
    fn a_full_queue_makes_the_launch_wait_for_room() {
        let gate = 5;
        let stream = stream_of(45);
        let one = LaunchConfig::grid(1).block(1);
        let opened = Instant::now();
        let opener = open_gate_after(gate, Duration::from_millis(300));
        for _ in 0..super::MAX_IN_FLIGHT {
            wait_for_gate::launch(&stream, one, gate as u32).unwrap();
        }
        assert!(
            opened.elapsed() < Duration::from_millis(300),
            "launches up to the bound were enqueued without waiting"
        );
        wait_for_gate::launch(&stream, one, gate as u32).unwrap();
        assert!(
            opened.elapsed() >= Duration::from_millis(300),
            "the launch past the bound returned before the kernels ahead of it finished"
        );
        opener.join().unwrap();
        stream.synchronize().unwrap();
    }

    /// What the kernels of `launches_keep_their_own_parameters_when_launches_are_reused`
    /// saw: (sequence number, thread index, whether its parameters were the ones sent).
    static REUSED: Mutex<Vec<(u64, u32, bool)>> = Mutex::new(Vec::new());

    /// Parameters kept inside the launch; `check` is `seq` times 3.
    #[kernel]
    fn small_params(seq: u64, check: u64) {
        REUSED.lock().push((seq, 0, check == seq * 3));
    }

    /// Parameters too large for the launch: kept in an allocation of their own; every word
    /// is `seq` plus its index.
    #[kernel]
    fn large_params(seq: u64, words: [u64; 40]) {
        let right = words.iter().enumerate().all(|(i, &w)| w == seq + i as u64);
        REUSED.lock().push((seq, 0, right));
    }

    /// Three threads that meet at the block's barrier before and after recording.
    #[kernel]
    fn block_params(seq: u64, check: u64) {
        arch::sync_threads();
        REUSED
            .lock()
            .push((seq, arch::thread_idx().x, check == seq * 3));
        arch::sync_threads();
    }

    /// Guards against a launch made in the allocation of an earlier one keeping anything of
    /// it: its parameter values (inside the launch or allocated), its shape (threads,
    /// block barriers), its count of threads left. Three kinds of launch alternate back to
    /// back behind a gate (so they queue and complete one after another on a pool thread,
    /// each handing the next over), then again run by the synchronizing thread; every
    /// kernel must see its own parameters, each thread once, in launch order.
    #[test]
    fn launches_keep_their_own_parameters_when_launches_are_reused() {
        let gate = 6;
        let mut stream = stream_of(46);
        stream.set_timeout(Duration::from_secs(10));
        let one = LaunchConfig::grid(1);
        let three = LaunchConfig::grid(1).block(3);
        let enqueue = |from: u64| {
            for seq in from..from + 60 {
                match seq % 3 {
                    0 => small_params::launch(&stream, one, seq, seq * 3).unwrap(),
                    1 => {
                        let words = std::array::from_fn(|i| seq + i as u64);
                        large_params::launch(&stream, one, seq, words).unwrap();
                    }
                    _ => block_params::launch(&stream, three, seq, seq * 3).unwrap(),
                }
            }
        };
        wait_for_gate::launch(&stream, one, gate as u32).unwrap();
        enqueue(0);
        GATES[gate].store(true, Ordering::Release);
        // No helper: a pool thread runs them. Waited for without `synchronize`.
        let deadline = Instant::now() + Duration::from_secs(30);
        while REUSED.lock().len() < 100 {
            assert!(Instant::now() < deadline, "the launches did not run");
            std::thread::sleep(Duration::from_millis(1));
        }
        stream.synchronize().unwrap();
        enqueue(60);
        stream.synchronize().unwrap();
        let seen = REUSED.lock().clone();
        assert!(
            seen.iter().all(|s| s.2),
            "a kernel saw another launch's parameters"
        );
        let mut expected = Vec::new();
        for seq in 0..120u64 {
            let threads = if seq % 3 == 2 { 3 } else { 1 };
            expected.extend((0..threads).map(|t| (seq, t)));
        }
        let mut got: Vec<(u64, u32)> = seen.iter().map(|s| (s.0, s.1)).collect();
        // Threads of one launch record in any order; launches in theirs.
        got.sort_by_key(|&(seq, t)| (seq, t));
        assert_eq!(got, expected);
        let launch_order: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert!(
            launch_order.windows(2).all(|w| w[0] <= w[1]),
            "launches overtook each other: {launch_order:?}"
        );
        assert!(
            stream.cpu_stream().spare_launches() > 0,
            "no completed launch was kept for reuse"
        );
    }

    /// Raised by [`raise_flag`] and [`wait_then_raise`], one or two per test below.
    static RAISED: [AtomicBool; 6] = [const { AtomicBool::new(false) }; 6];

    /// Raises flag `flag`.
    #[kernel]
    fn raise_flag(flag: u32) {
        RAISED[flag as usize].store(true, Ordering::Release);
    }

    /// Whether flag `flag` is raised within `limit` (looked at every millisecond).
    fn raised_within(flag: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if RAISED[flag].load(Ordering::Acquire) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        RAISED[flag].load(Ordering::Acquire)
    }

    /// Guards against a launch left for a `synchronize` that does not come (deferred; see
    /// `super::deferral`) never running: the host launches a kernel on an idle stream and,
    /// without synchronizing, waits for the kernel's flag, as a host waiting for a peer's
    /// message waits; the starter thread must hand the launch to a worker.
    #[test]
    fn a_launch_nobody_synchronizes_still_runs() {
        let stream = stream_of(24);
        raise_flag::launch(&stream, LaunchConfig::grid(1), 0).unwrap();
        assert!(
            raised_within(0, Duration::from_secs(10)),
            "the kernel did not run within 10 s without a synchronize"
        );
        stream.synchronize().unwrap();
    }

    /// Guards against a deferred launch lost with its stream: a kernel launched on a stream
    /// dropped at once must still run (a GPU runs what a destroyed stream had queued).
    #[test]
    fn a_launch_on_a_stream_dropped_at_once_still_runs() {
        let stream = stream_of(25);
        raise_flag::launch(&stream, LaunchConfig::grid(1), 1).unwrap();
        drop(stream);
        assert!(
            raised_within(1, Duration::from_secs(10)),
            "the kernel of the dropped stream did not run within 10 s"
        );
    }

    /// Waits (with back-off) for flag `wait`, then raises flag `then`.
    #[kernel]
    fn wait_then_raise(wait: u32, then: u32) {
        let mut i = 0;
        while !RAISED[wait as usize].load(Ordering::Acquire) {
            arch::spin_pause(i);
            i = i.saturating_add(1);
        }
        RAISED[then as usize].store(true, Ordering::Release);
    }

    /// Two streams the starter of deferred launches does not watch: only a host thread's
    /// own rules start their deferred launches.
    fn unwatched_streams(first: usize) -> (Stream, Stream) {
        let (a, b) = (stream_of(first), stream_of(first + 1));
        for s in [&a, &b] {
            super::deferral::unwatch(s.cpu_stream());
        }
        (a, b)
    }

    /// Guards against a host thread's `synchronize` of one stream waiting for the starter
    /// (or for ever) on a kernel it launched on another: kernel A (waits for flag 2) on one
    /// stream, then B (raises it) on another, both deferred, then the first stream
    /// synchronized; the synchronize must start B (the starter watches neither stream).
    #[test]
    fn synchronize_starts_the_threads_deferred_launch_on_another_stream() {
        let (first, second) = unwatched_streams(26);
        wait_then_raise::launch(&first, LaunchConfig::grid(1), 2, 3).unwrap();
        raise_flag::launch(&second, LaunchConfig::grid(1), 2).unwrap();
        first
            .cpu_stream()
            .synchronize(Duration::from_secs(10))
            .unwrap();
        second.synchronize().unwrap();
    }

    /// Guards against a host thread keeping several launches deferred: kernel A (waits for
    /// flag 4, then raises 5) on one stream, then B (raises 4) on another, the second
    /// stream synchronized, then flag 5 awaited without synchronizing the first: deferring
    /// B must have started A (the starter watches neither stream).
    #[test]
    fn deferring_a_launch_starts_the_threads_deferred_launch_on_another_stream() {
        let (first, second) = unwatched_streams(28);
        wait_then_raise::launch(&first, LaunchConfig::grid(1), 4, 5).unwrap();
        raise_flag::launch(&second, LaunchConfig::grid(1), 4).unwrap();
        second.synchronize().unwrap();
        assert!(
            raised_within(5, Duration::from_secs(10)),
            "the first stream's kernel did not run within 10 s"
        );
        first.synchronize().unwrap();
    }
}
