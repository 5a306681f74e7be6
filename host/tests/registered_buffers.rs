//! Collectives on buffers registered with `register_collective_buffer` (zero-copy: kernels
//! read the peers' buffers in place): every type and operation, in place and not, 1 to 4
//! ranks, one block and several; ranks that registered and ranks that did not in one call;
//! calls back to back with the host rewriting its buffers between them; and the
//! registration's own errors. Over Ethernet, where ranks cannot read each other's buffers,
//! the port all-reduce puts from a registered input instead of staging it.

mod common;

use common::assert_same;
use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{
    Communicator, DeviceBuffer, Error, ReduceElement, ReduceOp, Result, TransportChoice, bf16, f16,
};
use oxccl_device::launch::LaunchConfig;

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// A job whose all-reduces run direct with `blocks` blocks of `threads` threads and small
/// rounds (so that in place on rank 2 and up takes several pieces).
fn job(blocks: u32, threads: u32) -> InProcessConfig {
    let mut config = common::config();
    let c = &mut config.communicator.collectives;
    c.launch = Some(LaunchConfig::grid(blocks).block(threads));
    c.algorithm = AlgorithmChoice::Use(Algorithm::Direct);
    c.round_bytes = 256;
    config
}

/// Rank `rank`'s input element `i` in call `call`: small integers, exact in every type.
fn value<T: ReduceElement>(rank: u32, i: usize, call: u32) -> T {
    let v = ((rank as usize * 7 + i * 13 + call as usize * 5) % 23) as f64;
    T::from_f64(v + 1.0)
}

fn inputs<T: ReduceElement>(rank: u32, len: usize, call: u32) -> Vec<T> {
    (0..len).map(|i| value::<T>(rank, i, call)).collect()
}

/// The reduction by `op` of every rank's element `i` of call `call`, in rank order.
fn reduced<T: ReduceElement>(ranks: u32, op: ReduceOp, i: usize, call: u32) -> T {
    let mut acc = value::<T>(0, i, call);
    for r in 1..ranks {
        acc = acc.combine(value::<T>(r, i, call), op);
    }
    acc.finish(op, ranks)
}

/// Fills `buf` with `data` and a marker after it (a kernel writing past the data shows).
fn fill<T: ReduceElement>(buf: &mut DeviceBuffer<T>, data: &[T]) -> Result<()> {
    let mut host = data.to_vec();
    host.push(T::from_f64(99.0));
    buf.copy_from_host_at(0, &host)
}

/// The first `len` elements of `buf`, after checking the marker after them.
fn read<T: ReduceElement>(buf: &DeviceBuffer<T>, len: usize) -> Result<Vec<T>> {
    let mut host = vec![T::from_f64(0.0); len + 1];
    buf.copy_to_host_at(0, &mut host)?;
    assert_eq!(
        host[len].to_f64(),
        99.0,
        "the element past the output was written"
    );
    host.truncate(len);
    Ok(host)
}

/// Every op, count and placement of `T` on registered buffers, checked on every rank.
fn registered_case<T: ReduceElement>(comm: &mut Communicator, counts: &[usize]) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    let most = counts.iter().copied().max().unwrap_or(0) + 1;
    let mut send = comm.alloc::<T>(most)?;
    let mut recv = comm.alloc::<T>(most)?;
    comm.register_collective_buffer(&send)?;
    comm.register_collective_buffer(&recv)?;
    for (call, &count) in counts.iter().enumerate() {
        let call = call as u32;
        for op in OPS {
            let want: Vec<T> = (0..count).map(|i| reduced(n, op, i, call)).collect();
            let what = format!("{:?} {op:?} n={count} ranks={n}", T::TYPE);
            fill(&mut send, &inputs::<T>(rank, count, call))?;
            fill(&mut recv, &vec![T::from_f64(0.0); count])?;
            comm.all_reduce(&send, &mut recv, count, op, &stream)?;
            comm.synchronize(&stream)?;
            assert_same(&format!("{what} out of place"), &read(&recv, count)?, &want);
            fill(&mut send, &inputs::<T>(rank, count, call))?;
            comm.all_reduce_in_place(&mut send, count, op, &stream)?;
            comm.synchronize(&stream)?;
            assert_same(&format!("{what} in place"), &read(&send, count)?, &want);
        }
    }
    comm.deregister_collective_buffer(&send, &stream)?;
    comm.deregister_collective_buffer(&recv, &stream)
}

