//! Trigger FIFO cost, in two measurements:
//!
//! - Throughput (default): one producer thread pushes triggers through the device-side
//!   `push`, one consumer thread pops them as the proxy thread does (drain, then pace after
//!   a stream: `oxccl_proxy::consumer_pacing`); the same threads then move the same number of
//!   triggers through `crossbeam::queue::ArrayQueue` of the same capacity, with its consumer
//!   polling tightly and, separately, paced like ours; the faster of the two is the baseline.
//! - Round trip (`--round-trip`): a kernel thread pushes a signal trigger for a semaphore of
//!   its own and waits until the proxy thread (a real `ProxyService`, without assist, so the
//!   proxy thread executes every trigger) has raised it; against a two-thread atomic
//!   ping-pong timed in the same run.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin fifo_bench
//! fifo items=<N> push_pop_ns=<x> crossbeam_ns=<y> ratio=<x/y>
//! cargo run --release -p oxccl-examples --bin fifo_bench -- --round-trip
//! fifo_rtt items=<N> trigger_rtt_ns=<x> baseline_atomic_ns=<y> ratio=<x/y>
//! cargo run --release -p oxccl-examples --bin fifo_bench -- --round-trip --backend cuda
//! fifo_rtt backend=cuda items=<N> trigger_rtt_us=<x> (...)
//! cargo run --release -p oxccl-examples --bin fifo_bench -- --idle
//! fifo_idle policy=<doorbell|poll|poll_announced> idle_s=10 proxy_cpu_ms=<c> proxy_cpu_pct=<p> wakeups_per_s=<w> first_trigger_after_1s_idle_us_median=<m> max=<x> busy_rtt_us=<b>
//! ```
//!
//! - Round trip from a kernel (`--round-trip --backend cuda`, or `--from-kernel` on the
//!   emulator): a kernel signals a semaphore of its own through the FIFO and waits for it,
//!   as `port_pingpong` against itself: on a GPU the push crosses the bus into mapped host
//!   memory, the proxy polls it, and a CUDA IPC connection's stream write raises the
//!   semaphore in device memory. No baseline: there is no GPU counterpart to time here.
//! - Idle (`--idle`): what a proxy with nothing to do costs, for the parked proxy of the CPU
//!   emulator (`doorbell`) and the polling one a GPU needs (`poll`, default schedule; with
//!   the first trigger announced by `expect_triggers`: `poll_announced`): the
//!   proxy thread's CPU time and wakeups over 10 s of nothing (target: at most 1 % of a
//!   core), and the round trip of the first trigger after 1 s of nothing, against the round
//!   trip while triggers flow.

use clap::Parser;
use crossbeam::queue::ArrayQueue;
use oxccl::cuda_ipc_connection::CudaIpcConnection;
use oxccl::host_ipc_connection::HostIpcConnection;
use oxccl::{Backend, Device};
use oxccl_device::abort::AbortRecord;
use oxccl_device::fifo::FifoDeviceHandle;
use oxccl_device::fifo::{ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::port_channel::{PortChannelDeviceHandle, PortChannelIds};
use oxccl_device::semaphore::{Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts};
use oxccl_device::wait::WaitPolicy;
use oxccl_examples::atomic_pingpong;
use oxccl_examples::thread_stats::Snapshot;
use oxccl_kernels::pingpong::port_pingpong;
use oxccl_proxy::{
    Connection, Fifo, HostCell, IdlePolicy, MemoryRegion, PollSchedule, ProxyConfig, ProxyService,
    consumer_pacing,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Limit of every wait of the benchmark: long enough never to be reached by a working FIFO.
const WAIT: WaitPolicy<'static> = WaitPolicy::with_timeout_ns(60_000_000_000);

/// Measures push→pop cost per trigger against crossbeam's bounded queue.
#[derive(Parser, Debug)]
struct Args {
    /// Triggers to move.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), default_value_t = 2_000_000)]
    items: u64,
    /// Ring capacity (slots).
    #[arg(long, default_value_t = 512)]
    capacity: u32,
    /// Best of this many runs of each.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), default_value_t = 3)]
    runs: u32,
    /// Measure a trigger's round trip through the proxy thread instead of throughput.
    #[arg(long)]
    round_trip: bool,
    /// Measure what an idle proxy costs under each idle policy: its thread's CPU time and
    /// wakeups over `--idle-secs` of nothing, and the round trip of the first trigger after
    /// 1 s idle (`--runs` tries).
    #[arg(long)]
    idle: bool,
    /// Length of the idle window of `--idle`.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Where `--round-trip` pushes from: `cpu` (a host thread calls the device API, as the
    /// emulator's kernel threads do) or `cuda` (a kernel on GPU 0, the FIFO in mapped host
    /// memory, the semaphore raised by a CUDA IPC connection's stream write); `auto` picks.
    #[arg(long, env = oxccl::backend::BACKEND_ENV, default_value = "cpu", value_parser = oxccl_examples::collective_bench::options::parse_backend)]
    backend: Backend,
    /// With `--round-trip` on the emulator: push from a kernel (the path a GPU takes) rather
    /// than from a host thread.
    #[arg(long)]
    from_kernel: bool,
}

fn trigger(i: u64) -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::DATA,
        dst_offset: i & 0xffff_ffff,
        size: 64,
        ..Default::default()
    })
}

