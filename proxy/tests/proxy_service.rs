//! The proxy service with real threads: how it reports what would otherwise stall it.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use oxccl_device::DeviceError;
use oxccl_device::abort::AbortRecord;
use oxccl_device::fifo::PROXY_ASLEEP;
use oxccl_device::fifo::{ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::{
    Connection, FIFO_SITE, HostCell, IdlePolicy, MemoryRegion, PollSchedule, ProxyConfig,
    ProxyError, ProxyService, Refusal, Side,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A connection that only counts the signals it is asked to deliver.
#[derive(Default)]
struct CountingConnection {
    signals: AtomicU64,
}

impl Connection for CountingConnection {
    fn write(
        &self,
        _dst: &MemoryRegion,
        _dst_off: u64,
        _src: &MemoryRegion,
        _src_off: u64,
        _bytes: u64,
    ) -> Result<(), ProxyError> {
        Ok(())
    }

    fn update_and_sync(
        &self,
        _dst: &MemoryRegion,
        _dst_off: u64,
        _value: u64,
    ) -> Result<(), ProxyError> {
        self.signals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<(), ProxyError> {
        Ok(())
    }

    fn peer(&self) -> u32 {
        1
    }

    fn transport(&self) -> &'static str {
        "counting"
    }
}

fn signal_trigger() -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::FLAG,
        semaphore_id: 0,
        ..Default::default()
    })
}

/// Guards against a silent stall: a push that times out leaves a claimed FIFO position that
/// is never published, and the proxy, which executes in order, would stop at it forever for
/// every channel. The proxy must report it, naming the position, and raise the rank's stop
/// word so kernels stop waiting; and stopping the proxy afterwards must not hang.
#[test]
fn timed_out_push_is_reported() {
    timed_out_push_is_reported_under(IdlePolicy::Doorbell);
}

/// The same with a polling proxy, whose ring has no doorbell (as on a GPU).
#[test]
fn timed_out_push_is_reported_by_a_polling_proxy() {
    timed_out_push_is_reported_under(IdlePolicy::Poll(PollSchedule::default()));
}