/// [`registered_case`] of every type, for counts of one element to several rounds.
fn every_type(comm: &mut Communicator) -> Result<()> {
    let counts = [1usize, 7, 1000, 4099];
    registered_case::<f32>(comm, &counts)?;
    registered_case::<f64>(comm, &counts)?;
    registered_case::<f16>(comm, &counts)?;
    registered_case::<bf16>(comm, &counts)?;
    registered_case::<i8>(comm, &counts)?;
    registered_case::<u8>(comm, &counts)?;
    registered_case::<i32>(comm, &counts)?;
    registered_case::<u32>(comm, &counts)?;
    registered_case::<i64>(comm, &counts)?;
    registered_case::<u64>(comm, &counts)
}

/// Guards against a zero-copy all-reduce that reads a peer's buffer at the wrong offset,
/// combines out of rank order (in place on rank 2 and up reads its own input after
/// overwriting it), or mishandles a type, an operation or a grid.
#[test]
fn registered_all_reduce_every_type_op_and_placement() {
    for (ranks, blocks, threads) in [(1, 1, 1), (2, 1, 1), (2, 3, 2), (3, 2, 1), (4, 1, 2)] {
        in_process::run(ranks, job(blocks, threads), every_type).unwrap();
    }
}

/// A job whose ranks reach each other over Ethernet only: all-reduce takes the port
/// algorithm, in rounds of `round_bytes`, on `blocks` blocks of one thread, and puts from
/// registered inputs at every size.
fn ethernet_job(blocks: u32, round_bytes: u64) -> InProcessConfig {
    let mut config = job(blocks, 1);
    config.communicator.transport = TransportChoice::Ethernet;
    let c = &mut config.communicator.collectives;
    c.algorithm = AlgorithmChoice::Use(Algorithm::Ports);
    c.port_round_bytes = round_bytes;
    // From the first byte, not from the emulator's default size.
    c.port_direct_bytes = Some(0);
    config
}

/// Guards against a port all-reduce that puts a registered input from the wrong offset,
/// reduces in place over a round the proxy has not sent yet, or mixes ranks that put from
/// their input with ranks that stage it (three ranks in place: the third stages), in one
/// round and in several; every type and operation, over Ethernet.
#[test]
fn registered_port_all_reduce_over_ethernet_every_type_op_and_placement() {
    for (ranks, blocks) in [(2, 1), (2, 3), (3, 2), (4, 1)] {
        in_process::run(ranks, ethernet_job(blocks, 4096), |comm| {
            assert_eq!(comm.all_reduce_algorithm(1 << 20)?, Algorithm::Ports);
            every_type(comm)
        })
        .unwrap();
    }
}