fn oxccl_fifo(items: u64, capacity: u32) -> Result<Duration, oxccl_proxy::ProxyError> {
    let mut fifo = Fifo::new(capacity)?;
    let cells = fifo.cells();
    let handle = cells.device_handle(WAIT);
    let mut sum = 0u64;
    let elapsed = std::thread::scope(|scope| {
        let start = Instant::now();
        let producer = scope.spawn(move || {
            for i in 0..items {
                handle
                    .push(trigger(i))
                    .expect("a working FIFO never times out");
            }
        });
        let mut taken = 0;
        // The proxy thread's loop: drain what is published, then pace or poll again.
        while taken < items {
            let mut drained = 0;
            while let Some(t) = fifo.poll() {
                sum = sum.wrapping_add(t.decode().dst_offset);
                fifo.pop();
                drained += 1;
            }
            taken += drained;
            if drained == 0 {
                std::hint::spin_loop();
            } else {
                consumer_pacing::after_drain(drained);
            }
        }
        let elapsed = start.elapsed();
        producer.join().expect("producer thread");
        elapsed
    });
    assert_eq!(
        sum,
        (0..items).map(|i| i & 0xffff_ffff).sum::<u64>(),
        "FIFO lost or changed triggers"
    );
    Ok(elapsed)
}

fn crossbeam_queue(items: u64, capacity: u32, paced: bool) -> Duration {
    let queue = std::sync::Arc::new(ArrayQueue::<ProxyTrigger>::new(capacity as usize));
    let start = Instant::now();
    let producer = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            for i in 0..items {
                let mut t = trigger(i);
                while let Err(back) = queue.push(t) {
                    t = back;
                    std::hint::spin_loop();
                }
            }
        })
    };
    let mut sum = 0u64;
    let mut taken = 0;
    while taken < items {
        let mut drained = 0;
        while let Some(t) = queue.pop() {
            sum = sum.wrapping_add(t.decode().dst_offset);
            drained += 1;
        }
        taken += drained;
        if drained > 0 && paced {
            consumer_pacing::after_drain(drained);
        } else {
            std::hint::spin_loop();
        }
    }
    let elapsed = start.elapsed();
    producer.join().expect("producer thread");
    assert_eq!(sum, (0..items).map(|i| i & 0xffff_ffff).sum::<u64>());
    elapsed
}

/// A proxy service whose one channel signals a semaphore of the pushing thread's own: a
/// trigger's whole round trip through the FIFO and the proxy thread.
struct Loopback {
    proxy: ProxyService,
    /// The semaphore: inbound (raised by the proxy) and expected (ours), 128 bytes apart as
    /// in `SemaphoreCells`, so the waiter's count does not share a line with the signal.
    counters: Arc<[AtomicU64; 17]>,
    record: HostCell<AbortRecord>,
    stop: HostCell<AtomicU64>,
    id: u32,
}

