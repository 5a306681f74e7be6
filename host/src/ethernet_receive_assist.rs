//! Waiting threads read Ethernet frames: a kernel thread that waits (for a peer's signal,
//! say) applies the frames that have arrived for this process's receivers itself, in place
//! of yielding its core, as an MPI rank progresses its own receives.
//!
//! Why: a receiver thread blocked on its socket is woken for each frame, a context switch
//! (and, on a virtual machine, an interrupt between cores) per frame, and on a machine with
//! fewer cores than busy threads it competes with the kernel threads that wait for it. With
//! two ranks on 2 cores, a 4 MiB all-reduce over loopback Ethernet made about 60 context
//! switches a call, and its waiting threads spent a fifth of the CPU time yielding to each
//! other; Open MPI over TCP, one thread a rank that polls its sockets, made one per 2,500
//! calls.
//!
//! How: [`oxccl_device::arch::host::set_wait_work`] makes every waiting thread past its
//! spin budget call [`assist`], which, for each enlisted connection whose reading nobody
//! holds and which has something (one `poll` for many sockets, and a flag for bytes read
//! but not consumed), applies the frames that have arrived *whole* (so it never waits on
//! the network), at most [`FRAMES_PER_ASSIST`] at a time, through the same checks and code
//! as the receiver thread, one waiting thread at a time ([`Look`]): a thread that finds
//! another looking goes on waiting. Each look says the connection is covered for
//! [`COVER`]; the receiver thread stays parked while it is, instead of waiting on its
//! socket, so data that arrive wake nobody. Once nobody waits any more (the kernels
//! compute, or ended), the cover runs out and the receiver thread reads again, at most
//! [`COVER`] later.
//!
//! A frame seen begun but not whole for longer than [`PARTIAL_LIMIT`] (a payload larger
//! than the socket can queue, whose sender waits for it to be read; a peer that stalled
//! mid-frame) is handed to the receiver thread at once, which reads it under the frame
//! deadline as it always did, then goes back to being covered. So is a flush whose
//! acknowledgement the socket cannot take at once (a peer that sends flushes but does not
//! read its acknowledgements would otherwise hold the waiting thread in a blocking send, up
//! to the frame limit).
//!
//! Connections that reach a GPU's memory through a stager are not enlisted: their copies
//! stay on the receiver thread.

use crate::ethernet_frame_reader::Arrived;
use crate::ethernet_ready_set::ReadySet;
use crate::ethernet_receiver::{CoverEnd, Inbound, ReadState, readable, writable};
use crate::ethernet_whole_payload::queued;
use crate::ethernet_wire::{LENGTH_PREFIX_BYTES, MAX_HEADER_BYTES, Message, decode_header};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long one look of a waiting thread keeps the receiver thread parked.
pub(crate) const COVER: Duration = Duration::from_millis(1);

/// How long a frame may be seen begun but not whole before it is handed to the receiver
/// thread.
pub(crate) const PARTIAL_LIMIT: Duration = Duration::from_micros(200);

/// Most frames one call of [`assist`] applies per connection: the waiting thread goes back
/// to its own condition soon.
pub(crate) const FRAMES_PER_ASSIST: usize = 4;

/// An enlisted connection.
struct Entry {
    inbound: Weak<Inbound>,
    /// Whether its socket is in the process's [`ReadySet`] (under [`token`]); one that is
    /// not is looked at in every look.
    in_set: bool,
}

/// The enlisted connections of this process.
static ENLISTED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// How many are enlisted: a process without any pays one load per look.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The sockets of the enlisted connections (`None`: the system refused the set, and every
/// connection is looked at in every look).
static READY_SET: OnceLock<Option<ReadySet>> = OnceLock::new();

/// The process's ready set, made at the first call.
fn ready_set() -> Option<&'static ReadySet> {
    READY_SET
        .get_or_init(|| {
            ReadySet::new()
                .inspect_err(|e| {
                    tracing::debug!(%e, "Ethernet receive assist: no epoll set, every look reads every connection");
                })
                .ok()
        })
        .as_ref()
}

/// The token of `inbound` in the ready set: its address, unique while the entry's `Weak`
/// keeps the allocation.
fn token(inbound: &Weak<Inbound>) -> u64 {
    inbound.as_ptr() as usize as u64
}

