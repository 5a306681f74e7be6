//! The collectives of `Communicator` against a host reference: every collective, every
//! element type, every operation, in place and out of place, 1 to 4 ranks, counts that are
//! multiples of nothing convenient, one block and several, and calls back to back with
//! changing sizes and no host barrier.

mod common;

use common::assert_same;
use common::eager_steps::{
    barrier_after_eager_broadcasts_case, eager_calls_case, eager_steps, long_eager_runs,
};
use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, DataType, DeviceBuffer, ReduceElement, ReduceOp, Result, bf16, f16};
use oxccl_device::launch::LaunchConfig;
use std::sync::atomic::AtomicBool;

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// A job whose collectives run with `blocks` blocks of `threads` threads, `algorithm`, and
/// rounds of `round_bytes` (small, so that counts of a few thousand take several rounds).
fn job(blocks: u32, threads: u32, algorithm: AlgorithmChoice, round_bytes: u64) -> InProcessConfig {
    let mut config = common::config();
    let c = &mut config.communicator.collectives;
    c.launch = Some(LaunchConfig::grid(blocks).block(threads));
    c.algorithm = algorithm;
    c.round_bytes = round_bytes;
    c.packet_limit = 4096;
    config
}

/// The smallest packet message sent as data in each form the packet tests run: every
/// message as data and one signal, every message as LL16 packets.
const PACKET_FORMS: [u64; 2] = [0, u64::MAX];

/// `config` with packet messages from `data_from` bytes on sent as data.
fn with_packet_data(mut config: InProcessConfig, data_from: u64) -> InProcessConfig {
    config.communicator.collectives.packet_data_bytes = Some(data_from);
    config
}

/// Rank `rank`'s input element `i` in call `call`: small integers, exact in every type
/// (non-negative for the unsigned ones), and never two neighbours alike.
fn value<T: ReduceElement>(rank: u32, i: usize, call: u32) -> T {
    let v = ((rank as usize * 7 + i * 13 + call as usize * 5) % 23) as f64;
    let signed = matches!(T::TYPE, DataType::I8 | DataType::I32 | DataType::I64)
        || matches!(
            T::TYPE,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        );
    T::from_f64(if signed { v - 9.0 } else { v + 1.0 })
}

fn inputs<T: ReduceElement>(rank: u32, len: usize, call: u32) -> Vec<T> {
    (0..len).map(|i| value::<T>(rank, i, call)).collect()
}

/// The reduction by `op` of every rank's element `i`, combined in rank order, as the
/// kernels combine them.
fn reduced<T: ReduceElement>(ranks: u32, op: ReduceOp, elem: impl Fn(u32) -> T) -> T {
    let mut acc = elem(0);
    for r in 1..ranks {
        acc = acc.combine(elem(r), op);
    }
    acc.finish(op, ranks)
}

fn upload<T: ReduceElement>(comm: &Communicator, data: &[T]) -> Result<DeviceBuffer<T>> {
    // One spare element past the data, so a kernel writing one element too many is seen.
    let mut buf = comm.alloc::<T>(data.len() + 1)?;
    let mut host = data.to_vec();
    host.push(T::from_f64(99.0));
    buf.copy_from_host(&host)?;
    Ok(buf)
}

fn download<T: ReduceElement>(buf: &DeviceBuffer<T>, len: usize) -> Result<Vec<T>> {
    let all = buf.to_vec()?;
    assert_eq!(
        all[len].to_f64(),
        99.0,
        "the element past the output was written"
    );
    Ok(all[..len].to_vec())
}

/// All-reduce of `count` elements of `T` by `op`, in place or not, checked on every rank.
fn all_reduce_case<T: ReduceElement>(
    comm: &mut Communicator,
    count: usize,
    op: ReduceOp,
    in_place: bool,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    let send = upload(comm, &inputs::<T>(rank, count, 0))?;
    let mut out = upload(comm, &vec![T::from_f64(0.0); count])?;
    let result = if in_place {
        let mut buf = send;
        comm.all_reduce_in_place(&mut buf, count, op, &stream)?;
        comm.synchronize(&stream)?;
        download(&buf, count)?
    } else {
        comm.all_reduce(&send, &mut out, count, op, &stream)?;
        comm.synchronize(&stream)?;
        download(&out, count)?
    };
    let want: Vec<T> = (0..count)
        .map(|i| reduced(n, op, |r| value::<T>(r, i, 0)))
        .collect();
    let what = format!(
        "all_reduce {:?} {op:?} n={count} ranks={n} in_place={in_place}",
        T::TYPE
    );
    assert_same(&what, &result, &want);
    Ok(())
}