/// Guards against a port all-reduce that writes a registered buffer the proxy still sends
/// from (in place, a round before its puts were executed), and against calls queued
/// behind each other with no host barrier that do: chains of in-place calls on one buffer
/// (each call's input is the last one's output) and out-of-place calls from it, all
/// enqueued back to back, checked after one synchronize; one round and several.
#[test]
fn registered_port_calls_queued_back_to_back() {
    for ranks in [2, 3] {
        in_process::run(ranks, ethernet_job(1, 16 << 10), |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let stream = comm.device().stream()?;
            let calls = 6u32;
            for count in [1000usize, 40_000] {
                let mut buf = comm.alloc::<u64>(count + 1)?;
                let mut outs = Vec::new();
                for _ in 0..calls {
                    let mut out = comm.alloc::<u64>(count + 1)?;
                    fill(&mut out, &vec![0; count])?;
                    outs.push(out);
                }
                comm.register_collective_buffer(&buf)?;
                for out in &outs {
                    comm.register_collective_buffer(out)?;
                }
                fill(&mut buf, &inputs::<u64>(rank, count, 0))?;
                for out in outs.iter_mut() {
                    comm.all_reduce_in_place(&mut buf, count, ReduceOp::Sum, &stream)?;
                    comm.all_reduce(&buf, out, count, ReduceOp::Sum, &stream)?;
                }
                comm.synchronize(&stream)?;
                // After call k in place, element i is n^(k - 1) times the ranks' sum; the
                // out-of-place call after it sums that once more.
                let sum = |i: usize| reduced::<u64>(n, ReduceOp::Sum, i, 0);
                for (k, out) in outs.iter().enumerate() {
                    let scale = (n as u64).pow(k as u32 + 1);
                    let want: Vec<u64> = (0..count).map(|i| sum(i) * scale).collect();
                    assert_same(
                        &format!("{count}: out of place after call {k}"),
                        &read(out, count)?,
                        &want,
                    );
                }
                let scale = (n as u64).pow(calls - 1);
                let want: Vec<u64> = (0..count).map(|i| sum(i) * scale).collect();
                assert_same(&format!("{count}: in place"), &read(&buf, count)?, &want);
                for out in &outs {
                    comm.deregister_collective_buffer(out, &stream)?;
                }
                comm.deregister_collective_buffer(&buf, &stream)?;
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Guards against a port all-reduce that completes while the proxy may still read its
/// registered input: each rank rewrites its input the moment its own call is complete, with
/// no host barrier, out of place and in place, many rounds a call; a put that read late
/// would carry the next call's data. Registration and deregistration come and go too (the
/// proxy's ids are given back and taken again).
#[test]
fn registered_port_calls_back_to_back_with_host_writes_between() {
    // Two ranks take the one-shot, three the two-shot (which puts from the output too).
    for ranks in [2, 3] {
        let mut config = ethernet_job(1, 16 << 10);
        config.communicator.collectives.registered_buffers = 2;
        in_process::run(ranks, config, |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let stream = comm.device().stream()?;
            let count = 40_000;
            for round in 0..3u32 {
                let mut send = comm.alloc::<u32>(count + 1)?;
                let mut recv = comm.alloc::<u32>(count + 1)?;
                comm.register_collective_buffer(&send)?;
                comm.register_collective_buffer(&recv)?;
                for call in 0..40u32 {
                    let call = round * 100 + call;
                    let want: Vec<u32> = (0..count)
                        .map(|i| reduced(n, ReduceOp::Sum, i, call))
                        .collect();
                    fill(&mut send, &inputs::<u32>(rank, count, call))?;
                    fill(&mut recv, &vec![0; count])?;
                    comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
                    comm.synchronize(&stream)?;
                    // At once: a late read of the input would send this.
                    fill(&mut send, &vec![7; count])?;
                    assert_same(&format!("call {call}"), &read(&recv, count)?, &want);
                    fill(&mut send, &inputs::<u32>(rank, count, call))?;
                    comm.all_reduce_in_place(&mut send, count, ReduceOp::Sum, &stream)?;
                    comm.synchronize(&stream)?;
                    let got = read(&send, count)?;
                    fill(&mut send, &vec![7; count])?;
                    assert_same(&format!("call {call} in place"), &got, &want);
                }
                comm.deregister_collective_buffer(&send, &stream)?;
                comm.deregister_collective_buffer(&recv, &stream)?;
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Guards against ranks that take different paths when some registered their buffers and
/// some did not (one reading a peer's buffer in place while the peer expects staging):
/// every rank registers a buffer, but only some call with it.
#[test]
fn some_ranks_registered_others_not() {
    for ranks in [2, 3] {
        in_process::run(ranks, job(2, 1), |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let stream = comm.device().stream()?;
            let count = 3001;
            let mut registered = comm.alloc::<i32>(count + 1)?;
            let mut plain = comm.alloc::<i32>(count + 1)?;
            let mut out = comm.alloc::<i32>(count + 1)?;
            comm.register_collective_buffer(&registered)?;
            comm.register_collective_buffer(&out)?;
            for call in 0..6u32 {
                // Call 0..3: rank `call % n` alone uses its unregistered buffer; call 3..6:
                // only the input of rank `call % n` is registered, its output not.
                let odd = rank == call % n;
                let want: Vec<i32> = (0..count)
                    .map(|i| reduced(n, ReduceOp::Sum, i, call))
                    .collect();
                let data = inputs::<i32>(rank, count, call);
                let zeros = vec![0; count];
                let output = match (odd, call < 3) {
                    (true, true) => {
                        fill(&mut plain, &data)?;
                        fill(&mut out, &zeros)?;
                        comm.all_reduce(&plain, &mut out, count, ReduceOp::Sum, &stream)?;
                        &out
                    }
                    (true, false) => {
                        fill(&mut registered, &data)?;
                        fill(&mut plain, &zeros)?;
                        comm.all_reduce(&registered, &mut plain, count, ReduceOp::Sum, &stream)?;
                        &plain
                    }
                    _ => {
                        fill(&mut registered, &data)?;
                        fill(&mut out, &zeros)?;
                        comm.all_reduce(&registered, &mut out, count, ReduceOp::Sum, &stream)?;
                        &out
                    }
                };
                comm.synchronize(&stream)?;
                assert_same(
                    &format!("call {call} rank {rank}"),
                    &read(output, count)?,
                    &want,
                );
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Guards against a zero-copy all-reduce that lets a rank return while a peer still reads
/// its buffer: each rank rewrites its buffer the moment its own call is complete, with no
/// host barrier, many times; a peer that read late would get the next call's data.
#[test]
fn registered_calls_back_to_back_with_host_writes_between() {
    for ranks in [2, 3] {
        in_process::run(ranks, job(1, 1), |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let stream = comm.device().stream()?;
            let count = 20_000;
            let mut buf = comm.alloc::<u32>(count + 1)?;
            comm.register_collective_buffer(&buf)?;
            for call in 0..200u32 {
                fill(&mut buf, &inputs::<u32>(rank, count, call))?;
                comm.all_reduce_in_place(&mut buf, count, ReduceOp::Sum, &stream)?;
                comm.synchronize(&stream)?;
                let got = read(&buf, count)?;
                let want: Vec<u32> = (0..count)
                    .map(|i| reduced(n, ReduceOp::Sum, i, call))
                    .collect();
                assert_same(&format!("call {call} rank {rank}"), &got, &want);
            }
            Ok(())
        })
        .unwrap();
    }
}

/// Guards against registered and staged calls that overwrite each other's data when they
/// follow each other with no host barrier and changing sizes: all checked at the end.
#[test]
fn registered_and_staged_calls_back_to_back() {
    in_process::run(3, job(2, 1), |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let stream = comm.device().stream()?;
        let counts = [5usize, 900, 64, 1, 2000, 33, 700, 3, 1500];
        let mut calls = Vec::new();
        for (k, &count) in counts.iter().cycle().take(24).enumerate() {
            let mut send = comm.alloc::<i64>(count + 1)?;
            let mut recv = comm.alloc::<i64>(count + 1)?;
            fill(&mut send, &inputs::<i64>(rank, count, k as u32))?;
            fill(&mut recv, &vec![0; count])?;
            if k % 3 != 0 {
                comm.register_collective_buffer(&send)?;
                comm.register_collective_buffer(&recv)?;
            }
            comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
            calls.push((k as u32, count, send, recv));
        }
        comm.synchronize(&stream)?;
        for (k, count, _send, recv) in &calls {
            let want: Vec<i64> = (0..*count)
                .map(|i| reduced(n, ReduceOp::Sum, i, *k))
                .collect();
            assert_same(&format!("call {k}"), &read(recv, *count)?, &want);
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against registrations that overlap, overflow the table, or outlive their
/// deregistration, and against a freed slot that cannot be used again.
#[test]
fn registration_errors_are_clear_and_slots_are_reused() {
    let mut config = job(1, 1);
    config.communicator.collectives.registered_buffers = 1;
    in_process::run(2, config, |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let stream = comm.device().stream()?;
        let a = comm.alloc::<f32>(100)?;
        let mut b = comm.alloc::<f32>(101)?;
        comm.register_collective_buffer(&a)?;
        match comm.register_collective_buffer(&a) {
            Err(Error::InvalidUsage(why)) => assert!(why.contains("registered already"), "{why}"),
            other => panic!("registering twice: {other:?}"),
        }
        match comm.register_collective_buffer(&b) {
            Err(Error::InvalidUsage(why)) => assert!(why.contains("slots are taken"), "{why}"),
            other => panic!("a full table: {other:?}"),
        }
        match comm.deregister_collective_buffer(&b, &stream) {
            Err(Error::InvalidUsage(why)) => assert!(why.contains("not registered"), "{why}"),
            other => panic!("deregistering an unknown buffer: {other:?}"),
        }
        comm.deregister_collective_buffer(&a, &stream)?;
        comm.register_collective_buffer(&b)?;
        fill(&mut b, &inputs::<f32>(rank, 100, 1))?;
        comm.all_reduce_in_place(&mut b, 100, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        let want: Vec<f32> = (0..100).map(|i| reduced(n, ReduceOp::Sum, i, 1)).collect();
        assert_same("after reuse", &read(&b, 100)?, &want);
        Ok(())
    })
    .unwrap();
}

/// Guards against a zero-copy in-place all-reduce on rank 2 and up, which reduces its chunk
/// piece by piece through its scratch, letting a thread start the last (shorter) piece
/// while another still copies out the piece before: many calls, two threads, a chunk that
/// ends in a short piece.
#[test]
fn in_place_on_later_ranks_with_a_short_last_piece() {
    in_process::run(4, job(1, 2), |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let stream = comm.device().stream()?;
        let count = 1000;
        let mut buf = comm.alloc::<f32>(count + 1)?;
        comm.register_collective_buffer(&buf)?;
        for call in 0..300u32 {
            fill(&mut buf, &inputs::<f32>(rank, count, call))?;
            comm.all_reduce_in_place(&mut buf, count, ReduceOp::Sum, &stream)?;
            comm.synchronize(&stream)?;
            let want: Vec<f32> = (0..count)
                .map(|i| reduced(n, ReduceOp::Sum, i, call))
                .collect();
            assert_same(
                &format!("call {call} rank {rank}"),
                &read(&buf, count)?,
                &want,
            );
        }
        Ok(())
    })
    .unwrap();
}

/// All-gather, reduce-scatter, broadcast and reduce (roots 0 and last), all-to-all of `T`,
/// in place and not, and all-to-all-v (uneven counts, some zero), on
/// buffers each rank registers unless `plain_rank` names it; every result checked.
fn movers_case<T: ReduceElement>(
    comm: &mut Communicator,
    counts: &[usize],
    plain_rank: Option<u32>,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let nu = n as usize;
    let stream = comm.device().stream()?;
    let most = (counts.iter().copied().max().unwrap_or(0) + 3) * nu + 1;
    let mut send = comm.alloc::<T>(most)?;
    let mut recv = comm.alloc::<T>(most)?;
    // Every rank registers (a collective call); the plain rank then calls with buffers of
    // its own that are not.
    comm.register_collective_buffer(&send)?;
    comm.register_collective_buffer(&recv)?;
    let (mut plain_send, mut plain_recv) = (comm.alloc::<T>(most)?, comm.alloc::<T>(most)?);
    let plain = plain_rank == Some(rank);
    let (send, recv) = match plain {
        true => (&mut plain_send, &mut plain_recv),
        false => (&mut send, &mut recv),
    };
    for (call, &count) in counts.iter().enumerate() {
        let call = call as u32;
        let what = |c: &str| format!("{c} {:?} n={count} ranks={n} plain={plain_rank:?}", T::TYPE);
        let zeros = vec![T::from_f64(0.0); count * nu];
        // All-gather.
        let want: Vec<T> = (0..n).flat_map(|p| inputs::<T>(p, count, call)).collect();
        fill(send, &inputs::<T>(rank, count, call))?;
        fill(recv, &zeros)?;
        comm.all_gather(send, recv, count, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(&what("all_gather"), &read(recv, count * nu)?, &want);
        let mut mine = zeros.clone();
        mine[rank as usize * count..][..count].copy_from_slice(&inputs::<T>(rank, count, call));
        fill(send, &mine)?;
        comm.all_gather_in_place(send, count, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(
            &what("all_gather in place"),
            &read(send, count * nu)?,
            &want,
        );
        // Reduce-scatter (sum): block `rank` of every rank's input, reduced; in place, the
        // rest of the buffer as it was.
        let want: Vec<T> = (0..count)
            .map(|i| reduced(n, ReduceOp::Sum, rank as usize * count + i, call))
            .collect();
        fill(send, &inputs::<T>(rank, count * nu, call))?;
        fill(recv, &zeros[..count])?;
        comm.reduce_scatter(send, recv, count, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(&what("reduce_scatter"), &read(recv, count)?, &want);
        let mut whole = inputs::<T>(rank, count * nu, call);
        fill(send, &whole)?;
        comm.reduce_scatter_in_place(send, count, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        whole[rank as usize * count..][..count].copy_from_slice(&want);
        assert_same(
            &what("reduce_scatter in place"),
            &read(send, count * nu)?,
            &whole,
        );
        // Broadcast from the first and the last rank.
        for root in [0, n - 1] {
            let want = inputs::<T>(root, count, call);
            fill(send, &inputs::<T>(rank, count, call))?;
            fill(recv, &zeros[..count])?;
            comm.broadcast(send, recv, count, root, &stream)?;
            comm.synchronize(&stream)?;
            assert_same(&what("broadcast"), &read(recv, count)?, &want);
            fill(send, &inputs::<T>(rank, count, call))?;
            comm.broadcast_in_place(send, count, root, &stream)?;
            comm.synchronize(&stream)?;
            assert_same(&what("broadcast in place"), &read(send, count)?, &want);
        }
        // All-to-all: block `r` of rank `p`'s input lands in block `p` of rank `r`'s output.
        let want: Vec<T> = (0..n)
            .flat_map(|p| (0..count).map(move |i| value::<T>(p, rank as usize * count + i, call)))
            .collect();
        fill(send, &inputs::<T>(rank, count * nu, call))?;
        fill(recv, &zeros)?;
        comm.all_to_all(send, recv, count, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(&what("all_to_all"), &read(recv, count * nu)?, &want);
        fill(send, &inputs::<T>(rank, count * nu, call))?;
        comm.all_to_all_in_place(send, count, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(
            &what("all_to_all in place"),
            &read(send, count * nu)?,
            &want,
        );
        // Reduce (sum) to the first and the last rank.
        for root in [0, n - 1] {
            let want: Vec<T> = (0..count)
                .map(|i| reduced(n, ReduceOp::Sum, i, call))
                .collect();
            fill(send, &inputs::<T>(rank, count, call))?;
            fill(recv, &zeros[..count])?;
            comm.reduce(send, recv, count, ReduceOp::Sum, root, &stream)?;
            comm.synchronize(&stream)?;
            if rank == root {
                assert_same(&what("reduce"), &read(recv, count)?, &want);
            }
            comm.reduce_in_place(send, count, ReduceOp::Sum, root, &stream)?;
            comm.synchronize(&stream)?;
            if rank == root {
                assert_same(&what("reduce in place"), &read(send, count)?, &want);
            }
        }
        // All-to-all-v: uneven counts (some zero), gaps between the parts.
        let sc = |from: u32, to: u32| match (from + to) % 3 {
            0 => 0,
            k => count + ((from + 2 * to + k) % 3) as usize,
        };
        let displs = |counts: &dyn Fn(u32) -> usize, gap: usize| -> Vec<usize> {
            (0..n)
                .scan(0, |at, p| {
                    let here = *at;
                    *at += counts(p) + gap;
                    Some(here)
                })
                .collect()
        };
        let send_counts: Vec<usize> = (0..n).map(|p| sc(rank, p)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|p| sc(p, rank)).collect();
        let send_displs = displs(&|p| sc(rank, p), 1);
        let recv_displs = displs(&|p| sc(p, rank), 2);
        let recv_len = recv_displs[nu - 1] + recv_counts[nu - 1] + 2;
        let mut want = vec![T::from_f64(0.0); recv_len];
        for p in 0..n {
            let theirs = displs(&|q| sc(p, q), 1)[rank as usize];
            for i in 0..sc(p, rank) {
                want[recv_displs[p as usize] + i] = value::<T>(p, theirs + i, call);
            }
        }
        let send_len = send_displs[nu - 1] + send_counts[nu - 1] + 1;
        fill(send, &inputs::<T>(rank, send_len, call))?;
        fill(recv, &vec![T::from_f64(0.0); recv_len])?;
        comm.all_to_allv(
            send,
            &send_counts,
            &send_displs,
            recv,
            &recv_counts,
            &recv_displs,
            &stream,
        )?;
        comm.synchronize(&stream)?;
        assert_same(&what("all_to_allv"), &read(recv, recv_len)?, &want);
    }
    Ok(())
}

/// Guards against an all-gather, reduce-scatter, broadcast, reduce, all-to-all or
/// all-to-all-v that reads a peer's registered
/// buffer at the wrong place, lets a rank return while peers still read its input, or
/// takes another path than a peer (one rank's buffers not registered; an in-place
/// all-to-all, which must stage, beside out-of-place ones).
#[test]
fn registered_all_gather_reduce_scatter_broadcast_reduce_all_to_all_v() {
    for (ranks, blocks, threads) in [(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 2, 1), (4, 1, 2)] {
        in_process::run(ranks, job(blocks, threads), |comm| {
            let counts = [1usize, 7, 1000, 3001];
            movers_case::<i32>(comm, &counts, None)?;
            movers_case::<u8>(comm, &counts, None)?;
            movers_case::<f16>(comm, &counts, None)?;
            movers_case::<i32>(comm, &counts, Some(comm.size() - 1))?;
            movers_case::<f64>(comm, &counts, Some(0))
        })
        .unwrap();
    }
}