impl Loopback {
    /// A started proxy without assist (its thread executes every trigger), waiting as
    /// `idle` says when the FIFO is empty.
    fn new(capacity: u32, idle: IdlePolicy) -> Result<Self, Box<dyn std::error::Error>> {
        let mut proxy = ProxyService::new(ProxyConfig {
            rank: 0,
            fifo_size: capacity,
            wait_timeout: Duration::from_secs(60),
            assist: false,
            idle,
            share_thread: false,
            cpus: None,
        })?;
        let counters: Arc<[AtomicU64; 17]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        let inbound =
            MemoryRegion::new(0, counters[0].as_ptr() as u64, 8).with_keep_alive(counters.clone());
        let record = HostCell::new(AbortRecord::new());
        let id = proxy.add_channel(Arc::new(HostIpcConnection::new(0)), inbound, record.clone())?;
        proxy.start()?;
        let stop = proxy.stop_word();
        Ok(Loopback {
            proxy,
            counters,
            record,
            stop,
            id: id.0,
        })
    }

    /// The time `n` round trips take: signal, then wait until the proxy has raised it.
    fn round_trips(&self, n: u64) -> Result<Duration, oxccl_device::DeviceError> {
        // SAFETY: the record and the stop word are held by `self`, which outlives the handles.
        let wait = unsafe {
            WaitPolicy::from_raw_parts(&*self.record, &*self.stop, 60_000_000_000, self.id)
        };
        let raw = SemaphoreRawParts {
            inbound: self.counters[0].as_ptr() as u64,
            expected: self.counters[16].as_ptr() as u64,
            remote_inbound: 0,
        };
        // SAFETY: the counters are held by `self`; the proxy raises `inbound`, only the
        // calling thread touches `expected` (`&self` is not shared between threads here).
        let semaphore = unsafe { Host2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, wait) };
        let ids = PortChannelIds {
            semaphore_id: self.id,
            ..Default::default()
        };
        let cells = self.proxy.fifo_cells();
        let chan = PortChannelDeviceHandle::new(cells.device_handle(wait), semaphore, ids);
        let start = Instant::now();
        for _ in 0..n {
            chan.signal()?;
            chan.wait()?;
        }
        Ok(start.elapsed())
    }

    fn finish(mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.proxy.stop()?;
        self.proxy.check()?;
        Ok(())
    }
}

/// `items` round trips of a signal trigger through a proxy thread to a semaphore of the
/// pushing thread's own: push, then wait until the proxy has raised it.
fn trigger_round_trip(items: u64, capacity: u32) -> Result<Duration, Box<dyn std::error::Error>> {
    let loopback = Loopback::new(capacity, IdlePolicy::Doorbell)?;
    loopback.round_trips((items / 10).clamp(1, 10_000))?;
    let elapsed = loopback.round_trips(items)?;
    loopback.finish()?;
    Ok(elapsed)
}

/// What one idle policy costs: the proxy thread while nothing happens, and the first
/// trigger after a second of nothing.
struct IdleCost {
    /// CPU time of the proxy thread over the idle window.
    cpu: Duration,
    /// Times the proxy thread gave up its core over the window (its wakeups).
    wakeups: u64,
    /// Round trips of the first trigger after 1 s idle, one per try.
    first_after_idle: Vec<Duration>,
    /// A round trip while triggers flow (the best of a stream of them).
    busy: Duration,
}

