//! The grid barrier on the CPU emulator: blocks that meet round after round, launch after
//! launch, and barriers that cannot complete.
#![allow(missing_docs)]

mod common;

use common::config;
use oxccl::stream::CPU_MAX_THREADS_PER_LAUNCH;
use oxccl::{Device, Error, ErrorKind, in_process};
use oxccl_device::grid_barrier::GridBarrierDeviceHandle;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DeviceError, DeviceViewMut, arch, kernel};
use std::time::{Duration, Instant};

/// What thread `thread` of block `block` writes in round `round` of launch `launch`.
const fn value(launch: u32, round: u32, block: u32, thread: u32) -> u64 {
    ((launch as u64) << 48) | ((round as u64) << 24) | ((block as u64) << 12) | thread as u64
}

/// Round after round, every thread writes its value into the slot set of the round's parity,
/// the grid meets at the barrier, and every thread reads what the thread of its rank in each
/// other block wrote, counting wrong values into its own element of `wrong`. One barrier per
/// round is enough: the next round writes the other set, and the round after it waits for
/// the barrier every reader of this set reached after reading.
#[kernel(cooperative)]
fn rounds_of_exchange(
    barrier: GridBarrierDeviceHandle<'_>,
    slots: DeviceViewMut<'_, u64>,
    wrong: DeviceViewMut<'_, u64>,
    launch: u32,
    rounds: u32,
) -> Result<(), DeviceError> {
    let (blocks, threads) = (arch::blocks_per_grid(), arch::threads_per_block());
    let (block, thread) = (arch::block_rank(), arch::thread_rank_in_block());
    let per_set = (blocks * threads) as u64;
    let me = arch::thread_rank_in_grid();
    let mut bad = 0;
    for round in 0..rounds {
        let set = slots.slice((round % 2) as u64 * per_set..(round % 2 + 1) as u64 * per_set)?;
        set.set(me, value(launch, round, block, thread))?;
        barrier.sync_grid()?;
        for other in 0..blocks {
            let at = (other * threads + thread) as u64;
            if set.get(at)? != value(launch, round, other, thread) {
                bad += 1;
            }
        }
    }
    wrong.set(me, wrong.get(me)? + bad)
}

/// Guards against a barrier that lets a block through before every block has written
/// (wrong values read), that cannot be reused round after round and launch after launch
/// without a reset (generation counting), or that hangs: several blocks, many rounds,
/// launches back to back with no host barrier between them.
#[test]
fn blocks_meet_round_after_round_launch_after_launch() {
    let device = Device::cpu(0);
    let barrier = device.grid_barrier(Duration::from_secs(20)).unwrap();
    let stream = device.stream().unwrap();
    for (blocks, threads) in [(4u32, 2u32), (3, 3), (2, 1)] {
        let n = (blocks * threads) as usize;
        let slots = device.alloc::<u64>(2 * n).unwrap();
        let wrong = device.alloc_zeroed::<u64>(n).unwrap();
        let (launches, rounds) = (4u32, 40u32);
        for launch in 0..launches {
            rounds_of_exchange::launch(
                &stream,
                LaunchConfig::grid(blocks).block(threads),
                barrier.device_handle(),
                slots.view_mut(),
                wrong.view_mut(),
                launch,
                rounds,
            )
            .unwrap();
        }
        stream.synchronize().unwrap();
        let wrong = wrong.to_vec().unwrap();
        assert!(
            wrong.iter().all(|&w| w == 0),
            "grid {blocks}x{threads}: wrong values read, by thread: {wrong:?}"
        );
    }
    barrier.check().unwrap();
}

/// Block `absent` returns at once; the others wait at the barrier.
#[kernel(cooperative)]
fn one_block_missing(barrier: GridBarrierDeviceHandle<'_>, absent: u32) -> Result<(), DeviceError> {
    if arch::block_rank() == absent {
        return Ok(());
    }
    barrier.sync_grid()
}

/// Guards against a barrier that not every block reaches hanging the launch: the waiting
/// blocks give up after the barrier's limit with a timeout, the launch reports it, and the
/// barrier says how many blocks had arrived.
#[test]
fn barrier_not_all_blocks_reach_times_out() {
    let device = Device::cpu(0);
    let barrier = device.grid_barrier(Duration::from_millis(300)).unwrap();
    let stream = device.stream().unwrap();
    let started = Instant::now();
    one_block_missing::launch(
        &stream,
        LaunchConfig::grid(3).block(2),
        barrier.device_handle(),
        1,
    )
    .unwrap();
    let err = stream.synchronize().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "bounded");
    match &err {
        Error::KernelError { kernel, error, .. } => {
            assert_eq!(*kernel, "one_block_missing");
            assert!(
                matches!(error, DeviceError::Timeout | DeviceError::Aborted),
                "{err}"
            );
        }
        other => panic!("unexpected error: {other}"),
    }
    let err = barrier.check().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let text = err.to_string();
    assert!(text.contains("2 of 3 blocks had arrived"), "{text}");
    // Reported once.
    barrier.check().unwrap();
}

