//! All-gather, reduce-scatter, broadcast, reduce, all-to-all and all-to-all-v over port
//! channels, through the proxy: forced
//! on one node (port channels over host IPC) and chosen by themselves between ranks that
//! reach each other over Ethernet.

mod common;

use common::eager_steps::{
    barrier_after_eager_broadcasts_case, eager_calls_case, eager_steps, late_last_rank_at_barrier,
};
use common::gather_scatter_cases::{all_gather_case, inputs, marked, read, reduce_scatter_case};
use common::{
    TypedCase, assert_same, combined, every_type, small_round_job as job, small_value as value,
};
use oxccl::collectives::{Algorithm, AlgorithmChoice, Collective};
use oxccl::in_process;
use oxccl::{Communicator, ReduceElement, ReduceOp, Result, TransportChoice};
use std::sync::atomic::AtomicBool;

/// Elements rank `from` sends rank `to` in an all-to-all-v of about `count` each: half,
/// once or one and a half times `count` by the pair, none for some pairs.
fn v_count(from: u32, to: u32, count: usize) -> usize {
    if (from + to) % 4 == 3 {
        return 0;
    }
    count * (1 + (from + 2 * to) as usize % 3) / 2
}

/// Displacements of `counts` laid out in order with `gap` elements between them, and the
/// length of it all.
fn v_displs(counts: &[usize], gap: usize) -> (Vec<usize>, usize) {
    let mut at = 0;
    let displs = counts
        .iter()
        .map(|&c| {
            let here = at;
            at += c + gap;
            here
        })
        .collect();
    (displs, at)
}

/// All-to-all-v of `T` with uneven and zero counts and gaps between the parts: every part
/// lands where its receiver said, and nothing of the output outside them is written.
fn all_to_allv_case<T: ReduceElement>(
    comm: &mut Communicator,
    count: usize,
    call: u32,
) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    let sends = |from: u32| {
        (0..n)
            .map(|to| v_count(from, to, count))
            .collect::<Vec<_>>()
    };
    let send_counts = sends(rank);
    let (send_displs, send_len) = v_displs(&send_counts, 1);
    let recv_counts: Vec<usize> = (0..n).map(|from| v_count(from, rank, count)).collect();
    let (recv_displs, recv_len) = v_displs(&recv_counts, 2);
    let mut want = vec![T::from_f64(0.0); recv_len];
    for from in 0..n {
        let (their_displs, _) = v_displs(&sends(from), 1);
        for j in 0..recv_counts[from as usize] {
            let i = their_displs[rank as usize] + j;
            want[recv_displs[from as usize] + j] = value::<T>(from, i, call);
        }
    }
    let send = marked(comm, &inputs::<T>(rank, send_len, call))?;
    let mut recv = marked(comm, &vec![T::from_f64(0.0); recv_len])?;
    comm.all_to_allv(
        &send,
        &send_counts,
        &send_displs,
        &mut recv,
        &recv_counts,
        &recv_displs,
        &stream,
    )?;
    comm.synchronize(&stream)?;
    let what = format!("all_to_allv {:?} n={count} ranks={n}", T::TYPE);
    assert_same(&what, &read(&what, &recv, recv_len)?, &want);
    Ok(())
}

/// [`case`] for [`every_type`].
struct PortCase;

impl TypedCase for PortCase {
    fn run<T: ReduceElement>(&self, comm: &mut Communicator, counts: &[usize]) -> Result<()> {
        case::<T>(comm, counts)
    }
}

