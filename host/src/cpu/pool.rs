//! The emulator's kernel threads: a process-wide pool of parked OS threads.
//!
//! Every thread of a launch runs at once on its own OS thread (blocks of a kernel may wait
//! on each other's flags, as co-resident blocks do on a GPU), so a launch of `n` threads
//! takes `n` idle workers, spawning only what is missing: the pool grows to the largest
//! number of kernel threads running at the same time, and never spawns per launch.
//!
//! A worker given a launch claims one of its threads ([`Launch::claim_thread`]) and runs
//! it; a host thread waiting for the launch may have claimed one first (see
//! [`super::inline`]), and the worker then finds none left and goes back idle. Every
//! claimed thread has an OS thread of its own from its claim to its end, so the threads of
//! a launch still all run at once. A worker may also be given a kernel thread that a host
//! thread suspended, to finish it. A worker that claims the thread of a one-thread launch
//! may open the process's runner for it, or donate it to the runner (see `run_claimed` and
//! [`super::corun`]).
//!
//! Hand-off: the dispatcher puts a [`Task`] in a worker's slot, raises `posted` (Release)
//! and unparks the worker; the worker polls `posted` (Acquire) for a short while after its
//! last task (back-to-back launches then cost no wake-up), then parks. `unpark` before
//! `park` makes that `park` return at once, so no hand-off is lost.
//!
//! A worker puts itself back on the idle list *before* it reports its task done: the launch
//! that the report completes (or the next one it starts) finds the worker idle instead of
//! spawning another.

use super::corun::{self, Placement};
use super::inline::{self, Suspended};
use super::launch::Launch;
use super::stream::CpuStream;
use crossbeam_utils::Backoff;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle worker keeps polling for its next task before it parks: long enough to
/// catch the next launch of a loop of short kernels, short enough that idle workers leave
/// the cores to ranks and proxies that have work.
const IDLE_POLL: Duration = Duration::from_micros(50);

/// Stack of a kernel thread. Kernels are small; the default (2 MiB) is kept so a deep
/// debug-build kernel still fits.
pub(crate) const WORKER_STACK: usize = 2 << 20;

/// What a worker is given to do.
pub(crate) enum Task {
    /// Run a thread of this launch of this stream that nobody has claimed, if one is left.
    Start(Arc<CpuStream>, Arc<Launch>),
    /// Finish a kernel thread suspended on a host thread.
    Resume(Suspended),
}

/// Workers taken for one task: a launch of a few threads (or one resumed kernel thread)
/// takes them without an allocation.
type Workers = SmallVec<[Arc<Worker>; 4]>;

/// The process-wide pool.
pub(crate) struct Pool {
    /// Workers waiting for a task.
    idle: Mutex<Vec<Arc<Worker>>>,
    /// Workers spawned so far (names the next one).
    spawned: AtomicUsize,
}

/// A parked (or polling) OS thread and its task slot.
pub(crate) struct Worker {
    /// The task handed over, taken by the worker once it sees `posted`.
    slot: Mutex<Option<Task>>,
    /// Raised (Release) after `slot` is filled; pairs with the worker's Acquire poll.
    posted: AtomicBool,
    /// The worker's OS thread, for `unpark`; set once, right after spawning.
    thread: OnceLock<Thread>,
}

/// The pool of this process.
pub(crate) fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        idle: Mutex::new(Vec::new()),
        spawned: AtomicUsize::new(0),
    })
}

impl Pool {
    /// Gives `workers` workers of their own a [`Task::Start`] of `launch` (its caller runs
    /// the launch's other threads itself, if any).
    ///
    /// All or nothing: if a worker cannot be spawned, no worker is given the launch (a
    /// partial launch could leave its threads waiting in `sync_threads` for ones that never
    /// run) and the OS error is returned.
    pub(crate) fn dispatch(
        &'static self,
        stream: &Arc<CpuStream>,
        launch: &Arc<Launch>,
        workers: u32,
    ) -> std::io::Result<()> {
        let workers = self.take(workers as usize)?;
        if let [worker] = &workers[..]
            && launch.total_threads() == 1
        {
            *launch.worker.lock() = Some(worker.clone());
        }
        for worker in workers {
            worker.post(Task::Start(stream.clone(), launch.clone()));
        }
        Ok(())
    }

