//! All-gather and reduce-scatter round a ring of the ranks through the proxy
//! (`Algorithm::Ring`, the halves of the ring all-reduce): forced on one node (port
//! channels over host IPC), beside the port collectives that have no ring form.

mod common;

use common::gather_scatter_cases::{all_gather_case, inputs, reduce_scatter_case};
use common::{TypedCase, assert_same, every_type, small_round_job as job, small_value as value};
use oxccl::collectives::{Algorithm, AlgorithmChoice, Collective};
use oxccl::in_process;
use oxccl::{Communicator, ReduceElement, ReduceOp, Result};
use oxccl_kernels::collectives::PortLayout;

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// Block `b`'s element `i` as the ring reduce-scatter gives it: every rank's element
/// `b * count + i` combined in ring order from rank `b + 1` on.
fn ring_block<T: ReduceElement>(ranks: u32, op: ReduceOp, b: u32, at: usize, call: u32) -> T {
    let first = (b + 1) % ranks;
    let mut acc = value::<T>(first, at, call);
    for k in 1..ranks {
        acc = acc.combine(value::<T>((first + k) % ranks, at, call), op);
    }
    acc.finish(op, ranks)
}

/// [`case`] for [`every_type`].
struct RingCase;

impl TypedCase for RingCase {
    fn run<T: ReduceElement>(&self, comm: &mut Communicator, counts: &[usize]) -> Result<()> {
        case::<T>(comm, counts)
    }
}

/// All-gather and reduce-scatter (every operation) of `T`, in place and not, for each
/// count, in the ring; every result checked on every rank, bit for bit.
fn case<T: ReduceElement>(comm: &mut Communicator, counts: &[usize]) -> Result<()> {
    for c in [Collective::AllGather, Collective::ReduceScatter] {
        assert_eq!(comm.collective_algorithm(c, 4096)?, Algorithm::Ring, "{c}");
    }
    assert_eq!(
        comm.collective_algorithm(Collective::Broadcast, 4096)?,
        Algorithm::Ports
    );
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.device().stream()?;
    for (call, &count) in counts.iter().enumerate() {
        let call = call as u32;
        all_gather_case::<T>(comm, count, call, &stream)?;
        for op in OPS {
            let at = rank as usize * count;
            let want = |i| ring_block::<T>(n, op, rank, at + i, call);
            reduce_scatter_case(comm, count, call, op, &stream, want)?;
        }
    }
    Ok(())
}

/// Guards against a ring all-gather or reduce-scatter that sends or takes the wrong block
/// at a step, puts into a slot another step uses, forwards before the data arrived,
/// combines out of ring order or finishes (`Avg`) more than once, writes past its output
/// or over the rest of an in-place buffer, or reuses a set of the scratch too early (many
/// rounds per call); odd and even rings, several grids.
#[test]
fn ring_all_gather_and_reduce_scatter_every_type_op_and_placement() {
    let ring = AlgorithmChoice::Use(Algorithm::Ring);
    for (ranks, blocks, threads) in [(1, 1, 1), (2, 1, 1), (3, 2, 2), (4, 1, 1), (5, 1, 2)] {
        in_process::run(ranks, job(ring, blocks, threads), |comm| {
            every_type(comm, &RingCase)
        })
        .unwrap();
    }
}

/// Guards against the ring collectives and the port collectives beside them overwriting
/// each other's sets of the scratch: all-reduce, all-gather and reduce-scatter round the
/// ring and broadcast through ports, calls of several rounds each, alternating, back to
/// back with no host barrier, on four ranks; every result checked after one synchronize.
#[test]
fn ring_and_port_collectives_back_to_back() {
    let ring = AlgorithmChoice::Use(Algorithm::Ring);
    in_process::run(4, job(ring, 1, 1), |comm| {
        assert_eq!(comm.all_reduce_algorithm(1 << 20)?, Algorithm::Ring);
        let (rank, n) = (comm.rank(), comm.size());
        let nu = n as usize;
        let stream = comm.device().stream()?;
        let count = 700;
        // The rounds of this job, to know how many a call takes.
        let round = PortLayout::new(n, comm.config().collectives.port_round_bytes);
        assert!(
            count * 4 > round.round_bytes as usize,
            "several rounds a call"
        );
        let (mut kept, mut checks) = (vec![], vec![]);
        for call in 0..3u32 {
            let send = comm
                .device()
                .alloc_from(&inputs::<i32>(rank, count * nu, call))?;
            let mut reduced = comm.alloc::<i32>(count * nu)?;
            comm.all_reduce(&send, &mut reduced, count * nu, ReduceOp::Sum, &stream)?;
            let mut gathered = comm.alloc::<i32>(count * nu)?;
            let own = comm
                .device()
                .alloc_from(&inputs::<i32>(rank, count, call + 10))?;
            comm.all_gather(&own, &mut gathered, count, &stream)?;
            let mut scattered = comm.alloc::<i32>(count)?;
            comm.reduce_scatter(&send, &mut scattered, count, ReduceOp::Sum, &stream)?;
            let mut cast = comm
                .device()
                .alloc_from(&inputs::<i32>(rank, count, call + 20))?;
            comm.broadcast_in_place(&mut cast, count, 1, &stream)?;
            let sum = |at: usize| (0..n).map(|p| value::<i32>(p, at, call)).sum::<i32>();
            let want_reduced: Vec<i32> = (0..count * nu).map(sum).collect();
            let want_gathered: Vec<i32> = (0..n)
                .flat_map(|p| inputs::<i32>(p, count, call + 10))
                .collect();
            let at = rank as usize * count;
            let want_scattered = want_reduced[at..][..count].to_vec();
            checks.push((format!("all_reduce {call}"), reduced, want_reduced));
            checks.push((format!("all_gather {call}"), gathered, want_gathered));
            checks.push((format!("reduce_scatter {call}"), scattered, want_scattered));
            let want_cast = inputs::<i32>(1, count, call + 20);
            checks.push((format!("broadcast {call}"), cast, want_cast));
            // Inputs live until the synchronize: the kernels read them then.
            kept.push((send, own));
        }
        comm.synchronize(&stream)?;
        for (what, buf, want) in &checks {
            assert_same(what, &buf.to_vec()?, want);
        }
        Ok(())
    })
    .unwrap();
}
