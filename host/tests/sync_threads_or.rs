//! `arch::sync_threads_or` on the CPU emulator: every thread of a block gets the OR of the
//! block's predicates, generation after generation.
#![allow(missing_docs)]

use oxccl::Device;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DeviceSlice, arch, kernel};

/// Round `r` (of `rounds`): thread `r % (threads + 1)` votes true (none when it is
/// `threads`); each thread records what the barrier answered, in its block's part of `out`.
///
/// # Safety
/// `out` must hold `blocks * rounds * threads` writable elements.
#[kernel]
unsafe fn vote(out: DeviceSlice<u32>, rounds: u32) {
    let (tid, threads) = (arch::thread_rank_in_block(), arch::threads_per_block());
    let base = arch::block_rank() * rounds * threads;
    for r in 0..rounds {
        let any = arch::sync_threads_or(tid == r % (threads + 1));
        // SAFETY: `out` holds `blocks * rounds * threads` elements; each thread writes its own.
        unsafe { out.write((base + r * threads + tid) as u64, any as u32) };
    }
}

/// Guards against threads of one block taking different decisions (the hang it prevents: a
/// thread that stops alone leaves the others at the next barrier), and against a slow
/// thread reading the next generation's answer instead of its own.
#[test]
fn every_thread_gets_the_block_or() {
    let (threads, rounds) = (5u32, 60u32);
    let device = Device::cpu(0);
    let blocks = 2u32;
    let out = device
        .alloc::<u32>((blocks * threads * rounds) as usize)
        .unwrap();
    let stream = device.stream().unwrap();
    // SAFETY: `out` holds `blocks * rounds * threads` elements and outlives the launch.
    unsafe {
        vote::launch(
            &stream,
            LaunchConfig::grid(2).block(threads),
            out.device_slice(),
            rounds,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    for r in 0..rounds {
        let want = (r % (threads + 1) < threads) as u32;
        for t in 0..threads {
            assert_eq!(
                got[(r * threads + t) as usize],
                want,
                "round {r} thread {t}"
            );
        }
    }
}
