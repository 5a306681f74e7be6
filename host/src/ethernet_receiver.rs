//! The receiving end of an Ethernet connection: one thread per accepted connection applies
//! the peer's frames to this rank's memory, in order, and so do this process's waiting
//! kernel threads while they wait (see `ethernet_receive_assist.rs`): whoever holds the
//! connection's reading state reads and applies the next frame, so frames are applied one
//! at a time and in order whichever thread does it; the receiver thread stays parked while
//! waiting threads look after the connection.
//!
//! Every write and signal is resolved against this rank's own [`EthernetRegistry`] by
//! (id, offset, length) before anything is read into memory; a write's payload is read
//! straight into its destination once all of it has arrived, or else whole into a buffer of
//! one chunk (at most [`MAX_CHUNK_BYTES`]) and copied only once it has, so a frame cut short
//! writes nothing. A signal is a release store, after every earlier write (frames are
//! applied in the order TCP delivers them); a flush is acknowledged once every frame before
//! it is applied. Where the rank's memory is a GPU's, the buffer is a stager's pinned chunk,
//! and the copy and the signal's store are the stager's, in order (see
//! `ethernet_staging.rs`); such connections are read by their thread alone.
//!
//! A connection that ends without the peer's [`Message::Goodbye`] (its process was killed
//! mid-run) is recorded the same way, naming the peer, so this rank's waits for it end at
//! once instead of at their limit.
//!
//! A refused frame (unknown id, range outside the registration, malformed or oversized
//! header or length, another wire version, a frame cut short or stalled past the limit, an
//! unexpected kind) writes nothing: the failure is recorded with the rank's proxy (its next
//! `check` reports it, and the rank's stop word is raised), the peer is told why in an
//! [`Message::Error`] frame, and the connection is closed.

use crate::error::{Error, Result};
use crate::ethernet::lost_peer;
use crate::ethernet_frame_reader::FrameReader;
use crate::ethernet_receive_assist::{dismiss, enlist};
use crate::ethernet_registry::EthernetRegistry;
use crate::ethernet_staging::{Stager, Staging};
use crate::ethernet_whole_payload::wait_whole_payload;
use crate::ethernet_wire::{
    MAX_CHUNK_BYTES, Message, ReadOutcome, WireError, read_exact_by, read_header, send_frame,
};
use oxccl_proxy::{FailureSink, ProxyError};
use parking_lot::Mutex;
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How often a receiver waiting between frames looks whether it should stop.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// Longest a refusing receiver reads what the peer still sends before closing (see
/// [`drain`]), and most bytes it reads.
const LINGER: Duration = Duration::from_millis(200);
const LINGER_BYTES: usize = 1 << 20;

/// Buffered bytes of a receiver's socket reads: many small frames per system call.
const READ_BUFFER_BYTES: usize = 4 << 10;

/// What a receiver needs to know and where it reports.
#[derive(Clone, Debug)]
pub(crate) struct ReceiverContext {
    /// This rank.
    pub rank: u32,
    /// The table writes are resolved against.
    pub registry: Arc<EthernetRegistry>,
    /// Where refusals are recorded.
    pub failures: FailureSink,
    /// How long a frame may take to arrive once begun, and a reply to be taken.
    pub frame_timeout: Duration,
    /// How the rank's memory is reached, where the host cannot at its address.
    pub staging: Option<Arc<dyn Staging>>,
}

/// A running receiver; dropping it closes the connection and waits (bounded) for the
/// thread.
pub(crate) struct Receiver {
    inbound: Arc<Inbound>,
    thread: Option<JoinHandle<()>>,
    join_timeout: Duration,
}

/// One admitted connection's reading end, shared by its receiver thread and the waiting
/// threads that assist it (see `ethernet_receive_assist.rs`): whoever holds `reading`
/// reads and applies the next frame, so frames are applied one at a time, in order.
pub(crate) struct Inbound {
    peer: u32,
    context: ReceiverContext,
    /// The socket: polled, and written for acknowledgements and refusals.
    stream: TcpStream,
    /// Raised by the owner to end the receiver.
    stop: AtomicBool,
    /// Raised once the connection is done with (closed, lost or refused): nobody reads it.
    finished: AtomicBool,
    reading: Mutex<ReadState>,
    /// Whether the reading state held bytes read from the socket and not consumed yet when
    /// it was last let go ([`Reading`]): waiting threads look at a connection whose socket
    /// has nothing only if so.
    unread: AtomicBool,
    /// Until when (nanoseconds after [`clock_epoch`]) waiting threads look after the
    /// connection, so the receiver thread stays parked instead of being woken per frame.
    covered_until: AtomicU64,
    /// Raised while the receiver thread reads a frame that waiting threads saw begun for
    /// too long ([`Inbound::uncover`]): they neither read nor cover the connection.
    handed_over: AtomicBool,
    /// The receiver thread, to unpark.
    thread: OnceLock<Thread>,
}

