//! LL-packet ring all-reduce on the CPU emulator, ranks as threads: calls launched back to
//! back with no barrier between them, in and out of place.
#![allow(missing_docs)]

use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, DeviceBuffer, Error, MemoryChannel};
use oxccl_device::kernels::packet_all_reduce::{
    PacketAllReduceArgs, packet_all_reduce_sum_f32, packet_scratch_bytes,
};
use oxccl_device::launch::LaunchConfig;

/// Small integers, so every sum is exact in f32 whatever the order of additions.
fn input(rank: u32, i: usize, call: u32) -> f32 {
    ((i * 7 + rank as usize * 13 + call as usize * 5) % 101) as f32
}

/// The scratch of this rank and the ring channels over everyone's scratch.
fn setup(
    comm: &mut Communicator,
    n: usize,
) -> oxccl::Result<(DeviceBuffer<u64>, MemoryChannel, MemoryChannel)> {
    let bytes = packet_scratch_bytes(n as u64, comm.size()).max(8);
    let scratch = comm.alloc::<u64>((bytes / 8) as usize)?;
    let all = comm.all_gather_memory(&comm.register(&scratch))?;
    let mine = all[comm.rank() as usize].clone();
    let (next, prev) = comm.ring_memory_channels(&all, &mine, Some(&mine))?;
    Ok((scratch, next, prev))
}

/// `calls` all-reduces of `n` elements, launched back to back, then checked.
fn run(ranks: u32, n: usize, threads: u32, in_place: bool, calls: u32) {
    in_process::run(ranks, InProcessConfig::default(), |comm| {
        let rank = comm.rank();
        let (_scratch, next, prev) = setup(comm, n)?;
        let stream = comm.device().stream()?;
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for call in 0..calls {
            let data: Vec<f32> = (0..n).map(|i| input(rank, i, call)).collect();
            let buf = comm.device().alloc_from(&data)?;
            outputs.push(if in_place {
                None
            } else {
                Some(comm.alloc::<f32>(n)?)
            });
            inputs.push(buf);
        }
        comm.barrier()?;
        for call in 0..calls as usize {
            let input_addr = inputs[call].addr();
            let args = PacketAllReduceArgs {
                next: next.device_handle(),
                prev: prev.device_handle(),
                input: input_addr,
                output: outputs[call].as_ref().map_or(input_addr, |o| o.addr()),
                n: n as u64,
                flag: call as u32 + 1,
                rank,
                n_ranks: ranks,
                reserved: 0,
            };
            packet_all_reduce_sum_f32::launch(
                &stream,
                LaunchConfig::grid(1).block(threads),
                (args,),
            )?;
        }
        comm.synchronize(&stream)?;
        for call in 0..calls {
            let out = match &outputs[call as usize] {
                Some(o) => o.to_vec()?,
                None => inputs[call as usize].to_vec()?,
            };
            for (i, &have) in out.iter().enumerate() {
                let want: f32 = (0..ranks).map(|r| input(r, i, call)).sum();
                assert_eq!(have, want, "rank {rank} call {call} element {i}");
            }
        }
        comm.barrier()
    })
    .unwrap();
}

/// Guards against a wrong chunk schedule for two ranks, and against a call taking packets
/// of the call before it (launched back to back, inputs differing per call).
#[test]
fn two_ranks_back_to_back() {
    run(2, 1000, 2, false, 6);
}

/// Guards against an odd element count (a padded last packet written out) and an odd ring.
#[test]
fn three_ranks_odd_count_in_place() {
    run(3, 1001, 3, true, 4);
}

/// Guards against step-slot arithmetic that only holds for small rings, and uneven chunks.
#[test]
fn four_ranks_uneven() {
    run(4, 4099, 2, false, 3);
}

/// Guards against empty chunks (fewer packets than ranks) hanging a step.
#[test]
fn fewer_packets_than_ranks() {
    run(4, 3, 1, true, 3);
}

/// Guards against a rank alone doing anything but copying its input.
#[test]
fn one_rank_copies() {
    in_process::run(1, InProcessConfig::default(), |comm| {
        let data: Vec<f32> = (0..33).map(|i| i as f32).collect();
        let input = comm.device().alloc_from(&data)?;
        let output = comm.alloc::<f32>(33)?;
        let args = PacketAllReduceArgs {
            input: input.addr(),
            output: output.addr(),
            n: 33,
            flag: 1,
            n_ranks: 1,
            ..Default::default()
        };
        let stream = comm.device().stream()?;
        packet_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(1).block(4), (args,))?;
        comm.synchronize(&stream)?;
        assert_eq!(output.to_vec()?, data);
        Ok(())
    })
    .unwrap();
}

/// Guards against flag 0 (which a zeroed scratch would match) being accepted, and against
/// scratch too small for `n` being written past its end: both are refused, named by
/// channel, and nothing hangs.
#[test]
fn bad_flag_and_short_scratch_are_refused() {
    for (flag, scratch_for) in [(0u32, 64usize), (1, 8)] {
        in_process::run(2, InProcessConfig::default(), |comm| {
            let n = 64;
            let (_scratch, next, prev) = setup(comm, scratch_for)?;
            let data = comm.device().alloc_from(&vec![1f32; n])?;
            let args = PacketAllReduceArgs {
                next: next.device_handle(),
                prev: prev.device_handle(),
                input: data.addr(),
                output: data.addr(),
                n: n as u64,
                flag,
                rank: comm.rank(),
                n_ranks: 2,
                reserved: 0,
            };
            let stream = comm.device().stream()?;
            packet_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(1), (args,))?;
            stream.synchronize()?;
            match comm.check() {
                Err(Error::Aborted(what)) => {
                    let want = if flag == 0 {
                        "invalid argument"
                    } else {
                        "out of bounds"
                    };
                    assert!(
                        what.contains(want) && what.contains("Memory channel"),
                        "flag {flag}: {what}"
                    );
                }
                other => panic!("flag {flag}: expected a refusal, got {other:?}"),
            }
            Ok(())
        })
        .unwrap();
    }
}
