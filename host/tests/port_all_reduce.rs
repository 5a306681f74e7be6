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

/// Every op and placement of `T` for each count, every result checked on every rank;
/// a marker after the data shows a kernel that writes one element too many.
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
            let want: Vec<T> = (0..count).map(|i| reduced(n, op, i, call)).collect();
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
    let ports = AlgorithmChoice::Use(Algorithm::Ports);
    for (ranks, blocks, threads) in [(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 1, 2), (4, 2, 1)] {
        in_process::run(ranks, job(ports, blocks, threads), |comm| {
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
        })
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