macro_rules! for_each_type {
    ($f:ident, $($arg:expr),*) => {{
        $f::<f32>($($arg),*)?;
        $f::<f64>($($arg),*)?;
        $f::<f16>($($arg),*)?;
        $f::<bf16>($($arg),*)?;
        $f::<i8>($($arg),*)?;
        $f::<u8>($($arg),*)?;
        $f::<i32>($($arg),*)?;
        $f::<u32>($($arg),*)?;
        $f::<i64>($($arg),*)?;
        $f::<u64>($($arg),*)?;
    }};
}

/// Every type, op and count through one algorithm, on `ranks` ranks.
fn all_reduce_matrix(ranks: u32, config: InProcessConfig, counts: &[usize]) {
    in_process::run(ranks, config, |comm| {
        for &count in counts {
            for op in OPS {
                for in_place in [false, true] {
                    for_each_type!(all_reduce_case, comm, count, op, in_place);
                }
            }
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against a packet all-reduce that drops the padding of an odd size wrongly,
/// combines out of rank order, or mishandles any type or operation, as packets and as
/// data.
#[test]
fn all_reduce_packets_every_type_and_op() {
    let packets = AlgorithmChoice::Use(Algorithm::Packets);
    for data_from in PACKET_FORMS {
        for ranks in 1..=4 {
            let config = with_packet_data(job(1, 2, packets, 4096), data_from);
            all_reduce_matrix(ranks, config, &[0, 1, 7, 300]);
        }
    }
}

/// Guards against a two-shot all-reduce that loses a chunk's remainder, a round's tail,
/// or a rank's contribution, with one block and with several.
#[test]
fn all_reduce_direct_every_type_and_op() {
    let direct = AlgorithmChoice::Use(Algorithm::Direct);
    for ranks in 1..=4 {
        let (blocks, threads) = if ranks % 2 == 0 { (3, 2) } else { (1, 1) };
        // 256-byte rounds: 1000 elements take several.
        all_reduce_matrix(ranks, job(blocks, threads, direct, 256), &[0, 1, 7, 1000]);
    }
}

/// Guards against large counts going wrong where small ones do not: many rounds, a count
/// that is a multiple of nothing, the choice of the algorithm by size.
#[test]
fn all_reduce_large_odd_count() {
    for ranks in [2, 3] {
        in_process::run(ranks, job(2, 2, AlgorithmChoice::Auto, 64 << 10), |comm| {
            all_reduce_case::<f32>(comm, 1_000_003, ReduceOp::Sum, false)?;
            all_reduce_case::<u8>(comm, 1_000_003, ReduceOp::Max, true)
        })
        .unwrap();
    }
}

/// Guards against 16-bit float reductions drifting from the exact result by more than
/// their rounding: compared with an f64 reference, relative tolerance 2^-7 per rank for
/// bf16 and 2^-10 per rank for f16 (one rounding per combine).
#[test]
fn half_precision_sums_within_tolerance_of_f64() {
    fn check<T: ReduceElement>(comm: &mut Communicator, eps: f64) -> Result<()> {
        let (rank, n) = (comm.rank(), comm.size());
        let count = 777;
        let data: Vec<T> = (0..count)
            .map(|i| T::from_f64(1.0 + ((rank as usize * 31 + i * 17) % 97) as f64 / 7.0))
            .collect();
        let send = upload(comm, &data)?;
        let mut recv = upload(comm, &vec![T::from_f64(0.0); count])?;
        let stream = comm.device().stream()?;
        comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        let got = download(&recv, count)?;
        for (i, g) in got.iter().enumerate() {
            let exact: f64 = (0..n)
                .map(|r| T::from_f64(1.0 + ((r as usize * 31 + i * 17) % 97) as f64 / 7.0).to_f64())
                .sum();
            let err = (g.to_f64() - exact).abs() / exact.abs();
            assert!(
                err <= eps * n as f64,
                "{:?} element {i}: {} vs {exact}",
                T::TYPE,
                g.to_f64()
            );
        }
        Ok(())
    }
    for algo in [Algorithm::Packets, Algorithm::Direct] {
        in_process::run(3, job(1, 1, AlgorithmChoice::Use(algo), 1 << 10), |comm| {
            check::<f16>(comm, 1.0 / 1024.0)?;
            check::<bf16>(comm, 1.0 / 128.0)
        })
        .unwrap();
    }
}

/// The non-reducing and rooted collectives for one type and count.
fn others_case<T: ReduceElement>(
    comm: &mut Communicator,
    count: usize,
    in_place: bool,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let nu = n as usize;
    let stream = comm.device().stream()?;
    let tag = |what: &str| {
        format!(
            "{what} {:?} count={count} ranks={n} in_place={in_place} rank={rank}",
            T::TYPE
        )
    };

    // All-gather.
    let mine = inputs::<T>(rank, count, 1);
    let want: Vec<T> = (0..n).flat_map(|r| inputs::<T>(r, count, 1)).collect();
    let got = if in_place {
        let mut full = vec![T::from_f64(0.0); count * nu];
        full[rank as usize * count..][..count].copy_from_slice(&mine);
        let mut buf = upload(comm, &full)?;
        comm.all_gather_in_place(&mut buf, count, &stream)?;
        comm.synchronize(&stream)?;
        download(&buf, count * nu)?
    } else {
        let send = upload(comm, &mine)?;
        let mut recv = upload(comm, &vec![T::from_f64(0.0); count * nu])?;
        comm.all_gather(&send, &mut recv, count, &stream)?;
        comm.synchronize(&stream)?;
        download(&recv, count * nu)?
    };
    assert_same(&tag("all_gather"), &got, &want);

    // Reduce-scatter, every op.
    for op in OPS {
        let full = inputs::<T>(rank, count * nu, 2);
        let want: Vec<T> = (0..count)
            .map(|i| reduced(n, op, |r| value::<T>(r, rank as usize * count + i, 2)))
            .collect();
        let got = if in_place {
            let mut buf = upload(comm, &full)?;
            comm.reduce_scatter_in_place(&mut buf, count, op, &stream)?;
            comm.synchronize(&stream)?;
            let all = download(&buf, count * nu)?;
            all[rank as usize * count..][..count].to_vec()
        } else {
            let send = upload(comm, &full)?;
            let mut recv = upload(comm, &vec![T::from_f64(0.0); count])?;
            comm.reduce_scatter(&send, &mut recv, count, op, &stream)?;
            comm.synchronize(&stream)?;
            download(&recv, count)?
        };
        assert_same(&tag(&format!("reduce_scatter {op:?}")), &got, &want);
    }

    // Broadcast and reduce from every root.
    for root in 0..n {
        let want = inputs::<T>(root, count, 3);
        let got = if in_place {
            let start = if rank == root {
                want.clone()
            } else {
                vec![T::from_f64(0.0); count]
            };
            let mut buf = upload(comm, &start)?;
            comm.broadcast_in_place(&mut buf, count, root, &stream)?;
            comm.synchronize(&stream)?;
            download(&buf, count)?
        } else {
            let send = upload(comm, &inputs::<T>(rank, count, 3))?;
            let mut recv = upload(comm, &vec![T::from_f64(0.0); count])?;
            comm.broadcast(&send, &mut recv, count, root, &stream)?;
            comm.synchronize(&stream)?;
            download(&recv, count)?
        };
        assert_same(&tag(&format!("broadcast root {root}")), &got, &want);

        let op = OPS[root as usize % OPS.len()];
        let mine = inputs::<T>(rank, count, 4);
        let want: Vec<T> = (0..count)
            .map(|i| reduced(n, op, |r| value::<T>(r, i, 4)))
            .collect();
        let zero = vec![T::from_f64(0.0); count];
        let got = if in_place {
            let mut buf = upload(comm, &mine)?;
            comm.reduce_in_place(&mut buf, count, op, root, &stream)?;
            comm.synchronize(&stream)?;
            download(&buf, count)?
        } else {
            let send = upload(comm, &mine)?;
            let mut recv = upload(comm, &zero)?;
            comm.reduce(&send, &mut recv, count, op, root, &stream)?;
            comm.synchronize(&stream)?;
            download(&recv, count)?
        };
        if rank == root {
            assert_same(&tag(&format!("reduce {op:?} root {root}")), &got, &want);
        } else if in_place {
            assert_same(&tag("reduce leaves a non-root's input"), &got, &mine);
        } else {
            assert_same(&tag("reduce leaves a non-root's recv"), &got, &zero);
        }
    }

    // All-to-all: rank r's block p is value(r, p * count + i).
    let full = inputs::<T>(rank, count * nu, 5);
    let want: Vec<T> = (0..n)
        .flat_map(|r| (0..count).map(move |i| value::<T>(r, rank as usize * count + i, 5)))
        .collect();
    let got = if in_place {
        let mut buf = upload(comm, &full)?;
        comm.all_to_all_in_place(&mut buf, count, &stream)?;
        comm.synchronize(&stream)?;
        download(&buf, count * nu)?
    } else {
        let send = upload(comm, &full)?;
        let mut recv = upload(comm, &vec![T::from_f64(0.0); count * nu])?;
        comm.all_to_all(&send, &mut recv, count, &stream)?;
        comm.synchronize(&stream)?;
        download(&recv, count * nu)?
    };
    assert_same(&tag("all_to_all"), &got, &want);
    Ok(())
}

fn others_matrix(ranks: u32, config: InProcessConfig, counts: &[usize]) {
    in_process::run(ranks, config, |comm| {
        for &count in counts {
            for in_place in [false, true] {
                for_each_type!(others_case, comm, count, in_place);
            }
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against all-gather, reduce-scatter, broadcast, reduce and all-to-all placing a
/// rank's data at the wrong offset, losing a round's tail, reading a non-root's buffer or
/// writing a non-root's output, for every type, 1 to 4 ranks, one block and several. By
/// size (a packet limit of 4 KiB): all-gather, reduce-scatter, all-to-all, broadcast and
/// reduce take packets up to 100 elements and for 600 of the smaller types, direct for 600
/// of 8 bytes.
#[test]
fn other_collectives_every_type() {
    let auto = AlgorithmChoice::Auto;
    for ranks in 1..=4 {
        let (blocks, threads) = if ranks % 2 == 1 { (2, 2) } else { (1, 1) };
        others_matrix(ranks, job(blocks, threads, auto, 512), &[0, 1, 7, 100, 600]);
    }
}

/// Guards against the direct all-gather, reduce-scatter, all-to-all, broadcast and reduce
/// going wrong at the small sizes that take packets by default (and against forced
/// packets being ignored or misplacing data): both forced (packets as LL16 packets and as
/// data), every type, 1 to 4 ranks, every root.
#[test]
fn other_collectives_small_direct_and_packets() {
    let runs = [
        (Algorithm::Direct, u64::MAX),
        (Algorithm::Packets, PACKET_FORMS[0]),
        (Algorithm::Packets, PACKET_FORMS[1]),
    ];
    for (algo, data_from) in runs {
        for ranks in 1..=4 {
            let (blocks, threads) = if ranks % 2 == 0 { (2, 2) } else { (1, 1) };
            let config = job(blocks, threads, AlgorithmChoice::Use(algo), 512);
            others_matrix(ranks, with_packet_data(config, data_from), &[1, 7, 100]);
        }
    }
}

/// Guards against all-to-all-v misplacing uneven and zero counts, or taking too few
/// rounds when one pair moves far more than the others.
#[test]
fn all_to_allv_uneven_and_zero_counts() {
    in_process::run(3, job(2, 1, AlgorithmChoice::Auto, 256), |comm| {
        let (rank, n) = (comm.rank(), comm.size() as usize);
        // Rank r sends peer p (r * 5 + p * 37) % 60 elements (some zero, one large).
        let count = |from: u32, to: usize| (from as usize * 5 + to * 37) % 60;
        let send_counts: Vec<usize> = (0..n).map(|p| count(rank, p)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|p| count(p as u32, rank as usize)).collect();
        // Send ranges in reverse order with gaps; receive ranges packed with gaps of 3.
        let mut send_displs = vec![0; n];
        let mut at = 2;
        for p in (0..n).rev() {
            send_displs[p] = at;
            at += send_counts[p] + 1;
        }
        let send_len = at;
        let mut recv_displs = vec![0; n];
        let mut at = 0;
        for p in 0..n {
            recv_displs[p] = at;
            at += recv_counts[p] + 3;
        }
        let recv_len = at;
        let payload = |from: u32, to: usize, i: usize| {
            (from as u64 * 1000 + to as u64 * 100 + i as u64) as f64
        };
        let mut send_host = vec![-1.0f64; send_len];
        for p in 0..n {
            for i in 0..send_counts[p] {
                send_host[send_displs[p] + i] = payload(rank, p, i);
            }
        }
        let send = upload(comm, &send_host)?;
        let mut recv = upload(comm, &vec![-2.0f64; recv_len])?;
        let stream = comm.device().stream()?;
        for _ in 0..2 {
            comm.all_to_allv(
                &send,
                &send_counts,
                &send_displs,
                &mut recv,
                &recv_counts,
                &recv_displs,
                &stream,
            )?;
        }
        comm.synchronize(&stream)?;
        let got = download(&recv, recv_len)?;
        let mut want = vec![-2.0f64; recv_len];
        for p in 0..n {
            for i in 0..recv_counts[p] {
                want[recv_displs[p] + i] = payload(p as u32, rank as usize, i);
            }
        }
        assert_same(&format!("all_to_allv rank {rank}"), &got, &want);
        Ok(())
    })
    .unwrap();
}

/// Guards against a packet call that takes what an earlier call sent as data for its own
/// packets: a slot that held a message sent as data (not as packets) holds the user's
/// bytes, which can equal the flag of a later packet call on the same slot. Call 0 sends
/// 1 KiB of 3s as data (3 is the flag of call 2, which reuses call 0's set), call 1 a small
/// message as packets, and call 2 8 elements as packets while rank 1 starts it late: rank
/// 0 must wait for rank 1's packets, not sum the 3s it finds. Then the same through the
/// eager slots: broadcasts from rank 1 as data and as packets, 3 sets deep.
#[test]
fn packets_never_take_stale_data_for_their_flag() {
    let mut config = job(1, 1, AlgorithmChoice::Auto, 1024);
    config.communicator.collectives.packet_data_bytes = Some(512);
    config.communicator.collectives.eager_bytes = 0;
    in_process::run(2, config, |comm| {
        let rank = comm.rank();
        let stream = comm.device().stream()?;
        let late = |call: u32| {
            if rank == 1 && call == 2 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        };
        let mut kept = Vec::new();
        // Lockstep slots: calls 0-2 all-reduce (sequence numbers 0-2).
        for (call, count, value) in [(0u32, 256usize, 3i32), (1, 2, 1), (2, 8, 10)] {
            late(call);
            let send = upload(comm, &vec![value + rank as i32 * (call as i32); count])?;
            let mut recv = upload(comm, &vec![0; count])?;
            comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
            kept.push((count, 2 * value + call as i32, send, recv));
        }
        comm.synchronize(&stream)?;
        for (i, (count, want, _, recv)) in kept.iter().enumerate() {
            let what = format!("rank {rank}, all-reduce {i}");
            assert_same(&what, &download(recv, *count)?, &vec![*want; *count]);
        }
        // Eager slots, 3 sets: broadcasts from rank 1 (sequence numbers 3-6 after the
        // switch): 1 KiB of 7s as data into set 0 (call 3), then packets into sets 1, 2
        // and, late, 0 again (call 6, flag 7).
        let mut kept = Vec::new();
        for (call, count, value) in [(3u32, 256usize, 7i32), (4, 2, 1), (5, 2, 1), (6, 8, 20)] {
            if rank == 0 && call == 6 {
                comm.synchronize(&stream)?;
            }
            if rank == 1 && call == 6 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let mut buf = upload(comm, &vec![value * (rank as i32); count])?;
            comm.broadcast_in_place(&mut buf, count, 1, &stream)?;
            kept.push((count, value, buf));
        }
        comm.synchronize(&stream)?;
        for (count, value, buf) in &kept {
            let what = format!("rank {rank}, broadcast of {value}s");
            assert_same(&what, &download(buf, *count)?, &vec![*value; *count]);
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against calls that overwrite a peer's data before it was read when they follow
/// each other with no host barrier, with changing sizes and the packet and direct
/// algorithms mixed (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and
/// reduce each take packets up to 1024 elements here), broadcasts and reduces from a
/// changing root: every result is checked at the end, each call with a buffer of its own.
#[test]
fn back_to_back_calls_with_changing_sizes() {
    for ranks in [2, 3, 4] {
        in_process::run(ranks, job(2, 1, AlgorithmChoice::Auto, 256), |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let nu = n as usize;
            let stream = comm.device().stream()?;
            let counts = [5usize, 900, 0, 64, 1, 2000, 33, 700, 3, 1500];
            let mut calls = Vec::new();
            let mut exchanges = Vec::new();
            let mut rooted = Vec::new();
            for (k, &count) in counts.iter().cycle().take(30).enumerate() {
                let send = upload(comm, &inputs::<i32>(rank, count, k as u32))?;
                let mut recv = upload(comm, &vec![0i32; count])?;
                comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
                let gathered = upload(comm, &vec![0i32; count * nu])?;
                let mut gathered = gathered;
                comm.all_gather(&send, &mut gathered, count, &stream)?;
                let blocks = upload(comm, &inputs::<i32>(rank, count * nu, k as u32 + 1))?;
                let mut scattered = upload(comm, &vec![0i32; count])?;
                comm.reduce_scatter(&blocks, &mut scattered, count, ReduceOp::Sum, &stream)?;
                let mut swapped = upload(comm, &vec![0i32; count * nu])?;
                comm.all_to_all(&blocks, &mut swapped, count, &stream)?;
                let root = k as u32 % n;
                let mut spread = upload(comm, &vec![0i32; count])?;
                comm.broadcast(&send, &mut spread, count, root, &stream)?;
                let mut summed = upload(comm, &vec![0i32; count])?;
                comm.reduce(
                    &send,
                    &mut summed,
                    count,
                    ReduceOp::Sum,
                    (root + 1) % n,
                    &stream,
                )?;
                calls.push((k as u32, count, send, recv, gathered));
                exchanges.push((blocks, scattered, swapped));
                rooted.push((root, spread, summed));
            }
            comm.synchronize(&stream)?;
            for ((k, count, _, recv, _), (root, spread, summed)) in calls.iter().zip(&rooted) {
                let what = format!("call {k} broadcast from {root}");
                assert_same(
                    &what,
                    &download(spread, *count)?,
                    &inputs::<i32>(*root, *count, *k),
                );
                let what = format!("call {k} reduce to {}", (root + 1) % n);
                let want = if rank == (root + 1) % n {
                    download(recv, *count)?
                } else {
                    vec![0i32; *count]
                };
                assert_same(&what, &download(summed, *count)?, &want);
            }
            for ((k, count, _, _, _), (_, scattered, swapped)) in calls.iter().zip(&exchanges) {
                let (k, count, r) = (*k + 1, *count, rank as usize);
                let want: Vec<i32> = (0..count)
                    .map(|i| reduced(n, ReduceOp::Sum, |p| value::<i32>(p, r * count + i, k)))
                    .collect();
                let what = format!("call {} reduce_scatter", k - 1);
                assert_same(&what, &download(scattered, count)?, &want);
                let want: Vec<i32> = (0..n)
                    .flat_map(|p| (0..count).map(move |i| value::<i32>(p, r * count + i, k)))
                    .collect();
                let what = format!("call {} all_to_all", k - 1);
                assert_same(&what, &download(swapped, count * nu)?, &want);
            }
            for (k, count, _send, recv, gathered) in &calls {
                let want: Vec<i32> = (0..*count)
                    .map(|i| reduced(n, ReduceOp::Sum, |r| value::<i32>(r, i, *k)))
                    .collect();
                assert_same(
                    &format!("call {k} all_reduce"),
                    &download(recv, *count)?,
                    &want,
                );
                let want: Vec<i32> = (0..n).flat_map(|r| inputs::<i32>(r, *count, *k)).collect();
                assert_same(
                    &format!("call {k} all_gather"),
                    &download(gathered, count * n as usize)?,
                    &want,
                );
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Guards against a device barrier that lets a rank's next kernel start before every
/// rank's kernels before the barrier finished.
#[test]
fn barrier_on_orders_kernels_across_ranks() {
    in_process::run(3, job(2, 1, AlgorithmChoice::Auto, 1024), |comm| {
        let stream = comm.device().stream()?;
        for _ in 0..5 {
            comm.barrier_on(&stream)?;
        }
        comm.synchronize(&stream)
    })
    .unwrap();
}

/// Guards against ranks that disagree on a call hanging or computing garbage: every rank
/// gets an error naming the disagreement.
#[test]
fn allreduce_rejects_count_mismatch() {
    let results = in_process::run(3, job(1, 1, AlgorithmChoice::Auto, 1024), |comm| {
        let count = if comm.rank() == 1 { 9 } else { 8 };
        let send = comm.alloc_zeroed::<f32>(16)?;
        let mut recv = comm.alloc_zeroed::<f32>(16)?;
        let stream = comm.device().stream()?;
        let r = comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream);
        Ok(r.map_err(|e| e.to_string()))
    })
    .unwrap();
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().expect_err("a mismatched count must be refused");
        assert!(
            e.contains("disagree") && e.contains("9") && e.contains("8"),
            "rank {rank}: {e}"
        );
    }
}

/// Guards against ranks whose collective settings differ (here the eager slots' budget,
/// which sets how far a broadcast's root runs ahead) waiting for each other in vain or
/// writing past each other's slots: the first collective call fails on every rank, naming
/// the setting and both values.
#[test]
fn collectives_refuse_settings_that_differ_between_ranks() {
    let exchanges = oxccl::InProcessExchange::group(2, std::time::Duration::from_secs(20));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = exchanges
            .into_iter()
            .map(|exchange| {
                s.spawn(move || -> std::result::Result<(), String> {
                    let rank = exchange.rank_id();
                    let mut config = common::config().communicator;
                    if rank == 1 {
                        config.collectives.eager_bytes = 64 << 10;
                    }
                    let device = oxccl::Device::cpu(rank as usize);
                    let run = || -> Result<()> {
                        let mut comm =
                            Communicator::new(std::sync::Arc::new(exchange), device, config)?;
                        let stream = comm.device().stream()?;
                        let mut buf = comm.alloc_zeroed::<f32>(4)?;
                        comm.broadcast_in_place(&mut buf, 4, 0, &stream)?;
                        comm.synchronize(&stream)
                    };
                    run().map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, result) in results.iter().enumerate() {
        let e = result
            .as_ref()
            .expect_err("differing settings must be refused");
        assert!(
            e.contains("eager_bytes") && e.contains("1048576") && e.contains("65536"),
            "rank {rank}: {e}"
        );
    }
}

/// Guards against an all-to-all-v whose counts or displacements leave a buffer, or whose
/// counts disagree with a peer's, being launched.
#[test]
fn alltoallv_rejects_out_of_range_counts() {
    let results = in_process::run(2, job(1, 1, AlgorithmChoice::Auto, 1024), |comm| {
        let send = comm.alloc_zeroed::<u32>(10)?;
        let mut recv = comm.alloc_zeroed::<u32>(10)?;
        let stream = comm.device().stream()?;
        let mut errors = Vec::new();
        // A send range past the end.
        errors.push(comm.all_to_allv(
            &send,
            &[4, 4],
            &[0, 8],
            &mut recv,
            &[4, 4],
            &[0, 4],
            &stream,
        ));
        // Receive ranges that overlap.
        errors.push(comm.all_to_allv(
            &send,
            &[4, 4],
            &[0, 4],
            &mut recv,
            &[4, 4],
            &[0, 2],
            &stream,
        ));
        // One count per rank missing.
        errors.push(comm.all_to_allv(&send, &[4], &[0], &mut recv, &[4, 4], &[0, 4], &stream));
        // Counts that disagree with the peer's: rank 0 sends rank 1 three, rank 1 expects four.
        let three = if comm.rank() == 0 { 3 } else { 4 };
        errors.push(comm.all_to_allv(
            &send,
            &[4, three],
            &[0, 4],
            &mut recv,
            &[4, 4],
            &[0, 4],
            &stream,
        ));
        Ok(errors
            .into_iter()
            .map(|e| e.map_err(|e| e.to_string()))
            .collect::<Vec<_>>())
    })
    .unwrap();
    for (rank, errors) in results.iter().enumerate() {
        let wants = ["end past", "overlap", "one of each per rank", "disagree"];
        for (e, want) in errors.iter().zip(wants) {
            let e = e.as_ref().expect_err("must be refused");
            assert!(e.contains(want), "rank {rank}: `{e}` should say `{want}`");
        }
    }
}

/// Guards against a buffer too small being read or written past its end.
#[test]
fn short_buffers_are_refused() {
    in_process::run(2, job(1, 1, AlgorithmChoice::Auto, 1024), |comm| {
        let send = comm.alloc_zeroed::<f64>(8)?;
        let mut recv = comm.alloc_zeroed::<f64>(15)?;
        let stream = comm.device().stream()?;
        let e = comm
            .all_gather(&send, &mut recv, 8, &stream)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("recv buffer holds 15 elements, the call needs 16"),
            "{e}"
        );
        let e = comm
            .all_reduce(&send, &mut recv, 9, ReduceOp::Sum, &stream)
            .unwrap_err()
            .to_string();
        assert!(e.contains("send buffer holds 8"), "{e}");
        let e = comm
            .broadcast(&send, &mut recv, 4, 2, &stream)
            .unwrap_err()
            .to_string();
        assert!(e.contains("root 2 is not a rank"), "{e}");
        Ok(())
    })
    .unwrap();
}

/// Guards against an eager packet broadcast or reduce (data one way, the receivers' dones
/// let the sender run ahead by a few calls) whose sender writes an eager slot before its
/// receiver has read it out, waits for dones that never come, or leaves its owed dones to
/// be taken for a meeting's signals, and against a lockstep call after it that reuses a
/// slot a late rank still reads: the calls of `eager_steps` (runs of packet broadcasts from
/// one root, then from another root, packet reduces to a third, packet and direct
/// all-reduces, device barriers, and back), with one rank enqueuing late and another
/// stalling, every output checked at the end; as LL16 packets and as data.
#[test]
fn eager_packet_calls_back_to_back_with_late_ranks() {
    // 100 i32: packets for all but the large all-reduce (6400 bytes: direct, in rounds).
    for data_from in PACKET_FORMS {
        eager_calls_case(
            with_packet_data(job(2, 64, AlgorithmChoice::Auto, 1024), data_from),
            &eager_steps(),
            100,
            &format!("memory channels, data from {data_from} bytes"),
        );
    }
}

/// Guards against an eager packet sender that overwrites a set of eager slots its
/// receiver has not read out, or waits for the wrong dones, once a run of calls is longer
/// than its depth: runs of 150 broadcasts and reduces (`long_eager_runs`) at the default
/// depth (28 sets here) and at a depth of 5 sets (not a multiple of the 2 calls a done
/// covers there), one receiver starting late, every output checked; as LL16 packets and
/// as data.
#[test]
fn eager_packet_runs_longer_than_their_depth() {
    let runs = [
        (None, 28, PACKET_FORMS[0]),
        (Some(5 * 3 * 12288), 5, PACKET_FORMS[0]),
        (Some(5 * 3 * 12288), 5, PACKET_FORMS[1]),
    ];
    for (eager_bytes, sets, data_from) in runs {
        let mut config = with_packet_data(job(1, 1, AlgorithmChoice::Auto, 1024), data_from);
        if let Some(bytes) = eager_bytes {
            config.communicator.collectives.eager_bytes = bytes;
        }
        // 4 KiB messages, 3 ranks: 8 KiB packet slots and 4 KiB data slots, 36 KiB a set.
        let layout_sets = oxccl_kernels::collectives::ScratchLayout::new(
            3,
            4096,
            1024,
            config.communicator.collectives.eager_bytes,
        )
        .eager_sets;
        assert_eq!(layout_sets, sets);
        eager_calls_case(
            config,
            &long_eager_runs(),
            16,
            &format!("memory channels, {sets} eager sets, data from {data_from} bytes"),
        );
    }
}

/// Guards against a device barrier after eager packet broadcasts that takes the dones the
/// root is still owed for the peers' arrival at the barrier.
#[test]
fn barrier_after_eager_packet_broadcasts_waits_for_the_last_rank() {
    static LAST_ARRIVED: AtomicBool = AtomicBool::new(false);
    for data_from in PACKET_FORMS {
        let config = with_packet_data(job(2, 64, AlgorithmChoice::Auto, 1024), data_from);
        barrier_after_eager_broadcasts_case(config, 100, &LAST_ARRIVED);
    }
}
