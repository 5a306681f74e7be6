//! Kernel threads run by the host thread in `synchronize`, and moved to a pool thread at
//! its deadline: what they keep, what they leave behind, and what may happen meanwhile.
//!
//! Each test makes the synchronizing thread run the kernel thread it is about: a first
//! launch holds the stream until a gate opens while that thread is already helping, so the
//! launch under test becomes the running one *for the helper*, which runs it (one of its
//! threads) itself. None of them times anything: a wait past a deadline shows as a
//! different outcome (`Timeout` where `Ok` was due, or the reverse), or as a hang that a
//! watchdog ends.

use crate::cpu::corun;
use crate::cpu::stream::CpuStream;
use crate::{Device, Error, Stream};
use oxccl_device::arch;
use oxccl_device::arch::host::in_kernel;
use oxccl_device::block::block_agrees;
use oxccl_device::coop::Block;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts,
};
use oxccl_device::wait::WaitPolicy;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

/// The deadline of a `synchronize` that must time out.
const SHORT: Duration = Duration::from_millis(300);
/// The deadline of a `synchronize` that must not.
const LONG: Duration = Duration::from_secs(60);
/// When a watchdog releases a kernel that a broken emulator would wait for in
/// `synchronize` (far past `SHORT`, well within `LONG`).
const WATCHDOG: Duration = Duration::from_secs(15);

/// One gate per use (tests run at the same time in one process); see [`gate`].
static GATES: [AtomicBool; 40] = [const { AtomicBool::new(false) }; 40];
static NEXT_GATE: AtomicU32 = AtomicU32::new(0);

/// A fresh, closed gate.
fn gate() -> u32 {
    let g = NEXT_GATE.fetch_add(1, Ordering::Relaxed);
    assert!((g as usize) < GATES.len(), "more gates than GATES holds");
    g
}

fn open(gate: u32) {
    GATES[gate as usize].store(true, Ordering::Release);
}

/// Opens `gate` after `after`, from another thread.
fn open_after(gate: u32, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        open(gate);
    })
}

/// Waits (through the emulator's back-off, as every device wait) until `gate` opens.
fn pass(gate: u32) {
    let mut i = 0;
    while !GATES[gate as usize].load(Ordering::Acquire) {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
}

/// Holds its stream until `gate` opens.
#[kernel]
fn hold(gate: u32) {
    pass(gate);
}

/// A stream whose next launch is left for the thread that synchronizes it: a `hold`
/// launch runs first, and its gate opens once a thread helps in `synchronize`.
fn stream_held(ordinal: usize) -> (Stream, std::thread::JoinHandle<()>) {
    stream_held_at_most(ordinal, LONG)
}

/// [`stream_held`], but the gate opens after `at_most` if no thread helps by then.
fn stream_held_at_most(ordinal: usize, at_most: Duration) -> (Stream, std::thread::JoinHandle<()>) {
    let stream = Device::cpu(ordinal).stream().unwrap();
    let g = gate();
    hold::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    let cpu = stream.cpu_stream().clone();
    let opener = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + at_most;
        while cpu.helpers() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        open(g);
    });
    (stream, opener)
}

fn sync(stream: &Stream, timeout: Duration) -> crate::Result<()> {
    stream.cpu_stream().synchronize(timeout)
}

/// Where a kernel thread of [`moves`] was before and after its wait, and what it saw.
#[derive(Clone, Debug)]
struct Moved {
    index: u32,
    before: ThreadId,
    after: ThreadId,
    index_after: u32,
    in_kernel_after: bool,
    all_agree: bool,
}

static MOVED: Mutex<Vec<Moved>> = Mutex::new(Vec::new());

/// Both threads meet, wait for `gate`, then meet again through `sync_threads_or`, where
/// only thread 0 passes true: both must see true.
#[kernel]
fn moves(gate: u32) {
    let index = arch::thread_idx().x;
    let before = std::thread::current().id();
    arch::sync_threads();
    pass(gate);
    let all_agree = arch::sync_threads_or(arch::thread_idx().x == 0);
    MOVED.lock().push(Moved {
        index,
        before,
        after: std::thread::current().id(),
        index_after: arch::thread_idx().x,
        in_kernel_after: in_kernel(),
        all_agree,
    });
}

