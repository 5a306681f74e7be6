//! The all-reduce over port channels (`Algorithm::Ports`), which runs where ranks cannot
//! load and store each other's memory: forced on one node (port channels over host IPC),
//! and chosen by itself when the ranks reach each other over Ethernet, where it puts from
//! registered inputs.

mod common;

use common::{
    TypedCase, assert_same, combined, every_type, small_round_job as job, small_value as value,
};
use oxccl::collectives::{Algorithm, AlgorithmChoice, Collective};
use oxccl::in_process;
use oxccl::{Communicator, DeviceBuffer, Error, ReduceElement, ReduceOp, Result, TransportChoice};
use oxccl_device::coop::contiguous_chunk;
use oxccl_kernels::collectives::PortLayout;

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

fn reduced<T: ReduceElement>(ranks: u32, op: ReduceOp, i: usize, call: u32) -> T {
    combined(ranks, op, false, &|r| value::<T>(r, i, call))
}

/// What the ring gives element `i` of `count`: combined once, in ring order from the rank
/// that owns the element's chunk of its round (`c, c + 1, .., c - 1`), `round_bytes` the
/// port rounds the job asked for.
fn ring_reduced<T: ReduceElement>(
    ranks: u32,
    op: ReduceOp,
    i: usize,
    call: u32,
    count: usize,
    round_bytes: u64,
) -> T {
    let per = PortLayout::new(ranks, round_bytes).all_reduce_round(T::TYPE.size()) as usize;
    let (off, len) = (i / per * per, per.min(count - i / per * per));
    let at = (i - off) as u64;
    let owner = (0..ranks)
        .find(|&c| contiguous_chunk(c as u64, ranks as u64, len as u64).contains(&at))
        .expect("every element is in a chunk");
    let mut acc = value::<T>(owner, i, call);
    for k in 1..ranks {
        acc = acc.combine(value::<T>((owner + k) % ranks, i, call), op);
    }
    acc.finish(op, ranks)
}

/// [`case`] for [`every_type`].
struct AllReduceCase;

impl TypedCase for AllReduceCase {
    fn run<T: ReduceElement>(&self, comm: &mut Communicator, counts: &[usize]) -> Result<()> {
        case::<T>(comm, counts)
    }
}

/// Every op and placement of `T` for each count, every result checked on every rank;
/// a marker after the data shows a kernel that writes one element too many. The ring
/// combines in ring order, the other algorithms in rank order.
fn case<T: ReduceElement>(comm: &mut Communicator, counts: &[usize]) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    for (call, &count) in counts.iter().enumerate() {
        let call = call as u32;
        let mut data: Vec<T> = (0..count).map(|i| value(rank, i, call)).collect();
        data.push(T::from_f64(99.0));
        let mut marked = vec![T::from_f64(0.0); count];
        marked.push(T::from_f64(99.0));
        for op in OPS {
            let want: Vec<T> = match comm.all_reduce_algorithm(1)? {
                Algorithm::Ring => {
                    let round = comm.config().collectives.port_round_bytes;
                    let at = |i| ring_reduced(n, op, i, call, count, round);
                    (0..count).map(at).collect()
                }
                Algorithm::Doubling => (0..count)
                    .map(|i| combined(n, op, true, &|r| value::<T>(r, i, call)))
                    .collect(),
                _ => (0..count).map(|i| reduced(n, op, i, call)).collect(),
            };
            let what = format!("{:?} {op:?} n={count} ranks={n}", T::TYPE);
            let send = comm.device().alloc_from(&data)?;
            let mut recv: DeviceBuffer<T> = comm.device().alloc_from(&marked)?;
            comm.all_reduce(&send, &mut recv, count, op, &stream)?;
            let mut in_place = comm.device().alloc_from(&data)?;
            comm.all_reduce_in_place(&mut in_place, count, op, &stream)?;
            comm.synchronize(&stream)?;
            for (placement, buf) in [("out of place", &recv), ("in place", &in_place)] {
                let got = buf.to_vec()?;
                assert_eq!(got[count].to_f64(), 99.0, "{what} {placement}: wrote past");
                assert_same(&format!("{what} {placement}"), &got[..count], &want);
            }
        }
    }
    Ok(())
}

