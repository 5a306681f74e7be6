//! What this process does when told to stop (SIGINT from Ctrl-C, SIGTERM, SIGHUP) while it
//! runs a command.
//!
//! Every command runs in a process group of its own (see [`crate::bounded`]), so that a
//! timeout can kill it with everything it started. That group is not the terminal's
//! foreground group: Ctrl-C reaches this process alone, and a CI runner's SIGTERM reaches it
//! alone anyway. So, from the first command on, this process handles these signals itself:
//!
//! - while a command runs, the signal is recorded ([`received`]); the loop supervising the
//!   command passes it on to the command's group, then kills the group if it is still there
//!   after a grace period, and fails naming the signal;
//! - while no command runs, the signal's default action ends the process at once, as it
//!   would without this crate.
//!
//! Once a signal was received, every later command fails before it starts: the process is
//! on its way out. Only SIGKILL, which no process can handle, leaves the running group
//! behind; a CI runner that uses it stops the whole process tree anyway.
//!
//! The handlers are process-wide and stay installed. A build script or a command-line tool
//! wants exactly this; a long-running program with handlers of its own for these signals
//! should know that, once this crate ran a command, they still end it while no command runs
//! (its own handlers run first).

use crate::bounded::CommandError;
use parking_lot::Mutex;
use rustix::process::Signal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The signals passed on to the running command.
const FORWARDED: &[i32] = &[SIGINT, SIGTERM, SIGHUP];

/// The last forwarded signal received, or 0. Written by the signal handler.
static RECEIVED: AtomicUsize = AtomicUsize::new(0);

/// Whether no command runs, so that a signal takes its default action. Read by the signal
/// handler; written only under [`IN_FLIGHT`]'s lock, so that it always says `in flight == 0`.
static IDLE: AtomicBool = AtomicBool::new(true);

/// How many commands run now (tests run several at once).
static IN_FLIGHT: Mutex<usize> = Mutex::new(0);

/// Marks a command as running for as long as it lives: signals received meanwhile are
/// recorded for the command's supervisor instead of ending the process.
#[must_use = "the command counts as running only while this lives"]
pub struct InFlight(());

impl InFlight {
    /// Installs the signal handlers (once per process) and marks a command as running.
    ///
    /// # Errors
    ///
    /// If a handler cannot be installed; nothing is running then.
    pub fn enter() -> Result<InFlight, CommandError> {
        static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
        INSTALLED
            .get_or_init(|| install().map_err(|e| e.to_string()))
            .clone()
            .map_err(|reason| CommandError::Signals { reason })?;
        let mut n = IN_FLIGHT.lock();
        *n += 1;
        IDLE.store(false, Ordering::SeqCst);
        Ok(InFlight(()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut n = IN_FLIGHT.lock();
        *n -= 1;
        if *n == 0 {
            IDLE.store(true, Ordering::SeqCst);
        }
    }
}

/// The stop signal this process received while a command ran, if any.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => i32::try_from(sig).ok().and_then(Signal::from_named_raw),
    }
}

/// The name of `sig`, as the error messages show it (`SIGINT`).
pub fn name(sig: Signal) -> &'static str {
    match sig {
        Signal::INT => "SIGINT",
        Signal::TERM => "SIGTERM",
        Signal::HUP => "SIGHUP",
        Signal::KILL => "SIGKILL",
        _ => "a signal",
    }
}

fn install() -> std::io::Result<()> {
    for &sig in FORWARDED {
        let value = usize::try_from(sig).unwrap_or(0);
        signal_hook::flag::register_usize(sig, &RECEIVED, value)?;
        // Registered second: the signal is recorded either way, and ends the process when idle.
        signal_hook::flag::register_conditional_default(sig, &IDLE)?;
    }
    Ok(())
}
