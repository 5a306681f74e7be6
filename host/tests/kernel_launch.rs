//! Kernel launch on the CPU backend: `#[kernel]` shims, streams, the emulator's threads.
#![allow(missing_docs)]

use oxccl::{Device, Error, Stream};
use oxccl_device::arch::atomic::{self, Ordering, Scope};
use oxccl_device::arch::{self, Dim3};
use oxccl_device::launch::{LaunchConfig, Launcher};
use oxccl_device::{DevicePtr, DeviceSlice, kernel};
use std::ffi::c_void;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

/// Each thread writes its rank in the grid at that rank.
///
/// # Safety
/// `out` must hold one writable element per thread of the grid.
#[kernel]
pub unsafe fn write_grid_rank(out: DeviceSlice<u64>) {
    let rank = arch::thread_rank_in_grid();
    // SAFETY: each thread writes only its own element; the host reads after synchronize.
    unsafe { out.write(rank, rank) };
}

/// Each thread writes its `threadIdx`, `blockIdx`, `blockDim` and `gridDim` (12 words) at
/// its rank in the grid.
///
/// # Safety
/// `out` must hold one writable element per thread of the grid.
#[kernel]
pub unsafe fn write_indices(out: DeviceSlice<[u32; 12]>) {
    let (t, b, bd, gd) = (
        arch::thread_idx(),
        arch::block_idx(),
        arch::block_dim(),
        arch::grid_dim(),
    );
    let v = [
        t.x, t.y, t.z, b.x, b.y, b.z, bd.x, bd.y, bd.z, gd.x, gd.y, gd.z,
    ];
    // SAFETY: each thread writes only its own element.
    unsafe { out.write(arch::thread_rank_in_grid(), v) };
}

/// Round after round, each thread writes a value, waits at the block barrier, and reads
/// its right neighbour's (within the block); the sum of what it read goes to `out`.
///
/// # Safety
/// `scratch` and `out` must each hold one writable element per thread of the grid.
#[kernel]
pub unsafe fn neighbour_exchange(scratch: DeviceSlice<u64>, out: DeviceSlice<u64>, rounds: u32) {
    let n = u64::from(arch::threads_per_block());
    let me = u64::from(arch::thread_rank_in_block());
    let base = u64::from(arch::block_rank()) * n;
    let mut sum = 0;
    for round in 0..u64::from(rounds) {
        // SAFETY: between two barriers each thread writes only its own element and reads
        // only its neighbour's, after the barrier that follows the neighbour's write.
        unsafe { scratch.write(base + me, round * 1000 + me) };
        arch::sync_threads();
        // SAFETY: as above.
        sum += unsafe { scratch.read(base + (me + 1) % n) }.unwrap_or(u64::MAX);
        arch::sync_threads();
    }
    // SAFETY: each thread writes only its own element.
    unsafe { out.write(base + me, sum) };
}

/// Appends `value` to `log` at position `counter[0]` and bumps the counter, without
/// atomics: overlapping launches would lose updates or write out of order.
///
/// # Safety
/// `counter` must point to a writable u64, `log` be writable, and only launches of one
/// stream may use them.
#[kernel]
pub unsafe fn append(log: DeviceSlice<u64>, counter: DevicePtr<u64>, value: u64) {
    // SAFETY: one thread, and launches of one stream do not overlap; the host reads after
    // synchronize.
    unsafe {
        let n = counter.as_ptr().read();
        log.write(n, value);
        counter.as_ptr().write(n + 1);
    }
}

/// Thread 0 of the grid raises `flag` to `value` (Release).
///
/// # Safety
/// `flag` must point to a live u64 only accessed atomically while kernels run.
#[kernel]
pub unsafe fn set_flag(flag: DevicePtr<u64>, value: u64) {
    if arch::thread_rank_in_grid() == 0 {
        // SAFETY: `flag` is an 8-byte aligned u64 in a live device buffer, only accessed
        // atomically while kernels run.
        let cell = unsafe { atomic::cell(flag.addr()) };
        // Release: pairs with the Acquire in `wait_flag`.
        atomic::store(cell, value, Ordering::Release, Scope::System);
    }
}