/// Guards against a port all-reduce that puts a chunk into the wrong slot, reads a slot
/// before its signal, reuses a set of the scratch before the peers are done with it
/// (many rounds per call, calls back to back), combines out of rank order, or mishandles a
/// type, an operation or a grid.
#[test]
fn port_all_reduce_every_type_op_and_placement() {
    let shapes = [(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 1, 2), (4, 2, 1)];
    every_type_op_and_placement(Algorithm::Ports, &shapes);
}

/// Guards against a ring all-reduce that sends or takes the wrong chunk at a step, puts
/// into a slot another step uses, forwards before the chunk arrived, combines out of ring
/// order or finishes (`Avg`) more than once, or reuses a set of the scratch too early; odd
/// and even rings, rounds whose chunks differ in length.
#[test]
fn ring_all_reduce_every_type_op_and_placement() {
    let shapes = [(1, 1, 1), (2, 1, 1), (3, 2, 2), (4, 1, 1), (5, 1, 2)];
    every_type_op_and_placement(Algorithm::Ring, &shapes);
}

/// Guards against a recursive-doubling all-reduce that pairs the wrong ranks at a step,
/// sends what it has not reduced yet, finishes (`Avg`) more than once, overwrites a slot a
/// put still reads, or reuses a set of the scratch too early (many rounds per call, calls
/// back to back); and against one that runs on a number of ranks it cannot pair (three
/// take the all-pairs ports).
#[test]
fn doubling_all_reduce_every_type_op_and_placement() {
    let shapes = [
        (1, 1, 1),
        (2, 2, 1),
        (3, 1, 1),
        (4, 1, 1),
        (4, 2, 2),
        (8, 1, 1),
    ];
    every_type_op_and_placement(Algorithm::Doubling, &shapes);
}

/// Guards against a recursive-doubling all-reduce that does not give every rank the bits
/// its documentation promises: the balanced tree in rank order (`(x0 + x1) + (x2 + x3)`),
/// with values whose float sums here differ from rank order's.
#[test]
fn doubling_all_reduce_gives_every_rank_the_same_bits() {
    let job = job(AlgorithmChoice::Use(Algorithm::Doubling), 1, 1);
    let x = |r: u32, i: usize| 1.0f32 / (3.0 + r as f32 * 1.7 + i as f32);
    in_process::run(4, job, |comm| {
        let stream = comm.device().stream()?;
        let count = 300;
        let data: Vec<f32> = (0..count).map(|i| x(comm.rank(), i)).collect();
        let send = comm.device().alloc_from(&data)?;
        let mut recv = comm.alloc::<f32>(count)?;
        comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        let got = recv.to_vec()?;
        let tree: Vec<f32> = (0..count)
            .map(|i| (x(0, i) + x(1, i)) + (x(2, i) + x(3, i)))
            .collect();
        let in_rank_order = (0..count)
            .filter(|&i| ((x(0, i) + x(1, i)) + x(2, i)) + x(3, i) != tree[i])
            .count();
        assert!(in_rank_order > 0, "the values tell the orders apart");
        for (i, (g, w)) in got.iter().zip(&tree).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "rank {} element {i}", comm.rank());
        }
        Ok(())
    })
    .unwrap();
}

/// Runs every case on each (ranks, blocks, threads) shape with `algo` forced.
fn every_type_op_and_placement(algo: Algorithm, shapes: &[(u32, u32, u32)]) {
    for &(ranks, blocks, threads) in shapes {
        in_process::run(
            ranks,
            job(AlgorithmChoice::Use(algo), blocks, threads),
            |comm| {
                let taken = match algo {
                    Algorithm::Doubling if !ranks.is_power_of_two() => Algorithm::Ports,
                    algo => algo,
                };
                assert_eq!(comm.all_reduce_algorithm(1 << 20)?, taken, "{ranks} ranks");
                every_type(comm, &AllReduceCase)
            },
        )
        .unwrap();
    }
}