/// What reading a connection keeps from one frame to the next.
pub(crate) struct ReadState {
    /// The socket and the bytes read from it and not consumed yet.
    pub(crate) reader: FrameReader,
    /// One chunk at most, grown as writes need it: the connection's whole buffer (the
    /// stager's, where there is one).
    chunk: Vec<u8>,
    stager: Option<Box<dyn Stager>>,
    /// Since when a waiting thread has seen the next frame begun but not whole (see
    /// `ethernet_receive_assist.rs`).
    pub(crate) partial_since: Option<Instant>,
}

impl Receiver {
    /// Starts applying frames from `peer` on `stream` (already admitted).
    ///
    /// # Errors
    /// The socket could not be set up, no staging buffer, or the thread not started.
    pub(crate) fn spawn(stream: TcpStream, peer: u32, context: ReceiverContext) -> Result<Self> {
        let rank = context.rank;
        let join_timeout = context.frame_timeout;
        let inbound = Arc::new(Inbound::new(stream, peer, context)?);
        let thread = {
            let inbound = inbound.clone();
            std::thread::Builder::new()
                .name(format!("oxccl-eth-r{rank}-from{peer}"))
                .spawn(move || inbound.run())
                .map_err(|e| Error::System {
                    context: format!(
                        "rank {rank}: Ethernet receiver for peer {peer}: starting its thread"
                    ),
                    source: e,
                })?
        };
        let _ = inbound.thread.set(thread.thread().clone());
        // Where the rank's memory is a GPU's, the stager's copies stay on its own thread.
        if inbound.context.staging.is_none() {
            enlist(&inbound);
        }
        Ok(Receiver {
            inbound,
            thread: Some(thread),
            join_timeout,
        })
    }

    /// Whether the thread has ended (the connection closed or was refused).
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let inbound = &self.inbound;
        dismiss(inbound);
        // Relaxed: the flag carries no data; the shutdown below also wakes the thread.
        inbound.stop.store(true, Ordering::Relaxed);
        let _ = inbound.stream.shutdown(Shutdown::Both);
        inbound.wake();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + self.join_timeout;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    peer = inbound.peer,
                    "Ethernet receiver did not stop within {:?}; left to end by itself",
                    self.join_timeout
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = thread.join();
    }
}

/// Whether `socket` has something to read (bytes, its end, an error, a connection to
/// accept) within `timeout`.
pub(crate) fn readable(socket: &impl AsFd, timeout: Duration) -> bool {
    let timeout = Timespec::try_from(timeout).unwrap_or_default();
    let mut fds = [PollFd::new(socket, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&timeout)), Ok(n) if n > 0)
}

/// Whether `socket` takes a small write now without waiting (`POLLOUT`: TCP reports it
/// while at least a third of the send buffer is free).
pub(crate) fn writable(socket: &impl AsFd) -> bool {
    let mut fds = [PollFd::new(socket, PollFlags::OUT)];
    matches!(poll(&mut fds, Some(&Timespec::default())), Ok(n) if n > 0)
        && fds[0].revents().contains(PollFlags::OUT)
}

/// When a cover ends ([`Inbound::cover_until`]), on the clock of [`clock_now`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoverEnd(u64);

impl CoverEnd {
    /// `for_how_long` from now.
    pub(crate) fn after(for_how_long: Duration) -> Self {
        CoverEnd(clock_now().saturating_add(for_how_long.as_nanos() as u64))
    }
}