fn timed_out_push_is_reported_under(idle: IdlePolicy) {
    let limit = Duration::from_millis(200);
    let counted = Counted::new(idle, 2, limit);
    let (mut proxy, connection, record) = (counted.proxy, counted.connection, counted.record);
    let cells = proxy.fifo_cells();
    // SAFETY: the record and the stop word are kept alive by the Arcs above.
    let wait =
        unsafe { WaitPolicy::from_raw_parts(&*record, &*counted.stop, limit.as_nanos() as u64, 0) };
    let fifo = cells.device_handle(wait);

    // The proxy is not running yet: two pushes fill the ring, the third gives up.
    assert_eq!(fifo.push(signal_trigger()), Ok(0));
    assert_eq!(fifo.push(signal_trigger()), Ok(1));
    assert_eq!(fifo.push(signal_trigger()), Err(DeviceError::Timeout));
    record.clear();
    proxy.clear_stop();

    // Now it runs: it executes the two published triggers, then finds position 2 claimed
    // and never published.
    proxy.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let stalled = loop {
        match proxy.check() {
            Err(e @ ProxyError::FifoStalled { .. }) => break e,
            Err(other) => panic!("unexpected proxy error: {other}"),
            Ok(()) => {
                assert!(
                    Instant::now() < deadline,
                    "the proxy never reported the unpublished position"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    match &stalled {
        ProxyError::FifoStalled {
            rank: 0,
            position: 2,
            waited,
        } => assert!(*waited >= limit, "{waited:?}"),
        other => panic!("{other:?}"),
    }
    let message = stalled.to_string();
    assert!(message.contains("position 2"), "{message}");
    assert_eq!(connection.signals.load(Ordering::Relaxed), 2);
    let reason = proxy
        .stop_reason()
        .expect("kernels of the rank must be stopped");
    assert_eq!(reason.site, FIFO_SITE);
    // A wait of the rank now stops at once instead of running out its own limit.
    let started = Instant::now();
    assert_eq!(fifo.sync(2), Err(DeviceError::Aborted));
    assert!(started.elapsed() < limit, "{:?}", started.elapsed());

    let started = Instant::now();
    proxy.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Guards against "no limit" sneaking in as a zero limit.
#[test]
fn zero_wait_timeout_is_refused_by_the_proxy() {
    let err = ProxyService::new(ProxyConfig {
        wait_timeout: Duration::ZERO,
        ..Default::default()
    })
    .err()
    .expect("a zero limit must be refused");
    assert!(err.to_string().contains("zero"), "{err}");
}

/// Guards against a removed memory that a trigger can still reach (its region, and what it
/// keeps alive, would outlive its owner's deregistration), and against ids that run out
/// when memories come and go: a removed id names nothing, and the next memory takes it.
#[test]
fn a_removed_memory_is_refused_and_its_id_taken_again() {
    let mut counted = Counted::new(IdlePolicy::Doorbell, 8, Duration::from_secs(10));
    let proxy = &mut counted.proxy;
    let (ours, theirs) = ([0u64; 8], [0u64; 8]);
    let region = |rank: u32, cells: &[u64; 8]| MemoryRegion::new(rank, cells.as_ptr() as u64, 64);
    let src = proxy.add_memory(region(0, &ours)).unwrap();
    let dst = proxy.add_memory(region(1, &theirs)).unwrap();
    proxy.remove_memory(src).unwrap();
    let again = proxy.remove_memory(src).unwrap_err();
    assert!(again.to_string().contains("not registered"), "{again}");
    let next = proxy.add_memory(region(0, &ours)).unwrap();
    assert_eq!(next, src, "a removed id is taken by the next memory");
    proxy.remove_memory(next).unwrap();

    proxy.start().unwrap();
    // SAFETY: the record and the stop word are kept alive by `counted`.
    let wait =
        unsafe { WaitPolicy::from_raw_parts(&*counted.record, &*counted.stop, 10_000_000_000, 0) };
    let cells = counted.proxy.fifo_cells();
    let fifo = cells.device_handle(wait);
    let put = ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::DATA,
        src_memory_id: src.0,
        dst_memory_id: dst.0,
        size: 64,
        semaphore_id: 0,
        ..Default::default()
    });
    fifo.push(put).unwrap();
    let refused = loop_until_error(&counted.proxy);
    assert!(
        matches!(
            &refused,
            ProxyError::TriggerRefused {
                refusal: Refusal::UnknownMemory {
                    side: Side::Src,
                    id,
                },
                ..
            } if *id == src.0
        ),
        "{refused:?}"
    );
    counted.proxy.stop().unwrap();
}

/// The first error `proxy` reports, within 10 s.
fn loop_until_error(proxy: &ProxyService) -> ProxyError {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Err(e) = proxy.check() {
            return e;
        }
        assert!(Instant::now() < deadline, "the proxy reported nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A proxy without assist, with a counting channel to peer 1, and what the wait policy of
/// its handles needs; the Arcs keep the policy's cells alive.
struct Counted {
    proxy: ProxyService,
    connection: Arc<CountingConnection>,
    record: HostCell<AbortRecord>,
    stop: HostCell<AtomicU64>,
    _semaphore: Arc<AtomicU64>,
}

impl Counted {
    /// Not started yet.
    fn new(idle: IdlePolicy, fifo_size: u32, wait_timeout: Duration) -> Counted {
        let proxy = ProxyService::new(ProxyConfig {
            rank: 0,
            fifo_size,
            wait_timeout,
            assist: false,
            idle,
            share_thread: false,
            cpus: None,
        })
        .unwrap();
        let connection = Arc::new(CountingConnection::default());
        let record = HostCell::new(AbortRecord::new());
        let semaphore = Arc::new(AtomicU64::new(0));
        let remote_inbound = MemoryRegion::new(1, semaphore.as_ptr() as u64, 8);
        proxy
            .add_channel(connection.clone(), remote_inbound, record.clone())
            .unwrap();
        let stop = proxy.stop_word();
        Counted {
            proxy,
            connection,
            record,
            stop,
            _semaphore: semaphore,
        }
    }

    /// Started, with an 8-slot ring and a limit of 10 s.
    fn started(idle: IdlePolicy) -> Counted {
        let mut counted = Counted::new(idle, 8, Duration::from_secs(10));
        counted.proxy.start().unwrap();
        counted
    }

    /// Pushes one signal and returns how long the proxy took to deliver it (at most 5 s:
    /// the test fails beyond).
    fn signal(&self) -> Duration {
        // SAFETY: the record and the stop word are kept alive by `self`.
        let wait =
            unsafe { WaitPolicy::from_raw_parts(&*self.record, &*self.stop, 10_000_000_000, 0) };
        let cells = self.proxy.fifo_cells();
        let before = self.connection.signals.load(Ordering::Relaxed);
        let started = Instant::now();
        cells.device_handle(wait).push(signal_trigger()).unwrap();
        while self.connection.signals.load(Ordering::Relaxed) == before {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the proxy did not execute a trigger within 5 s"
            );
            std::thread::yield_now();
        }
        started.elapsed()
    }

    /// The FIFO head as the host sees it.
    fn head(&self) -> u64 {
        self.proxy
            .fifo_cells()
            .head_word()
            .expect("a heap FIFO's head is readable")
    }
}

/// Guards the GPU's FIFO contract on the emulator: a polling proxy's ring carries no
/// doorbell (a GPU cannot ring one), and the proxy never writes the head (on a GPU it is
/// device memory, where host atomics are not atomic with the device's), yet still executes a
/// trigger pushed long after it went idle. The parked proxy of the CPU emulator, for
/// contrast, does mark the head when it parks: the check below can see such a mark.
#[test]
fn a_polling_proxy_needs_no_doorbell_and_never_writes_the_head() {
    let schedule = PollSchedule {
        hot: Duration::from_millis(1),
        first_nap: Duration::from_micros(50),
        max_nap: Duration::from_millis(2),
    };
    let polling = Counted::started(IdlePolicy::Poll(schedule));
    assert_eq!(polling.proxy.fifo_cells().raw_parts().doorbell, 0);
    polling.signal();
    for _ in 0..3 {
        // Past the hot spell, into the naps: the next trigger is seen after one nap at most.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            polling.head() & PROXY_ASLEEP,
            0,
            "the polling proxy wrote the head"
        );
        polling.signal();
    }
    assert_eq!(polling.connection.signals.load(Ordering::Relaxed), 4);
    assert_eq!(polling.head(), 4);

    let parking = Counted::started(IdlePolicy::Doorbell);
    assert_ne!(parking.proxy.fifo_cells().raw_parts().doorbell, 0);
    parking.signal();
    let deadline = Instant::now() + Duration::from_secs(5);
    while parking.head() & PROXY_ASLEEP == 0 {
        assert!(
            Instant::now() < deadline,
            "the parked proxy never marked the head"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Guards the latency of a kernel's first trigger after a long idle spell: with naps of
/// 10 s, a trigger would wait up to 10 s, unless the host says work is coming
/// (`expect_triggers`, called by the communicator before launching a kernel that pushes),
/// also when the trigger comes a while after the call (a launch on a loaded machine: the
/// proxy went back to its naps once its spin budget was spent, and this test failed under
/// load). Stopping a napping proxy must not wait out its nap either.
#[test]
fn expect_triggers_ends_a_long_nap() {
    let schedule = PollSchedule {
        hot: Duration::ZERO,
        first_nap: Duration::from_secs(10),
        max_nap: Duration::from_secs(10),
    };
    let mut napping = Counted::started(IdlePolicy::Poll(schedule));
    std::thread::sleep(Duration::from_millis(20));
    napping.proxy.expect_triggers();
    let took = napping.signal();
    assert!(took < Duration::from_secs(2), "{took:?}");
    for delay_ms in [1, 30] {
        std::thread::sleep(Duration::from_millis(20));
        napping.proxy.expect_triggers();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let took = napping.signal();
        assert!(
            took < Duration::from_secs(2),
            "{delay_ms} ms later: {took:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    napping.proxy.stop().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// The CPU list the kernel reports for the thread of this process named `name`, if any.
fn cpus_allowed_of_thread(name: &str) -> Option<String> {
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string());
        }
    }
    None
}

/// Guards the placement of a proxy thread near its GPU: given CPUs, the thread runs on
/// them and on no other (here: the last CPU this process may use, as the kernel lists it).
#[test]
fn a_proxy_thread_runs_on_the_cpus_it_is_given() {
    let allowed = rustix::thread::sched_getaffinity(None).unwrap();
    let last = (0..rustix::thread::CpuSet::MAX_CPU)
        .rev()
        .find(|&c| allowed.is_set(c))
        .unwrap();
    let mut proxy = ProxyService::new(ProxyConfig {
        rank: 41,
        cpus: Some(vec![last]),
        ..Default::default()
    })
    .unwrap();
    proxy.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let placed = loop {
        match cpus_allowed_of_thread("oxccl-proxy-r41") {
            Some(list) if list == last.to_string() => break list,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "the proxy thread runs on {other:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    assert_eq!(placed, last.to_string());
    proxy.stop().unwrap();
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|comm| comm.trim() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits up to 5 s for `what` to hold.
fn eventually(what: &str, holds: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !holds() {
        assert!(Instant::now() < deadline, "not within 5 s: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Guards the process's shared proxy thread: services that ask for it are served by one
/// thread (no thread of their own), which parks with every FIFO's sleep bit set (so a push
/// to any of them wakes it) and executes each FIFO's triggers; a service that stops is let
/// go while the others are still served; the thread ends with its last service, and a
/// service started later gets a new one.
#[test]
fn services_share_one_proxy_thread_and_leave_it_one_by_one() {
    let shared = |rank| {
        let mut counted = Counted::new(IdlePolicy::Doorbell, 8, Duration::from_secs(10));
        counted.proxy = ProxyService::new(ProxyConfig {
            rank,
            fifo_size: 8,
            wait_timeout: Duration::from_secs(10),
            assist: false,
            share_thread: true,
            ..Default::default()
        })
        .unwrap();
        let semaphore = Arc::new(AtomicU64::new(0));
        counted
            .proxy
            .add_channel(
                counted.connection.clone(),
                MemoryRegion::new(1, semaphore.as_ptr() as u64, 8),
                counted.record.clone(),
            )
            .unwrap();
        counted.stop = counted.proxy.stop_word();
        counted._semaphore = semaphore;
        counted.proxy.start().unwrap();
        counted
    };
    let mut a = shared(50);
    let mut b = shared(51);
    // The name is set by the thread itself once it runs.
    eventually("one shared thread", || threads_named("oxccl-proxy") == 1);
    assert_eq!(
        threads_named("oxccl-proxy-r50") + threads_named("oxccl-proxy-r51"),
        0
    );
    for _ in 0..3 {
        a.signal();
        b.signal();
    }
    // Idle, the thread parks announcing it in both heads at once.
    eventually("both FIFOs marked by one park", || {
        a.head() & PROXY_ASLEEP != 0 && b.head() & PROXY_ASLEEP != 0
    });
    b.signal();
    a.signal();
    a.proxy.stop().unwrap();
    assert_eq!(threads_named("oxccl-proxy"), 1, "b is still served");
    b.signal();
    assert_eq!(a.connection.signals.load(Ordering::Relaxed), 4);
    assert_eq!(b.connection.signals.load(Ordering::Relaxed), 5);
    b.proxy.stop().unwrap();
    eventually("the shared thread ends with its last service", || {
        threads_named("oxccl-proxy") == 0
    });
    let c = shared(52);
    eventually("a new shared thread", || threads_named("oxccl-proxy") == 1);
    c.signal();
}

/// Guards the bound on an idle proxy's hot phase: with every core taken by busy threads,
/// each yield of the proxy thread may give its core away for a whole time slice, and a
/// phase counted only in polls (4096 yields) lasted longer than 5 s. A proxy without
/// assist must still park (mark the head) soon after its last trigger.
#[test]
fn an_idle_proxy_parks_while_every_core_is_busy() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let parking = Counted::started(IdlePolicy::Doorbell);
    parking.signal();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut parked = false;
    while Instant::now() < deadline && !parked {
        parked = parking.head() & PROXY_ASLEEP != 0;
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    assert!(
        parked,
        "the idle proxy did not park within 5 s beside busy cores"
    );
}