/// Guards against collectives that try memory channels between ranks that reach each
/// other only over Ethernet: all-reduce picks the port algorithm by itself, at every size
/// (and says so); buffer registration, with no load/store access to read the peers'
/// buffers, registers for the port all-reduce, with the same errors as on one node
/// (overlaps, a full table, an unknown buffer), and registered and plain calls agree.
#[test]
fn over_ethernet_all_reduce_takes_ports_and_registers_for_it() {
    let mut config = job(AlgorithmChoice::Auto, 1, 1);
    config.communicator.transport = TransportChoice::Ethernet;
    config.communicator.collectives.registered_buffers = 1;
    config.communicator.collectives.port_direct_bytes = Some(0);
    in_process::run(3, config, |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let stream = comm.device().stream()?;
        let count = 2000;
        let data: Vec<i32> = (0..count).map(|i| value(rank, i, 0)).collect();
        let send = comm.device().alloc_from(&data)?;
        let mut recv = comm.alloc::<i32>(count)?;
        comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
        comm.all_reduce(&send, &mut recv, 3, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        assert_eq!(comm.all_reduce_algorithm(16)?, Algorithm::Ports);
        let want: Vec<i32> = (0..3).map(|i| reduced(n, ReduceOp::Sum, i, 0)).collect();
        assert_same("all_reduce over ethernet", &recv.to_vec()?[..3], &want);
        let refused = |e: Result<()>, what: &str, says: &str| match e {
            Err(Error::InvalidUsage(why)) => assert!(why.contains(says), "{what}: {why}"),
            other => panic!("{what} over ethernet: {other:?}"),
        };
        comm.register_collective_buffer(&send)?;
        refused(
            comm.register_collective_buffer(&send),
            "registering twice",
            "registered already",
        );
        refused(
            comm.register_collective_buffer(&recv),
            "a full table",
            "slots are taken",
        );
        refused(
            comm.deregister_collective_buffer(&recv, &stream),
            "deregistering an unknown buffer",
            "not registered",
        );
        comm.all_reduce(&send, &mut recv, count, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream)?;
        let want: Vec<i32> = (0..count)
            .map(|i| reduced(n, ReduceOp::Sum, i, 0))
            .collect();
        assert_same("all_reduce from a registered input", &recv.to_vec()?, &want);
        comm.deregister_collective_buffer(&send, &stream)?;
        comm.register_collective_buffer(&recv)?;
        comm.deregister_collective_buffer(&recv, &stream)
    })
    .unwrap();
}

/// Guards against recursive doubling and the port collectives beside it overwriting each
/// other's sets of the scratch, and against the automatic choice: over Ethernet, four
/// ranks, small all-reduces take recursive doubling and large ones the ring (all-gather
/// and reduce-scatter the ring too) where the ring starts at four ranks, else the
/// all-pairs ports (all-gather recursive doubling, reduce-scatter recursive halving);
/// broadcast recursive doubling, reduce the ports; calls of several rounds each,
/// alternating, back to back with no host barrier; every result checked after one
/// synchronize.
#[test]
fn doubling_ring_and_port_collectives_back_to_back_over_ethernet() {
    for (ring_min_ranks, large, gather) in [
        (4, Algorithm::Ring, Algorithm::Ring),
        (8, Algorithm::Ports, Algorithm::Doubling),
    ] {
        let mut config = job(AlgorithmChoice::Auto, 1, 1);
        let c = &mut config.communicator.collectives;
        c.ring_min_ranks = ring_min_ranks;
        c.doubling_max_bytes = 4096;
        config.communicator.transport = TransportChoice::Ethernet;
        in_process::run(4, config, |comm| back_to_back(comm, large, gather)).unwrap();
    }
}