/// All-gather, reduce-scatter (every operation), all-to-all, all-to-all-v, reduce and
/// broadcast (first and last root) of `T`, in place and not (all-to-all-v: not), for each
/// count, over port channels; every result checked on every rank.
fn case<T: ReduceElement>(comm: &mut Communicator, counts: &[usize]) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    // Recursive doubling (halving), where forced, is taken by all-gather, reduce-scatter and
    // broadcast, on a power of two of ranks; its reductions combine as a tree.
    let doubling = match comm.config().collectives.algorithm {
        AlgorithmChoice::Use(Algorithm::Doubling) if n.is_power_of_two() => Algorithm::Doubling,
        _ => Algorithm::Ports,
    };
    for c in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
    ] {
        assert_eq!(comm.collective_algorithm(c, 4096)?, doubling, "{c}");
    }
    for c in [
        Collective::Reduce,
        Collective::AllToAll,
        Collective::AllToAllV,
    ] {
        assert_eq!(comm.collective_algorithm(c, 4096)?, Algorithm::Ports, "{c}");
    }
    let tree = doubling == Algorithm::Doubling;
    let nu = n as usize;
    let stream = comm.device().stream()?;
    for (call, &count) in counts.iter().enumerate() {
        let call = call as u32;
        let what = |c: &str| format!("{c} {:?} n={count} ranks={n}", T::TYPE);
        let zeros = vec![T::from_f64(0.0); count * nu];
        all_gather_case::<T>(comm, count, call, &stream)?;
        // Reduce-scatter: block `rank` of every rank's input, reduced in rank order (or as a
        // tree, by recursive halving).
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ] {
            let at = rank as usize * count;
            reduce_scatter_case(comm, count, call, op, &stream, |i| {
                combined(n, op, tree, &|p| value::<T>(p, at + i, call))
            })?;
        }
        // All-to-all: block `r` of rank `p`'s input lands in block `p` of rank `r`'s output.
        let want: Vec<T> = (0..n)
            .flat_map(|p| (0..count).map(move |i| value::<T>(p, rank as usize * count + i, call)))
            .collect();
        let send = marked(comm, &inputs::<T>(rank, count * nu, call))?;
        let mut recv = marked(comm, &zeros)?;
        comm.all_to_all(&send, &mut recv, count, &stream)?;
        let mut in_place = marked(comm, &inputs::<T>(rank, count * nu, call))?;
        comm.all_to_all_in_place(&mut in_place, count, &stream)?;
        comm.synchronize(&stream)?;
        assert_same(&what("all_to_all"), &read("", &recv, count * nu)?, &want);
        let got = read("all_to_all in place", &in_place, count * nu)?;
        assert_same(&what("all_to_all in place"), &got, &want);
        all_to_allv_case::<T>(comm, count, call)?;
        // Reduce (sum and max) to the first and the last rank; the others' outputs untouched.
        for (root, op) in [(0, ReduceOp::Sum), (n - 1, ReduceOp::Max)] {
            let want: Vec<T> = (0..count)
                .map(|i| combined(n, op, false, &|p| value::<T>(p, i, call)))
                .collect();
            let mine = inputs::<T>(rank, count, call);
            let send = marked(comm, &mine)?;
            let mut recv = marked(comm, &zeros[..count])?;
            comm.reduce(&send, &mut recv, count, op, root, &stream)?;
            let mut in_place = marked(comm, &mine)?;
            comm.reduce_in_place(&mut in_place, count, op, root, &stream)?;
            comm.synchronize(&stream)?;
            let what = what(&format!("reduce {op:?} to {root}"));
            let (out, kept) = if rank == root {
                (want.clone(), want)
            } else {
                (zeros[..count].to_vec(), mine)
            };
            assert_same(&what, &read(&what, &recv, count)?, &out);
            assert_same(
                &format!("{what} in place"),
                &read(&what, &in_place, count)?,
                &kept,
            );
        }
        // Broadcast from the first and the last rank.
        for root in [0, n - 1] {
            let want = inputs::<T>(root, count, call);
            let send = marked(comm, &inputs::<T>(rank, count, call))?;
            let mut recv = marked(comm, &zeros[..count])?;
            comm.broadcast(&send, &mut recv, count, root, &stream)?;
            let mut in_place = marked(comm, &inputs::<T>(rank, count, call))?;
            comm.broadcast_in_place(&mut in_place, count, root, &stream)?;
            comm.synchronize(&stream)?;
            let what = what(&format!("broadcast from {root}"));
            assert_same(&what, &read(&what, &recv, count)?, &want);
            assert_same(&what, &read(&what, &in_place, count)?, &want);
        }
    }
    Ok(())
}

/// Guards against a port all-gather, reduce-scatter, all-to-all, all-to-all-v, reduce or
/// broadcast that puts into the wrong slot, reads a slot before its signal, reuses a set of
/// the scratch before the peers are done with it (many rounds per call, calls of all six
/// back to back with no host barrier), reduces out of rank order, writes past its output or
/// between the parts of an all-to-all-v, or mishandles a type, an operation, a root, a
/// count of zero or a grid.
#[test]
fn port_collectives_every_type_and_placement() {
    let shapes = [(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 1, 2), (4, 2, 1)];
    every_type_and_placement(Algorithm::Ports, &shapes);
}