    /// Takes back the task of the worker given one-thread `launch`, whose thread the caller
    /// has claimed, if the worker has not taken it yet; the worker goes back idle at once
    /// instead of waking to find nothing (while the next launch spawned a worker for want
    /// of it).
    pub(crate) fn retract(&self, launch: &Launch) {
        let Some(worker) = launch.worker.lock().take() else {
            return;
        };
        let retracted = {
            let mut slot = worker.slot.lock();
            match &*slot {
                Some(Task::Start(_, l)) if std::ptr::eq(Arc::as_ptr(l), launch) => {
                    *slot = None;
                    // Relaxed: under the slot's lock, which the worker takes before it
                    // trusts `posted`.
                    worker.posted.store(false, Ordering::Relaxed);
                    true
                }
                _ => false,
            }
        };
        if retracted {
            self.put_back(worker);
        }
    }

    /// Gives `suspended` to a worker of its own to finish; if none can be had, returns it
    /// with the OS error (boxed: only this rare path pays for an allocation).
    pub(crate) fn resume(
        &'static self,
        suspended: Suspended,
    ) -> Result<(), Box<(Suspended, std::io::Error)>> {
        match self.take(1) {
            Ok(workers) => {
                if let Some(worker) = workers.into_iter().next() {
                    worker.post(Task::Resume(suspended));
                }
                Ok(())
            }
            Err(err) => Err(Box::new((suspended, err))),
        }
    }

    /// `n` idle workers, spawning what is missing; none if one cannot be spawned.
    fn take(&'static self, n: usize) -> std::io::Result<Workers> {
        if n == 0 {
            return Ok(Workers::new());
        }
        let mut workers: Workers = {
            let mut idle = self.idle.lock();
            let keep = idle.len().saturating_sub(n);
            idle.drain(keep..).collect()
        };
        while workers.len() < n {
            match self.spawn() {
                Ok(worker) => workers.push(worker),
                Err(err) => {
                    self.idle.lock().extend(workers);
                    return Err(err);
                }
            }
        }
        Ok(workers)
    }