/// Every thread waits (with back-off) until `flag` reaches `value`, then writes 1 at its
/// rank in `out`.
///
/// # Safety
/// As [`set_flag`] for `flag`; `out` must hold one writable element per thread.
#[kernel]
pub unsafe fn wait_flag(flag: DevicePtr<u64>, value: u64, out: DeviceSlice<u64>) {
    // SAFETY: as in `set_flag`.
    let cell = unsafe { atomic::cell(flag.addr()) };
    let mut i = 0;
    // Acquire: pairs with the Release in `set_flag`.
    while atomic::load(cell, Ordering::Acquire, Scope::System) < value {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
    // SAFETY: each thread writes only its own element.
    unsafe { out.write(arch::thread_rank_in_grid(), 1) };
}

/// Each rank's thread 0 raises its flag in `flags[rank]`; then every thread waits until all
/// `flags` are raised and writes 1 at its rank in `out`.
///
/// # Safety
/// `flags` must be live u64s only accessed atomically while kernels run, `rank` below its
/// length; `out` must hold one writable element per thread.
#[kernel]
pub unsafe fn all_ranks_meet(flags: DeviceSlice<u64>, rank: u64, out: DeviceSlice<u64>) {
    let cell = |i: u64| {
        // SAFETY: `flags` is a live device buffer of u64 cells, only accessed atomically
        // while kernels run; `i < flags.len()`.
        unsafe { atomic::cell(flags.addr() + 8 * i) }
    };
    if arch::thread_rank_in_grid() == 0 {
        // Release: pairs with the Acquire loads below, on every rank.
        atomic::store(cell(rank), 1, Ordering::Release, Scope::System);
    }
    for peer in 0..flags.len() {
        let mut i = 0;
        // Acquire: pairs with the Release store of `peer`.
        while atomic::load(cell(peer), Ordering::Acquire, Scope::System) == 0 {
            arch::spin_pause(i);
            i = i.saturating_add(1);
        }
    }
    // SAFETY: each thread writes only its own element.
    unsafe { out.write(arch::thread_rank_in_grid(), 1) };
}

/// Waits (with back-off) for `STUCK_ABORT`, which only the timeout test raises, after it
/// has seen the timeout; then writes 1 at `out`.
///
/// # Safety
/// `out` must point to a writable u64.
#[kernel]
pub unsafe fn wait_for_abort(out: DevicePtr<u64>) {
    let mut i = 0;
    while !STUCK_ABORT.load(Ordering::Relaxed) {
        arch::spin_pause(i);
        i = i.saturating_add(1);
    }
    // SAFETY: one thread writes; the host reads after synchronize.
    unsafe { out.as_ptr().write(1) };
}

/// Thread 3 of each block panics; the others wait at the block barrier for it.
#[kernel]
pub fn panics_in_thread_3() {
    if arch::thread_rank_in_block() == 3 {
        panic!("thread 3 gives up");
    }
    arch::sync_threads();
}

/// Stores `value` at `out`.
///
/// # Safety
/// `out` must point to a writable u64.
#[kernel]
pub unsafe fn store_value(out: DevicePtr<u64>, value: u64) {
    // SAFETY: one thread writes; the host reads after synchronize.
    unsafe { out.as_ptr().write(value) };
}

/// Does nothing: measures launch overhead.
#[kernel]
pub fn empty() {}

/// A parameter larger, and more aligned, than the values a launch keeps in itself.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Wide {
    words: [u64; 40],
}

/// Stores a checksum of its parameters at `out`.
///
/// # Safety
/// `out` must point to a writable u64.
#[kernel]
pub unsafe fn wide_checksum(small: u8, wide: Wide, tail: u16, out: DevicePtr<u64>) {
    let sum = wide.words.iter().enumerate().fold(0u64, |acc, (i, w)| {
        acc.wrapping_add((i as u64 + 1).wrapping_mul(*w))
    });
    let checksum = sum ^ (u64::from(small) << 56) ^ (u64::from(tail) << 40);
    // SAFETY: one thread writes; the host reads after synchronize.
    unsafe { out.as_ptr().write(checksum) };
}