/// Lets waiting threads read `inbound` (and installs the wait work, once).
pub(crate) fn enlist(inbound: &Arc<Inbound>) {
    oxccl_device::arch::host::set_wait_work(assist);
    let weak = Arc::downgrade(inbound);
    let in_set = ready_set().is_some_and(|set| {
        set.add(inbound.stream(), token(&weak))
            .inspect_err(
                |e| tracing::debug!(%e, "Ethernet receive assist: socket not in the epoll set"),
            )
            .is_ok()
    });
    let mut enlisted = ENLISTED.lock();
    enlisted.retain(|e| e.inbound.strong_count() > 0);
    enlisted.push(Entry {
        inbound: weak,
        in_set,
    });
    COUNT.store(enlisted.len(), Ordering::Relaxed);
}

/// Stops waiting threads from reading `inbound` (those reading it now finish their frame).
pub(crate) fn dismiss(inbound: &Arc<Inbound>) {
    let mut enlisted = ENLISTED.lock();
    let me = Arc::downgrade(inbound);
    enlisted.retain(|e| {
        let gone = e.inbound.ptr_eq(&me);
        if gone
            && e.in_set
            && let Some(set) = ready_set()
        {
            // Closing its descriptors would remove it too; this takes it out now.
            let _ = set.remove(inbound.stream());
        }
        e.inbound.strong_count() > 0 && !gone
    });
    COUNT.store(enlisted.len(), Ordering::Relaxed);
}

/// How long a thread waiting for a reply first looks at its socket before it looks at the
/// receivers again ([`assist_until_readable`]); the look doubles while there is nothing to
/// apply, up to [`COVER`].
const REPLY_POLL: Duration = Duration::from_micros(20);

/// Waits until `stream` has something to read (a reply, its end, an error) or `deadline`
/// passes, applying meanwhile the frames that arrive for this process's receivers.
///
/// Why: a thread that waits for a flush's acknowledgement while it covers receivers (a
/// kernel thread executing its own triggers) would otherwise leave them unread until their
/// cover ran out; when the peer flushes to us at the same time, each side's acknowledgement
/// waits in a receiver the other side covers, and both would stall for [`COVER`].
pub(crate) fn assist_until_readable(stream: &TcpStream, deadline: Instant) {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut look = REPLY_POLL;
    while !readable(stream, Duration::ZERO) && Instant::now() < deadline {
        if assist() {
            look = REPLY_POLL;
        } else if readable(stream, look) {
            return;
        } else {
            look = (look * 2).min(COVER);
        }
    }
}

/// The wait work: applies the whole frames that have arrived on every enlisted connection
/// nobody is reading; returns whether it applied any.
///
/// One `epoll_wait` ([`ReadySet`]) tells which sockets have something; only those, and the
/// connections with bytes left unconsumed in their reading state, are looked at further.
/// The others are covered, as a look that found nothing would. A look at each (a peek, a
/// system call per connection) cost a waiting thread of 4 ranks over Ethernet 12 system
/// calls per look, most of them finding nothing, on cores the ranks that had something to
/// do were short of; a `poll` of all of them, a quarter of the CPU time of 4 ranks as
/// processes.
fn assist() -> bool {
    // Relaxed: a connection enlisted a moment ago is found at the next look.
    if COUNT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let chosen = {
        let Some(_look) = Look::begin() else {
            // Another waiting thread is looking at the connections now.
            return false;
        };
        choose(&Readiness::now())
    };
    // Frames are applied after the look: two threads may apply frames of different
    // connections at once (reading a large payload takes a while).
    let mut applied = false;
    for inbound in &chosen {
        applied |= assist_one(inbound);
    }
    applied
}

/// Raised while a waiting thread looks at the connections ([`Look`]).
static LOOKING: AtomicBool = AtomicBool::new(false);

/// The one look at the connections under way in the process: which ones have something.
///
/// Why one at a time: every waiting thread of the process looks for work, and connections
/// are the process's, so a look by one serves them all; looks at once by several only
/// compete for the same sockets and for the same connections' reference counts and covers.
/// Four ranks over Ethernet on 2 cores made half as many `poll` calls a call with one look
/// at a time, and took some 20 % less time.
///
/// A look is short (one `epoll_wait` and a pass over the list; frames are applied after
/// it). A thread descheduled during one holds up the others' looks, not the frames: once
/// the covers run out ([`COVER`]), the receiver threads read again.
struct Look;

