//! One stream of the emulator: launches run one after the other, in enqueue order.
//!
//! The enqueuing host thread starts a launch at once if the stream is idle, else queues
//! it; the kernel thread that completes a launch starts the next one. No thread belongs to
//! a stream, so an idle stream costs nothing and a launch costs one hand-off to the pool.
//!
//! Counters: `submitted` (written by the enqueuing host thread, under `queue`) and
//! `completed` (written by the completing kernel thread, Release after the launch's
//! writes; read with Acquire by `synchronize`). Failures are kept in `error` until the
//! next `synchronize` takes them.

use super::launch::{FailureKind, Launch};
use super::pool::pool;
use super::{CpuDevice, Signal};
use crate::Error;
use oxccl_device::launch::{KernelInfo, LaunchConfig};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
}

#[derive(Default)]
struct Queue {
    /// The launch whose threads are running, if any.
    running: Option<Arc<Launch>>,
    /// Launches waiting for `running` to complete, oldest first.
    pending: VecDeque<Arc<Launch>>,
}

impl CpuStream {
    pub(crate) fn new(device: Arc<CpuDevice>) -> Self {
        let id = device.next_stream_id();
        Self {
            device,
            id,
            queue: Mutex::new(Queue::default()),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            progress: Signal::default(),
            error: Mutex::new(None),
        }
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
        // SAFETY: forwarded contract.
        let launch = Arc::new(unsafe { Launch::new(kernel, config, params, self.clone())? });
        self.device.launch_enqueued();
        let start_now = {
            let mut queue = self.queue.lock();
            self.submitted.fetch_add(1, Ordering::Relaxed);
            if queue.running.is_none() {
                queue.running = Some(launch.clone());
                true
            } else {
                queue.pending.push_back(launch.clone());
                false
            }
        };
        if start_now {
            self.start(launch);
        }
        Ok(())
    }

    /// Called by the last thread of `launch` to finish: records its failure, and starts
    /// the next launch of the stream, if any.
    pub(crate) fn complete(self: &Arc<Self>, launch: &Launch) {
        if let Some(next) = self.finish(launch) {
            self.start(next);
        }
    }

    /// Waits for every launch enqueued before this call, at most `timeout`, then reports
    /// (and forgets) the first failure since the last call.
    pub(crate) fn synchronize(&self, timeout: Duration) -> crate::Result<()> {
        let target = self.submitted.load(Ordering::Relaxed);
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        // SeqCst: acquires the kernels' writes (pairs with the SeqCst increment in
        // `finish`), and is the waiter's half of the `Signal` handshake.
        let done = || self.completed.load(Ordering::SeqCst) >= target;
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

    /// Dispatches `launch` to the pool; a launch that cannot start is finished as failed
    /// and the next one tried, in a loop rather than by recursion.
    fn start(self: &Arc<Self>, launch: Arc<Launch>) {
        let mut launch = launch;
        loop {
            let Err(err) = pool().dispatch(&launch) else {
                return;
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
            match self.finish(&launch) {
                Some(next) => launch = next,
                None => return,
            }
        }
    }

    /// Marks `launch` (the running one) complete; returns the next launch, now running.
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
            queue.running = next.clone();
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