/// The instant [`Inbound::covered_until`] counts from.
fn clock_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from [`clock_epoch`] to now.
fn clock_now() -> u64 {
    u64::try_from(clock_epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Inbound {
    /// The reading end of `stream` (already admitted) from `peer`, with no thread yet.
    ///
    /// # Errors
    /// The socket could not be set up, or no staging buffer.
    pub(crate) fn new(stream: TcpStream, peer: u32, context: ReceiverContext) -> Result<Self> {
        let rank = context.rank;
        let system = |what: &str, e: std::io::Error| Error::System {
            context: format!("rank {rank}: Ethernet receiver for peer {peer}: {what}"),
            source: e,
        };
        stream
            .set_read_timeout(Some(IDLE_TICK))
            .map_err(|e| system("read timeout", e))?;
        stream
            .set_write_timeout(Some(context.frame_timeout))
            .map_err(|e| system("write timeout", e))?;
        let read_half = stream.try_clone().map_err(|e| system("cloning", e))?;
        let stager = context.staging.as_ref().map(|s| s.stager()).transpose()?;
        Ok(Inbound {
            peer,
            context,
            stream,
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            reading: Mutex::new(ReadState {
                reader: FrameReader::with_capacity(READ_BUFFER_BYTES, read_half),
                chunk: Vec::new(),
                stager,
                partial_since: None,
            }),
            unread: AtomicBool::new(false),
            covered_until: AtomicU64::new(0),
            handed_over: AtomicBool::new(false),
            thread: OnceLock::new(),
        })
    }

    /// The receiver thread: applies frames until the peer closes, the owner stops it, or a
    /// frame is refused. It stays parked while waiting threads look after the connection,
    /// and waits for the socket without holding `reading`, so they can.
    fn run(&self) {
        loop {
            if self.is_done() {
                return;
            }
            if let Some(left) = self.covered_for() {
                std::thread::park_timeout(left);
                continue;
            }
            {
                let mut state = Reading {
                    inbound: self,
                    state: self.reading.lock(),
                };
                if self.is_done() {
                    return;
                }
                if !state.reader.buffer().is_empty() || self.readable(Duration::ZERO) {
                    if !self.serve(&mut state) {
                        // Marked before the state is let go (see `ethernet_receive_assist`).
                        return self.finish();
                    }
                    state.partial_since = None;
                    self.handed_over.store(false, Ordering::Relaxed);
                    continue;
                }
            }
            self.readable(IDLE_TICK);
        }
    }

    /// Whether the owner stopped the receiver or the connection is done with.
    pub(crate) fn is_done(&self) -> bool {
        // Relaxed: flags that carry no data; `reading` orders the frames.
        self.stop.load(Ordering::Relaxed) || self.finished.load(Ordering::Relaxed)
    }

    /// Marks the connection done with and lets the receiver thread end.
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Relaxed);
        self.wake();
    }

    /// Unparks the receiver thread.
    pub(crate) fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }

    /// Says that a waiting thread looks after the connection for `for_how_long` from now
    /// (unless it is handed over to the receiver thread).
    pub(crate) fn cover(&self, for_how_long: Duration) {
        self.cover_until(CoverEnd::after(for_how_long));
    }

    /// As [`Self::cover`], until `end` (one clock read for a look's many connections).
    pub(crate) fn cover_until(&self, end: CoverEnd) {
        if self.is_handed_over() {
            return;
        }
        // Relaxed: a hint for the receiver thread, which carries no data. Read first: a
        // cover already as long leaves the cache line alone.
        if self.covered_until.load(Ordering::Relaxed) < end.0 {
            self.covered_until.fetch_max(end.0, Ordering::Relaxed);
        }
    }

    /// Hands the connection to the receiver thread now, until it has read the next frame.
    pub(crate) fn uncover(&self) {
        // Relaxed: flags that carry no data.
        self.handed_over.store(true, Ordering::Relaxed);
        self.covered_until.store(0, Ordering::Relaxed);
        self.wake();
    }

    /// How much longer waiting threads look after the connection, if they do now.
    pub(crate) fn covered_for(&self) -> Option<Duration> {
        let until = self.covered_until.load(Ordering::Relaxed);
        let now = clock_now();
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// Whether the receiver thread reads the next frame (see [`Self::uncover`]).
    pub(crate) fn is_handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Relaxed)
    }

    /// The reading state, if nobody holds it.
    pub(crate) fn try_reading(&self) -> Option<Reading<'_>> {
        let state = self.reading.try_lock()?;
        Some(Reading {
            inbound: self,
            state,
        })
    }

    /// Whether bytes read from the socket were left unconsumed in the reading state when it
    /// was last let go (a frame that came in one read with the one applied): the socket's
    /// readiness does not show them.
    pub(crate) fn has_unread(&self) -> bool {
        // Relaxed: a hint; whoever acts on it takes `reading`, which orders the bytes.
        self.unread.load(Ordering::Relaxed)
    }

    /// The socket.
    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Whether the socket has something to read within `timeout` (see [`readable`]).
    fn readable(&self, timeout: Duration) -> bool {
        readable(&self.stream, timeout)
    }

    /// Reads and applies the next frame; returns false once the connection is done with
    /// (closed, lost, refused or stopped; the failure, if any, is recorded).
    pub(crate) fn serve(&self, state: &mut ReadState) -> bool {
        let (peer, context, stop) = (self.peer, &self.context, &self.stop);
        let timeout = context.frame_timeout;
        let next = read_header(
            &mut state.reader,
            // Relaxed: see `Receiver::drop`.
            || !stop.load(Ordering::Relaxed),
            || Instant::now() + timeout,
        );
        let message = match next {
            Ok(ReadOutcome::Frame(Message::Goodbye)) => {
                tracing::debug!(rank = context.rank, peer, "Ethernet connection closed");
                return false;
            }
            Ok(ReadOutcome::Frame(message)) => message,
            Ok(ReadOutcome::Stopped) => return false,
            Ok(ReadOutcome::Closed) if stop.load(Ordering::Relaxed) => return false,
            Ok(ReadOutcome::Closed) => {
                // No goodbye: the peer's process ended (or its socket was closed) mid-run.
                // Recording raises this rank's stop word, so kernels waiting for the peer
                // end now, with this error, instead of at their wait limit.
                let what = format!("peer {peer} closed its connection without a goodbye");
                context
                    .failures
                    .record(lost_peer(context.rank, peer, &what));
                return false;
            }
            Err(_) if stop.load(Ordering::Relaxed) => return false,
            Err(e @ WireError::Reset(_)) => {
                // Between frames, as a close without a goodbye: the peer is gone.
                let what = format!("peer {peer}'s connection ended without a goodbye ({e})");
                context
                    .failures
                    .record(lost_peer(context.rank, peer, &what));
                return false;
            }
            Err(e) => {
                refuse(&self.stream, peer, context, e.to_string());
                return false;
            }
        };
        let buffer = Buffer {
            chunk: &mut state.chunk,
            stager: state.stager.as_deref_mut(),
        };
        if let Err(why) = apply(&message, &mut state.reader, buffer, &self.stream, context) {
            if !stop.load(Ordering::Relaxed) {
                refuse(&self.stream, peer, context, format!("{message}: {why}"));
            }
            return false;
        }
        true
    }
}

