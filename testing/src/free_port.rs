//! A loopback TCP port for a test's rank 0 to listen on.

use std::net::TcpListener;

/// A TCP port on 127.0.0.1 that nothing listens on right now: the system picks it for a
/// listener that is closed again at once.
///
/// Another process may take the port before the test binds it; a bootstrap that then
/// fails to bind reports it, so a test sees an error, never another job's ranks.
///
/// # Panics
///
/// If no loopback listener can be made (no port free, no network stack): the test cannot
/// run at all.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free TCP port on 127.0.0.1")
}