/// Stores a weighted sum of its seventeen values at `out`.
///
/// # Safety
/// `out` must point to a writable u64.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub unsafe fn seventeen(
    p0: u64,
    p1: u8,
    p2: u64,
    p3: u16,
    p4: u64,
    p5: u32,
    p6: u64,
    p7: u8,
    p8: u64,
    p9: u64,
    p10: u64,
    p11: u64,
    p12: u64,
    p13: u64,
    p14: u64,
    p15: u64,
    p16: u64,
    out: DevicePtr<u64>,
) {
    let values = [
        p0,
        u64::from(p1),
        p2,
        u64::from(p3),
        p4,
        u64::from(p5),
        p6,
        u64::from(p7),
        p8,
        p9,
        p10,
        p11,
        p12,
        p13,
        p14,
        p15,
        p16,
    ];
    let sum = values.iter().enumerate().fold(0u64, |acc, (i, v)| {
        acc.wrapping_add((i as u64 + 1).wrapping_mul(*v))
    });
    // SAFETY: one thread writes; the host reads after synchronize.
    unsafe { out.as_ptr().write(sum) };
}

/// Thread 0 of each block returns at once; the others wait at the block barrier for it.
#[kernel]
pub fn thread_0_skips_the_barrier() {
    if arch::thread_rank_in_block() == 0 {
        return;
    }
    arch::sync_threads();
}

/// Raised by `stuck_kernel_gives_timeout` to release its stuck kernel thread once the
/// timeout is seen, so that the thread ends and the process exits cleanly.
static STUCK_ABORT: AtomicBool = AtomicBool::new(false);

fn stream_with_timeout(device: &Device, timeout: Duration) -> Stream {
    let mut stream = device.stream().unwrap();
    stream.set_timeout(timeout);
    stream
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Launches `write_grid_rank` on a 2 x 4 grid and checks every thread wrote its rank.
fn assert_grid_ranks_written(device: &Device, stream: &Stream) {
    let out = device.alloc::<u64>(8).unwrap();
    // SAFETY: `out` holds one element per thread of the grid and outlives the launch (synchronized below).
    unsafe { write_grid_rank::launch(stream, LaunchConfig::grid(2).block(4), out.device_slice()) }
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), (0..8).collect::<Vec<u64>>());
}

/// Guards against threads of a launch not all running, or computing wrong grid ranks
/// (block-major, thread-minor), on the simplest multi-block launch.
#[test]
fn each_thread_writes_its_grid_rank() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    assert_grid_ranks_written(&device, &stream);
}

