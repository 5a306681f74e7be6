//! Ring all-reduce over memory channels on the CPU emulator, ranks as threads.
#![allow(missing_docs)]

use oxccl::in_process::{self, InProcessConfig};
use oxccl_device::kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};
use oxccl_device::launch::LaunchConfig;

/// Small integers, so every sum is exact in f32 whatever the order of additions.
fn input(rank: u32, i: usize, iteration: u32) -> f32 {
    ((i * 7 + rank as usize * 13 + iteration as usize) % 101) as f32
}

fn run(ranks: u32, n: usize, threads: u32, in_place: bool, iterations: u32) {
    in_process::run(ranks, InProcessConfig::default(), |comm| {
        let rank = comm.rank();
        let mut work = comm.alloc::<f32>(2 * n)?;
        let mut input_buf = comm.alloc::<f32>(n)?;
        let all = comm.all_gather_memory(&comm.register(&work))?;
        let mine = all[rank as usize].clone();
        let (to_next, to_prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let stream = comm.device().stream()?;
        for it in 0..iterations {
            let data: Vec<f32> = (0..n).map(|i| input(rank, i, it)).collect();
            let mut host = vec![0f32; 2 * n];
            if in_place {
                host[..n].copy_from_slice(&data);
            } else {
                input_buf.copy_from_host(&data)?;
            }
            work.copy_from_host(&host)?;
            comm.barrier()?;
            let args = RingAllReduceArgs {
                next: to_next.device_handle(),
                prev: to_prev.device_handle(),
                input: if in_place {
                    work.addr()
                } else {
                    input_buf.addr()
                },
                work: work.addr(),
                n: n as u64,
                rank,
                n_ranks: ranks,
            };
            ring_all_reduce_sum_f32::launch(
                &stream,
                LaunchConfig::grid(1).block(threads),
                (args,),
            )?;
            comm.synchronize(&stream)?;
            let got = work.to_vec()?;
            for (i, &have) in got.iter().take(n).enumerate() {
                let want: f32 = (0..ranks).map(|r| input(r, i, it)).sum();
                assert_eq!(have, want, "rank {rank} iteration {it} element {i}");
            }
            // Nobody reloads its buffers while a peer may still write into them.
            comm.barrier()?;
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against a wrong chunk schedule (a chunk summed twice or missed) for two ranks.
#[test]
fn two_ranks_out_of_place() {
    run(2, 1000, 2, false, 3);
}

/// Guards against an odd ring size breaking the step arithmetic, and uneven chunks.
#[test]
fn three_ranks_uneven_in_place() {
    run(3, 1001, 3, true, 2);
}

/// Guards against scratch reuse across launches overwriting data not yet reduced.
#[test]
fn four_ranks_repeated() {
    run(4, 4099, 2, false, 4);
}

/// Guards against fewer elements than ranks (empty chunks) hanging or miscounting signals.
#[test]
fn fewer_elements_than_ranks() {
    run(4, 3, 1, true, 2);
}
