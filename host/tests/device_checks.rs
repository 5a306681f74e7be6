//! The device crate's synchronization on every backend here: the emulator always, and GPU 0
//! where a CUDA driver and device are present (the GPU bundle runs this program there).
//! What the emulator cannot show, a GPU can: its weaker memory model, blocks that are not
//! all resident, memory that is not zeroed. Each check builds its handles from raw device
//! addresses, so it needs no communicator, and reads the results back through the host; the
//! FIFO and port-channel checks have proxy services of their own, whose FIFOs the device
//! places, and one check waits on a stop word and record the host shares with the device.

use oxccl::cuda_ipc_connection::CudaIpcConnection;
use oxccl::host_ipc_connection::HostIpcConnection;
use oxccl::{Backend, Device, DeviceBuffer, Error, IdlePolicy, PollSchedule, Stream};
use oxccl_device::DeviceError;
use oxccl_device::abort::{AbortReason, AbortRecord};
use oxccl_device::channel_set::ChannelSetDeviceHandle;
use oxccl_device::error::DeviceOp;
use oxccl_device::fifo::FifoDeviceHandle;
use oxccl_device::grid_barrier::{GridBarrierDeviceHandle, GridBarrierRawParts};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
use oxccl_device::port_channel::{PortChannelDeviceHandle, PortChannelIds};
use oxccl_device::reduce::{DataType, ReduceOp};
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts,
};
use oxccl_device::wait::WaitPolicy;
use oxccl_kernels::collectives::all_reduce::collective_all_reduce;
use oxccl_kernels::collectives::all_reduce_packets::collective_all_reduce_packets;
use oxccl_kernels::collectives::rounds::{elements_per_round, rounds};
use oxccl_kernels::collectives::{CollectiveArgs, PacketForm, ScratchLayout};
use oxccl_kernels::device_check::{
    barrier_stamp, fifo_push_check, fill_sequence, grid_barrier_check,
};
use oxccl_kernels::packet_exchange::{ll8_exchange, ll16_exchange};
use oxccl_kernels::pingpong::memory_pingpong;
use oxccl_kernels::ring_exchange::port_ring_exchange;
use oxccl_proxy::{Connection, HostCell, MemoryRegion, ProxyConfig, ProxyService};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The devices a check runs on: the emulator, and GPU 0 where there is one (else the
/// reason there is none is printed). Each has run a kernel of `oxccl_kernels` already, so
/// loading the module is not in the figures a check prints.
fn every_backend(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu(0)];
    match Backend::cuda_device_count() {
        Ok(_) => devices.push(Device::new(Backend::Cuda, 0).expect("open cuda device 0")),
        Err(why) => println!("{test}: the cuda part is skipped: {why}"),
    }
    for device in &devices {
        let s = device.stream().unwrap();
        let warm = device.alloc::<u32>(256).unwrap();
        fill_sequence::launch(&s, LaunchConfig::grid(1).block(256), warm.view_mut(), 0).unwrap();
        s.synchronize().unwrap();
    }
    devices
}

/// A stream of `device` whose synchronize gives up after `timeout`.
fn stream(device: &Device, timeout: Duration) -> Stream {
    let mut stream = device.stream().unwrap();
    stream.set_timeout(timeout);
    stream
}

/// A healthy abort record in `device`'s memory (32 bytes, zeroed).
fn abort_record(device: &Device) -> DeviceBuffer<u64> {
    let record = device.alloc_zeroed::<u64>(4).unwrap();
    assert_eq!(record.addr() % 32, 0, "an abort record is 32-byte aligned");
    record
}

/// What a record in device memory says, read through the host.
fn recorded(record: &DeviceBuffer<u64>) -> Option<AbortReason> {
    AbortReason::decode(record.to_vec().unwrap()[0])
}

/// A wait policy of at most `timeout` per wait, failures recorded in `record`.
///
/// # Safety
/// `record` outlives every kernel launched with the policy.
unsafe fn policy(record: &DeviceBuffer<u64>, timeout: Duration) -> WaitPolicy<'static> {
    // SAFETY: `record` is 32 zeroed, 32-byte aligned bytes of device memory every device
    // thread and the host reach (checked in `abort_record`), touched only through the
    // record's atomics while kernels run; it outlives them (the caller).
    unsafe {
        WaitPolicy::from_raw_parts(
            record.addr() as usize as *const AbortRecord,
            std::ptr::null(),
            timeout.as_nanos() as u64,
            0,
        )
    }
}

/// One side of a memory channel between two "ranks" on one device: its data buffer, its
/// packet buffer (either may be what the peer writes) and its two semaphore counters
/// `[inbound, expected]`.
struct Side {
    data: DeviceBuffer<u64>,
    packets: DeviceBuffer<u64>,
    counters: DeviceBuffer<u64>,
}

impl Side {
    /// A side of `words` data words, not zeroed (as GPU memory is not: each check writes
    /// what it later reads), and `packet_words` zeroed packet words.
    fn new(device: &Device, words: usize, packet_words: usize) -> Side {
        Side {
            data: device.alloc(words).unwrap(),
            packets: device.alloc_zeroed(packet_words.max(1)).unwrap(),
            counters: device.alloc_zeroed(2).unwrap(),
        }
    }

