//! Ring all-reduce over memory channels on the CPU emulator, ranks as threads.
#![allow(missing_docs)]

mod common;

use common::{add_errors, config};
use oxccl::Error;
use oxccl::in_process;
use oxccl_device::coop::{Block, Coop};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DevicePtr, DeviceSlice, kernel};
use oxccl_kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};

/// Small integers, so every sum is exact in f32 whatever the order of additions.
const fn input(rank: u32, i: u64, call: u32) -> f32 {
    ((i * 7 + rank as u64 * 13 + call as u64) % 101) as f32
}

/// Counts, into `errors`, the first `n` elements of `out` that are not `scale` times the
/// sum over `ranks` ranks of `input(r, i, call)`.
///
/// # Safety
/// `out` must hold `n` readable elements and `errors` be one u64 only accessed atomically,
/// until the launch completes.
#[kernel(max_blocks = 1)]
unsafe fn count_wrong_sums(
    out: DeviceSlice<f32>,
    n: u64,
    ranks: u32,
    call: u32,
    scale: f32,
    errors: DevicePtr<u64>,
) {
    let mut wrong = 0;
    for i in Block.split(n) {
        let want = scale * (0..ranks).map(|r| input(r, i, call)).sum::<f32>();
        // SAFETY: `i < n` (contract).
        if unsafe { out.read(i) } != Some(want) {
            wrong += 1;
        }
    }
    // SAFETY: a live u64 only accessed atomically (contract).
    unsafe { add_errors(errors, wrong) };
}

/// All-reduces of the sizes `ns`, launched back to back on the same buffers and channels
/// with no host barrier, each checked on the device right after it, in stream order, as a
/// rank racing ahead would see it. Out of place, each call reduces its own input; in place,
/// each call reduces the previous call's result, so call `k` must give `ranks^k` times the
/// first sums (`ns` must then not grow). Returns the wrong elements of every rank.
fn back_to_back(ranks: u32, ns: &[usize], threads: u32, in_place: bool) -> Vec<u64> {
    let capacity = ns.iter().copied().max().unwrap_or(0);
    in_process::run(ranks, config(), |comm| {
        let rank = comm.rank();
        let first: Vec<f32> = (0..capacity as u64).map(|i| input(rank, i, 0)).collect();
        let mut work_init = first.clone();
        work_init.resize(2 * capacity, f32::NAN);
        let work = comm.device().alloc_from(&work_init)?;
        let inputs = ns
            .iter()
            .enumerate()
            .map(|(call, &n)| {
                let data: Vec<f32> = (0..n as u64).map(|i| input(rank, i, call as u32)).collect();
                comm.device().alloc_from(&data)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let all = comm.all_gather_memory(&comm.register(&work)?)?;
        let mine = all[rank as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let errors = comm.alloc_zeroed::<u64>(1)?;
        let stream = comm.device().stream()?;
        let config = LaunchConfig::grid(1).block(threads);
        for (call, &n) in ns.iter().enumerate() {
            let args = RingAllReduceArgs {
                next: next.device_handle(),
                prev: prev.device_handle(),
                input: if in_place {
                    work.view()
                } else {
                    inputs[call].view()
                },
                work: work.view_mut(),
                n: n as u64,
                capacity: capacity as u64,
                rank,
                n_ranks: ranks,
            };
            ring_all_reduce_sum_f32::launch(&stream, config, args)?;
            let (check_call, scale) = if in_place {
                (0, (ranks as f32).powi(call as i32))
            } else {
                (call as u32, 1.0)
            };
            // SAFETY: `work` holds at least `n` elements; `errors` one u64.
            unsafe {
                count_wrong_sums::launch(
                    &stream,
                    LaunchConfig::grid(1).block(2),
                    work.device_slice(),
                    n as u64,
                    ranks,
                    check_call,
                    scale,
                    errors.device_ptr(),
                )?
            };
        }
        comm.synchronize(&stream)?;
        Ok(errors.to_vec()?[0])
    })
    .unwrap()
}

fn assert_none_wrong(what: &str, wrong: Vec<u64>) {
    assert!(
        wrong.iter().all(|&w| w == 0),
        "{what}: wrong elements by rank {wrong:?}"
    );
}

/// Guards against a wrong chunk schedule (a chunk summed twice or missed) for two ranks.
#[test]
fn two_ranks_out_of_place() {
    assert_none_wrong("2 ranks", back_to_back(2, &[1000, 1000, 1000], 2, false));
}

/// Guards against an odd ring size breaking the step arithmetic, and uneven chunks.
#[test]
fn three_ranks_uneven_in_place() {
    assert_none_wrong("3 ranks", back_to_back(3, &[1001, 1001], 3, true));
}

/// Guards against scratch reuse across launches overwriting data not yet reduced: four
/// ranks, calls launched back to back with no host barrier, each checked on the device.
#[test]
fn four_ranks_repeated() {
    assert_none_wrong("4 ranks", back_to_back(4, &[4099; 4], 2, false));
}

/// Guards against fewer elements than ranks (empty chunks) hanging or miscounting signals.
#[test]
fn fewer_elements_than_ranks() {
    assert_none_wrong("n < ranks", back_to_back(4, &[3, 3, 2], 1, true));
}

/// Guards against the scratch placed at the call's `n`: with a shrinking `n`, a rank one
/// call ahead of `next` then writes its partial sums into `next`'s output. Back to back, no
/// host barrier, 2 to 4 ranks, in and out of place, every call checked on the device.
#[test]
fn ring_all_reduce_shrinking_n_back_to_back() {
    let shrinking = [4099, 2000, 1000, 333, 64, 7, 1, 0];
    for ranks in [2, 3, 4] {
        for in_place in [false, true] {
            let what = format!("{ranks} ranks, in place {in_place}");
            assert_none_wrong(&what, back_to_back(ranks, &shrinking, 2, in_place));
        }
    }
    // Out of place the sizes may also grow again.
    assert_none_wrong(
        "4 ranks, any sizes",
        back_to_back(4, &[8, 1000, 0, 8, 3, 1000], 2, false),
    );
}

/// Guards against a kernel written for one block being run on several (every block would
/// redo the whole reduction): the launch is refused before it runs, naming the kernel and
/// the launch shape.
#[test]
fn unsupported_launch_shape_is_refused() {
    in_process::run(2, config(), |comm| {
        let work = comm.alloc_zeroed::<f32>(64)?;
        let all = comm.all_gather_memory(&comm.register(&work)?)?;
        let mine = all[comm.rank() as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let args = RingAllReduceArgs {
            next: next.device_handle(),
            prev: prev.device_handle(),
            input: work.view(),
            work: work.view_mut(),
            n: 32,
            capacity: 32,
            rank: comm.rank(),
            n_ranks: 2,
        };
        let stream = comm.device().stream()?;
        let err = ring_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(2).block(4), args)
            .unwrap_err();
        match &err {
            Error::InvalidUsage(msg) => {
                assert!(msg.contains("ring_all_reduce_sum_f32"), "{msg}");
                assert!(
                    msg.contains("at most 1 block") && msg.contains("2x1x1"),
                    "{msg}"
                );
            }
            other => panic!("expected InvalidUsage, got {other:?}"),
        }
        comm.synchronize(&stream)
    })
    .unwrap();
}