/// Every block calls `sync_blocks(blocks)`.
#[kernel(cooperative)]
fn sync_first(barrier: GridBarrierDeviceHandle<'_>, blocks: u32) -> Result<(), DeviceError> {
    barrier.sync_blocks(blocks)
}

/// Guards against a call the barrier cannot count right (a block outside the blocks asked
/// for) being taken: it is refused and named, not left to time out or to let others through.
#[test]
fn block_outside_the_participants_is_refused() {
    let device = Device::cpu(0);
    let barrier = device.grid_barrier(Duration::from_secs(20)).unwrap();
    let stream = device.stream().unwrap();
    sync_first::launch(
        &stream,
        LaunchConfig::grid(2).block(2),
        barrier.device_handle(),
        1,
    )
    .unwrap();
    let err = stream.synchronize().unwrap_err();
    assert!(matches!(err, Error::KernelError { .. }), "{err}");
    let err = barrier.check().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidUsage, "{err}");
    assert!(
        err.to_string().contains("block 1 called it for 1 blocks"),
        "{err}"
    );
}

/// Guards against a launch of a cooperative kernel whose blocks cannot all run at once
/// being started (its blocks would wait for blocks that cannot start): it is refused before
/// it runs, naming the kernel, that it is cooperative, and the shape. A kernel that is not
/// cooperative gets the general limit's message for the same shape.
#[test]
fn cooperative_launch_larger_than_co_resident_is_refused() {
    let device = Device::cpu(0);
    let barrier = device.grid_barrier(Duration::from_secs(1)).unwrap();
    let stream = device.stream().unwrap();
    let threads = 32u32;
    let blocks = (CPU_MAX_THREADS_PER_LAUNCH / threads as u64) as u32 + 1;
    let err = sync_first::launch(
        &stream,
        LaunchConfig::grid(blocks).block(threads),
        barrier.device_handle(),
        blocks,
    )
    .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.kind(), ErrorKind::InvalidUsage, "{text}");
    for part in [
        "sync_first",
        "cooperative",
        "resident at once",
        &format!("grid {blocks}x1x1"),
        "block 32x1x1",
    ] {
        assert!(text.contains(part), "`{part}` not in: {text}");
    }
    assert!(sync_first::KERNEL.cooperative);
    assert!(!not_grid_synced::KERNEL.cooperative);
    let err =
        not_grid_synced::launch(&stream, LaunchConfig::grid(blocks).block(threads), 0).unwrap_err();
    assert!(!err.to_string().contains("cooperative"), "{err}");
    // The largest co-resident grid runs.
    let fits = blocks - 1;
    sync_first::launch(
        &stream,
        LaunchConfig::grid(fits).block(1),
        barrier.device_handle(),
        fits,
    )
    .unwrap();
    stream.synchronize().unwrap();
}

/// A kernel that is not cooperative, for the launch limit's message.
#[kernel]
fn not_grid_synced(_absent: u32) {}

/// Guards against a grid barrier of a communicator that times out going unreported by the
/// rank's `check` (or reported as an unknown channel), and against its wait ignoring the
/// rank's stop word.
#[test]
fn communicator_barrier_reports_through_check() {
    let mut cfg = config();
    cfg.communicator.wait_timeout = Duration::from_millis(300);
    in_process::run(1, cfg, |comm| {
        let barrier = comm.grid_barrier()?;
        let stream = comm.device().stream()?;
        one_block_missing::launch(
            &stream,
            LaunchConfig::grid(2).block(1),
            barrier.device_handle(),
            0,
        )?;
        let err = comm.synchronize(&stream).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(err.to_string().contains("grid barrier"), "{err}");
        assert!(barrier.check().is_err());
        // Reported and lowered: the rank runs again.
        let stopper = comm.stopper();
        stopper.stop("test".into());
        one_block_missing::launch(
            &stream,
            LaunchConfig::grid(2).block(1),
            barrier.device_handle(),
            0,
        )?;
        let err = comm.synchronize(&stream).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Aborted, "{err}");
        Ok(())
    })
    .unwrap();
}