    /// This side's handle of the channel to `peer`: it writes the peer's data buffer, or
    /// its packet buffer if `to_packets`.
    ///
    /// # Safety
    /// `self`, `peer` and the policy's record outlive every kernel launched with it.
    unsafe fn handle(
        &self,
        peer: &Side,
        to_packets: bool,
        wait: WaitPolicy<'static>,
    ) -> MemoryChannelDeviceHandle<'static> {
        let remote = if to_packets {
            &peer.packets
        } else {
            &peer.data
        };
        // SAFETY: forwarded contract; the counters are zeroed (`new`).
        unsafe {
            memory_channel(
                &self.counters,
                &peer.counters,
                remote,
                &self.data,
                &self.packets,
                wait,
            )
        }
    }
}

/// A memory channel's handle over device buffers: `counters` are this side's zeroed
/// `[inbound, expected]`, `peer_counters` the peer's; the channel writes `remote`, reads
/// `local`, and takes packets in `packets`.
///
/// # Safety
/// Every buffer and the policy's record outlive every kernel launched with the handle;
/// both counter pairs are zeroed when first used and touched only by the two handles.
unsafe fn memory_channel<R: bytemuck::Pod, L: bytemuck::Pod, P: bytemuck::Pod>(
    counters: &DeviceBuffer<u64>,
    peer_counters: &DeviceBuffer<u64>,
    remote: &DeviceBuffer<R>,
    local: &DeviceBuffer<L>,
    packets: &DeviceBuffer<P>,
    wait: WaitPolicy<'static>,
) -> MemoryChannelDeviceHandle<'static> {
    let raw = SemaphoreRawParts {
        inbound: counters.addr(),
        expected: counters.addr() + 8,
        remote_inbound: peer_counters.addr(),
    };
    let buffers = MemoryChannelBuffers {
        remote: remote.addr(),
        remote_size: remote.size_bytes() as u64,
        local: local.addr(),
        local_size: local.size_bytes() as u64,
        packets: packets.addr(),
        packets_size: packets.size_bytes() as u64,
    };
    // SAFETY: the counters are aligned u64s and the buffers live, 256-byte aligned device
    // memory of the sizes given, all reachable by every thread of the kernels (one device)
    // and outliving them (the caller).
    unsafe {
        MemoryChannelDeviceHandle::from_raw_parts(
            Device2DeviceSemaphoreDeviceHandle::from_raw_parts(raw, wait),
            buffers,
        )
    }
}

/// Guards against signals or data that a kernel on another stream does not see, or sees
/// late or out of order: two kernels, each a rank, ping-pong through a memory channel
/// (data stored, then the peer's semaphore raised) on one device, and both find every
/// round's data and count every signal. Prints the round trip.
#[test]
fn memory_channel_pingpong_between_two_streams() {
    const ITERS: u32 = 20_000;
    const WORDS: usize = 8;
    for device in every_backend("memory_channel_pingpong_between_two_streams") {
        let (a, b) = (Side::new(&device, WORDS, 0), Side::new(&device, WORDS, 0));
        let (record_a, record_b) = (abort_record(&device), abort_record(&device));
        let wait = Duration::from_secs(5);
        // SAFETY: the sides and records live until the end of this iteration, after both
        // streams are synchronized.
        let (to_b, to_a) = unsafe {
            (
                a.handle(&b, false, policy(&record_a, wait)),
                b.handle(&a, false, policy(&record_b, wait)),
            )
        };
        let (sa, sb) = (stream(&device, wait * 4), stream(&device, wait * 4));
        let bytes = (WORDS * 8) as u64;
        let start = Instant::now();
        memory_pingpong::launch(&sa, LaunchConfig::grid(1).block(32), to_b, ITERS, 1, bytes)
            .unwrap();
        memory_pingpong::launch(&sb, LaunchConfig::grid(1).block(32), to_a, ITERS, 0, bytes)
            .unwrap();
        let (ra, rb) = (sa.synchronize(), sb.synchronize());
        let elapsed = start.elapsed();
        assert_eq!(recorded(&record_a), None, "{device:?}: side a");
        assert_eq!(recorded(&record_b), None, "{device:?}: side b");
        ra.unwrap();
        rb.unwrap();
        let last = u64::from(ITERS - 1);
        for (name, side) in [("a", &a), ("b", &b)] {
            assert_eq!(
                side.data.to_vec().unwrap(),
                [last; WORDS],
                "{device:?}: {name}'s data"
            );
            let counters = side.counters.to_vec().unwrap();
            assert_eq!(
                counters,
                [u64::from(ITERS); 2],
                "{device:?}: {name}'s [inbound, expected] counters"
            );
        }
        println!(
            "memory channel round trip between two streams on {device:?}: {:.2} us ({ITERS} \
             rounds of {bytes} bytes, launches included)",
            elapsed.as_secs_f64() * 1e6 / f64::from(ITERS)
        );
    }
}