/// Guards against a kernel thread that moves to a pool thread at the deadline without its
/// emulated context (its indices, its block barrier, "in a kernel"), and against the
/// synchronizing thread keeping that context after it gave the kernel thread away (later
/// code on it would take itself for a kernel thread).
#[test]
fn moved_kernel_thread_keeps_its_context_and_leaves_none_behind() {
    let (stream, opener) = stream_held(40);
    let g = gate();
    moves::launch(&stream, LaunchConfig::grid(1).block(2), g).unwrap();
    match sync(&stream, SHORT) {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("moves"), "{what}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    opener.join().unwrap();
    assert!(
        !in_kernel(),
        "the synchronizing thread is still in a kernel"
    );
    assert_eq!(arch::thread_idx(), arch::Dim3::ZERO);
    assert_eq!(arch::block_dim(), arch::Dim3::ONE);
    open(g);
    sync(&stream, LONG).unwrap();
    let moved = MOVED.lock().clone();
    assert_eq!(moved.len(), 2, "{moved:?}");
    let me = std::thread::current().id();
    assert_eq!(
        moved.iter().filter(|m| m.before == me).count(),
        1,
        "{moved:?}"
    );
    for m in &moved {
        assert_ne!(m.after, me, "still on the synchronizing thread: {m:?}");
        assert_eq!(m.index, m.index_after, "{m:?}");
        assert!(m.in_kernel_after, "{m:?}");
        assert!(m.all_agree, "the block barrier did not move along: {m:?}");
    }
}

/// Waits for `gate`, then panics.
#[kernel]
fn panics_after(gate: u32) {
    pass(gate);
    panic!("gives up after the move");
}

/// Guards against a kernel thread that panics after its move to a pool thread going
/// unreported, taking that pool thread down, or leaving the stream unusable.
#[test]
fn panic_after_the_move_is_reported() {
    let (stream, opener) = stream_held(41);
    let g = gate();
    panics_after::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    assert!(matches!(sync(&stream, SHORT), Err(Error::Timeout { .. })));
    opener.join().unwrap();
    open(g);
    match sync(&stream, LONG) {
        Err(Error::KernelFailed { kernel, message }) => {
            assert_eq!(kernel, "panics_after");
            assert!(message.contains("gives up after the move"), "{message}");
        }
        other => panic!("expected KernelFailed, got {other:?}"),
    }
    assert!(!std::thread::panicking());
    let again = gate();
    open(again);
    hold::launch(&stream, LaunchConfig::grid(1), again).unwrap();
    sync(&stream, LONG).unwrap();
}

/// Waits for its gate when dropped.
struct WaitOnDrop(u32);

impl Drop for WaitOnDrop {
    fn drop(&mut self) {
        pass(self.0);
    }
}

/// Panics, and waits for `gate` while unwinding.
#[kernel]
fn waits_while_unwinding(gate: u32) {
    let _wait = WaitOnDrop(gate);
    panic!("unwinds slowly");
}

/// Guards against a kernel thread suspended (and moved) in the middle of unwinding: the
/// panic count is the OS thread's, so the synchronizing thread would stay "panicking" for
/// good (and the pool thread's count would underflow). Such a thread runs to its end where
/// it is, past the deadline, and its failure is reported.
#[test]
fn kernel_thread_unwinding_is_not_moved() {
    let (stream, opener) = stream_held(42);
    let g = gate();
    waits_while_unwinding::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    // Opens far past the deadline, while the kernel thread waits in its drop.
    let late = open_after(g, Duration::from_secs(1));
    match sync(&stream, SHORT) {
        Err(Error::KernelFailed { message, .. }) => {
            assert!(message.contains("unwinds slowly"), "{message}")
        }
        other => panic!("expected KernelFailed, got {other:?}"),
    }
    assert!(!std::thread::panicking(), "the panic count stayed raised");
    opener.join().unwrap();
    late.join().unwrap();
    sync(&stream, LONG).unwrap();
}

/// Calls `synchronize` (with a short timeout) when dropped, and keeps its result.
struct SynchronizeOnDrop<'a> {
    stream: &'a Stream,
    result: &'a Mutex<Option<crate::Result<()>>>,
}

impl Drop for SynchronizeOnDrop<'_> {
    fn drop(&mut self) {
        *self.result.lock() = Some(sync(self.stream, SHORT));
    }
}

