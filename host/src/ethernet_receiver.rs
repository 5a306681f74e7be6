//! The receiving end of an Ethernet connection: one thread per accepted connection applies
//! the peer's frames to this rank's memory, in order.
//!
//! Every write and signal is resolved against this rank's own [`EthernetRegistry`] by
//! (id, offset, length) before anything is read into memory; a write's payload is read
//! whole into a buffer of one chunk (at most [`MAX_CHUNK_BYTES`]) and copied only once it
//! has arrived, so a frame cut short writes nothing. A signal is a release store, after
//! every earlier write (frames are applied in the order TCP delivers them); a flush is
//! acknowledged once every frame before it is applied. Where the rank's memory is a GPU's,
//! the buffer is a stager's pinned chunk, and the copy and the signal's store are the
//! stager's, in order (see `ethernet_staging.rs`).
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
use crate::ethernet_registry::EthernetRegistry;
use crate::ethernet_staging::{Stager, Staging};
use crate::ethernet_whole_payload::wait_whole_payload;
use crate::ethernet_wire::{
    MAX_CHUNK_BYTES, Message, ReadOutcome, WireError, read_exact_by, read_header, send_frame,
};
use oxccl_proxy::{FailureSink, ProxyError};
use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
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

/// A running receiver thread; dropping it closes the connection and waits (bounded) for
/// the thread.
pub(crate) struct Receiver {
    peer: u32,
    stream: TcpStream,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    join_timeout: Duration,
}

impl Receiver {
    /// Starts applying frames from `peer` on `stream` (already admitted).
    ///
    /// # Errors
    /// The socket could not be set up or the thread not started.
    pub(crate) fn spawn(stream: TcpStream, peer: u32, context: ReceiverContext) -> Result<Self> {
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
        let ours = stream.try_clone().map_err(|e| system("cloning", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let join_timeout = context.frame_timeout;
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("oxccl-eth-r{rank}-from{peer}"))
                .spawn(move || receive(stream, peer, &context, &stop))
                .map_err(|e| system("starting its thread", e))?
        };
        Ok(Receiver {
            peer,
            stream: ours,
            stop,
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
        // Relaxed: the flag carries no data; the shutdown below also wakes the thread.
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + self.join_timeout;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    peer = self.peer,
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

/// The thread: applies frames until the peer closes, the owner stops it, or a frame is
/// refused.
fn receive(stream: TcpStream, peer: u32, context: &ReceiverContext, stop: &AtomicBool) {
    let Ok(read_half) = stream.try_clone() else {
        return refuse(&stream, peer, context, "cannot clone the socket".into());
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
    // One chunk at most, grown as writes need it: the connection's whole buffer (the
    // stager's, where there is one).
    let mut chunk: Vec<u8> = Vec::new();
    let mut stager = match context.staging.as_ref().map(|s| s.stager()).transpose() {
        Ok(stager) => stager,
        Err(e) => return refuse(&stream, peer, context, format!("no staging buffer: {e}")),
    };
    loop {
        let timeout = context.frame_timeout;
        let next = read_header(
            &mut reader,
            // Relaxed: see `Receiver::drop`.
            || !stop.load(Ordering::Relaxed),
            || Instant::now() + timeout,
        );
        let message = match next {
            Ok(ReadOutcome::Frame(Message::Goodbye)) => {
                tracing::debug!(rank = context.rank, peer, "Ethernet connection closed");
                return;
            }
            Ok(ReadOutcome::Frame(message)) => message,
            Ok(ReadOutcome::Stopped) => return,
            Ok(ReadOutcome::Closed) if stop.load(Ordering::Relaxed) => return,
            Ok(ReadOutcome::Closed) => {
                // No goodbye: the peer's process ended (or its socket was closed) mid-run.
                // Recording raises this rank's stop word, so kernels waiting for the peer
                // end now, with this error, instead of at their wait limit.
                let what = format!("peer {peer} closed its connection without a goodbye");
                return context
                    .failures
                    .record(lost_peer(context.rank, peer, &what));
            }
            Err(_) if stop.load(Ordering::Relaxed) => return,
            Err(e @ WireError::Reset(_)) => {
                // Between frames, as a close without a goodbye: the peer is gone.
                let what = format!("peer {peer}'s connection ended without a goodbye ({e})");
                return context
                    .failures
                    .record(lost_peer(context.rank, peer, &what));
            }
            Err(e) => return refuse(&stream, peer, context, e.to_string()),
        };
        let buffer = Buffer {
            chunk: &mut chunk,
            stager: stager.as_deref_mut(),
        };
        if let Err(why) = apply(&message, &mut reader, buffer, &stream, context) {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            return refuse(&stream, peer, context, format!("{message}: {why}"));
        }
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
    reader: &mut BufReader<TcpStream>,
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
    reader: &mut BufReader<TcpStream>,
    addr: u64,
    len: usize,
    deadline: Instant,
) -> Result<bool, String> {
    if len == 0 {
        return Ok(true);
    }
    let buffered = reader.buffer().len().min(len);
    match wait_whole_payload(reader.get_ref(), len - buffered, deadline) {
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
    read_exact_by(reader.get_mut(), &mut dst[buffered..], deadline, "payload")
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