/// Guards against LL packets read before their data arrived, torn, or taken from an earlier
/// launch (a stale flag): two ranks on two streams run back-to-back rounds, each refilling
/// its buffer on its own stream and exchanging it as 8- and 16-byte packets, with no host
/// step in between; the last round's data must arrive whole.
#[test]
fn ll_packets_cross_between_two_streams_round_after_round() {
    const ROUNDS: u32 = 50;
    const BYTES: usize = 256 << 10;
    let words = BYTES / 8;
    for device in every_backend("ll_packets_cross_between_two_streams_round_after_round") {
        for packet in ["ll8", "ll16"] {
            // Data: our BYTES, then the peer's; packets: twice what they carry.
            let (a, b) = (
                Side::new(&device, 2 * words, 2 * words),
                Side::new(&device, 2 * words, 2 * words),
            );
            let (record_a, record_b) = (abort_record(&device), abort_record(&device));
            let wait = Duration::from_secs(5);
            // SAFETY: the sides and records live until the end of this iteration, after both
            // streams are synchronized.
            let (to_b, to_a) = unsafe {
                (
                    a.handle(&b, true, policy(&record_a, wait)),
                    b.handle(&a, true, policy(&record_b, wait)),
                )
            };
            let streams = [stream(&device, wait * 4), stream(&device, wait * 4)];
            let first = |round: u32, rank: u32| round * 1_000_003 + rank * 7 + 1;
            let start = Instant::now();
            for round in 0..ROUNDS {
                for (rank, (s, side, chan)) in [(&streams[0], &a, to_b), (&streams[1], &b, to_a)]
                    .into_iter()
                    .enumerate()
                {
                    let ours = side.data.view_mut().cast::<u32>().unwrap();
                    let ours = ours.slice(0..(BYTES / 4) as u64).unwrap();
                    fill_sequence::launch(
                        s,
                        LaunchConfig::grid(4).block(256),
                        ours,
                        first(round, rank as u32),
                    )
                    .unwrap();
                    let config = LaunchConfig::grid(1).block(512);
                    let flag = round + 1;
                    match packet {
                        "ll8" => ll8_exchange::launch(s, config, chan, chan, BYTES as u64, flag),
                        _ => ll16_exchange::launch(s, config, chan, chan, BYTES as u64, flag),
                    }
                    .unwrap();
                }
            }
            let (ra, rb) = (streams[0].synchronize(), streams[1].synchronize());
            let elapsed = start.elapsed();
            assert_eq!(recorded(&record_a), None, "{device:?} {packet}: side a");
            assert_eq!(recorded(&record_b), None, "{device:?} {packet}: side b");
            ra.unwrap();
            rb.unwrap();
            for (rank, side) in [&a, &b].into_iter().enumerate() {
                let peer = 1 - rank as u32;
                let got: Vec<u32> =
                    bytemuck::cast_slice(&side.data.to_vec().unwrap()[words..]).to_vec();
                let base = first(ROUNDS - 1, peer);
                let wrong = (0..got.len())
                    .filter(|&i| got[i] != base.wrapping_add(i as u32))
                    .count();
                assert_eq!(
                    wrong,
                    0,
                    "{device:?} {packet}: rank {rank} got {wrong} wrong words of {}",
                    got.len()
                );
            }
            println!(
                "{packet} packet exchange of {} KiB between two streams on {device:?}: {:.1} us a round",
                BYTES >> 10,
                elapsed.as_secs_f64() * 1e6 / f64::from(ROUNDS)
            );
        }
    }
}

/// Guards against a wait that never ends on a device, or ends without saying why: a rank
/// whose peer never answers records a timeout after its wait limit, and its kernel ends.
#[test]
fn an_unanswered_wait_ends_at_its_limit_and_records_why() {
    let limit = Duration::from_millis(200);
    for device in every_backend("an_unanswered_wait_ends_at_its_limit_and_records_why") {
        let (me, absent) = (Side::new(&device, 1, 0), Side::new(&device, 1, 0));
        let record = abort_record(&device);
        // SAFETY: the sides and the record live until the end of this iteration, after the
        // stream is synchronized.
        let chan = unsafe { me.handle(&absent, false, policy(&record, limit)) };
        let s = stream(&device, Duration::from_secs(20));
        let start = Instant::now();
        memory_pingpong::launch(&s, LaunchConfig::grid(1).block(32), chan, 1, 1, 0).unwrap();
        let outcome = s.synchronize();
        let elapsed = start.elapsed();
        // The emulator reports a kernel's returned error; a GPU kernel's outcome is not
        // returned: only its records say.
        match (device.backend(), &outcome) {
            (Backend::Cpu, Err(Error::KernelError { error, .. })) => {
                assert_eq!(*error, DeviceError::Timeout)
            }
            (Backend::Cuda, Ok(())) => {}
            _ => panic!("{device:?}: {outcome:?}"),
        }
        let reason = recorded(&record).unwrap_or_else(|| panic!("{device:?}: nothing recorded"));
        assert_eq!(
            reason.error,
            Some(DeviceError::Timeout),
            "{device:?}: {reason:?}"
        );
        assert!(
            elapsed >= limit,
            "{device:?}: ended after {elapsed:?}, before its limit"
        );
        assert!(
            elapsed < limit + Duration::from_secs(5),
            "{device:?}: ended {elapsed:?} after its launch, far past its limit of {limit:?}"
        );
        // The peer saw the one signal sent before the wait.
        assert_eq!(absent.counters.to_vec().unwrap()[0], 1, "{device:?}");
        println!(
            "an unanswered wait with a limit of {limit:?} ended after {elapsed:?} on {device:?}"
        );
    }
}

