//! The all-reduce over port channels (`Algorithm::Ports`), which runs where ranks cannot
//! load and store each other's memory: forced on one node (port channels over host IPC),
//! and chosen by itself when the ranks reach each other over Ethernet, where collectives
//! without a port algorithm and buffer registration refuse with a clear error.

mod common;

use common::{assert_same, small_round_job as job, small_value as value};
use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::in_process;
use oxccl::{
    Communicator, DeviceBuffer, Error, ReduceElement, ReduceOp, Result, TransportChoice, bf16, f16,
};
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
    let mut acc = value::<T>(0, i, call);
    for r in 1..ranks {
        acc = acc.combine(value::<T>(r, i, call), op);
    }
    acc.finish(op, ranks)
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

/// Runs every case on each (ranks, blocks, threads) shape with `algo` forced.
fn every_type_op_and_placement(algo: Algorithm, shapes: &[(u32, u32, u32)]) {
    for &(ranks, blocks, threads) in shapes {
        in_process::run(
            ranks,
            job(AlgorithmChoice::Use(algo), blocks, threads),
            |comm| {
                // Many rounds for two types; every type and operation over a few.
                case::<f32>(comm, &[1000, 3001])?;
                case::<i64>(comm, &[1001])?;
                let counts = [1usize, 7, 100];
                case::<f32>(comm, &counts)?;
                case::<f64>(comm, &counts)?;
                case::<f16>(comm, &counts)?;
                case::<bf16>(comm, &counts)?;
                case::<i8>(comm, &counts)?;
                case::<u8>(comm, &counts)?;
                case::<i32>(comm, &counts)?;
                case::<u32>(comm, &counts)?;
                case::<i64>(comm, &counts)?;
                case::<u64>(comm, &counts)
            },
        )
        .unwrap();
    }
}

/// Guards against collectives that try memory channels between ranks that reach each
/// other only over Ethernet: all-reduce picks the port algorithm by itself, at every size
/// (and says so); buffer registration, which needs load/store access, is refused with an
/// error that says why, on every rank, and nothing hangs.
#[test]
fn over_ethernet_all_reduce_takes_ports_and_registration_is_refused() {
    let mut config = job(AlgorithmChoice::Auto, 1, 1);
    config.communicator.transport = TransportChoice::Ethernet;
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
        let refused = |e: Result<()>, what: &str| match e {
            Err(Error::InvalidUsage(why)) => assert!(why.contains("proxy"), "{what}: {why}"),
            other => panic!("{what} over ethernet: {other:?}"),
        };
        refused(
            comm.register_collective_buffer(&send),
            "register_collective_buffer",
        );
        Ok(())
    })
    .unwrap();
}
