//! A collective call in the steady state allocates nothing on the host: not in the call,
//! nor in its launch, nor where the emulator runs its kernel.
//!
//! Its own test binary, because it installs a global allocator that counts every
//! allocation of the process (kernel threads and pool workers included).

use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, DeviceBuffer, ReduceOp, Result, Stream};
use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Rounds of calls in the window (seven collectives each).
const ROUNDS: u64 = 60;

/// Calls in the window on each rank.
const CALLS: u64 = ROUNDS * 7;

/// Most allocations a window may see, all ranks together: one a call would be hundreds.
/// What the runtime itself may allocate meanwhile is allowed for: a pool thread spawned for
/// a kernel thread handed on (some twenty allocations), a thread of the test harness.
/// Seen here: 1-8 a window mostly, up to 34 with co-running on a loaded machine.
const MOST_ALLOCATIONS: u64 = CALLS / 4;

/// One collective call of each kind, each synchronized; `i` picks the root of the rooted
/// ones.
fn each_collective(
    comm: &mut Communicator,
    bufs: &mut (DeviceBuffer<f32>, DeviceBuffer<f32>),
    stream: &Stream,
    i: u64,
) -> Result<()> {
    let (send, recv) = (&bufs.0, &mut bufs.1);
    let n = comm.size() as usize;
    let root = (i % n as u64) as u32;
    // The all-to-all-v counts of the all-to-all: COUNT to and from each rank.
    let counts = [COUNT; MAX_RANKS];
    let displs: [usize; MAX_RANKS] = std::array::from_fn(|r| r * COUNT);
    let (counts, displs) = (&counts[..n], &displs[..n]);
    comm.all_reduce(send, recv, COUNT, ReduceOp::Sum, stream)?;
    comm.synchronize(stream)?;
    comm.all_gather(send, recv, COUNT, stream)?;
    comm.synchronize(stream)?;
    comm.reduce_scatter(send, recv, COUNT, ReduceOp::Max, stream)?;
    comm.synchronize(stream)?;
    comm.broadcast(send, recv, COUNT, root, stream)?;
    comm.synchronize(stream)?;
    comm.reduce(send, recv, COUNT, ReduceOp::Sum, root, stream)?;
    comm.synchronize(stream)?;
    comm.all_to_all(send, recv, COUNT, stream)?;
    comm.synchronize(stream)?;
    comm.all_to_allv(send, counts, displs, recv, counts, displs, stream)?;
    comm.synchronize(stream)
}

/// Elements a rank sends to each rank (small: the packet algorithms where there are).
const COUNT: usize = 64;

/// Most ranks of these tests.
const MAX_RANKS: usize = 2;

/// Rounds of [`each_collective`] on every rank; returns the process's allocations during
/// `ROUNDS` of them, after a warm-up. (Calls enqueued back to back reuse launches as deep
/// as the stream's queue has been, up to a limit: see
/// `a_stream_keeps_the_launches_of_its_deepest_queue` in the emulator's stream.)
fn allocations_per_window(comm: &mut Communicator) -> Result<u64> {
    let len = COUNT * comm.size() as usize;
    let mut bufs = (comm.alloc::<f32>(len)?, comm.alloc::<f32>(len)?);
    let stream = comm.device().stream()?;
    for i in 0..16 {
        each_collective(comm, &mut bufs, &stream, i)?;
    }
    comm.barrier()?;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..ROUNDS {
        each_collective(comm, &mut bufs, &stream, i)?;
    }
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    comm.barrier()?;
    Ok(during)
}

/// Runs the window on 1 and on 2 ranks, with the algorithms chosen by size (packets and
/// direct loads and stores at these sizes) and through the proxy (port channels: the
/// triggers, their execution and the semaphores, with proxy assist and without), and
/// checks the allocations.
fn check_steady_state() {
    let ports = AlgorithmChoice::Use(Algorithm::Ports);
    // Through the proxy both ways: the pushing kernel threads executing their triggers
    // (assist), and the proxy thread executing them itself.
    for (algorithm, assist) in [(AlgorithmChoice::Auto, true), (ports, true), (ports, false)] {
        for ranks in 1..=MAX_RANKS as u32 {
            let mut config = InProcessConfig::default();
            config.communicator.collectives.algorithm = algorithm;
            config.communicator.proxy_assist = assist;
            let counts = in_process::run(ranks, config, allocations_per_window).unwrap();
            let total: u64 = counts.iter().sum();
            assert!(
                total < MOST_ALLOCATIONS,
                "{ranks} rank(s), {algorithm:?}, assist {assist}: {total} allocations in \
                 {CALLS} collective calls per rank"
            );
        }
    }
}

/// Longest the run with co-running forced, in a process of its own, may take.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Guards the promise that a collective call allocates nothing once set up (the checks of
/// the call, its launch and parameters, the kernel thread that runs it); then the same with
/// the two ranks' kernel threads taking turns on one host thread (`OXCCL_CPU_CORUN=always`:
/// donations, the runner's queue of guests, the kernel threads it hands to pool threads
/// when it closes). The policy is the process's, read once, so that part runs this test
/// again in a process of its own with it set, after the first part (the window counts
/// every thread of the process: nothing else of the test may run meanwhile). An allocation
/// of the harness or the runtime may still land in a window: the bound allows a few, not
/// one a call.
#[test]
fn collective_calls_do_not_allocate_in_the_steady_state() {
    const NAME: &str = "collective_calls_do_not_allocate_in_the_steady_state";
    check_steady_state();
    if std::env::var_os("OXCCL_CPU_CORUN").is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--test-threads", "1"])
        .env("OXCCL_CPU_CORUN", "always")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + CHILD_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the run with co-running forced took over {CHILD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "the run with co-running forced failed: {status}"
    );
}