fn idle_cost(
    capacity: u32,
    idle: IdlePolicy,
    window: Duration,
    tries: u32,
    announce: bool,
) -> Result<IdleCost, Box<dyn std::error::Error>> {
    let loopback = Loopback::new(capacity, idle)?;
    let busy = (0..5)
        .map(|_| loopback.round_trips(1000).map(|d| d / 1000))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .min()
        .unwrap_or_default();
    let mut first_after_idle = Vec::new();
    for _ in 0..tries {
        std::thread::sleep(Duration::from_secs(1));
        if announce {
            loopback.proxy.expect_triggers();
        }
        first_after_idle.push(loopback.round_trips(1)?);
    }
    // Let the hot spell after the last trigger pass, then watch the thread do nothing.
    std::thread::sleep(Duration::from_millis(100));
    let proxy = |s: &Snapshot| {
        s.named("oxccl-proxy-r0")
            .map(|c| (c.cpu_ns, c.voluntary_switches))
            .ok_or("the proxy thread (oxccl-proxy-r0) is not listed in /proc/self/task")
    };
    let before = proxy(&Snapshot::take())?;
    std::thread::sleep(window);
    let after = proxy(&Snapshot::take())?;
    loopback.finish()?;
    Ok(IdleCost {
        cpu: Duration::from_nanos(after.0.saturating_sub(before.0)),
        wakeups: after.1.saturating_sub(before.1),
        first_after_idle,
        busy,
    })
}