/// Guards against y/z components being dropped or transposed when the emulator turns a
/// linear thread number into `threadIdx`/`blockIdx` (CUDA: x fastest).
#[test]
fn three_dimensional_indices_follow_cuda() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let (grid, block) = (Dim3::new(2, 1, 3), Dim3::new(2, 3, 2));
    let total = (grid.volume() * block.volume()) as usize;
    let out = device.alloc::<[u32; 12]>(total).unwrap();
    let config = LaunchConfig {
        grid,
        block,
        shared_mem_bytes: 0,
    };
    // SAFETY: `out` holds one element per thread of the grid and outlives the launch.
    unsafe { write_indices::launch(&stream, config, out.device_slice()) }.unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    let mut seen = 0;
    for bz in 0..grid.z {
        for by in 0..grid.y {
            for bx in 0..grid.x {
                for tz in 0..block.z {
                    for ty in 0..block.y {
                        for tx in 0..block.x {
                            let b = Dim3::new(bx, by, bz);
                            let t = Dim3::new(tx, ty, tz);
                            let rank = b.linear_in(grid) * block.volume() + t.linear_in(block);
                            let want = [
                                tx, ty, tz, bx, by, bz, block.x, block.y, block.z, grid.x, grid.y,
                                grid.z,
                            ];
                            assert_eq!(got[rank as usize], want, "rank {rank}");
                            seen += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(seen, total);
}

/// Guards against a block barrier that lets a thread through before its block has
/// arrived (it would read a neighbour's value from the previous round), that mixes blocks,
/// or that breaks when reused round after round.
#[test]
fn sync_threads_orders_writes_within_a_block() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let (blocks, threads, rounds) = (3u32, 4u32, 50u32);
    let n = (blocks * threads) as usize;
    let scratch = device.alloc::<u64>(n).unwrap();
    let out = device.alloc::<u64>(n).unwrap();
    // SAFETY: `scratch` and `out` hold one element per thread of the grid and outlive the launch.
    unsafe {
        neighbour_exchange::launch(
            &stream,
            LaunchConfig::grid(blocks).block(threads),
            scratch.device_slice(),
            out.device_slice(),
            rounds,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    let rounds_sum: u64 = (0..u64::from(rounds)).map(|r| r * 1000).sum();
    let want: Vec<u64> = (0..n as u64)
        .map(|i| {
            let me = i % u64::from(threads);
            rounds_sum + u64::from(rounds) * ((me + 1) % u64::from(threads))
        })
        .collect();
    assert_eq!(out.to_vec().unwrap(), want);
}

/// Guards against launches of one stream overlapping or running out of order (the counter
/// kernel is not atomic: overlap loses updates, reordering scrambles the log).
#[test]
fn launches_on_one_stream_run_in_order() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let log = device.alloc::<u64>(100).unwrap();
    let counter = device.alloc_zeroed::<u64>(1).unwrap();
    for i in 0..100 {
        // SAFETY: `log` and `counter` are live buffers of this test used by this stream only.
        unsafe {
            append::launch(
                &stream,
                LaunchConfig::grid(1),
                log.device_slice(),
                counter.device_ptr(),
                i,
            )
        }
        .unwrap();
    }
    stream.synchronize().unwrap();
    assert_eq!(counter.to_vec().unwrap(), [100]);
    assert_eq!(log.to_vec().unwrap(), (0..100).collect::<Vec<u64>>());
}

/// Guards against streams (of one device, or of two devices) being serialized: the waiting
/// kernel is launched first and can only finish once the other stream's kernel runs.
#[test]
fn two_streams_and_two_devices_run_concurrently() {
    let dev0 = Device::cpu(0);
    let dev1 = Device::cpu(1);
    let flag = dev0.alloc_zeroed::<u64>(1).unwrap();
    let mut out = dev0.alloc::<u64>(8).unwrap();
    for (setter_device, value) in [(&dev0, 1u64), (&dev1, 2)] {
        out.zero().unwrap();
        let waiter = stream_with_timeout(&dev0, Duration::from_secs(30));
        let setter = stream_with_timeout(setter_device, Duration::from_secs(30));
        // SAFETY: `flag` is a live u64 only accessed atomically; `out` holds one element per thread.
        unsafe {
            wait_flag::launch(
                &waiter,
                LaunchConfig::grid(2).block(4),
                flag.device_ptr(),
                value,
                out.device_slice(),
            )
        }
        .unwrap();
        // SAFETY: `flag` is a live u64 of this test, only accessed atomically by the kernels.
        unsafe { set_flag::launch(&setter, LaunchConfig::grid(1), flag.device_ptr(), value) }
            .unwrap();
        setter.synchronize().unwrap();
        waiter.synchronize().unwrap();
        assert_eq!(out.to_vec().unwrap(), [1; 8]);
    }
}

/// Guards against emulated ranks starving each other on few cores: four devices, 8 kernel
/// threads each, all waiting for every rank's flag, must all finish (waits back off).
#[test]
fn several_ranks_progress_on_few_cores() {
    let ranks = 4u64;
    let home = Device::cpu(0);
    let flags = home.alloc_zeroed::<u64>(ranks as usize).unwrap();
    let devices: Vec<Device> = (0..ranks as usize).map(Device::cpu).collect();
    let outs: Vec<_> = devices.iter().map(|d| d.alloc::<u64>(8).unwrap()).collect();
    let streams: Vec<Stream> = devices
        .iter()
        .map(|d| stream_with_timeout(d, Duration::from_secs(60)))
        .collect();
    for (rank, (stream, out)) in streams.iter().zip(&outs).enumerate() {
        // SAFETY: `flags` holds one u64 per rank, accessed atomically; `out` one element per thread.
        unsafe {
            all_ranks_meet::launch(
                stream,
                LaunchConfig::grid(2).block(4),
                flags.device_slice(),
                rank as u64,
                out.device_slice(),
            )
        }
        .unwrap();
    }
    for stream in &streams {
        stream.synchronize().unwrap();
    }
    for out in &outs {
        assert_eq!(out.to_vec().unwrap(), [1; 8]);
    }
}

/// Guards against a panicking kernel thread hanging its block in `sync_threads` (the
/// barrier must be poisoned), being reported as success, being reported without the cause,
/// or leaving the stream unusable (or its error sticky) afterwards.
#[test]
fn panicking_kernel_reports_kernel_failed_and_stream_recovers() {
    let device = Device::cpu(0);
    let stream = stream_with_timeout(&device, Duration::from_secs(30));
    panics_in_thread_3::launch(&stream, LaunchConfig::grid(2).block(4)).unwrap();
    match stream.synchronize() {
        Err(Error::KernelFailed { kernel, message }) => {
            assert_eq!(kernel, "panics_in_thread_3");
            assert!(message.contains("thread 3 gives up"), "{message}");
            assert!(message.contains("thread (3, 0, 0)"), "{message}");
        }
        other => panic!("expected KernelFailed, got {other:?}"),
    }
    assert_grid_ranks_written(&device, &stream);
    stream.synchronize().unwrap();
}

/// Guards against `synchronize` hanging forever on a kernel that never finishes, against a
/// timeout that does not say what it waited for, and against buffer drops that then wait
/// a whole timeout each.
#[test]
fn stuck_kernel_gives_timeout() {
    // Its own device, so no other test's buffer drop waits for the stuck kernel.
    let device = Device::cpu(7);
    let mut stream = stream_with_timeout(&device, Duration::from_millis(200));
    let out = device.alloc::<u64>(1).unwrap();
    // SAFETY: `out` is a live u64 of this test.
    unsafe { wait_for_abort::launch(&stream, LaunchConfig::grid(1), out.device_ptr()) }.unwrap();
    let started = Instant::now();
    match stream.synchronize() {
        Err(Error::Timeout { what, after }) => {
            assert!(what.contains("wait_for_abort"), "{what}");
            assert!(
                what.contains("stream") && what.contains("device 7"),
                "{what}"
            );
            assert!(after >= Duration::from_millis(200), "{after:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // Cleaning up after the timeout must not wait a whole timeout again per buffer (the
    // buffer is leaked, not freed, while the kernel may still run).
    let extra = device.alloc::<u64>(16).unwrap();
    let dropped = Instant::now();
    drop(extra);
    assert!(
        dropped.elapsed() < Duration::from_secs(5),
        "{:?}",
        dropped.elapsed()
    );
    // Release the stuck thread; the stream then drains and works again.
    STUCK_ABORT.store(true, Ordering::Relaxed);
    stream.set_timeout(Duration::from_secs(30));
    stream.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [1]);
}

/// Guards against freeing a buffer while a kernel of its device still runs (a
/// use-after-free in the emulator's process): the drop waits, as `cuMemFree` does.
#[test]
fn dropping_a_buffer_waits_for_running_kernels() {
    let device = Device::cpu(5);
    let other = Device::cpu(6);
    let gate = other.alloc_zeroed::<u64>(1).unwrap();
    let buf = device.alloc::<u64>(1).unwrap();
    let stream = stream_with_timeout(&device, Duration::from_secs(30));
    // SAFETY: `flag` is a live u64 only accessed atomically; `out` holds one element per thread.
    unsafe {
        wait_flag::launch(
            &stream,
            LaunchConfig::grid(1),
            gate.device_ptr(),
            1,
            buf.device_slice(),
        )
    }
    .unwrap();
    let gate_ptr = gate.device_ptr();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let stream = other.stream().unwrap();
        // SAFETY: `flag` is a live u64 of this test, only accessed atomically by the kernels.
        unsafe { set_flag::launch(&stream, LaunchConfig::grid(1), gate_ptr, 1) }.unwrap();
        stream.synchronize().unwrap();
    });
    let started = Instant::now();
    drop(buf);
    assert!(
        started.elapsed() >= Duration::from_millis(80),
        "{:?}",
        started.elapsed()
    );
    opener.join().unwrap();
    stream.synchronize().unwrap();
}

/// Guards against a launch keeping pointers to the caller's argument storage instead of
/// copying the values before `launch_raw` returns (launches are asynchronous: here the
/// kernel runs only after the caller has overwritten its variable).
#[test]
fn arguments_are_copied_before_launch_returns() {
    let device = Device::cpu(0);
    let stream = stream_with_timeout(&device, Duration::from_secs(30));
    let gate = device.alloc_zeroed::<u64>(1).unwrap();
    let waited = device.alloc::<u64>(1).unwrap();
    let out = device.alloc::<u64>(1).unwrap();
    // SAFETY: `flag` is a live u64 only accessed atomically; `out` holds one element per thread.
    unsafe {
        wait_flag::launch(
            &stream,
            LaunchConfig::grid(1),
            gate.device_ptr(),
            1,
            waited.device_slice(),
        )
    }
    .unwrap();
    let mut value = 7u64;
    let ptr = out.device_ptr();
    let params = [
        (&raw const ptr).cast::<c_void>(),
        (&raw const value).cast::<c_void>(),
    ];
    // SAFETY: two pointers, to a `DevicePtr<u64>` and a `u64`, the parameters of
    // `store_value`, both alive during the call.
    unsafe { stream.launch_raw(&store_value::KERNEL, LaunchConfig::grid(1), &params) }.unwrap();
    value = 99;
    std::hint::black_box(&mut value);
    let opener = device.stream().unwrap();
    // SAFETY: `flag` is a live u64 of this test, only accessed atomically by the kernels.
    unsafe { set_flag::launch(&opener, LaunchConfig::grid(1), gate.device_ptr(), 1) }.unwrap();
    opener.synchronize().unwrap();
    stream.synchronize().unwrap();
    assert_eq!(out.to_vec().unwrap(), [7]);
}

/// Guards against parameter values that a launch cannot keep in itself (more bytes, or
/// more aligned, than it holds; more parameters than it keeps offsets for) arriving wrong:
/// those take an allocation of their own, and each value must still land at its aligned
/// place with its bytes intact.
#[test]
fn large_aligned_and_many_parameters_arrive_intact() {
    let device = Device::cpu(0);
    let stream = stream_with_timeout(&device, Duration::from_secs(30));
    let (out_wide, out_many) = (
        device.alloc::<u64>(1).unwrap(),
        device.alloc::<u64>(1).unwrap(),
    );
    let mut wide = Wide { words: [0; 40] };
    for (i, w) in wide.words.iter_mut().enumerate() {
        *w = 0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 3);
    }
    // SAFETY: each output holds a u64, alive until the stream is synchronized.
    unsafe {
        wide_checksum::launch(
            &stream,
            LaunchConfig::grid(1),
            0xa5,
            wide,
            0xbeef,
            out_wide.device_ptr(),
        )
        .unwrap();
        seventeen::launch(
            &stream,
            LaunchConfig::grid(1),
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            9,
            10,
            11,
            12,
            13,
            14,
            15,
            16,
            u64::MAX - 16,
            out_many.device_ptr(),
        )
        .unwrap();
    }
    stream.synchronize().unwrap();
    let sum = wide.words.iter().enumerate().fold(0u64, |acc, (i, w)| {
        acc.wrapping_add((i as u64 + 1).wrapping_mul(*w))
    });
    let wide_expected = sum ^ (0xa5u64 << 56) ^ (0xbeefu64 << 40);
    let seventeen_expected = (1..=16u64)
        .map(|v| v * v)
        .fold(0u64, u64::wrapping_add)
        .wrapping_add(17u64.wrapping_mul(u64::MAX - 16));
    assert_eq!(out_wide.to_vec().unwrap(), [wide_expected]);
    assert_eq!(out_many.to_vec().unwrap(), [seventeen_expected]);
}

/// Guards against a launch whose pointer array does not match the kernel's parameters
/// being run (the kernel would read garbage or out of bounds) instead of refused.
#[test]
fn parameter_count_mismatch_is_invalid_usage() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let value = 1u64;
    let one = [(&raw const value).cast::<c_void>()];
    // SAFETY: deliberately one pointer for a two-parameter kernel: the stream checks the
    // count before it reads any pointer, which is what this test checks.
    let err = unsafe { stream.launch_raw(&store_value::KERNEL, LaunchConfig::grid(1), &one) }
        .unwrap_err();
    match err {
        Error::InvalidUsage(msg) => {
            assert!(msg.contains("store_value"), "{msg}");
            assert!(msg.contains("2 parameters"), "{msg}");
        }
        other => panic!("expected InvalidUsage, got {other:?}"),
    }
    stream.synchronize().unwrap();
}

/// Guards against launches the emulator cannot run (too many OS threads, empty extents,
/// dynamic shared memory) being accepted and then hanging or crashing.
#[test]
fn bad_configurations_are_invalid_usage() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let bad = [
        LaunchConfig::grid(1).block(1025),
        LaunchConfig::grid(33).block(32),
        LaunchConfig {
            grid: Dim3::new(4, 4, 4),
            block: Dim3::new(5, 4, 1),
            shared_mem_bytes: 0,
        },
        LaunchConfig::grid(0).block(4),
        LaunchConfig::grid(1).block(0),
        LaunchConfig {
            grid: Dim3::new(1, 0, 1),
            block: Dim3::ONE,
            shared_mem_bytes: 0,
        },
        LaunchConfig {
            shared_mem_bytes: 1024,
            ..LaunchConfig::grid(1)
        },
    ];
    for config in bad {
        match empty::launch(&stream, config) {
            Err(Error::InvalidUsage(msg)) => assert!(msg.contains("`empty`"), "{msg}"),
            other => panic!("{config:?}: expected InvalidUsage, got {other:?}"),
        }
    }
    // The largest allowed launch runs.
    empty::launch(&stream, LaunchConfig::grid(32).block(32)).unwrap();
    stream.synchronize().unwrap();
}

/// Guards against a block barrier that some threads of the block never reach (they
/// returned early, which would hang a GPU) hanging the launch: the waiting threads fail,
/// and `synchronize` reports the kernel and the block, long before the stream's timeout.
#[test]
fn barrier_not_reached_by_all_threads_is_an_error() {
    let device = Device::cpu(0);
    let stream = stream_with_timeout(&device, Duration::from_secs(30));
    let started = Instant::now();
    thread_0_skips_the_barrier::launch(&stream, LaunchConfig::grid(2).block(4)).unwrap();
    match stream.synchronize() {
        Err(Error::KernelFailed { kernel, message }) => {
            assert_eq!(kernel, "thread_0_skips_the_barrier");
            assert!(
                message.contains("sync_threads can never complete"),
                "{message}"
            );
            assert!(message.contains("block ("), "{message}");
        }
        other => panic!("expected the launch to fail, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The stream stays usable.
    assert_grid_ranks_written(&device, &stream);
}

/// Guards against host copies that read or write past either side when lengths differ.
#[test]
fn copy_length_mismatch_is_invalid_usage() {
    let device = Device::cpu(0);
    let mut buf = device.alloc::<u32>(4).unwrap();
    assert!(matches!(
        buf.copy_from_host(&[1, 2, 3]),
        Err(Error::InvalidUsage(_))
    ));
    assert!(matches!(
        buf.copy_from_host(&[1, 2, 3, 4, 5]),
        Err(Error::InvalidUsage(_))
    ));
    let mut short = [0u32; 3];
    assert!(matches!(
        buf.copy_to_host(&mut short),
        Err(Error::InvalidUsage(_))
    ));
    buf.copy_from_host(&[1, 2, 3, 4]).unwrap();
    assert_eq!(buf.to_vec().unwrap(), [1, 2, 3, 4]);
}

/// Guards against sub-range copies that land at the wrong offset, touch elements outside
/// their range, or accept a range past the end (or one whose end overflows).
#[test]
fn sub_range_copies_stay_in_their_range() {
    let device = Device::cpu(0);
    let mut buf = device.alloc::<u32>(6).unwrap();
    buf.copy_from_host(&[0, 1, 2, 3, 4, 5]).unwrap();
    buf.copy_from_host_at(2, &[20, 30]).unwrap();
    assert_eq!(buf.to_vec().unwrap(), [0, 1, 20, 30, 4, 5]);
    let mut two = [0u32; 2];
    buf.copy_to_host_at(3, &mut two).unwrap();
    assert_eq!(two, [30, 4]);
    buf.copy_from_host_at(6, &[]).unwrap();
    for (offset, len) in [(5, 2), (7, 0), (usize::MAX, 2)] {
        let data = vec![9u32; len];
        let e = buf.copy_from_host_at(offset, &data).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        let mut out = vec![0u32; len];
        assert!(matches!(
            buf.copy_to_host_at(offset, &mut out),
            Err(Error::InvalidUsage(_))
        ));
    }
    assert_eq!(buf.to_vec().unwrap(), [0, 1, 20, 30, 4, 5]);
}

/// Guards against device memory that is not page-aligned, zeroed without being asked (code
/// relying on zeroed memory must fail here as on a GPU, whose fresh memory holds anything)
/// or not zeroed when asked, helpers that miss elements, and absurd sizes that panic or
/// wrap instead of failing.
#[test]
fn buffers_are_filled_as_asked_aligned_and_sized() {
    let device = Device::cpu(3);
    let fresh = device.alloc::<u16>(5000).unwrap();
    let garbage = u16::from_ne_bytes([oxccl::UNINITIALIZED_BYTE; 2]);
    assert!(fresh.to_vec().unwrap().iter().all(|&x| x == garbage));
    let mut buf = device.alloc_zeroed::<u16>(5000).unwrap();
    assert!(buf.addr().is_multiple_of(4096));
    assert_eq!(buf.len(), 5000);
    assert_eq!(buf.size_bytes(), 10000);
    assert!(buf.to_vec().unwrap().iter().all(|&x| x == 0));
    buf.fill(0xabcd).unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&x| x == 0xabcd));
    buf.zero().unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&x| x == 0));
    let slice = buf.device_slice();
    assert_eq!((slice.addr(), slice.len()), (buf.addr(), 5000));
    assert_eq!(buf.device_ptr().addr(), buf.addr());
    let empty = device.alloc::<u64>(0).unwrap();
    assert!(empty.is_empty() && empty.addr() != 0);
    assert!(matches!(
        device.alloc::<u64>(usize::MAX / 4),
        Err(Error::InvalidUsage(_))
    ));
    // More than the machine has (1 PiB): refused as out of memory, as `cuMemAlloc` does,
    // not granted as a sparse mapping whose pages cannot all exist.
    match device.alloc::<u8>(1 << 50) {
        Err(e @ Error::System { .. }) => {
            assert!(e.to_string().contains("memory available"), "{e}");
            let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref());
            let kind = source.map(std::io::Error::kind);
            assert_eq!(kind, Some(std::io::ErrorKind::OutOfMemory), "{e}");
        }
        other => panic!("1 PiB: {other:?}"),
    }
    assert_eq!(device.ordinal(), 3);
    assert_eq!(device.backend(), oxccl::Backend::Cpu);
}