/// Guards the cells the host and kernels share (on a GPU: pinned device-mapped host
/// memory, [`Device::host_cell`]), both ways. A kernel waits, with a limit of 60 s, for a
/// peer that never answers; the host raises the rank's stop word after 100 ms, and the wait
/// ends within seconds (a stopped wait records nothing: the failure that raised the word
/// is the one reported). Then a wait with a limit of 200 ms times out: the kernel records
/// why in the record and raises the stop word, and the host reads both without a copy.
#[test]
fn host_cells_carry_stops_and_failures_between_host_and_kernels() {
    for device in every_backend("host_cells_carry_stops_and_failures_between_host_and_kernels") {
        let (me, absent) = (Side::new(&device, 1, 0), Side::new(&device, 1, 0));
        let s = stream(&device, Duration::from_secs(20));
        let wait_alone = |limit: Duration, stop_after: Option<Duration>| {
            let record = device.host_cell(AbortRecord::new()).unwrap();
            let stop = device.host_cell(AtomicU64::new(0)).unwrap();
            // SAFETY: the sides, the record and the stop word live until after the stream
            // is synchronized below; both cells are reached atomically.
            let chan = unsafe {
                let wait = WaitPolicy::from_raw_parts(&*record, &*stop, limit.as_nanos() as u64, 7);
                me.handle(&absent, false, wait)
            };
            let start = Instant::now();
            memory_pingpong::launch(&s, LaunchConfig::grid(1).block(32), chan, 1, 1, 0).unwrap();
            if let Some(after) = stop_after {
                std::thread::sleep(after);
                let word = AbortReason::encode(DeviceError::Aborted, DeviceOp::Unknown, 99);
                stop.store(word, Ordering::Relaxed);
            }
            let outcome = s.synchronize();
            let elapsed = start.elapsed();
            let returned = match (device.backend(), outcome) {
                (Backend::Cpu, Err(Error::KernelError { error, .. })) => Some(error),
                // A GPU kernel's returned error does not come back: only its records say.
                (Backend::Cuda, Ok(())) => None,
                (_, outcome) => panic!("{device:?}: {outcome:?}"),
            };
            (
                elapsed,
                returned,
                record.read(),
                AbortReason::decode(stop.load(Ordering::Relaxed)),
            )
        };

        let (elapsed, returned, recorded, stopped) =
            wait_alone(Duration::from_secs(60), Some(Duration::from_millis(100)));
        assert!(
            elapsed < Duration::from_secs(5),
            "{device:?}: a wait stopped 100 ms in ended {elapsed:?} after its launch"
        );
        assert!(
            returned.is_none_or(|e| e == DeviceError::Aborted),
            "{returned:?}"
        );
        assert_eq!(
            recorded, None,
            "{device:?}: a stopped wait recorded a failure"
        );
        assert_eq!(stopped.map(|r| r.site), Some(99), "{device:?}");

        let (elapsed, returned, recorded, stopped) = wait_alone(Duration::from_millis(200), None);
        assert!(elapsed < Duration::from_secs(5), "{device:?}: {elapsed:?}");
        assert!(
            returned.is_none_or(|e| e == DeviceError::Timeout),
            "{returned:?}"
        );
        let recorded = recorded.unwrap_or_else(|| panic!("{device:?}: nothing recorded"));
        assert_eq!(
            (recorded.error, recorded.site),
            (Some(DeviceError::Timeout), 7),
            "{device:?}: {recorded:?}"
        );
        let stopped = stopped.unwrap_or_else(|| panic!("{device:?}: the stop word stayed down"));
        assert_eq!(stopped.site, 7, "{device:?}: {stopped:?}");
        println!(
            "host cells on {device:?}: a wait stopped by the host ended, a timed-out one was \
             recorded and raised the stop word"
        );
    }
}

/// Guards against a grid barrier that lets a block past before every block's writes are
/// visible, or that loses count over many barriers: as many blocks as the device holds at
/// once (on a GPU) exchange stamps through memory around 200 barriers, and none reads a
/// stale one.
#[test]
fn grid_barrier_orders_every_block_of_a_full_grid() {
    const ROUNDS: u32 = 100;
    for device in every_backend("grid_barrier_orders_every_block_of_a_full_grid") {
        // On the emulator every block is a thread: a few make the check; on a GPU, the most
        // the device holds at once (the launch is refused beyond that).
        // Then, on a GPU, a grid of 16 blocks, for the time of a barrier there.
        let groups: &[&[u32]] = match device.backend() {
            Backend::Cuda => &[&[4096, 2048, 1024, 528, 264, 132], &[16]],
            _ => &[&[4]],
        };
        let counters = device.alloc_zeroed::<u64>(2).unwrap();
        let record = abort_record(&device);
        // SAFETY: the counters are two zeroed, aligned u64s of device memory, touched only
        // by this barrier; they and the record outlive every launch (synchronized below).
        let barrier = unsafe {
            GridBarrierDeviceHandle::from_raw_parts(
                GridBarrierRawParts {
                    count: counters.addr(),
                    generation: counters.addr() + 8,
                },
                policy(&record, Duration::from_secs(5)),
            )
        };
        let s = stream(&device, Duration::from_secs(60));
        let mut completed = 0;
        for candidates in groups {
            let mut ran = None;
            for &blocks in *candidates {
                let stamps = device.alloc_zeroed::<u32>(blocks as usize).unwrap();
                let wrong = device.alloc_zeroed::<u32>(blocks as usize).unwrap();
                let config = LaunchConfig::grid(blocks).block(128);
                let started = Instant::now();
                match grid_barrier_check::launch(
                    &s,
                    config,
                    barrier,
                    stamps.view_mut(),
                    wrong.view_mut(),
                    ROUNDS,
                ) {
                    Ok(()) => {}
                    Err(e) => {
                        println!("{device:?}: {blocks} blocks refused: {e}");
                        continue;
                    }
                }
                s.synchronize().unwrap();
                let elapsed = started.elapsed();
                completed += 2 * ROUNDS;
                assert_eq!(recorded(&record), None, "{device:?}, {blocks} blocks");
                let wrong = wrong.to_vec().unwrap();
                assert!(
                    wrong.iter().all(|&w| w == 0),
                    "{device:?}, {blocks} blocks: {} blocks read stale stamps ({} reads)",
                    wrong.iter().filter(|&&w| w != 0).count(),
                    wrong.iter().map(|&w| u64::from(w)).sum::<u64>()
                );
                let want: Vec<u32> = (0..blocks).map(|b| barrier_stamp(ROUNDS - 1, b)).collect();
                assert_eq!(
                    stamps.to_vec().unwrap(),
                    want,
                    "{device:?}, {blocks} blocks"
                );
                let counters = counters.to_vec().unwrap();
                assert_eq!(
                    counters[0], 0,
                    "{device:?}: arrivals left over after the barriers"
                );
                assert_eq!(
                    counters[1],
                    u64::from(completed),
                    "{device:?}: barriers completed"
                );
                ran = Some((blocks, elapsed));
                break;
            }
            let (blocks, elapsed) =
                ran.unwrap_or_else(|| panic!("{device:?}: every grid size was refused"));
            println!(
                "grid barrier: {blocks} blocks of 128 threads, {} barriers, on {device:?}: {:.2} us \
             a barrier (the launch included)",
                2 * ROUNDS,
                elapsed.as_secs_f64() * 1e6 / f64::from(2 * ROUNDS)
            );
        }
    }
}