impl Look {
    /// The look, if no other thread is looking.
    fn begin() -> Option<Look> {
        // Relaxed first: a thread that finds a look under way leaves the flag's cache
        // line alone. Acquire: pairs with the Release in `drop` (the flag guards no data:
        // the reading states have locks of their own).
        if LOOKING.load(Ordering::Relaxed) || LOOKING.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(Look)
    }
}

impl Drop for Look {
    fn drop(&mut self) {
        LOOKING.store(false, Ordering::Release);
    }
}

/// Most ready sockets one look learns of; more wait for the next look (the set is
/// level-triggered: they are reported again).
const READY_MOST: usize = 32;

/// Which sockets of the ready set had something to read when a look began.
struct Readiness {
    /// Those under these tokens (the first `n`)...
    tokens: [u64; READY_MOST],
    n: usize,
    /// ... unless this is false: not known (no set, or the call failed), and every
    /// connection is looked at.
    known: bool,
}

impl Readiness {
    /// What the ready set says now.
    fn now() -> Self {
        let mut readiness = Readiness {
            tokens: [0; READY_MOST],
            n: 0,
            known: false,
        };
        if let Some(set) = ready_set()
            && let Ok(n) = set.ready(&mut readiness.tokens)
        {
            readiness.n = n;
            readiness.known = true;
        }
        readiness
    }

    /// Whether the socket of `entry` may have something to read.
    fn includes(&self, entry: &Entry) -> bool {
        !self.known || !entry.in_set || self.tokens[..self.n].contains(&token(&entry.inbound))
    }
}

/// Connections a look chose, held (a few without an allocation).
type Chosen = SmallVec<[Arc<Inbound>; 8]>;

/// The enlisted connections nobody has handed over whose socket `ready` includes or whose
/// reading state holds unconsumed bytes; the others are covered, as a look that found
/// nothing would. The list's lock is held for the pass only: no frame is applied under a
/// lock that enlisting waits for.
fn choose(ready: &Readiness) -> Chosen {
    let mut chosen = Chosen::new();
    let cover = CoverEnd::after(COVER);
    let enlisted = ENLISTED.lock();
    for entry in enlisted.iter() {
        let Some(inbound) = entry.inbound.upgrade() else {
            continue;
        };
        if inbound.is_done() || inbound.is_handed_over() {
            continue;
        }
        if wanted(&inbound, ready.includes(entry), cover) {
            chosen.push(inbound);
        }
    }
    chosen
}

/// Whether a look takes `inbound`: its socket may have something (`socket_ready`), or its
/// reading state holds unconsumed bytes; if not, the look covers it until `cover`.
fn wanted(inbound: &Inbound, socket_ready: bool, cover: CoverEnd) -> bool {
    if socket_ready || inbound.has_unread() {
        return true;
    }
    inbound.cover_until(cover);
    false
}

/// Applies the whole frames that have arrived on `inbound`, if nobody is reading it.
fn assist_one(inbound: &Inbound) -> bool {
    if inbound.is_done() || inbound.is_handed_over() {
        return false;
    }
    let Some(mut state) = inbound.try_reading() else {
        // Its thread or another waiting thread is reading it.
        inbound.cover(COVER);
        return false;
    };
    if inbound.is_done() || inbound.is_handed_over() {
        return false;
    }
    let mut applied = false;
    // Whether the socket may hold bytes not read yet: the poll said it had some, and a
    // read that found fewer than it had room for left it empty (what arrives after is for
    // the next look: not reading is never wrong, only later).
    let mut may_read = true;
    for _ in 0..FRAMES_PER_ASSIST {
        match next_frame(inbound, &mut state, &mut may_read) {
            NextFrame::Whole => {
                applied = true;
                state.partial_since = None;
                if !inbound.serve(&mut state) {
                    // Marked while still holding the state: a reader that takes it next
                    // finds the connection done with, instead of reading what follows
                    // (the end of a connection it refused, say).
                    inbound.finish();
                    return true;
                }
            }
            NextFrame::AnswerWaits => {
                // The receiver thread may wait, under the frame limit, for the peer to
                // take the acknowledgement; a waiting thread may not.
                drop(state);
                inbound.uncover();
                return applied;
            }
            NextFrame::Begun => {
                let since = *state.partial_since.get_or_insert_with(Instant::now);
                if since.elapsed() > PARTIAL_LIMIT {
                    drop(state);
                    inbound.uncover();
                    return applied;
                }
                break;
            }
            NextFrame::Nothing => {
                state.partial_since = None;
                break;
            }
        }
    }
    drop(state);
    inbound.cover(COVER);
    applied
}