/// Guards against a kernel called directly (outside any launch) seeing stale or garbage
/// indices: it is thread 0 of a one-thread grid.
#[test]
fn direct_call_is_a_single_thread_grid() {
    let device = Device::cpu(0);
    let out = device.alloc::<u64>(1).unwrap();
    // SAFETY: `out` holds the one element of the one thread this call is.
    unsafe { write_grid_rank(out.device_slice()) };
    assert_eq!(out.to_vec().unwrap(), [0]);
    assert_eq!(arch::threads_per_grid(), 1);
}

/// Launch-to-completion overhead: an empty kernel launched in a loop, then synchronized;
/// and launch + synchronize round trips. Run with
/// `cargo test --release -p oxccl --test kernel_launch -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark: prints launch overhead"]
fn launch_overhead() {
    let device = Device::cpu(0);
    let stream = device.stream().unwrap();
    let iters = 1000u32;
    for (grid, block) in [(1, 1), (2, 4)] {
        let config = LaunchConfig::grid(grid).block(block);
        // Warm up: spawn the pool's workers.
        for _ in 0..10 {
            empty::launch(&stream, config).unwrap();
            stream.synchronize().unwrap();
        }
        let start = Instant::now();
        for _ in 0..iters {
            empty::launch(&stream, config).unwrap();
        }
        stream.synchronize().unwrap();
        let queued = start.elapsed() / iters;
        let start = Instant::now();
        for _ in 0..iters {
            empty::launch(&stream, config).unwrap();
            stream.synchronize().unwrap();
        }
        let round_trip = start.elapsed() / iters;
        println!(
            "empty kernel {grid}x{block}: {iters} launches then synchronize: {queued:?} per \
             launch; launch+synchronize round trip: {round_trip:?}"
        );
    }
}