/// As [`port_collectives_every_type_and_placement`], with recursive doubling forced: the
/// all-gather and broadcast by recursive doubling and the reduce-scatter by recursive
/// halving (a power of two of ranks; three take the ports) between the port collectives,
/// back to back. Guards against one that sends the wrong rounds or halves at a step or to
/// the wrong place, packs them wrong, combines what has not arrived, finishes (`Avg`) more
/// than once, or reuses an area or a set of the scratch too early.
#[test]
fn doubling_collectives_among_the_port_collectives() {
    let shapes = [(2, 1, 1), (3, 1, 2), (4, 2, 1), (8, 1, 1)];
    every_type_and_placement(Algorithm::Doubling, &shapes);
}

/// Runs every case on each (ranks, blocks, threads) shape with `algo` forced.
fn every_type_and_placement(algo: Algorithm, shapes: &[(u32, u32, u32)]) {
    for &(ranks, blocks, threads) in shapes {
        in_process::run(
            ranks,
            job(AlgorithmChoice::Use(algo), blocks, threads),
            |comm| every_type(comm, &PortCase),
        )
        .unwrap();
    }
}

/// Guards against collectives trying memory channels between ranks that reach each other
/// only over Ethernet: every one of them takes ports by itself and gives the right results,
/// also with memory staged through host buffers as a GPU's is.
#[test]
fn over_ethernet_every_collective_runs_over_ports() {
    for staging in [false, true] {
        let mut config = job(AlgorithmChoice::Auto, 1, 1);
        config.communicator.transport = TransportChoice::Ethernet;
        config.communicator.ethernet_staging = staging;
        in_process::run(3, config, |comm| case::<i32>(comm, &[1000])).unwrap();
    }
}

/// Guards against a device barrier over port channels that lets a rank's kernels after it
/// start before every rank's kernel has reached it: the last rank reaches it late, and the
/// others' streams must not get past it before then.
#[test]
fn port_barrier_waits_for_the_last_rank() {
    static LAST_ARRIVED: AtomicBool = AtomicBool::new(false);
    let mut config = job(AlgorithmChoice::Auto, 2, 1);
    config.communicator.transport = TransportChoice::Ethernet;
    in_process::run(3, config, |comm| {
        assert_eq!(
            comm.collective_algorithm(Collective::Barrier, 0)?,
            Algorithm::Ports
        );
        let stream = comm.device().stream()?;
        for round in 0..3 {
            comm.barrier()?;
            late_last_rank_at_barrier(comm, &stream, round, &LAST_ARRIVED)?;
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against an eager broadcast or reduce (data one way, the receivers' dones let the
/// sender run ahead by a few rounds, across calls) whose sender writes a round's slot before
/// its receiver has read it out, waits for dones that never come, or leaves its owed dones
/// to be taken for another collective's signals: the calls of `eager_steps` (runs of
/// broadcasts from one root, many rounds each, then from another root, reduces to a third,
/// all-reduces, device barriers, and back), over host IPC and Ethernet.
#[test]
fn eager_calls_back_to_back_with_late_ranks() {
    for transport in [TransportChoice::Auto, TransportChoice::Ethernet] {
        let mut config = job(AlgorithmChoice::Use(Algorithm::Ports), 2, 2);
        config.communicator.transport = transport;
        // 400 bytes: four rounds of 128.
        eager_calls_case(
            config,
            &eager_steps(),
            100,
            &format!("ports over {transport:?}"),
        );
    }
}

/// Guards against a device barrier after eager broadcasts that takes the dones the root is
/// still owed for the peers' arrival: the root of three broadcasts (many rounds each) calls
/// the barrier while the last rank reaches it late, and must not get past it before then.
#[test]
fn port_barrier_after_eager_broadcasts_waits_for_the_last_rank() {
    static LAST_ARRIVED: AtomicBool = AtomicBool::new(false);
    let mut config = job(AlgorithmChoice::Use(Algorithm::Ports), 2, 1);
    config.communicator.transport = TransportChoice::Ethernet;
    barrier_after_eager_broadcasts_case(config, 100, &LAST_ARRIVED);
}
