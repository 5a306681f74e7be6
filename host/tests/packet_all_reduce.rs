//! LL-packet ring all-reduce on the CPU emulator, ranks as threads: calls launched back to
//! back with no barrier between them, with changing sizes, in and out of place.
#![allow(missing_docs)]

mod common;

use common::config;
use oxccl::in_process;
use oxccl::{ChannelFailure, Communicator, DeviceBuffer, Error, MemoryChannel};
use oxccl_device::error::DeviceOp;
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::packet_all_reduce::{
    PacketAllReduceArgs, packet_all_reduce_sum_f32, packet_scratch_bytes,
};

/// Small integers, so every sum is exact in f32 whatever the order of additions.
fn input(rank: u32, i: usize, call: u64) -> f32 {
    ((i * 7 + rank as usize * 13 + call as usize * 5) % 101) as f32
}

/// The zeroed scratch of this rank, sized for `capacity` elements, and the ring channels
/// over everyone's scratch.
fn setup(
    comm: &mut Communicator,
    capacity: usize,
) -> oxccl::Result<(DeviceBuffer<u64>, MemoryChannel, MemoryChannel)> {
    let bytes = packet_scratch_bytes(capacity as u64, comm.size()).max(16);
    let scratch = comm.alloc_zeroed::<u64>((bytes / 8) as usize)?;
    let all = comm.all_gather_memory(&comm.register(&scratch)?)?;
    let mine = all[comm.rank() as usize].clone();
    let (next, prev) = comm.ring_memory_channels(&all, &mine, Some(&mine))?;
    Ok((scratch, next, prev))
}

/// All-reduces of sizes `ns`, calls numbered from `first_sequence`, launched back to back
/// with no host barrier (each with its own input and output buffers), then all checked.
fn run(ranks: u32, ns: &[usize], threads: u32, in_place: bool, first_sequence: u64) {
    run_with(config(), ranks, ns, threads, in_place, first_sequence)
}