impl ReadState {
    /// The bytes read from the socket and not consumed yet.
    pub(crate) fn buffered(&self) -> &[u8] {
        self.reader.buffer()
    }
}

/// A connection's reading state, held: on letting it go, records whether bytes are left
/// unconsumed in it ([`Inbound::has_unread`]).
pub(crate) struct Reading<'a> {
    inbound: &'a Inbound,
    state: parking_lot::MutexGuard<'a, ReadState>,
}

impl std::ops::Deref for Reading<'_> {
    type Target = ReadState;

    fn deref(&self) -> &ReadState {
        &self.state
    }
}

impl std::ops::DerefMut for Reading<'_> {
    fn deref_mut(&mut self) -> &mut ReadState {
        &mut self.state
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let unread = !self.state.buffered().is_empty();
        // Relaxed: see `Inbound::has_unread`.
        self.inbound.unread.store(unread, Ordering::Relaxed);
    }
}

/// Where a receiver reads payloads: its own chunk, or its stager's.
struct Buffer<'a> {
    chunk: &'a mut Vec<u8>,
    stager: Option<&'a mut (dyn Stager + 'static)>,
}

/// Applies one frame (reading a write's payload first).
fn apply(
    message: &Message,
    reader: &mut FrameReader,
    buffer: Buffer<'_>,
    stream: &TcpStream,
    context: &ReceiverContext,
) -> Result<(), String> {
    match *message {
        Message::Write { id, offset, len } => {
            // Checked before a payload byte is read; `decode_header` bounds `len` already,
            // this keeps the buffer bounded whatever changes there.
            if len > MAX_CHUNK_BYTES {
                return Err(WireError::PayloadTooLong { len: len as u64 }.to_string());
            }
            let len = len as usize;
            let addr = context
                .registry
                .resolve(id, offset, len as u64)
                .map_err(|e| e.to_string())?;
            let deadline = Instant::now() + context.frame_timeout;
            if let Some(stager) = buffer.stager {
                read_exact_by(reader, &mut stager.buffer()[..len], deadline, "payload")
                    .map_err(|e| e.to_string())?;
                if len == 0 {
                    return Ok(());
                }
                // SAFETY: `addr..addr + len` lies inside a registration of this rank
                // (resolved above), kept allocated by the registry; `len` is at most a
                // chunk (checked above).
                return unsafe { stager.copy_in(addr, len) }
                    .map_err(|e| format!("copying into memory: {e}"));
            }
            if read_in_place(reader, addr, len, deadline)? {
                return Ok(());
            }
            let chunk = buffer.chunk;
            if chunk.len() < len {
                chunk.resize(len, 0);
            }
            read_exact_by(reader, &mut chunk[..len], deadline, "payload")
                .map_err(|e| e.to_string())?;
            if len > 0 {
                // SAFETY: `addr..addr + len` lies inside a registration of this rank
                // (resolved above), whose memory the registry keeps allocated as long as
                // it lives, and we hold it; `chunk` is our own buffer, which cannot overlap
                // device memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), addr as usize as *mut u8, len)
                };
            }
            Ok(())
        }
        Message::Signal { id, offset, value } => {
            let addr = context
                .registry
                .resolve_semaphore(id, offset)
                .map_err(|e| e.to_string())?;
            if let Some(stager) = buffer.stager {
                // SAFETY: an aligned u64 inside a registration of this rank, kept allocated
                // by the registry (resolved and checked above), a semaphore cell only
                // accessed atomically; the stager writes it after its copies of the writes
                // before this frame.
                return unsafe { stager.store_counter(addr, value) }
                    .map_err(|e| format!("raising the semaphore: {e}"));
            }
            // SAFETY: an aligned u64 inside a registration of this rank, kept allocated by
            // the registry (resolved and checked above); semaphore cells are only accessed
            // atomically.
            let cell = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
            // Release: pairs with the kernel's Acquire load of its inbound counter, so the
            // writes applied before this frame are visible to it.
            cell.store(value, Ordering::Release);
            Ok(())
        }
        Message::Flush { seq } => send_frame(stream, &Message::FlushAck { seq }, &[])
            .map_err(|e| format!("acknowledging: {e}")),
        Message::Error { ref reason } => Err(format!("the peer gave up: {reason}")),
        ref other => Err(format!("a {} frame has no place here", other.kind())),
    }
}