/// What a connection has for a reader that must not wait.
#[derive(Debug, PartialEq, Eq)]
enum NextFrame {
    /// A whole frame (or an end, or an error, which reading reports at once).
    Whole,
    /// Part of a frame: reading it now could wait.
    Begun,
    /// A whole frame whose answer (a flush's acknowledgement) the socket cannot take now:
    /// applying it could wait for the peer to read.
    AnswerWaits,
    /// Nothing.
    Nothing,
}

/// Whether the next frame of `inbound` can be read and applied without waiting.
///
/// A frame already read whole into `state`'s buffer costs no system call. Otherwise, if
/// `may_read`, what has arrived is read behind the buffered bytes without waiting (one
/// `recv`, which moves the frame into the buffer if it is whole and no larger than the
/// buffer), and `may_read` says afterwards whether the socket may hold more; a write whose
/// payload is larger than the buffer is whole once the socket queues the rest (its length,
/// a second system call), which reading then moves straight to its destination.
fn next_frame(inbound: &Inbound, state: &mut ReadState, may_read: &mut bool) -> NextFrame {
    if let Some(whole) = whole_in_buffer(inbound, state.buffered()) {
        return whole;
    }
    if *may_read {
        match state.reader.read_arrived() {
            Arrived::Bytes { drained, .. } => *may_read = !drained,
            Arrived::Nothing => *may_read = false,
            // Reading reports the end (or cuts short what is buffered) and the failure.
            Arrived::Ended | Arrived::Failed => return NextFrame::Whole,
        }
        if let Some(whole) = whole_in_buffer(inbound, state.buffered()) {
            return whole;
        }
    }
    let buffered = state.buffered();
    if buffered.is_empty() {
        return NextFrame::Nothing;
    }
    let Some((need, _)) = frame_size(buffered) else {
        return NextFrame::Begun;
    };
    if need <= state.reader.capacity() {
        // It would fit behind the buffered bytes: all that had arrived was read.
        return NextFrame::Begun;
    }
    let Ok(queued) = queued(inbound.stream()) else {
        return NextFrame::Whole;
    };
    if buffered.len().saturating_add(queued) >= need {
        NextFrame::Whole
    } else {
        NextFrame::Begun
    }
}

/// What the frame at the front of `buffered` is, if it lies there whole (or reading refuses
/// it from the bytes there): [`NextFrame::Whole`], or [`NextFrame::AnswerWaits`] for a
/// flush whose acknowledgement `inbound`'s socket cannot take now.
fn whole_in_buffer(inbound: &Inbound, buffered: &[u8]) -> Option<NextFrame> {
    let (need, answered) = frame_size(buffered)?;
    if need > buffered.len() {
        return None;
    }
    Some(if answered && !writable(inbound.stream()) {
        NextFrame::AnswerWaits
    } else {
        NextFrame::Whole
    })
}