fn run_with(
    config: oxccl::in_process::InProcessConfig,
    ranks: u32,
    ns: &[usize],
    threads: u32,
    in_place: bool,
    first_sequence: u64,
) {
    let capacity = ns.iter().copied().max().unwrap_or(0);
    in_process::run(ranks, config, |comm| {
        let rank = comm.rank();
        let (_scratch, next, prev) = setup(comm, capacity)?;
        let stream = comm.device().stream()?;
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for (call, &n) in ns.iter().enumerate() {
            let data: Vec<f32> = (0..n).map(|i| input(rank, i, call as u64)).collect();
            inputs.push(comm.device().alloc_from(&data)?);
            outputs.push(if in_place {
                None
            } else {
                Some(comm.alloc::<f32>(n)?)
            });
        }
        for (call, &n) in ns.iter().enumerate() {
            let input_addr = inputs[call].addr();
            let args = PacketAllReduceArgs {
                next: next.device_handle(),
                prev: prev.device_handle(),
                input: input_addr,
                output: outputs[call].as_ref().map_or(input_addr, |o| o.addr()),
                n: n as u64,
                capacity: capacity as u64,
                sequence: first_sequence + call as u64,
                rank,
                n_ranks: ranks,
            };
            // SAFETY: each call's input and output hold `n` elements, untouched until the end.
            unsafe {
                packet_all_reduce_sum_f32::launch(
                    &stream,
                    LaunchConfig::grid(1).block(threads),
                    args,
                )?
            };
        }
        comm.synchronize(&stream)?;
        for (call, &n) in ns.iter().enumerate() {
            let out = match &outputs[call] {
                Some(o) => o.to_vec()?,
                None => inputs[call].to_vec()?,
            };
            for (i, &have) in out.iter().enumerate().take(n) {
                let want: f32 = (0..ranks).map(|r| input(r, i, call as u64)).sum();
                assert_eq!(have, want, "rank {rank} call {call} (n {n}) element {i}");
            }
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against a wrong chunk schedule for two ranks, and against a call taking packets
/// of the call before it (launched back to back, inputs differing per call).
#[test]
fn two_ranks_back_to_back() {
    run(2, &[1000; 6], 2, false, 0);
}

/// Guards against an odd element count (a padded last packet written out) and an odd ring.
#[test]
fn three_ranks_odd_count_in_place() {
    run(3, &[1001; 4], 3, true, 0);
}

/// Guards against step-slot arithmetic that only holds for small rings, and uneven chunks.
#[test]
fn four_ranks_uneven() {
    run(4, &[4099; 3], 2, false, 0);
}

/// Guards against empty chunks (fewer packets than ranks) hanging a step.
#[test]
fn fewer_packets_than_ranks() {
    run(4, &[3; 3], 1, true, 0);
}

/// Guards against slot sets placed by the call's `n`: with consecutive calls of different
/// sizes the two sets overlap, a rank one call ahead overwrites packets its `next` has not
/// read, and `next` times out or reads the wrong call's data. 2 to 4 ranks, no host barrier.
/// The sizes alternate between pairs whose slots would overlap (1000 then 300 at an even
/// call, 300 then 1000 at an odd one), often enough for a rank to run a call ahead of its
/// neighbour on the emulator; a short wait limit makes a lost packet fail fast.
#[test]
fn packet_all_reduce_back_to_back_varying_n() {
    let mut sizes = vec![8, 1000, 0, 8, 3, 1000];
    sizes.extend([1000, 300].iter().cycle().take(120));
    let mut config = config();
    config.communicator.wait_timeout = std::time::Duration::from_secs(3);
    for ranks in [2, 3, 4] {
        for in_place in [false, true] {
            run_with(config.clone(), ranks, &sizes, 4, in_place, 0);
        }
    }
}

/// Guards against a slot set chosen by the flag's parity: the flag skips 0 when it wraps,
/// so two calls in a row would use the same set. Calls run through the wrap.
#[test]
fn packet_all_reduce_flag_wraps() {
    let wrap = u32::MAX as u64;
    for ranks in [2, 3] {
        run(ranks, &[64, 8, 64, 8, 64, 8, 64, 8], 2, false, wrap - 4);
    }
}

/// Guards against a rank alone doing anything but copying its input.
#[test]
fn one_rank_copies() {
    in_process::run(1, config(), |comm| {
        let data: Vec<f32> = (0..33).map(|i| i as f32).collect();
        let input = comm.device().alloc_from(&data)?;
        let output = comm.alloc::<f32>(33)?;
        let args = PacketAllReduceArgs {
            input: input.addr(),
            output: output.addr(),
            n: 33,
            capacity: 33,
            n_ranks: 1,
            ..Default::default()
        };
        let stream = comm.device().stream()?;
        // SAFETY: input and output hold 33 elements each.
        unsafe {
            packet_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(1).block(4), args)?
        };
        comm.synchronize(&stream)?;
        assert_eq!(output.to_vec()?, data);
        Ok(())
    })
    .unwrap();
}

/// Guards against a call larger than the capacity, or scratch too small for it, being
/// written past the scratch's end: both are refused, named by channel with the sizes, and
/// nothing hangs.
#[test]
fn oversized_call_and_short_scratch_are_refused() {
    // (n, capacity the kernel is told, capacity the scratch was sized for)
    for (n, capacity, scratch_for) in [(64usize, 32usize, 64usize), (64, 64, 8)] {
        in_process::run(2, config(), |comm| {
            let (_scratch, next, prev) = setup(comm, scratch_for)?;
            let data = comm.device().alloc_from(&vec![1f32; n])?;
            let args = PacketAllReduceArgs {
                next: next.device_handle(),
                prev: prev.device_handle(),
                input: data.addr(),
                output: data.addr(),
                n: n as u64,
                capacity: capacity as u64,
                sequence: 0,
                rank: comm.rank(),
                n_ranks: 2,
            };
            let stream = comm.device().stream()?;
            // SAFETY: `data` holds `n` elements.
            unsafe { packet_all_reduce_sum_f32::launch(&stream, LaunchConfig::grid(1), args)? };
            match comm.synchronize(&stream) {
                Err(Error::Channel(e)) => {
                    let text = e.to_string();
                    assert!(text.contains("memory channel #"), "{text}");
                    assert!(text.contains("packet_all_reduce_sum_f32"), "{text}");
                    if capacity < n {
                        assert!(
                            matches!(
                                e.cause,
                                ChannelFailure::InvalidArgument { op: DeviceOp::Kernel, detail }
                                    if detail[0] == n as u64 && detail[1] == capacity as u64
                            ),
                            "{e:?}"
                        );
                    } else {
                        assert!(
                            matches!(
                                e.cause,
                                ChannelFailure::OutOfBounds {
                                    op: DeviceOp::WritePacket,
                                    ..
                                }
                            ),
                            "{e:?}"
                        );
                    }
                }
                other => panic!("n {n} capacity {capacity}: expected a refusal, got {other:?}"),
            }
            Ok(())
        })
        .unwrap();
    }
}