/// The calls of [`doubling_ring_and_port_collectives_back_to_back_over_ethernet`], checked.
fn back_to_back(comm: &mut Communicator, large_algo: Algorithm, gather: Algorithm) -> Result<()> {
    let (rank, n) = (comm.rank(), comm.size());
    let (small, large) = (700usize, 1500usize);
    assert_eq!(
        comm.all_reduce_algorithm(small as u64 * 4)?,
        Algorithm::Doubling
    );
    assert_eq!(comm.all_reduce_algorithm(large as u64 * 4)?, large_algo);
    for (c, algo) in [
        (Collective::AllGather, gather),
        (Collective::ReduceScatter, gather),
        (Collective::Broadcast, Algorithm::Ports),
        (Collective::Reduce, Algorithm::Ports),
    ] {
        assert_eq!(comm.collective_algorithm(c, 64)?, algo, "{c}");
    }
    let stream = comm.device().stream()?;
    let round = PortLayout::new(n, comm.config().collectives.port_round_bytes);
    assert!(
        small * 4 > 2 * round.copy_round_bytes() as usize,
        "several rounds a call"
    );
    let sum = |call: u32, at: usize| (0..n).map(|p| value::<i32>(p, at, call)).sum::<i32>();
    let input =
        |call: u32, len: usize| -> Vec<i32> { (0..len).map(|i| value(rank, i, call)).collect() };
    let (mut kept, mut checks) = (vec![], vec![]);
    for call in 0..3u32 {
        for (k, count) in [small, large, small].into_iter().enumerate() {
            let call = call * 10 + k as u32;
            let send = comm.device().alloc_from(&input(call, count))?;
            let mut reduced = comm.alloc::<i32>(count)?;
            comm.all_reduce(&send, &mut reduced, count, ReduceOp::Sum, &stream)?;
            let want: Vec<i32> = (0..count).map(|i| sum(call, i)).collect();
            checks.push((format!("all_reduce {call} of {count}"), reduced, want));
            kept.push(send);
        }
        let own = comm.device().alloc_from(&input(call + 100, small))?;
        let mut gathered = comm.alloc::<i32>(small * n as usize)?;
        comm.all_gather(&own, &mut gathered, small, &stream)?;
        let want: Vec<i32> = (0..n)
            .flat_map(|p| (0..small).map(move |i| value::<i32>(p, i, call + 100)))
            .collect();
        checks.push((format!("all_gather {call}"), gathered, want));
        let nu = n as usize;
        let send = comm.device().alloc_from(&input(call + 300, small * nu))?;
        let mut scattered = comm.alloc::<i32>(small)?;
        comm.reduce_scatter(&send, &mut scattered, small, ReduceOp::Sum, &stream)?;
        let at = rank as usize * small;
        let want: Vec<i32> = (0..small).map(|i| sum(call + 300, at + i)).collect();
        checks.push((format!("reduce_scatter {call}"), scattered, want));
        kept.push(send);
        let mut cast = comm.device().alloc_from(&input(call + 200, small))?;
        comm.broadcast_in_place(&mut cast, small, 2, &stream)?;
        let want: Vec<i32> = (0..small).map(|i| value(2, i, call + 200)).collect();
        checks.push((format!("broadcast {call}"), cast, want));
        let mut reduced = comm.device().alloc_from(&input(call + 400, small))?;
        comm.reduce_in_place(&mut reduced, small, ReduceOp::Sum, 1, &stream)?;
        let want: Vec<i32> = match rank {
            1 => (0..small).map(|i| sum(call + 400, i)).collect(),
            _ => input(call + 400, small),
        };
        checks.push((format!("reduce {call}"), reduced, want));
        kept.push(own);
    }
    comm.synchronize(&stream)?;
    for (what, buf, want) in &checks {
        assert_same(what, &buf.to_vec()?, want);
    }
    Ok(())
}
