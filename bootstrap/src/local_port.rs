//! A loopback port for a job whose ranks are started on this host.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

/// Where the system picks ports for outgoing connections when it cannot read its own
/// setting (Linux's default `ip_local_port_range`).
const DEFAULT_EPHEMERAL: RangeInclusive<u16> = 32768..=60999;

/// The lowest port handed out: above the well-known and most registered services' ports.
const LOWEST: u16 = 10_000;

/// The fewest ports a candidate range must hold to be used.
const MIN_CANDIDATES: u16 = 1_000;

/// Ports handed out by this process so far, and where the next search starts.
static HANDED_OUT: Mutex<Option<(HashSet<u16>, u32)>> = Mutex::new(None);

/// A TCP port on 127.0.0.1 for a job started on this host to use as its root's port
/// (`MASTER_PORT`): nothing listens on it now, it lies outside the system's ephemeral
/// range, and this process has not handed it out before.
///
/// The usual trick, binding port 0 and closing the listener at once, returns a port from
/// the ephemeral range, which the system may give at any moment to the local end of an
/// outgoing connection anywhere on the machine; rank 0 binding it a moment later then
/// fails with "address in use". Ports below that range are taken only by an explicit
/// bind. The search starts at a random place, so two processes choosing at once are
/// unlikely to try the same ports; a job that still loses its port gets a clear error
/// from rank 0's bind, never another job's ranks (the secret differs).
///
/// # Errors
///
/// [`Error::System`] if no candidate port can be bound (all taken, no network stack).
pub fn free_loopback_port() -> Result<u16> {
    let candidates = candidate_range(&ephemeral_range());
    let (first, last) = (*candidates.start(), *candidates.end());
    let count = u32::from(last - first) + 1;
    let mut state = HANDED_OUT.lock();
    let (handed_out, cursor) = state.get_or_insert_with(|| {
        let seed = RandomState::new().hash_one(std::process::id());
        // Below `count`, which is at most 2^16.
        (HashSet::new(), (seed % u64::from(count)) as u32)
    });
    let mut last_error = None;
    for step in 0..count {
        // Below `last`: `first` plus a remainder of `count`.
        let port = first + ((*cursor + step) % count) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        match probe(port) {
            Ok(()) => {
                handed_out.insert(port);
                *cursor = (*cursor + step + 1) % count;
                return Ok(port);
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(Error::system(
        format!("finding a free TCP port on 127.0.0.1 in {first}..={last}"),
        last_error.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()),
    ))
}

/// Whether `port` of 127.0.0.1 can be bound by a listener with `SO_REUSEADDR` (as a root
/// listener is, see `net::bind_listener`): a socket bound to it as that listener is bound
/// (`net::bound_socket`), never listening, then closed. A listening probe would keep the port from everyone for as long
/// as any copy of it lives, and a child process forked by another thread of this process
/// at that moment holds one until it execs (binding the handed-out ports at once, while
/// another thread spawned processes, failed with "address in use" within 300 ports in
/// every run); a copy of a socket that never listened keeps no listener with
/// `SO_REUSEADDR` from binding.
fn probe(port: u16) -> std::io::Result<()> {
    crate::net::bound_socket((Ipv4Addr::LOCALHOST, port).into()).map(drop)
}

/// The ports to hand out: below the ephemeral range when it leaves room there, else above.
fn candidate_range(ephemeral: &RangeInclusive<u16>) -> RangeInclusive<u16> {
    let (low, high) = (*ephemeral.start(), *ephemeral.end());
    if low >= LOWEST.saturating_add(MIN_CANDIDATES) {
        LOWEST..=low - 1
    } else if high <= u16::MAX - MIN_CANDIDATES {
        high + 1..=u16::MAX
    } else {
        // The ephemeral range covers nearly everything: no port is safer than another.
        LOWEST..=u16::MAX
    }
}

/// The system's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_range() -> RangeInclusive<u16> {
    let parsed = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut words = text.split_whitespace().map(str::parse::<u16>);
            match (words.next(), words.next()) {
                (Some(Ok(low)), Some(Ok(high))) if low <= high => Some(low..=high),
                _ => None,
            }
        });
    parsed.unwrap_or(DEFAULT_EPHEMERAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_avoid_the_ephemeral_range() {
        assert_eq!(candidate_range(&(32768..=60999)), 10_000..=32767);
        assert_eq!(candidate_range(&(1024..=50000)), 50001..=65535);
        assert_eq!(candidate_range(&(1024..=65000)), 10_000..=65535);
    }
}