/// Guards the trigger FIFO where the device places it (on a GPU: slots and tail in mapped
/// host memory, head and tail cache in device memory, no doorbell, a polling proxy): every
/// thread of a grid pushes signal triggers through a ring much smaller than their number,
/// so pushers wait for the proxy's tail across the bus lap after lap, then waits for its
/// last one. Every position is handed out once, the proxy executes every trigger, and the
/// device sees the proxy's tail. Prints the time a trigger.
#[test]
fn fifo_triggers_from_every_thread_reach_a_polling_proxy() {
    const TRIGGERS: u32 = 16;
    for device in every_backend("fifo_triggers_from_every_thread_reach_a_polling_proxy") {
        let config = match device.backend() {
            Backend::Cuda => LaunchConfig::grid(16).block(128),
            _ => LaunchConfig::grid(2).block(16),
        };
        let threads = (config.grid.x * config.block.x) as usize;
        let total = threads * TRIGGERS as usize;
        let mut proxy = device
            .proxy_service(ProxyConfig {
                rank: 0,
                fifo_size: 64,
                wait_timeout: Duration::from_secs(10),
                assist: false,
                idle: IdlePolicy::Poll(PollSchedule::default()),
                share_thread: false,
                cpus: None,
            })
            .unwrap();
        assert_eq!(proxy.fifo_cells().raw_parts().doorbell, 0);
        // The channel signals a counter of the host's: each executed trigger raises it by 1.
        let signalled = Arc::new(AtomicU64::new(0));
        let inbound =
            MemoryRegion::new(0, signalled.as_ptr() as u64, 8).with_keep_alive(signalled.clone());
        proxy
            .add_channel(
                Arc::new(HostIpcConnection::new(0)),
                inbound,
                HostCell::new(AbortRecord::new()),
            )
            .unwrap();
        proxy.start().unwrap();
        let record = abort_record(&device);
        let cells = proxy.fifo_cells();
        // SAFETY: the cells are the proxy's FIFO, kept alive by `cells` (and the policy's
        // record by `record`) until after the stream is synchronized below.
        let fifo = unsafe {
            FifoDeviceHandle::from_raw_parts(
                cells.raw_parts(),
                policy(&record, Duration::from_secs(10)),
            )
        };
        let positions = device.alloc::<u64>(total).unwrap();
        let s = stream(&device, Duration::from_secs(60));
        proxy.expect_triggers();
        let started = Instant::now();
        fifo_push_check::launch(&s, config, fifo, TRIGGERS, positions.view_mut()).unwrap();
        s.synchronize().unwrap();
        let elapsed = started.elapsed();
        assert_eq!(recorded(&record), None, "{device:?}");
        proxy.stop().unwrap();
        proxy.check().unwrap();
        assert_eq!(
            signalled.load(Ordering::Acquire),
            total as u64,
            "{device:?}: triggers executed"
        );
        let mut got = positions.to_vec().unwrap();
        got.sort_unstable();
        assert!(
            got.iter().copied().eq(0..total as u64),
            "{device:?}: positions are not 0..{total} once each"
        );
        println!(
            "fifo: {total} triggers from {threads} threads through 64 slots to a polling proxy \
             on {device:?}: {:.3} us a trigger (the launch included)",
            elapsed.as_secs_f64() * 1e6 / total as f64
        );
    }
}

/// One rank of a port-channel ring of two built by hand on one device: its buffer, its
/// channels' semaphore counters `[next inbound, next expected, prev inbound, prev
/// expected]`, its abort record, and its own proxy (whose FIFO the device placed).
struct PortRank {
    buffer: DeviceBuffer<u8>,
    counters: DeviceBuffer<u64>,
    record: DeviceBuffer<u64>,
    proxy: ProxyService,
}