/// Bytes of the frame that `head` (its first bytes) begins, prefix and payload included, once
/// `head` holds its whole header; the bytes of `head` alone where reading refuses the frame
/// as soon as it reads them (a header length out of bounds, a header that does not decode);
/// `None` while the header is not all in `head`. With them, whether applying the frame writes
/// an answer to the peer (a flush's acknowledgement).
fn frame_size(head: &[u8]) -> Option<(usize, bool)> {
    let prefix = head.first_chunk::<LENGTH_PREFIX_BYTES>()?;
    let len = u16::from_le_bytes(*prefix) as usize;
    if len == 0 || len > MAX_HEADER_BYTES {
        return Some((head.len(), false));
    }
    let header = head.get(LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + len)?;
    let (payload, answered) = match decode_header(header) {
        Ok(Message::Write { len, .. }) => (len as usize, false),
        Ok(Message::Flush { .. }) => (0, true),
        // Another frame has no payload and no answer.
        Ok(_) => (0, false),
        Err(_) => return Some((head.len(), false)),
    };
    Some((LENGTH_PREFIX_BYTES + len + payload, answered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethernet_receiver::ReceiverContext;
    use crate::ethernet_registry::EthernetRegistry;
    use crate::ethernet_wire::{MAX_FRAME_HEADER_BYTES, encode};
    use oxccl_proxy::{ProxyConfig, ProxyService};
    use std::io::Write;
    use std::net::{Ipv4Addr, TcpListener};

    /// A look at `inbound` alone and the frames it finds applied, as [`assist`] does, its
    /// socket asked with `poll` (it is not enlisted: no other test's waiting thread reads
    /// it).
    fn look_at(inbound: &Inbound) -> bool {
        let ready = readable(inbound.stream(), Duration::ZERO);
        wanted(inbound, ready, CoverEnd::after(COVER)) && assist_one(inbound)
    }

    /// The bytes of a frame writing `payload` at `offset` of registration `id`, and the
    /// length of its header.
    fn write_frame(id: u32, offset: u64, payload: &[u8]) -> (Vec<u8>, usize) {
        let mut head = [0u8; MAX_FRAME_HEADER_BYTES];
        let write = Message::Write {
            id,
            offset,
            len: payload.len() as u32,
        };
        let n = encode(&write, &mut head).unwrap();
        ([&head[..n], payload].concat(), n)
    }

    /// A test client's connection into an inbound end that writes into `memory`,
    /// registered as `id` (no receiver thread: the test reads it).
    struct Fixture {
        proxy: ProxyService,
        memory: Box<[u8]>,
        id: u32,
        client: TcpStream,
        inbound: Arc<Inbound>,
    }

    /// A [`Fixture`] whose memory holds `bytes` bytes of `fill`.
    fn fixture(fill: u8, bytes: usize) -> Fixture {
        let proxy = ProxyService::new(ProxyConfig::default()).unwrap();
        let mut memory = vec![fill; bytes].into_boxed_slice();
        let registry = Arc::new(EthernetRegistry::new());
        let id = registry
            .add(memory.as_mut_ptr() as u64, bytes as u64, Arc::new(()))
            .unwrap();
        let context = ReceiverContext {
            rank: 0,
            registry,
            failures: proxy.failure_sink(),
            frame_timeout: Duration::from_secs(5),
            staging: None,
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let inbound = Arc::new(Inbound::new(accepted, 1, context).unwrap());
        Fixture {
            proxy,
            memory,
            id,
            client,
            inbound,
        }
    }

    /// Guards against a frame that stops mid-way keeping its connection covered for good:
    /// waiting threads never read a frame that is not whole (they must not wait on the
    /// network), so past [`PARTIAL_LIMIT`] they hand it to the receiver thread (which reads it
    /// under the frame limit, as without them) and neither read nor cover the connection
    /// until that thread has read it. With no receiver thread here, the frame stays unread.
    #[test]
    fn a_frame_begun_too_long_is_handed_to_the_receiver_thread() {
        let Fixture {
            proxy,
            memory,
            id,
            mut client,
            inbound,
        } = fixture(0xaa, 4096);
        // A write of 1000 bytes of which 100 come.
        let (frame, n) = write_frame(id, 0, &[1; 1000]);
        client.write_all(&frame[..n + 100]).unwrap();
        let start = Instant::now();
        while !inbound.is_handed_over() {
            assert!(!assist_one(&inbound), "a frame not whole was applied");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "a frame begun for {:?} was never handed over",
                start.elapsed()
            );
        }
        assert!(start.elapsed() >= PARTIAL_LIMIT, "handed over too soon");
        assert!(
            inbound.covered_for().is_none(),
            "handed over, but still covered"
        );
        // Even once the frame is whole, waiting threads leave it to the receiver thread:
        // what they read of it stays in the connection's buffer, unapplied.
        client.write_all(&frame[n + 100..]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!assist_one(&inbound));
        assert!(inbound.covered_for().is_none());
        let mut state = inbound.try_reading().unwrap();
        assert_eq!(state.buffered().len(), n + 100, "read past the part seen");
        assert!(proxy.check().is_ok());
        assert!(memory.iter().all(|&b| b == 0xaa), "a frame was written");
        // The receiver thread then applies it whole, the part in the buffer first.
        assert!(inbound.serve(&mut state));
        drop(state);
        assert!(memory[..1000].iter().all(|&b| b == 1), "the frame was lost");
        assert!(memory[1000..].iter().all(|&b| b == 0xaa));
        assert!(proxy.check().is_ok());
    }

    /// Guards the reads of waiting threads: a frame that arrives in pieces is read into the
    /// connection's buffer piece by piece and applied by the look that finds it whole, its
    /// bytes in order; a write larger than the buffer is applied once the socket holds all
    /// of it, and not before.
    #[test]
    fn frames_are_applied_by_the_look_that_finds_them_whole() {
        const LARGE: usize = 48 << 10;
        let Fixture {
            proxy,
            memory,
            id,
            mut client,
            inbound,
        } = fixture(0, 2 * LARGE);
        let payload = |len: usize, byte: u8| -> Vec<u8> {
            (0..len).map(|i| byte.wrapping_add(i as u8)).collect()
        };
        let frame =
            |offset: u64, len: usize, byte: u8| write_frame(id, offset, &payload(len, byte)).0;
        let arrive = |client: &mut TcpStream, bytes: &[u8]| {
            client.write_all(bytes).unwrap();
            // Loopback delivers at once; the look must find the bytes there.
            std::thread::sleep(Duration::from_millis(20));
            // As if the piece had come within `PARTIAL_LIMIT` (the limit is the subject of
            // `a_frame_begun_too_long_is_handed_to_the_receiver_thread`).
            inbound.try_reading().unwrap().partial_since = None;
        };
        // 1000 bytes in three pieces, the first cutting the header.
        let small = frame(0, 1000, 7);
        arrive(&mut client, &small[..5]);
        assert!(!assist_one(&inbound), "applied from 5 bytes");
        arrive(&mut client, &small[5..600]);
        assert!(!assist_one(&inbound), "applied from 600 bytes");
        assert!(memory[..1000].iter().all(|&b| b == 0), "written early");
        arrive(&mut client, &small[600..]);
        assert!(assist_one(&inbound), "a whole frame was not applied");
        assert_eq!(&memory[..1000], &payload(1000, 7)[..]);
        // A write larger than the buffer: not applied while part of it is missing.
        let large = frame(LARGE as u64, LARGE, 3);
        arrive(&mut client, &large[..LARGE / 2]);
        assert!(!assist_one(&inbound), "applied from half of it");
        assert!(memory[LARGE..].iter().all(|&b| b == 0), "written early");
        arrive(&mut client, &large[LARGE / 2..]);
        assert!(assist_one(&inbound), "a whole large frame was not applied");
        assert_eq!(&memory[LARGE..], &payload(LARGE, 3)[..]);
        assert!(!inbound.is_handed_over());
        assert!(proxy.check().is_ok());
    }

    /// Guards against a peer that holds a waiting thread: a flush's acknowledgement is a
    /// write to the peer, which blocks (up to the frame limit) once the peer stops reading
    /// and the socket's buffers are full. A waiting thread must not wait on the network, so
    /// it leaves such a flush to the receiver thread: every look returns at once, and the
    /// connection is handed over.
    #[test]
    fn a_flush_that_cannot_be_answered_at_once_is_handed_to_the_receiver_thread() {
        let proxy = ProxyService::new(ProxyConfig::default()).unwrap();
        let context = ReceiverContext {
            rank: 0,
            registry: Arc::new(EthernetRegistry::new()),
            failures: proxy.failure_sink(),
            frame_timeout: Duration::from_secs(5),
            staging: None,
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        rustix::net::sockopt::set_socket_recv_buffer_size(&client, 4096).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&accepted, 4096).unwrap();
        let inbound = Inbound::new(accepted, 1, context).unwrap();
        // Flushes, whose acknowledgements the client never reads.
        let mut flushes = Vec::new();
        for seq in 0..20_000 {
            let mut head = [0u8; MAX_FRAME_HEADER_BYTES];
            let n = encode(&Message::Flush { seq }, &mut head).unwrap();
            flushes.extend_from_slice(&head[..n]);
        }
        let sender = std::thread::spawn(move || {
            client
                .set_write_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let _ = client.write_all(&flushes);
            client
        });
        let start = Instant::now();
        let mut longest = Duration::ZERO;
        while !inbound.is_handed_over() {
            let look = Instant::now();
            assist_one(&inbound);
            longest = longest.max(look.elapsed());
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never handed over"
            );
        }
        assert!(
            longest < Duration::from_millis(500),
            "a look waited {longest:?} to acknowledge a flush"
        );
        assert!(inbound.covered_for().is_none());
        drop(inbound);
        drop(sender.join().unwrap());
    }

    /// Guards against a look that asks only the socket whether a connection has frames:
    /// two writes that came in one read leave the second in the reading state's buffer,
    /// with nothing on the socket. The next look must apply it (nothing else would: the
    /// receiver thread stays parked while the connection is covered); and a connection
    /// with nothing anywhere is covered, not read.
    #[test]
    fn a_frame_left_in_the_buffer_is_applied_by_the_next_look() {
        let Fixture {
            proxy,
            memory,
            id,
            mut client,
            inbound,
        } = fixture(0, 64);
        assert!(!look_at(&inbound), "nothing has come");
        assert!(inbound.covered_for().is_some(), "an empty look covers");
        // Two writes of 8 bytes, sent at once.
        let mut frames = Vec::new();
        for (offset, byte) in [(0u64, 1u8), (8, 2)] {
            frames.extend(write_frame(id, offset, &[byte; 8]).0);
        }
        client.write_all(&frames).unwrap();
        let start = Instant::now();
        while !readable(inbound.stream(), Duration::from_millis(10)) {
            assert!(start.elapsed() < Duration::from_secs(5), "never arrived");
        }
        // The first applied by a reader that reads both: the second stays buffered.
        {
            let mut state = inbound.try_reading().unwrap();
            assert!(inbound.serve(&mut state));
            assert!(!state.buffered().is_empty(), "both came in one read");
        }
        assert!(!readable(inbound.stream(), Duration::ZERO));
        assert!(look_at(&inbound), "the buffered frame was left unread");
        assert!(inbound.try_reading().unwrap().buffered().is_empty());
        assert_eq!(&memory[..16], &[[1u8; 8], [2; 8]].concat()[..]);
        assert!(!look_at(&inbound), "nothing more has come");
        assert!(proxy.check().is_ok());
    }

    /// Guards the look-ahead that lets a waiting thread read a frame: a frame's length is
    /// known only once its whole header has arrived, and counts its payload; what reading
    /// refuses at once needs nothing more; a flush, and only a flush, is answered.
    #[test]
    fn frame_length_is_known_once_the_header_has_arrived() {
        let frame_len = |head: &[u8]| frame_size(head).map(|(len, _)| len);
        let mut buf = [0u8; MAX_FRAME_HEADER_BYTES];
        let write = Message::Write {
            id: 3,
            offset: 64,
            len: 1000,
        };
        let n = encode(&write, &mut buf).unwrap();
        for have in 0..n {
            assert_eq!(frame_len(&buf[..have]), None, "{have} bytes of {n}");
        }
        assert_eq!(frame_len(&buf[..n]), Some(n + 1000));
        assert_eq!(frame_len(&buf), Some(n + 1000));
        let signal = Message::Signal {
            id: 1,
            offset: 8,
            value: 5,
        };
        let n = encode(&signal, &mut buf).unwrap();
        assert_eq!(frame_len(&buf[..n - 1]), None);
        assert_eq!(frame_len(&buf[..n]), Some(n));
        // Refused as soon as read: a header length of 0 or past the bound, garbage.
        assert_eq!(frame_len(&[0, 0]), Some(2));
        assert_eq!(frame_len(&[0xff, 0xff, 1]), Some(3));
        assert_eq!(frame_len(&[1, 0, 0xff]), Some(3));
        let n = encode(&Message::Flush { seq: 9 }, &mut buf).unwrap();
        assert_eq!(frame_size(&buf[..n]), Some((n, true)));
        let n = encode(&signal, &mut buf).unwrap();
        assert_eq!(frame_size(&buf[..n]), Some((n, false)));
    }
}
