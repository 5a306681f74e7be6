//! The doorbell a FIFO push rings so that a host proxy executes the published trigger.

use std::boxed::Box;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::Thread;

/// Work a doorbell can hand to the ringing thread: drains the FIFO on the caller's thread
/// if nobody else is draining it; returns false when someone else is.
pub type Assist = Box<dyn Fn() -> bool + Send + Sync>;

/// How a kernel thread that published a trigger gets it executed by a host proxy.
///
/// The FIFO device handle carries the doorbell's address (zero on the GPU, where the proxy
/// polls) and rings it after every push, saying whether the proxy had announced that it was
/// parking (a bit in the FIFO head, see `oxccl_device::fifo`). A ring:
/// - **assists** if the proxy installed an assist: the ringing thread drains the FIFO
///   itself, in order and through the same checks, when nobody else holds the consumer. On
///   a CPU with fewer cores than busy threads this saves two thread hand-offs per round
///   trip. It costs one uncontended lock attempt per push.
/// - otherwise, or if the consumer was busy, **wakes** the proxy thread if it was asleep.
///   A push to an awake proxy without an assist costs nothing here.
#[derive(Default)]
pub struct Doorbell {
    /// The consumer thread that parked on the ring last. Replaced, not set once: a ring
    /// outlives the thread that serves it (a proxy service stopped and started again, or
    /// moved to the process's shared proxy thread), and a doorbell that kept waking the
    /// first one left the new one asleep until its park timed out.
    sleeper: Mutex<Option<Thread>>,
    assist: OnceLock<Assist>,
}

impl core::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Doorbell")
            .field("sleeper", &self.sleeper().as_ref().map(Thread::id))
            .field("assist", &self.assist.get().is_some())
            .finish()
    }
}

impl Doorbell {
    /// A doorbell with no sleeper and no assist yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs the assist (once); returns false if one was installed already.
    pub fn set_assist(&self, assist: Assist) -> bool {
        self.assist.set(assist).is_ok()
    }

    /// Records the calling thread as the one [`Self::wake_sleeper`] unparks (in place of
    /// the one before, if another).
    pub fn register_sleeper(&self) {
        let mut sleeper = self.sleeper();
        let me = std::thread::current();
        if sleeper.as_ref().is_none_or(|t| t.id() != me.id()) {
            *sleeper = Some(me);
        }
    }

    /// The sleeper's slot. Nothing panics while holding it, so a poisoned lock still holds
    /// a whole value.
    fn sleeper(&self) -> MutexGuard<'_, Option<Thread>> {
        self.sleeper.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gets published work done: assists if possible, else wakes the sleeper if
    /// `proxy_asleep`.
    #[inline]
    pub fn ring(&self, proxy_asleep: bool) {
        if let Some(assist) = self.assist.get()
            && assist()
        {
            return;
        }
        if proxy_asleep {
            self.wake_sleeper();
        }
    }

    /// Unparks the registered sleeper, if any (a wake before its park is kept by the OS
    /// thread's token, so it is never lost).
    pub fn wake_sleeper(&self) {
        if let Some(t) = self.sleeper().as_ref() {
            t.unpark();
        }
    }
}

/// Rings the doorbell at `addr`, if any (zero means none).
#[inline]
pub(crate) fn ring_doorbell(addr: u64, proxy_asleep: bool) {
    if addr != 0 {
        // SAFETY: a non-zero doorbell address in a FIFO handle is set by the host from a
        // `Doorbell` that the proxy service keeps alive as long as the FIFO exists.
        let bell = unsafe { &*(addr as usize as *const Doorbell) };
        // Under loom the proxy never parks, so nothing rings; kept out of the model.
        if !cfg!(oxccl_loom) {
            bell.ring(proxy_asleep);
        }
    }
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// Far longer than a wake takes: a sleeper still parked after this was not woken.
    const NOT_WOKEN: Duration = Duration::from_secs(10);

    /// Guards a FIFO moving to another consumer thread (a proxy service stopped and started
    /// again, or moved to the shared proxy thread): its doorbell must wake the thread that
    /// parks on it now, not the first one that ever did, which left the new one asleep
    /// until its park timed out, at every push.
    #[test]
    fn doorbell_wakes_the_thread_that_parked_last() {
        let bell = Arc::new(Doorbell::new());
        for sleeper in 0..2 {
            let (ready, is_ready) = mpsc::channel();
            let parked = {
                let bell = bell.clone();
                std::thread::spawn(move || {
                    bell.register_sleeper();
                    ready.send(()).unwrap();
                    // A wake that comes before the park is kept by the thread's token.
                    let start = Instant::now();
                    std::thread::park_timeout(NOT_WOKEN);
                    start.elapsed()
                })
            };
            is_ready.recv().unwrap();
            bell.ring(true);
            let parked = parked.join().unwrap();
            assert!(
                parked < NOT_WOKEN,
                "sleeper {sleeper}: the doorbell did not wake the thread parked on it"
            );
        }
    }
}