/// Reads a write's `len` payload bytes straight into its destination at `addr`, if all of
/// them are already buffered or queued on the socket by `deadline` (so the reads cannot
/// come up short and nothing of a frame that ends early is written); returns whether it
/// did. See `ethernet_whole_payload.rs`.
fn read_in_place(
    reader: &mut FrameReader,
    addr: u64,
    len: usize,
    deadline: Instant,
) -> Result<bool, String> {
    if len == 0 {
        return Ok(true);
    }
    let buffered = reader.buffer().len().min(len);
    match wait_whole_payload(reader.stream(), len - buffered, deadline) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) => {
            // A socket that will not say (an option this kernel refuses, say): the buffered
            // path reads the payload all the same, and reports a socket that failed.
            tracing::debug!(%e, "Ethernet receiver: payload not read in place");
            return Ok(false);
        }
    }
    // SAFETY: `addr..addr + len` lies inside a registration of this rank (resolved by the
    // caller), which the registry keeps allocated while it lives; the channel's contract
    // gives this put's destination to the receiver alone until the signal that follows it,
    // so nothing else accesses these bytes while the slice lives.
    let dst = unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len) };
    dst[..buffered].copy_from_slice(&reader.buffer()[..buffered]);
    reader.consume(buffered);
    read_exact_by(
        &mut reader.stream(),
        &mut dst[buffered..],
        deadline,
        "payload",
    )
    .map_err(|e| e.to_string())?;
    Ok(true)
}

/// Records the refusal, tells the peer why, and closes the connection.
fn refuse(stream: &TcpStream, peer: u32, context: &ReceiverContext, why: String) {
    context.failures.record(ProxyError::Inbound {
        rank: context.rank,
        peer,
        transport: "ethernet",
        message: why.clone(),
    });
    let _ = send_frame(stream, &Message::error(&why), &[]);
    let _ = stream.shutdown(Shutdown::Write);
    drain(stream);
}

/// Reads and drops what the peer still sends, for a moment: a socket closed with unread
/// bytes sends a reset, which can destroy the error frame before the peer reads it.
fn drain(mut stream: &TcpStream) {
    use std::io::Read;
    let deadline = Instant::now() + LINGER;
    let mut left = LINGER_BYTES;
    let mut sink = [0u8; 4096];
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    while left > 0 && Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(n) => left = left.saturating_sub(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}