/// Guards against a `synchronize` called while its thread unwinds (from a drop during a
/// panic) running a kernel thread itself: it could not suspend it at the deadline, and
/// would wait for a kernel that never ends instead of timing out. (Here the kernel ends
/// when a watchdog opens its gate, far past the deadline: a broken `synchronize` returns
/// `Ok` then.)
#[test]
fn synchronize_while_unwinding_still_times_out() {
    // Nobody helps when this works: the first launch ends after a while all the same.
    let (stream, opener) = stream_held_at_most(43, Duration::from_secs(1));
    let g = gate();
    hold::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    let watchdog = open_after(g, WATCHDOG);
    let result = Mutex::new(None);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _sync = SynchronizeOnDrop {
            stream: &stream,
            result: &result,
        };
        // Unwinds without the panic hook (nothing printed), `panicking()` all the same.
        std::panic::resume_unwind(Box::new("the caller's own panic"));
    }));
    assert!(unwound.is_err());
    match result.lock().take() {
        Some(Err(Error::Timeout { what, .. })) => assert!(what.contains("hold"), "{what}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    opener.join().unwrap();
    open(g);
    sync(&stream, LONG).unwrap();
    drop(watchdog);
}

/// The OS thread that synchronizes in [`kernel_blocked_at_a_barrier_times_out`].
static BARRIER_HOST: Mutex<Option<ThreadId>> = Mutex::new(None);

/// Threads on other OS threads than `BARRIER_HOST` wait for `gate`; then all meet at the
/// block barrier (so the one that thread runs blocks there, not in the gate).
#[kernel]
fn barrier_after_gate(gate: u32) {
    if Some(std::thread::current().id()) != *BARRIER_HOST.lock() {
        pass(gate);
    }
    arch::sync_threads();
}

/// Guards against a kernel thread run by the synchronizing thread that blocks in
/// `sync_threads` (not only in a device wait) holding `synchronize` past its deadline.
#[test]
fn kernel_blocked_at_a_barrier_times_out() {
    let (stream, opener) = stream_held(44);
    let g = gate();
    *BARRIER_HOST.lock() = Some(std::thread::current().id());
    barrier_after_gate::launch(&stream, LaunchConfig::grid(1).block(2), g).unwrap();
    let watchdog = open_after(g, WATCHDOG);
    match sync(&stream, SHORT) {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("barrier_after_gate"), "{what}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    // Again, with the kernel still blocked: the stream stays stuck, `synchronize` does not.
    match sync(&stream, SHORT) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    opener.join().unwrap();
    open(g);
    sync(&stream, LONG).unwrap();
    drop(watchdog);
}

/// The OS thread that synchronizes in [`wide_launch_runs_all_its_threads_at_once`].
static WIDE_HOST: Mutex<Option<ThreadId>> = Mutex::new(None);
/// Arrivals at each launch's meeting point, by `launch` number.
static WIDE_ARRIVED: [AtomicU32; 2] = [const { AtomicU32::new(0) }; 2];
/// (launch, OS thread at the start, OS thread at the end) of each finished thread.
static WIDE_ENDS: Mutex<Vec<(u32, ThreadId, ThreadId)>> = Mutex::new(Vec::new());

/// Every thread of the grid arrives and waits until all `all` have (which only threads
/// running at the same time can do); then the thread that `WIDE_HOST` runs waits for
/// `gate`, the rest of its block waiting for it at the block barrier.
#[kernel]
fn wide(launch: u32, gate: u32, all: u32) {
    let start = std::thread::current().id();
    let arrived = &WIDE_ARRIVED[launch as usize];
    arrived.fetch_add(1, Ordering::AcqRel);
    let mut i = 0;
    while arrived.load(Ordering::Acquire) < all {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
    if Some(start) == *WIDE_HOST.lock() {
        pass(gate);
    }
    arch::sync_threads();
    WIDE_ENDS
        .lock()
        .push((launch, start, std::thread::current().id()));
}

/// Guards against the threads of a launch the synchronizing thread helps with not all
/// running at once (a thread of a launch may wait for any other: were the others started
/// only after the helper's own thread, it would wait for them until the deadline and end
/// on a pool thread), and against a launch whose helper's thread moves at the deadline
/// not finishing there with the others.
#[test]
fn wide_launch_runs_all_its_threads_at_once() {
    let me = std::thread::current().id();
    *WIDE_HOST.lock() = Some(me);
    let config = LaunchConfig::grid(4).block(16);
    let (stream, opener) = stream_held(45);
    let open_gate = gate();
    open(open_gate);
    wide::launch(&stream, config, 0, open_gate, 64).unwrap();
    sync(&stream, LONG).unwrap();
    opener.join().unwrap();
    let ends: Vec<_> = WIDE_ENDS.lock().clone();
    let here: Vec<_> = ends.iter().filter(|e| e.1 == me).collect();
    assert_eq!(ends.len(), 64);
    assert_eq!(here.len(), 1, "{here:?}");
    assert_eq!(
        here[0].2, me,
        "the helper's own thread was moved: it waited alone"
    );

    let (stream, opener) = stream_held(49);
    let g = gate();
    wide::launch(&stream, config, 1, g, 64).unwrap();
    let watchdog = open_after(g, WATCHDOG);
    match sync(&stream, SHORT) {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("wide"), "{what}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    opener.join().unwrap();
    open(g);
    sync(&stream, LONG).unwrap();
    let ends: Vec<_> = WIDE_ENDS
        .lock()
        .iter()
        .filter(|e| e.0 == 1)
        .cloned()
        .collect();
    assert_eq!(ends.len(), 64);
    let moved: Vec<_> = ends.iter().filter(|e| e.1 == me).collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_ne!(moved[0].2, me, "{moved:?}");
    drop(watchdog);
}

/// (which stream, OS thread at the end) of each [`meet`] that finished.
static MET: Mutex<Vec<(u32, ThreadId)>> = Mutex::new(Vec::new());
static MEET_FLAGS: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

/// Raises flag `me`, waits for flag `peer` (raised by a kernel on another stream), and
/// records where it ended.
#[kernel]
fn meet(me: u32, peer: u32) {
    MEET_FLAGS[me as usize].store(true, Ordering::Release);
    let mut i = 0;
    while !MEET_FLAGS[peer as usize].load(Ordering::Acquire) {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
    MET.lock().push((me, std::thread::current().id()));
}

/// Guards against state of the kernel threads a host thread runs that is not that host
/// thread's own (its deadline, its coroutine): two host threads each synchronize their own
/// stream and run a kernel thread there, the two waiting for each other; then one of them
/// times out on a third kernel while the other keeps running its own, which must neither
/// be cut off at the first one's deadline nor move.
#[test]
fn host_threads_synchronizing_streams_of_their_own_do_not_interfere() {
    let (a, opener_a) = stream_held(46);
    let (b, opener_b) = stream_held(47);
    meet::launch(&a, LaunchConfig::grid(1), 0, 1).unwrap();
    meet::launch(&b, LaunchConfig::grid(1), 1, 0).unwrap();
    let stuck = gate();
    hold::launch(&a, LaunchConfig::grid(1), stuck).unwrap();
    let slow = gate();
    hold::launch(&b, LaunchConfig::grid(1), slow).unwrap();
    record_thread::launch(&b, LaunchConfig::grid(1), 7).unwrap();
    let watchdog = open_after(stuck, WATCHDOG);
    let (thread_a, result_a) = std::thread::scope(|s| {
        let on_b = s.spawn(|| (std::thread::current().id(), sync(&b, LONG)));
        let result_a = sync(&a, SHORT);
        // `b` keeps going well past `a`'s deadline, then finishes.
        std::thread::sleep(SHORT * 2);
        open(slow);
        let (thread_b, result_b) = on_b.join().unwrap();
        result_b.unwrap();
        let met = MET.lock().clone();
        assert_eq!(met.len(), 2, "{met:?}");
        assert!(
            met.contains(&(1, thread_b)),
            "b's kernel did not end on b's thread: {met:?}"
        );
        let ended_b = *RECORDED.lock();
        assert_eq!(ended_b, Some((7, thread_b)), "b's last kernel moved");
        (std::thread::current().id(), result_a)
    });
    match result_a {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("hold"), "{what}"),
        other => panic!("expected Timeout on a, got {other:?}"),
    }
    assert!(MET.lock().contains(&(0, thread_a)), "{:?}", MET.lock());
    opener_a.join().unwrap();
    opener_b.join().unwrap();
    open(stuck);
    sync(&a, LONG).unwrap();
    drop(watchdog);
}

/// (tag, OS thread) of the last [`record_thread`].
static RECORDED: Mutex<Option<(u32, ThreadId)>> = Mutex::new(None);

/// Records its OS thread, under `tag`, after a wait of its own.
#[kernel]
fn record_thread(tag: u32) {
    // A wait, so a broken emulator has a chance to move it.
    let mut i = 0;
    while i < 64 {
        arch::spin_pause(i);
        i += 1;
    }
    *RECORDED.lock() = Some((tag, std::thread::current().id()));
}

/// Counts finished [`count_after`] kernels.
static COUNTED: AtomicU32 = AtomicU32::new(0);

/// Waits for `gate`, then counts itself.
#[kernel]
fn count_after(gate: u32) {
    pass(gate);
    COUNTED.fetch_add(1, Ordering::AcqRel);
}

/// Guards against a kernel thread moved to a pool thread depending on the stream handle
/// it was launched on: the handle (and its device handle) are dropped while the kernel
/// thread waits, and the launch queued behind it must still run when it finishes.
#[test]
fn stream_dropped_while_its_kernel_thread_is_moved() {
    let (stream, opener) = stream_held(48);
    let device = stream.cpu_stream().device.clone();
    let g = gate();
    count_after::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    let open_gate = gate();
    open(open_gate);
    count_after::launch(&stream, LaunchConfig::grid(1), open_gate).unwrap();
    assert!(matches!(sync(&stream, SHORT), Err(Error::Timeout { .. })));
    opener.join().unwrap();
    let cpu: Arc<CpuStream> = stream.cpu_stream().clone();
    drop(stream);
    drop(cpu);
    open(g);
    // Not `wait_idle`: the timeout marked the device stuck, so that returns at once.
    let deadline = std::time::Instant::now() + LONG;
    while !device.is_idle() {
        assert!(
            std::time::Instant::now() < deadline,
            "the launches never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(COUNTED.load(Ordering::Acquire), 2);
}

/// Ranks of [`communicator_dropped_while_its_kernel_thread_is_moved`] whose kernel went
/// all the way through, after their communicators were gone.
static RING_DONE: AtomicU32 = AtomicU32::new(0);

/// Waits for `gate`; then puts `bytes` into the next rank's buffer, signals it and waits
/// for the previous rank's signal.
#[kernel(max_blocks = 1)]
fn gated_ring(
    gate: u32,
    next: MemoryChannelDeviceHandle<'_>,
    prev: MemoryChannelDeviceHandle<'_>,
    bytes: u64,
) -> Result<(), DeviceError> {
    pass(gate);
    next.put(Block, 0, 0, bytes)?;
    arch::sync_threads();
    block_agrees(|| {
        next.signal()?;
        prev.wait()
    })?;
    RING_DONE.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Guards against a kernel thread moved to a pool thread losing what it works on when its
/// rank's communicator, channels and buffers are dropped meanwhile: both ranks' kernels
/// write into each other's buffers and signal after every host object is gone. A buffer
/// freed, or a peer's buffer unmapped, under them crashes the test process (the peer's
/// mapping was unmapped at once until it learned to wait for the device, as buffers do).
#[test]
fn communicator_dropped_while_its_kernel_thread_is_moved() {
    let _turns = Turns::with(corun::CorunPolicy::Auto);
    let g = gate();
    let mut config = crate::in_process::InProcessConfig::default();
    // Bounds each rank's teardown (its wait for the stuck kernel) and the kernels' waits.
    config.communicator.wait_timeout = Duration::from_secs(2);
    crate::in_process::run(2, config, |comm| {
        let rank = comm.rank();
        let buf = comm.alloc::<u64>(512)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let mine = all[rank as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let stream = comm.device().stream()?;
        let held = gate();
        hold::launch(&stream, LaunchConfig::grid(1), held)?;
        let cpu = stream.cpu_stream().clone();
        let opener = std::thread::spawn(move || {
            while cpu.helpers() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            open(held);
        });
        gated_ring::launch(
            &stream,
            LaunchConfig::grid(1).block(2),
            g,
            next.device_handle(),
            prev.device_handle(),
            4096,
        )?;
        match sync(&stream, SHORT) {
            Err(Error::Timeout { what, .. }) => assert!(what.contains("gated_ring"), "{what}"),
            other => panic!("expected Timeout, got {other:?}"),
        }
        opener.join().unwrap();
        Ok(())
    })
    .unwrap();
    open(g);
    let deadline = std::time::Instant::now() + LONG;
    while RING_DONE.load(Ordering::Acquire) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ranks' kernels never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Set by [`note_start_then_hold`] once it runs.
static HELD_STARTED: AtomicBool = AtomicBool::new(false);
/// (tag, OS thread) of each [`note_where`].
static WHERE: Mutex<Vec<(u32, ThreadId)>> = Mutex::new(Vec::new());

/// Says it started, then holds its stream until `gate` opens.
#[kernel]
fn note_start_then_hold(gate: u32) {
    HELD_STARTED.store(true, Ordering::Release);
    pass(gate);
}

/// Records its OS thread under `tag`.
#[kernel]
fn note_where(tag: u32) {
    WHERE.lock().push((tag, std::thread::current().id()));
}

/// Guards against a synchronizing thread that, finding the running launch on a pool thread,
/// stops helping after a while and leaves the launches queued behind it to that pool
/// thread (which then competes for the cores with it): it must stay a helper, wait, and
/// run them itself.
#[test]
fn helper_waits_for_a_pool_thread_and_runs_what_follows() {
    let stream = Device::cpu(50).stream().unwrap();
    let g = gate();
    note_start_then_hold::launch(&stream, LaunchConfig::grid(1), g).unwrap();
    // Running on a pool thread before `synchronize` starts, so the helper cannot take it.
    let started = std::time::Instant::now();
    while !HELD_STARTED.load(Ordering::Acquire) {
        assert!(started.elapsed() < LONG, "the first launch never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    for tag in 0..5 {
        note_where::launch(&stream, LaunchConfig::grid(1), tag).unwrap();
    }
    // Long after a helper that polls for a while would have given up.
    let opener = open_after(g, Duration::from_millis(200));
    sync(&stream, LONG).unwrap();
    opener.join().unwrap();
    let me = std::thread::current().id();
    let seen = WHERE.lock().clone();
    assert_eq!(
        seen.iter().map(|w| w.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(
        seen.iter().all(|w| w.1 == me),
        "not run by the helper: {seen:?}"
    );
}

/// Held by each test whose kernels may take turns (devices of communicators, or marked so):
/// the process has one runner, and a test's kernel thread adopted by another test's runner
/// would break what either asserts. Each leaves the policy as it found it (`auto`).
static TAKING_TURNS: Mutex<()> = Mutex::new(());

/// Holds [`TAKING_TURNS`] with `policy` in force, back to `auto` when dropped.
struct Turns(#[allow(dead_code)] parking_lot::MutexGuard<'static, ()>);

impl Turns {
    fn with(policy: corun::CorunPolicy) -> Turns {
        let guard = TAKING_TURNS.lock();
        corun::set_policy(policy);
        Turns(guard)
    }
}

impl Drop for Turns {
    fn drop(&mut self) {
        corun::set_policy(corun::CorunPolicy::Auto);
    }
}

/// Per test using [`hand_over`]: the hand-over token (kernel thread `parity` may go when
/// it is `2 * round + parity`), whether the first has started, whether the second is done,
/// and where each started and ended (`(parity, start, end)`).
static TOKENS: [AtomicU32; 5] = [const { AtomicU32::new(0) }; 5];
static FIRST_STARTED: [AtomicBool; 5] = [const { AtomicBool::new(false) }; 5];
static SECOND_DONE: [AtomicBool; 5] = [const { AtomicBool::new(false) }; 5];
static HANDED_WHERE: [Mutex<Vec<HandedWhere>>; 5] = [const { Mutex::new(Vec::new()) }; 5];

/// Where a kernel thread of [`play_hand_over`] started and ended: `(parity, start, end)`.
type HandedWhere = (u32, ThreadId, ThreadId);

/// Waits through the device library's back-off until `done` holds.
fn wait_until(done: impl Fn() -> bool) {
    let mut i = 0;
    while !done() {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
}

/// Hands the token of `slot` back and forth with the other thread for `rounds` rounds,
/// working `busy_us` microseconds (no wait) before each hand-over; the first (`parity` 0)
/// returns only after the second. The body of [`hand_over`] and [`hand_over_busy`].
fn play_hand_over(slot: u32, parity: u32, rounds: u32, busy_us: u32) {
    let slot = slot as usize;
    let start = std::thread::current().id();
    if parity == 0 {
        FIRST_STARTED[slot].store(true, Ordering::Release);
    }
    for round in 0..rounds {
        let mine = 2 * round + parity;
        wait_until(|| TOKENS[slot].load(Ordering::Acquire) == mine);
        let until = std::time::Instant::now() + Duration::from_micros(u64::from(busy_us));
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        TOKENS[slot].store(mine + 1, Ordering::Release);
    }
    note_and_end_together(slot, parity, start);
}

/// Notes where kernel thread `parity` of `slot` started (`start`) and ends, the first
/// returning only after the second: a second still on the runner when it ends ends there.
fn note_and_end_together(slot: usize, parity: u32, start: ThreadId) {
    HANDED_WHERE[slot]
        .lock()
        .push((parity, start, std::thread::current().id()));
    if parity == 0 {
        wait_until(|| SECOND_DONE[slot].load(Ordering::Acquire));
    } else {
        SECOND_DONE[slot].store(true, Ordering::Release);
    }
}

/// [`play_hand_over`] with no work between hand-overs.
#[kernel]
fn hand_over(slot: u32, parity: u32, rounds: u32) {
    play_hand_over(slot, parity, rounds, 0);
}

/// [`play_hand_over`] with `busy_us` of work between hand-overs. A kernel of its own: the
/// emulator keeps a kernel whose turns run long apart for a while, by kernel, and a kernel
/// shared with [`hand_over`] would then keep the next test's threads apart too.
#[kernel]
fn hand_over_busy(slot: u32, parity: u32, rounds: u32, busy_us: u32) {
    play_hand_over(slot, parity, rounds, busy_us);
}

/// [`play_hand_over`] after a device call that fails (a wait on a zeroed semaphore handle
/// for `parity` 0, a signal of one for 1), whose error it returns at the end: each kernel
/// thread's last failure must travel with it through its turns.
#[kernel]
fn hand_over_after_failing(slot: u32, parity: u32, rounds: u32) -> Result<(), DeviceError> {
    let failed = if parity == 0 {
        Host2DeviceSemaphoreDeviceHandle::default().wait()
    } else {
        Device2DeviceSemaphoreDeviceHandle::default().signal()
    };
    play_hand_over(slot, parity, rounds, 0);
    failed
}

/// A held stream of device `ordinal` (see [`stream_held`]) and a stream of device
/// `ordinal + 1`, both devices allowed to take turns (as a communicator's are).
fn streams_taking_turns(ordinal: usize) -> (Stream, std::thread::JoinHandle<()>, Stream) {
    let (first, opener) = stream_held(ordinal);
    let second = Device::cpu(ordinal + 1).stream().unwrap();
    for stream in [&first, &second] {
        let device = &stream.cpu_stream().device;
        device.corun.store(true, Ordering::Relaxed);
    }
    (first, opener, second)
}

/// Runs [`hand_over`] (or, with `busy_us`, [`hand_over_busy`]) for `slot` and `rounds`
/// with co-running always allowed: the first on a device of `ordinal` whose synchronizing
/// thread runs it (so opens the process's runner), the second on device `ordinal + 1` once
/// the first has started.
/// Returns the runner's thread and where each kernel thread started and ended, in parity
/// order, after checking that every round was played.
fn hand_over_on_two_devices(
    slot: u32,
    ordinal: usize,
    rounds: u32,
    busy_us: u32,
) -> (ThreadId, Vec<HandedWhere>) {
    let (runner, seen, [first, second]) =
        take_turns_on_two_devices(slot, ordinal, |stream, parity| {
            let one = LaunchConfig::grid(1);
            match busy_us {
                0 => hand_over::launch(stream, one, slot, parity, rounds),
                _ => hand_over_busy::launch(stream, one, slot, parity, rounds, busy_us),
            }
            .unwrap()
        });
    first.unwrap();
    second.unwrap();
    assert_eq!(TOKENS[slot as usize].load(Ordering::Acquire), 2 * rounds);
    (runner, seen)
}

/// The flow of [`hand_over_on_two_devices`] for any kernel playing [`play_hand_over`] for
/// `slot`, launched by `launch(stream, parity)`: returns the runner's thread, where each
/// kernel thread started and ended (in parity order), and what each stream's
/// synchronization returned.
fn take_turns_on_two_devices(
    slot: u32,
    ordinal: usize,
    launch: impl Fn(&Stream, u32),
) -> (ThreadId, Vec<HandedWhere>, [crate::Result<()>; 2]) {
    let _turns = Turns::with(corun::CorunPolicy::Always);
    let (first, opener, second) = streams_taking_turns(ordinal);
    launch(&first, 0);
    let runner = std::thread::spawn(move || {
        let synced = sync(&first, LONG);
        (std::thread::current().id(), synced)
    });
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !FIRST_STARTED[slot as usize].load(Ordering::Acquire) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first kernel never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    launch(&second, 1);
    let second_synced = sync(&second, LONG);
    let (runner, first_synced) = runner.join().unwrap();
    opener.join().unwrap();
    let mut seen = HANDED_WHERE[slot as usize].lock().clone();
    seen.sort_by_key(|s| s.0);
    assert_eq!(seen.len(), 2, "{seen:?}");
    (runner, seen, [first_synced, second_synced])
}

/// Guards against kernel threads taking turns with each other's emulator context (kept in
/// the suspended frame of each one's wait hook, not carried out of the coroutine): two
/// kernel threads on the runner each make a different failing call, hand over 500 times,
/// then return the error; each stream must report its own kernel's call, and both must
/// have run on the runner.
#[test]
fn kernel_threads_taking_turns_keep_their_own_last_failure() {
    let rounds = 500;
    let (runner, seen, [first, second]) = take_turns_on_two_devices(2, 52, |stream, parity| {
        hand_over_after_failing::launch(stream, LaunchConfig::grid(1), 2, parity, rounds).unwrap()
    });
    assert_eq!(TOKENS[2].load(Ordering::Acquire), 2 * rounds);
    assert_eq!(
        seen[1].1, runner,
        "the second did not start on the runner: {seen:?}"
    );
    for (synced, call) in [(first, "wait"), (second, "signal")] {
        match synced {
            Err(Error::KernelError { error, message, .. }) => {
                assert_eq!(error, DeviceError::NullHandle);
                assert!(
                    message.contains(&format!("error of {call} ")),
                    "{call}: {message}"
                );
            }
            other => panic!("{call}: expected the kernel's error, got {other:?}"),
        }
    }
}

/// Guards against co-running that does not happen, or loses a kernel thread: two devices of
/// communicator ranks (co-running allowed), each a one-thread kernel that waits for the
/// other's hand-over 2000 times. The first runs on the host thread that synchronizes its
/// stream (the process's runner); the second, launched once the first has started, must
/// start and end on that same host thread (donated by whichever thread claimed it), both
/// finishing every round.
#[test]
fn kernel_threads_of_two_devices_take_turns_on_the_runner() {
    let (runner, seen) = hand_over_on_two_devices(0, 42, 2000, 0);
    assert_eq!((seen[0].1, seen[0].2), (runner, runner), "first: {seen:?}");
    assert_eq!(
        (seen[1].1, seen[1].2),
        (runner, runner),
        "the second did not run on the runner: {seen:?}"
    );
}

/// Set by [`late_runner`] when it starts.
static RUNNER_STARTED: AtomicBool = AtomicBool::new(false);

/// Notes that it started, then waits for `gate`.
#[kernel]
fn late_runner(gate: u32) {
    RUNNER_STARTED.store(true, Ordering::Release);
    pass(gate);
}

/// Set by [`gated_guest`] when it starts.
static GUEST_STARTED: AtomicBool = AtomicBool::new(false);
/// Where [`gated_guest`] started and ended.
static GUEST_WHERE: Mutex<Option<(ThreadId, ThreadId)>> = Mutex::new(None);

/// Notes where it starts, waits for `gate`, notes where it ends.
#[kernel]
fn gated_guest(gate: u32) {
    let start = std::thread::current().id();
    GUEST_STARTED.store(true, Ordering::Release);
    pass(gate);
    *GUEST_WHERE.lock() = Some((start, std::thread::current().id()));
}

/// Guards against a donated kernel thread lost, or kept on the runner's host thread, when
/// the runner's own kernel thread passes its deadline: the runner's `synchronize` times
/// out, both kernel threads move to pool threads and finish there once their gates open.
#[test]
fn donated_kernel_thread_moves_to_a_pool_thread_when_the_runner_is_late() {
    let _turns = Turns::with(corun::CorunPolicy::Always);
    let (first, opener, second) = streams_taking_turns(44);
    let (own_gate, guest_gate) = (gate(), gate());
    late_runner::launch(&first, LaunchConfig::grid(1), own_gate).unwrap();
    let runner = std::thread::spawn(move || {
        let late = sync(&first, SHORT);
        (std::thread::current().id(), late, first)
    });
    // The guest comes once the runner runs its own kernel thread (it is donated to it).
    let started = std::time::Instant::now();
    while !RUNNER_STARTED.load(Ordering::Acquire) {
        assert!(
            started.elapsed() < WATCHDOG,
            "the runner's kernel never started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    gated_guest::launch(&second, LaunchConfig::grid(1), guest_gate).unwrap();
    while !GUEST_STARTED.load(Ordering::Acquire) {
        assert!(started.elapsed() < WATCHDOG, "the guest never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (runner, late, first) = runner.join().unwrap();
    opener.join().unwrap();
    assert!(matches!(late, Err(Error::Timeout { .. })), "{late:?}");
    open(guest_gate);
    sync(&second, LONG).unwrap();
    open(own_gate);
    sync(&first, LONG).unwrap();
    let (start, end) = GUEST_WHERE.lock().expect("the guest finished");
    assert_eq!(start, runner, "the guest did not start on the runner");
    assert_ne!(end, runner, "the guest stayed on the runner's host thread");
}

/// Guards against co-running that keeps kernel threads that compute more than they wait on
/// one host thread (their work then takes twice as long as on two cores): two kernel
/// threads that each work 300 µs between hand-overs start taking turns on the runner, and
/// the donated one must leave it for a pool thread before it ends, both finishing every
/// round.
#[test]
fn kernel_threads_that_compute_leave_the_runner() {
    let (runner, seen) = hand_over_on_two_devices(1, 46, 40, 300);
    assert_eq!(
        seen[1].1, runner,
        "the second did not start on the runner: {seen:?}"
    );
    assert_ne!(
        seen[1].2, runner,
        "the second stayed on the runner: {seen:?}"
    );
}

/// How many kernel threads of [`meet_and_note`] have arrived, over all its rounds.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
/// Where each [`meet_and_note`] started, by round: `(round, thread, a pool thread's)`.
static MET_WHERE: Mutex<Vec<(u32, ThreadId, bool)>> = Mutex::new(Vec::new());

/// Notes where it starts, arrives for `round` and waits until the other kernel thread of
/// the round has arrived too.
#[kernel]
fn meet_and_note(round: u32) {
    let here = std::thread::current();
    let pool = here.name().is_some_and(|n| n.starts_with("oxccl-kern"));
    MET_WHERE.lock().push((round, here.id(), pool));
    ARRIVED.fetch_add(1, Ordering::AcqRel);
    wait_until(|| ARRIVED.load(Ordering::Acquire) >= 2 * (round + 1));
}

/// Guards against two host threads that launch and synchronize at the same moment running
/// apart: each found no runner to donate to, then one opened the runner and the other ran
/// its kernel thread alone, beside it, for the whole launch (two spinning threads and a
/// proxy on two cores: a ping-pong took 1-2 µs a round trip instead of 0.25 in some
/// processes); or a pool thread that took a launch before its host thread did ran it apart
/// from a runner opened meanwhile. Deciding "runner, else donate" in that order, each under
/// the registry's lock, on host and pool threads alike, makes one of them the runner and
/// the other its guest: both kernel threads of every round start on one thread.
#[test]
fn host_threads_launching_at_once_take_turns() {
    const ROUNDS: u32 = 100;
    let _turns = Turns::with(corun::CorunPolicy::Always);
    let streams: Vec<Stream> = (60..62)
        .map(|ordinal| {
            let stream = Device::cpu(ordinal).stream().unwrap();
            stream
                .cpu_stream()
                .device
                .corun
                .store(true, Ordering::Relaxed);
            stream
        })
        .collect();
    let start = Arc::new(std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        for stream in &streams {
            let start = start.clone();
            s.spawn(move || {
                for round in 0..ROUNDS {
                    start.wait();
                    meet_and_note::launch(stream, LaunchConfig::grid(1), round).unwrap();
                    sync(stream, LONG).unwrap();
                }
            });
        }
    });
    let seen = MET_WHERE.lock().clone();
    assert_eq!(seen.len(), 2 * ROUNDS as usize);
    let apart: Vec<(u32, bool)> = (0..ROUNDS)
        .filter_map(|round| {
            let both: Vec<_> = seen.iter().filter(|w| w.0 == round).collect();
            (both[0].1 != both[1].1).then(|| (round, both.iter().any(|w| w.2)))
        })
        .collect();
    assert!(
        apart.is_empty(),
        "{} of {ROUNDS} rounds ran apart (round, a pool thread's): {apart:?}",
        apart.len()
    );
}

/// The counters of the two semaphores of each slot of [`semaphore_hand_over`] and
/// [`semaphore_never_signaled`]: for kernel thread `parity`, its inbound counter at
/// `2 * parity` and its count of consumed signals at `2 * parity + 1`.
static SEMAPHORE_COUNTERS: [[AtomicU64; 4]; 5] = [const { [const { AtomicU64::new(0) }; 4] }; 5];

/// Kernel thread `parity`'s end of the semaphore pair of `slot`, whose waits give up after
/// `limit_ms`.
fn semaphore_of(
    slot: u32,
    parity: u32,
    limit_ms: u32,
) -> Device2DeviceSemaphoreDeviceHandle<'static> {
    let c = &SEMAPHORE_COUNTERS[slot as usize];
    let (mine, theirs) = (2 * parity as usize, 2 * (1 - parity) as usize);
    let raw = SemaphoreRawParts {
        inbound: c[mine].as_ptr() as u64,
        expected: c[mine + 1].as_ptr() as u64,
        remote_inbound: c[theirs].as_ptr() as u64,
    };
    let wait = WaitPolicy::with_timeout_ns(u64::from(limit_ms) * 1_000_000);
    // SAFETY: the counters are statics, only accessed atomically.
    unsafe { Device2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, wait) }
}

/// Hands the token of `slot` back and forth with the other kernel thread for `rounds`
/// rounds through a pair of the device library's semaphores (whose waits a runner polls by
/// probe while the kernel thread is suspended), checking at each turn that it is its own.
#[kernel]
fn semaphore_hand_over(slot: u32, parity: u32, rounds: u32) -> Result<(), DeviceError> {
    let i = slot as usize;
    let start = std::thread::current().id();
    let sem = semaphore_of(slot, parity, 60_000);
    if parity == 0 {
        FIRST_STARTED[i].store(true, Ordering::Release);
    }
    for round in 0..rounds {
        if parity == 1 || round > 0 {
            sem.wait()?;
        }
        let mine = 2 * round + parity;
        let token = TOKENS[i].load(Ordering::Acquire);
        assert_eq!(token, mine, "kernel thread {parity} went out of turn");
        TOKENS[i].store(mine + 1, Ordering::Release);
        if parity == 0 || round + 1 < rounds {
            sem.signal()?;
        }
    }
    note_and_end_together(i, parity, start);
    Ok(())
}

/// Waits for a signal of the other kernel thread of `slot` that never comes, through the
/// device library's semaphore, whose wait gives up after `limit_ms`.
#[kernel]
fn semaphore_never_signaled(slot: u32, parity: u32, limit_ms: u32) -> Result<(), DeviceError> {
    let i = slot as usize;
    let start = std::thread::current().id();
    if parity == 0 {
        FIRST_STARTED[i].store(true, Ordering::Release);
    }
    let waited = semaphore_of(slot, parity, limit_ms).wait();
    HANDED_WHERE[i]
        .lock()
        .push((parity, start, std::thread::current().id()));
    waited
}

/// Guards against a wait that a runner polls by probe (the device library's semaphore wait
/// of a kernel thread taking turns) ending before its signal, or not when it comes: two
/// kernel threads on the runner hand a token over 2000 times through two semaphores, each
/// checking that the token says its turn, and both end on the runner.
#[test]
fn kernel_threads_taking_turns_at_semaphore_waits_end_each_at_its_signal() {
    let rounds = 2000;
    let (runner, seen, [first, second]) = take_turns_on_two_devices(3, 54, |stream, parity| {
        semaphore_hand_over::launch(stream, LaunchConfig::grid(1), 3, parity, rounds).unwrap()
    });
    first.unwrap();
    second.unwrap();
    assert_eq!(TOKENS[3].load(Ordering::Acquire), 2 * rounds);
    for (parity, start, end) in seen {
        assert_eq!(
            (start, end),
            (runner, runner),
            "kernel thread {parity} left the runner"
        );
    }
}

/// Guards against a wait polled by probe that is never resumed, and so never looks at its
/// own limit: two kernel threads on the runner each wait for a signal that never comes,
/// their waits limited to 300 ms; each must give up with a timeout (with the probes alone,
/// the runner polled both forever, and the streams' 60 s deadline ended it).
#[test]
fn kernel_threads_taking_turns_at_semaphore_waits_give_up_at_their_limit() {
    let (runner, seen, synced) = take_turns_on_two_devices(4, 56, |stream, parity| {
        semaphore_never_signaled::launch(stream, LaunchConfig::grid(1), 4, parity, 300).unwrap()
    });
    assert_eq!(
        seen[1].1, runner,
        "the second did not start on the runner: {seen:?}"
    );
    for (parity, synced) in synced.into_iter().enumerate() {
        match synced {
            Err(Error::KernelError { error, .. }) => {
                assert_eq!(error, DeviceError::Timeout, "kernel thread {parity}")
            }
            other => panic!("kernel thread {parity}: expected a timeout, got {other:?}"),
        }
    }
}