/// The byte `i` of rank `rank`'s chunk.
fn port_byte(rank: u32, i: usize) -> u8 {
    (i as u32).wrapping_mul(31).wrapping_add(rank * 101) as u8
}

/// The connection a rank's proxy reaches its peer through: the GPU's copy engines on a
/// GPU, the CPU on the emulator.
fn peer_connection(device: &Device, peer: u32) -> Arc<dyn Connection> {
    match device.backend() {
        Backend::Cuda => {
            Arc::new(CudaIpcConnection::new(device, peer, Duration::from_secs(10)).unwrap())
        }
        _ => Arc::new(HostIpcConnection::new(peer)),
    }
}

/// Guards the whole port-channel path where the device runs it (on a GPU: the FIFO in
/// mapped host memory, a polling proxy, copies and semaphore writes queued on the
/// connection's stream): two ranks, each a stream with a proxy of its own, exchange their
/// chunks with `port_ring_exchange` (ready handshake, put with signal, wait, flush), and
/// each finds the other's chunk in its buffer. Then the exchange runs back to back, for its
/// time.
#[test]
fn port_channels_exchange_between_two_streams() {
    const CHUNK: usize = 64 * 1024;
    const TIMED: u32 = 200;
    for device in every_backend("port_channels_exchange_between_two_streams") {
        let ranks: Vec<PortRank> = (0..2u32)
            .map(|rank| {
                let mut chunk = vec![0u8; 2 * CHUNK];
                for (i, byte) in chunk
                    .iter_mut()
                    .enumerate()
                    .skip(rank as usize * CHUNK)
                    .take(CHUNK)
                {
                    *byte = port_byte(rank, i - rank as usize * CHUNK);
                }
                PortRank {
                    buffer: device.alloc_from(&chunk).unwrap(),
                    counters: device.alloc_zeroed(4).unwrap(),
                    record: abort_record(&device),
                    proxy: device
                        .proxy_service(ProxyConfig {
                            rank,
                            fifo_size: 64,
                            wait_timeout: Duration::from_secs(10),
                            assist: false,
                            idle: IdlePolicy::Poll(PollSchedule::default()),
                            share_thread: false,
                            cpus: None,
                        })
                        .unwrap(),
                }
            })
            .collect();
        let mut handles = Vec::new();
        for (rank, me) in ranks.iter().enumerate() {
            let peer = &ranks[1 - rank];
            let (rank, peer_rank) = (rank as u32, 1 - rank as u32);
            let size = me.buffer.size_bytes() as u64;
            let src = me
                .proxy
                .add_memory(MemoryRegion::new(rank, me.buffer.addr(), size))
                .unwrap();
            let dst = me
                .proxy
                .add_memory(MemoryRegion::new(peer_rank, peer.buffer.addr(), size))
                .unwrap();
            let connection = peer_connection(&device, peer_rank);
            // `next` puts raise the peer's `prev` inbound; `prev` signals (the ready
            // handshake) raise the peer's `next` inbound.
            let channel = |peer_inbound: u64| {
                let inbound = MemoryRegion::new(peer_rank, peer.counters.addr() + peer_inbound, 8);
                me.proxy
                    .add_channel(
                        connection.clone(),
                        inbound,
                        HostCell::new(AbortRecord::new()),
                    )
                    .unwrap()
            };
            let (next_id, prev_id) = (channel(16), channel(0));
            // SAFETY: every buffer, counter and record named is held by `ranks` until the
            // streams are synchronized below; the counters are zeroed, each pair touched
            // only by this rank's handle and the peer's proxy.
            let handle = |id: u32, counters: u64| unsafe {
                let wait = policy(&me.record, Duration::from_secs(10));
                PortChannelDeviceHandle::new(
                    FifoDeviceHandle::from_raw_parts(me.proxy.fifo_cells().raw_parts(), wait),
                    Host2DeviceSemaphoreDeviceHandle::from_raw_parts(
                        SemaphoreRawParts {
                            inbound: counters,
                            expected: counters + 8,
                            remote_inbound: 0,
                        },
                        wait,
                    ),
                    PortChannelIds {
                        semaphore_id: id,
                        dst_memory_id: dst.0,
                        src_memory_id: src.0,
                        reserved: 0,
                    },
                )
            };
            handles.push((
                handle(next_id.0, me.counters.addr()),
                handle(prev_id.0, me.counters.addr() + 16),
            ));
        }
        let mut ranks = ranks;
        for me in &mut ranks {
            me.proxy.start().unwrap();
        }
        let streams: Vec<Stream> = (0..2)
            .map(|_| stream(&device, Duration::from_secs(60)))
            .collect();
        let exchange = |times: u32| {
            for _ in 0..times {
                for (rank, (next, prev)) in handles.iter().enumerate() {
                    let config = LaunchConfig::grid(1).block(32);
                    port_ring_exchange::launch(
                        &streams[rank],
                        config,
                        *next,
                        *prev,
                        rank as u32,
                        2,
                        CHUNK as u64,
                    )
                    .unwrap();
                }
            }
            for s in &streams {
                s.synchronize().unwrap();
            }
        };
        exchange(1);
        for (rank, me) in ranks.iter().enumerate() {
            assert_eq!(recorded(&me.record), None, "{device:?}: rank {rank}");
            me.proxy.check().unwrap();
            let got = me.buffer.to_vec().unwrap();
            let want: Vec<u8> = (0..2 * CHUNK)
                .map(|i| port_byte((i / CHUNK) as u32, i % CHUNK))
                .collect();
            assert!(
                got == want,
                "{device:?}: rank {rank} lacks its peer's chunk"
            );
        }
        let started = Instant::now();
        exchange(TIMED);
        let elapsed = started.elapsed();
        for me in &mut ranks {
            me.proxy.stop().unwrap();
            me.proxy.check().unwrap();
        }
        println!(
            "port channels: {TIMED} exchanges of {} KiB between two streams on {device:?}: \
             {:.2} us an exchange (handshake, put with signal, wait, flush)",
            CHUNK / 1024,
            elapsed.as_secs_f64() * 1e6 / f64::from(TIMED)
        );
    }
}

