//! The doorbell a FIFO push rings so that a host proxy executes the published trigger.

use std::boxed::Box;
use std::sync::OnceLock;
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
    sleeper: OnceLock<Thread>,
    assist: OnceLock<Assist>,
}

impl core::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Doorbell")
            .field("sleeper", &self.sleeper.get().map(Thread::id))
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

    /// Records the calling thread as the one [`Self::wake_sleeper`] unparks.
    pub fn register_sleeper(&self) {
        let _ = self.sleeper.get_or_init(std::thread::current);
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
        if let Some(t) = self.sleeper.get() {
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
