//! Waiting until a whole write payload has arrived in a socket's receive queue, so that an
//! Ethernet receiver can read it straight into its destination.
//!
//! A receiver must write nothing of a frame it refuses, and a frame whose payload ends
//! early (the peer died or stalled mid-frame) is refused. Reading the payload into a buffer
//! of the connection first and copying it to the destination once complete keeps that
//! promise at the price of a second copy of every byte, which on a fast link is what
//! bounds the receiver. Instead the receiver asks the kernel to report the socket readable
//! only once the payload's bytes are all queued (`SO_RCVLOWAT`), checks they are
//! (`FIONREAD`), and only then reads them into the destination: those reads cannot come up
//! short. Where the kernel cannot promise that (a payload larger than the receive buffer
//! may grow to, memory pressure, the peer closing), [`wait_whole_payload`] says no and the
//! receiver takes the buffered path.

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Longest single poll: the deadline is looked at again after it.
const POLL_TICK: Duration = Duration::from_millis(100);

/// Waits, until `deadline`, for at least `bytes` bytes to be readable on `stream` without
/// blocking. `Ok(true)`: they are (reads of up to `bytes` bytes now return in full);
/// `Ok(false)`: the deadline passed, or the socket became readable with fewer (the peer
/// closed, an error is pending, or the kernel woke early under memory pressure) — the
/// caller reads the ordinary way, which reports what happened.
///
/// # Errors
/// The socket option, poll or queue query failed.
pub(crate) fn wait_whole_payload(
    stream: &TcpStream,
    bytes: usize,
    deadline: Instant,
) -> io::Result<bool> {
    if bytes == 0 || queued(stream)? >= bytes {
        return Ok(true);
    }
    set_low_water(stream, bytes)?;
    let outcome = poll_for(stream, bytes, deadline);
    // Back to the default, so the frame reads that follow return what has arrived.
    set_low_water(stream, 1)?;
    outcome
}

fn poll_for(stream: &TcpStream, bytes: usize, deadline: Instant) -> io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        // At most `POLL_TICK`, which the conversion always takes.
        let timeout = Timespec::try_from(left.min(POLL_TICK)).unwrap_or_default();
        let mut fds = [PollFd::new(stream, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => return Ok(queued(stream)? >= bytes),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Bytes queued for reading on `stream`.
pub(crate) fn queued(stream: &TcpStream) -> io::Result<usize> {
    let n = rustix::io::ioctl_fionread(stream)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// Sets `SO_RCVLOWAT`: poll reports the socket readable once `bytes` are queued (Linux
/// also grows the receive buffer to hold them where it may).
fn set_low_water(stream: &TcpStream, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `setsockopt` reads `size_of::<c_int>()` bytes from the pointer, which points
    // at `value`, alive for the call; the descriptor is `stream`'s, open while borrowed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