/// `--idle`: one line per policy, the parked proxy of the CPU emulator and the polling
/// proxy a GPU needs (default schedule), the latter also with the first trigger announced
/// (`expect_triggers`, as the communicator does before launching a kernel that pushes).
fn idle_main(args: &Args) -> std::process::ExitCode {
    let window = Duration::from_secs(args.idle_secs.max(1));
    let poll = IdlePolicy::Poll(PollSchedule::default());
    let policies = [
        ("doorbell", IdlePolicy::Doorbell, false),
        ("poll", poll, false),
        ("poll_announced", poll, true),
    ];
    for (name, policy, announce) in policies {
        let cost = match idle_cost(args.capacity, policy, window, args.runs.max(1), announce) {
            Ok(cost) => cost,
            Err(e) => {
                eprintln!("fifo_bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let mut first = cost.first_after_idle.clone();
        first.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "fifo_idle policy={name} idle_s={} proxy_cpu_ms={:.2} proxy_cpu_pct={:.3} wakeups_per_s={:.0} \
             first_trigger_after_1s_idle_us_median={:.1} max={:.1} busy_rtt_us={:.2}",
            window.as_secs(),
            cost.cpu.as_secs_f64() * 1e3,
            cost.cpu.as_secs_f64() / window.as_secs_f64() * 100.0,
            cost.wakeups as f64 / window.as_secs_f64(),
            us(first[first.len() / 2]),
            us(*first.last().expect("at least one try")),
            us(cost.busy),
        );
    }
    std::process::ExitCode::SUCCESS
}

fn main() -> std::process::ExitCode {
    oxccl_examples::init_logging();
    let args = Args::parse();
    if args.round_trip {
        return round_trip_main(&args);
    }
    if args.idle {
        return idle_main(&args);
    }
    let items = args.items.max(1);
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..args.runs.max(1) {
        match oxccl_fifo(items, args.capacity) {
            Ok(d) => best.0 = best.0.min(d),
            Err(e) => {
                eprintln!("fifo_bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
        for paced in [false, true] {
            best.1 = best.1.min(crossbeam_queue(items, args.capacity, paced));
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e9 / items as f64;
    let (ours, theirs) = (per(best.0), per(best.1));
    println!(
        "fifo items={items} push_pop_ns={ours:.1} crossbeam_ns={theirs:.1} ratio={:.2}",
        ours / theirs
    );
    std::process::ExitCode::SUCCESS
}

/// `items` round trips of a signal trigger from a kernel on `device`'s stream through a
/// proxy whose FIFO the device placed, to a semaphore of the kernel's own in device memory
/// (`port_pingpong` against itself): push, proxy, connection (a stream write on a GPU),
/// wait. The time of one launch of `items` round trips, after a warm-up launch.
fn kernel_round_trip(
    device: &Device,
    items: u64,
    capacity: u32,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let mut proxy = device.proxy_service(ProxyConfig {
        rank: 0,
        fifo_size: capacity,
        wait_timeout: Duration::from_secs(60),
        assist: false,
        idle: IdlePolicy::Poll(PollSchedule::default()),
        share_thread: false,
        cpus: None,
    })?;
    // inbound at word 0 (raised by the proxy), expected at word 16 (the kernel's count).
    let counters = device.alloc_zeroed::<u64>(17)?;
    let connection: Arc<dyn Connection> = match device.backend() {
        Backend::Cuda => Arc::new(CudaIpcConnection::new(device, 0, Duration::from_secs(60))?),
        _ => Arc::new(HostIpcConnection::new(0)),
    };
    let inbound = MemoryRegion::new(0, counters.addr(), 8);
    let record = device.host_cell(AbortRecord::new())?;
    let id = proxy.add_channel(connection, inbound, record.clone())?;
    proxy.start()?;
    let stop = proxy.stop_word();
    let cells = proxy.fifo_cells();
    // SAFETY: the record, the stop word, the counters and the FIFO's cells are held until
    // the end of the function, after the stream is synchronized.
    let chan = unsafe {
        let wait = WaitPolicy::from_raw_parts(&*record, &*stop, 60_000_000_000, id.0);
        let raw = SemaphoreRawParts {
            inbound: counters.addr(),
            expected: counters.addr() + 128,
            remote_inbound: 0,
        };
        let ids = PortChannelIds {
            semaphore_id: id.0,
            ..Default::default()
        };
        PortChannelDeviceHandle::new(
            FifoDeviceHandle::from_raw_parts(cells.raw_parts(), wait),
            Host2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, wait),
            ids,
        )
    };
    let stream = device.stream()?;
    let one = LaunchConfig::grid(1).block(1);
    let warm = (items / 10).clamp(1, 10_000) as u32;
    port_pingpong::launch(&stream, one, chan, warm, 1, 0)?;
    stream.synchronize()?;
    proxy.expect_triggers();
    let started = Instant::now();
    port_pingpong::launch(&stream, one, chan, items as u32, 1, 0)?;
    stream.synchronize()?;
    let elapsed = started.elapsed();
    proxy.stop()?;
    proxy.check()?;
    if let Some(reason) = record.read() {
        return Err(format!("the kernel failed: {reason:?}").into());
    }
    Ok(elapsed)
}

/// `--round-trip --backend cuda`: the round trip from a GPU kernel, best of `--runs`.
fn kernel_round_trip_main(args: &Args, backend: Backend) -> std::process::ExitCode {
    let items = args.items.clamp(1, 1_000_000);
    let device = match Device::new(backend, 0) {
        Ok(device) => device,
        Err(e) => {
            eprintln!("fifo_bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut best = Duration::MAX;
    for _ in 0..args.runs.max(1) {
        match kernel_round_trip(&device, items, args.capacity) {
            Ok(d) => best = best.min(d),
            Err(e) => {
                eprintln!("fifo_bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    println!(
        "fifo_rtt backend={backend} items={items} trigger_rtt_us={:.2} (a kernel's signal, \
         the proxy, the connection's semaphore write, the kernel's wait)",
        best.as_secs_f64() * 1e6 / items as f64
    );
    std::process::ExitCode::SUCCESS
}

/// `--round-trip`: best of `--runs` for the trigger round trip and for the atomic baseline.
fn round_trip_main(args: &Args) -> std::process::ExitCode {
    match args.backend.resolve() {
        Backend::Cpu if !args.from_kernel => {}
        backend => return kernel_round_trip_main(args, backend),
    }
    let items = args.items.clamp(1, 1_000_000);
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..args.runs.max(1) {
        match trigger_round_trip(items, args.capacity) {
            Ok(d) => best.0 = best.0.min(d),
            Err(e) => {
                eprintln!("fifo_bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
        best.1 = best.1.min(atomic_pingpong(items) * items as u32);
    }
    let per = |d: Duration| d.as_secs_f64() * 1e9 / items as f64;
    let (ours, theirs) = (per(best.0), per(best.1));
    println!(
        "fifo_rtt items={items} trigger_rtt_ns={ours:.1} baseline_atomic_ns={theirs:.1} ratio={:.2}",
        ours / theirs
    );
    std::process::ExitCode::SUCCESS
}
