//! A loopback TCP port for a test's rank 0 to listen on.

/// [`oxccl_bootstrap::free_loopback_port`], for tests: a port on 127.0.0.1 outside the
/// ephemeral range that nothing listens on and this process has not handed out before.
///
/// # Panics
///
/// If no such port can be found (all taken, no network stack): the test cannot run at
/// all.
pub fn free_port() -> u16 {
    oxccl_bootstrap::free_loopback_port().expect("a free TCP port on 127.0.0.1")
}