/// One rank of a two-rank communicator built by hand on one device: the scratch every
/// channel names, its channel's semaphore counters, its grid barrier's counters, its abort
/// record, and the input and output.
struct CollectiveRank {
    scratch: DeviceBuffer<u8>,
    counters: DeviceBuffer<u64>,
    barrier: DeviceBuffer<u64>,
    record: DeviceBuffer<u64>,
    input: DeviceBuffer<u32>,
    output: DeviceBuffer<u32>,
}

/// The first value of rank `rank`'s input in call `call` (the rest count up from it).
fn collective_first(call: u32, rank: u32) -> u32 {
    call.wrapping_mul(0x9e37_79b9) ^ (rank + 1).wrapping_mul(0x85eb_ca6b)
}

/// Guards against the collective all-reduce kernel failing where the emulator cannot
/// show it: its exchanges through the scratch on a weaker memory model, its grid barrier
/// across many blocks, calls launched back to back with no host step. Two ranks (two
/// streams of one device) each refill their input on their own stream and all-reduce it
/// (u32 sum), call after call; the last call's sum is checked on both ranks, and no wait
/// failed. On a GPU, with one round a call and with several, on one block and on many;
/// prints the time of a call of each.
#[test]
fn collective_all_reduce_kernel_between_two_streams() {
    let layout = ScratchLayout::new(N_RANKS, 2 << 10, 64 << 10, 0);
    let per_round = elements_per_round(&layout, 4, 1) as usize;
    // A count that is not a multiple of anything, in one round and in four.
    let (one, four) = (per_round - 999, 3 * per_round + 1_001);
    for device in every_backend("collective_all_reduce_kernel_between_two_streams") {
        let cases = match device.backend() {
            Backend::Cuda => vec![
                (LaunchConfig::grid(1).block(256), one),
                (LaunchConfig::grid(16).block(256), one),
                (LaunchConfig::grid(16).block(256), four),
                (LaunchConfig::grid(64).block(256), four),
            ],
            _ => vec![(LaunchConfig::grid(2).block(2), four)],
        };
        for (config, count) in cases {
            let call = all_reduce_calls(&device, layout, config, count, AllReduceKernel::Direct);
            println!(
                "collective all-reduce of {:.1} KiB (u32 sum, {} round(s) a call) between two \
                 streams on {device:?}, grid {} x block {}: {:.1} us a call ({CALLS} calls back \
                 to back, refills included)",
                (count * 4) as f64 / 1024.0,
                rounds(count as u64, per_round as u64),
                config.grid.x,
                config.block.x,
                call.as_secs_f64() * 1e6
            );
        }
    }
}

/// Guards against the packet all-reduce kernel failing where the emulator cannot show it,
/// in both forms of its messages: LL16 packets (a flag in every 8 bytes, polled) and data
/// with one release signal (a wait, then plain loads of the slot), on a weaker memory model,
/// calls back to back with no host step, each set of slots reused two calls later. Two
/// ranks on two streams of one device, u32 sum; the last call is checked on both ranks.
/// On a GPU, with a full block and with a warp; prints the time of a call of each.
#[test]
fn packet_all_reduce_kernel_between_two_streams_in_both_forms() {
    // 2 KiB a message at most: 512 u32.
    let layout = ScratchLayout::new(N_RANKS, 2 << 10, 64 << 10, 0);
    for device in every_backend("packet_all_reduce_kernel_between_two_streams_in_both_forms") {
        let cases = match device.backend() {
            Backend::Cuda => vec![
                (LaunchConfig::grid(1).block(256), 500),
                (LaunchConfig::grid(1).block(32), 7),
            ],
            _ => vec![(LaunchConfig::grid(1).block(2), 500)],
        };
        for form in [PacketForm::LL16, PacketForm::DATA] {
            for &(config, count) in &cases {
                let kernel = AllReduceKernel::Packets { form };
                let call = all_reduce_calls(&device, layout, config, count, kernel);
                println!(
                    "packet all-reduce of {} B (u32 sum, {}) between two streams on {device:?}, \
                     block {}: {:.1} us a call ({CALLS} calls back to back, refills included)",
                    count * 4,
                    if form == PacketForm::DATA {
                        "as data and a signal"
                    } else {
                        "as LL16 packets"
                    },
                    config.block.x,
                    call.as_secs_f64() * 1e6
                );
            }
        }
    }
}

