//! Cooperating-thread groups inside real launches on the CPU emulator.
#![allow(missing_docs)]

use oxccl::Device;
use oxccl_device::coop::{Block, Coop, Grid, Warp};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DeviceSlice, arch, kernel};

/// Each thread writes its rank and size in the warp, the block and the grid.
///
/// # Safety
/// `out` must hold 6 writable elements per thread of the grid.
#[kernel]
unsafe fn ranks(out: DeviceSlice<u64>) {
    let t = arch::thread_rank_in_grid();
    let values = [
        Warp.thread_rank(),
        Warp.size(),
        Block.thread_rank(),
        Block.size(),
        Grid.thread_rank(),
        Grid.size(),
    ];
    for (k, v) in values.into_iter().enumerate() {
        // SAFETY: `out` holds 6 values per thread of the grid; each thread writes its own.
        unsafe { out.write(t * 6 + k as u64, v) };
    }
}

/// Guards against group ranks and sizes that differ from CUDA's in a launch (a partial
/// last warp, several blocks), which would make split copies skip or repeat elements.
#[test]
fn group_ranks_and_sizes_follow_the_launch() {
    let (blocks, threads) = (2u32, 40u32);
    let device = Device::cpu(0);
    let out = device
        .alloc::<u64>((blocks * threads * 6) as usize)
        .unwrap();
    let stream = device.stream().unwrap();
    // SAFETY: `out` holds 6 elements per thread of the grid and outlives the launch.
    unsafe {
        ranks::launch(
            &stream,
            LaunchConfig::grid(blocks).block(threads),
            out.device_slice(),
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    for b in 0..blocks as u64 {
        for t in 0..threads as u64 {
            let g = b * threads as u64 + t;
            let row = &got[(g * 6) as usize..(g * 6 + 6) as usize];
            let warp_size = if t < 32 { 32 } else { threads as u64 - 32 };
            assert_eq!(
                row,
                [
                    t % 32,
                    warp_size,
                    t,
                    threads as u64,
                    g,
                    (blocks * threads) as u64
                ],
                "block {b} thread {t}"
            );
        }
    }
}