    /// Spawns a worker that waits for its first task.
    fn spawn(&'static self) -> std::io::Result<Arc<Worker>> {
        let worker = Arc::new(Worker {
            slot: Mutex::new(None),
            posted: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let n = self.spawned.fetch_add(1, Ordering::Relaxed);
        let me = worker.clone();
        let handle = std::thread::Builder::new()
            // Short enough for Linux's 15-character thread names (`/proc`, `top -H`).
            .name(format!("oxccl-kern-{n}"))
            .stack_size(WORKER_STACK)
            .spawn(move || me.run(self))?;
        let _ = worker.thread.set(handle.thread().clone());
        // The handle is dropped: workers live as long as the process.
        Ok(worker)
    }

    /// Workers spawned since the process started.
    #[cfg(test)]
    pub(crate) fn spawned(&self) -> usize {
        self.spawned.load(Ordering::Relaxed)
    }

    fn put_back(&self, worker: Arc<Worker>) {
        self.idle.lock().push(worker);
    }
}

/// Where a worker's claimed kernel thread ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ran {
    /// Here, to its end: the worker reports it done.
    Here,
    /// Donated to the process's runner, which reports it done.
    GivenAway,
}

/// Runs thread `index` of `launch` (of `stream`), claimed by this worker: as the process's
/// runner if the launch may take turns and there is none yet (kernel threads that others
/// donate then take turns with it here, as on a host thread in `synchronize`), else
/// donated to the runner there is, else alone.
///
/// Why a worker may be the runner: a launch on an idle stream goes to a worker at once, and
/// a worker that takes it before its host thread does, at the moment another rank's host
/// thread opens a runner of its own, could otherwise only run it apart from that runner,
/// for the whole launch: two busy kernel threads and a proxy on two cores, a ping-pong
/// some 1-2 µs a round trip instead of 0.25 in about one process in a hundred.
fn run_claimed(stream: &Arc<CpuStream>, launch: &Arc<Launch>, index: u32) -> Ran {
    let runner = match corun::place(stream, launch, index) {
        Placement::Donated => return Ran::GivenAway,
        Placement::Alone => {
            launch.run_thread(index);
            return Ran::Here;
        }
        Placement::Runner(runner) => runner,
    };
    let Some(stack) = inline::stack() else {
        drop(runner);
        launch.run_thread(index);
        return Ran::Here;
    };
    // No deadline: a worker runs its kernel thread to its end (guests the runner still
    // holds when it ends go to other workers, as from a host thread).
    match inline::run(stream, launch, index, stack, None, Some(runner)) {
        Ok(stack) => inline::recycle(stack),
        // Never late without a deadline; finished here all the same.
        Err(suspended) => {
            suspended.finish();
        }
    }
    Ran::Here
}

impl Worker {
    fn post(&self, task: Task) {
        *self.slot.lock() = Some(task);
        // Release: pairs with the Acquire poll in `next_task`; the slot's mutex orders the
        // task itself.
        self.posted.store(true, Ordering::Release);
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    /// The worker thread: take a task, run it, go back on the idle list, report it done
    /// (or run the stream's next launch, if the report hands one over: see
    /// [`CpuStream::thread_done_on_worker`]).
    fn run(self: Arc<Self>, pool: &'static Pool) {
        let mut idle_since = Instant::now();
        loop {
            let (stream, launch) = match self.next_task(idle_since) {
                Task::Start(stream, launch) => match launch.claim_thread() {
                    Some(index) => {
                        // Ours now: nothing to take back (and no cycle through the slot).
                        launch.worker.lock().take();
                        if run_claimed(&stream, &launch, index) == Ran::GivenAway {
                            // The process's runner runs it in turns with its own.
                            pool.put_back(self.clone());
                            continue;
                        }
                        (stream, launch)
                    }
                    None => {
                        // A host thread ran it: no work done, so the idle time goes on.
                        pool.put_back(self.clone());
                        continue;
                    }
                },
                Task::Resume(suspended) => suspended.finish(),
            };
            let mut done = launch;
            while let Some((next, index)) =
                stream.thread_done_on_worker(done, || pool.put_back(self.clone()))
            {
                if run_claimed(&stream, &next, index) == Ran::GivenAway {
                    pool.put_back(self.clone());
                    break;
                }
                done = next;
            }
            idle_since = Instant::now();
        }
    }

    /// The next task, polled for until `IDLE_POLL` after `idle_since`, then parked for.
    fn next_task(&self, idle_since: Instant) -> Task {
        let backoff = Backoff::new();
        loop {
            // Acquire: pairs with the Release in `post`.
            if self.posted.swap(false, Ordering::Acquire)
                && let Some(task) = self.slot.lock().take()
            {
                return task;
            }
            if !backoff.is_completed() {
                backoff.snooze();
            } else if idle_since.elapsed() < IDLE_POLL {
                std::thread::yield_now();
            } else {
                // `post` unparks after raising `posted`: a wake-up is never lost, and a
                // spurious one only costs another poll.
                std::thread::park();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pool;
    use crate::Device;
    use oxccl_device::kernel;
    use oxccl_device::launch::LaunchConfig;

    #[kernel]
    fn nothing() {}

    /// Guards against an OS thread spawned per launch (or per launched thread): 200
    /// launches of 8 threads each must reuse the pool's workers. The bound leaves room for
    /// other tests of this process launching at the same time.
    #[test]
    fn workers_are_reused_across_launches() {
        let device = Device::cpu(0);
        let stream = device.stream().unwrap();
        for _ in 0..200 {
            nothing::launch(&stream, LaunchConfig::grid(2).block(4)).unwrap();
            stream.synchronize().unwrap();
        }
        assert!(pool().spawned() < 200, "{} workers", pool().spawned());
    }
}