/// Which all-reduce kernel [`all_reduce_calls`] launches.
#[derive(Clone, Copy)]
enum AllReduceKernel {
    /// The two-shot direct kernel, in rounds.
    Direct,
    /// The packet kernel (one call number a call, one block), its messages in `form`.
    Packets { form: u32 },
}

/// Ranks of [`all_reduce_calls`].
const N_RANKS: u32 = 2;
/// Calls of [`all_reduce_calls`].
const CALLS: u32 = 6;

/// Runs [`CALLS`] all-reduces of `count` u32s between two ranks on two streams of
/// `device`, checks the last, and returns the time of one call.
fn all_reduce_calls(
    device: &Device,
    layout: ScratchLayout,
    config: LaunchConfig,
    count: usize,
    kernel: AllReduceKernel,
) -> Duration {
    const N: u32 = N_RANKS;
    let per_call = match kernel {
        AllReduceKernel::Direct => rounds(count as u64, elements_per_round(&layout, 4, 1)),
        AllReduceKernel::Packets { .. } => 1,
    };
    let ranks: Vec<CollectiveRank> = (0..N)
        .map(|_| CollectiveRank {
            // Zeroed: a packet slot must not read as arrived before its first packet.
            scratch: device.alloc_zeroed(layout.total_bytes() as usize).unwrap(),
            counters: device.alloc_zeroed(2).unwrap(),
            barrier: device.alloc_zeroed(2).unwrap(),
            record: abort_record(device),
            input: device.alloc(count).unwrap(),
            output: device.alloc(count).unwrap(),
        })
        .collect();
    let wait = Duration::from_secs(10);
    // Each rank's channel set: slot `p` is the channel to peer `p`, its own slot zeroed.
    let sets: Vec<DeviceBuffer<u8>> = (0..N as usize)
        .map(|r| {
            let (me, peer) = (&ranks[r], &ranks[1 - r]);
            // SAFETY: counters zeroed, scratches live; the record as `policy` needs; all
            // outlive the launches (synchronized below).
            let handle = unsafe {
                memory_channel(
                    &me.counters,
                    &peer.counters,
                    &peer.scratch,
                    &me.scratch,
                    &me.scratch,
                    policy(&me.record, wait),
                )
            };
            let mut slots = vec![MemoryChannelDeviceHandle::default(); N as usize];
            slots[1 - r] = handle;
            // SAFETY: the handles are `repr(C)` plain data with no padding (their layout
            // asserts add up to their size), read as bytes only to be copied.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    slots.as_ptr().cast::<u8>(),
                    std::mem::size_of_val(&slots[..]),
                )
            };
            device.alloc_from(bytes).unwrap()
        })
        .collect();
    let streams = [stream(device, wait * 4), stream(device, wait * 4)];
    let start = Instant::now();
    for call in 0..CALLS {
        for (r, me) in ranks.iter().enumerate() {
            let s = &streams[r];
            fill_sequence::launch(
                s,
                LaunchConfig::grid(4).block(256),
                me.input.view_mut(),
                collective_first(call, r as u32),
            )
            .unwrap();
            // SAFETY: the set holds N handles built above (or zeroed), and the barrier's
            // counters are zeroed, aligned and used by this rank's launches alone, one at
            // a time (one stream); all outlive the launches.
            let (peers, barrier) = unsafe {
                (
                    ChannelSetDeviceHandle::from_raw_parts(sets[r].addr(), N),
                    GridBarrierDeviceHandle::from_raw_parts(
                        GridBarrierRawParts {
                            count: me.barrier.addr(),
                            generation: me.barrier.addr() + 8,
                        },
                        policy(&me.record, wait),
                    ),
                )
            };
            let args = CollectiveArgs {
                peers,
                barrier,
                input: me.input.view().cast::<u8>().unwrap(),
                output: me.output.view_mut().cast::<u8>().unwrap(),
                scratch: me.scratch.view_mut(),
                layout,
                count: count as u64,
                sequence: u64::from(call) * per_call,
                rank: r as u32,
                n_ranks: N,
                dtype: DataType::U32 as u32,
                op: ReduceOp::Sum as u32,
                ..CollectiveArgs::default()
            };
            match kernel {
                AllReduceKernel::Direct => collective_all_reduce::launch(s, config, args),
                AllReduceKernel::Packets { form } => {
                    let args = CollectiveArgs {
                        packet_form: form,
                        ..args
                    };
                    collective_all_reduce_packets::launch(s, config, args)
                }
            }
            .unwrap();
        }
    }
    let outcomes = [streams[0].synchronize(), streams[1].synchronize()];
    let elapsed = start.elapsed();
    for (r, me) in ranks.iter().enumerate() {
        assert_eq!(recorded(&me.record), None, "{device:?}: rank {r}");
    }
    for outcome in outcomes {
        outcome.unwrap();
    }
    let last = CALLS - 1;
    let want: Vec<u32> = (0..count as u32)
        .map(|i| {
            collective_first(last, 0)
                .wrapping_add(i)
                .wrapping_add(collective_first(last, 1).wrapping_add(i))
        })
        .collect();
    for (r, me) in ranks.iter().enumerate() {
        let got = me.output.to_vec().unwrap();
        let wrong = (0..count).filter(|&i| got[i] != want[i]).count();
        assert_eq!(
            wrong, 0,
            "{device:?}: rank {r}: {wrong} of {count} elements wrong"
        );
    }
    elapsed / CALLS
}
