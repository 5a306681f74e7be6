//! The eager broadcast and reduce tests, run over either path (port channels and packets
//! over memory channels): runs of calls back to back with late ranks, and a device barrier
//! after eager broadcasts.

use super::assert_same;
use super::gather_scatter_cases::{inputs, marked, read};
use super::small_value as value;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, ReduceOp, Result, Stream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One call of [`eager_calls_case`]: a broadcast from `root`, a reduce (sum) to `root`, an
/// all-reduce (sum) of the case's count or of `LARGE` times it, or a device barrier, each
/// of call number `call`.
#[derive(Clone, Copy, Debug)]
pub enum EagerStep {
    Broadcast { root: u32 },
    Reduce { root: u32 },
    AllReduce,
    LargeAllReduce,
    Barrier,
}

/// Elements of [`EagerStep::LargeAllReduce`], in counts of the case.
const LARGE: usize = 16;

/// The calls of [`eager_calls_case`]: runs of broadcasts from one root, then from another
/// root, reduces to a third, all-reduces, device barriers, and back.
pub fn eager_steps() -> Vec<EagerStep> {
    use EagerStep::{AllReduce, Barrier, Broadcast, LargeAllReduce, Reduce};
    let mut steps = vec![];
    steps.extend([Broadcast { root: 0 }; 8]);
    steps.extend([Broadcast { root: 2 }; 2]);
    steps.extend([Reduce { root: 1 }; 5]);
    steps.push(AllReduce);
    steps.extend([Broadcast { root: 0 }; 4]);
    steps.extend([
        Barrier,
        Broadcast { root: 0 },
        Broadcast { root: 0 },
        Barrier,
    ]);
    steps.extend([
        Reduce { root: 0 },
        Broadcast { root: 0 },
        Reduce { root: 0 },
    ]);
    steps.extend([Reduce { root: 2 }; 4]);
    steps.push(LargeAllReduce);
    steps.extend([Broadcast { root: 1 }; 3]);
    steps.push(LargeAllReduce);
    steps
}

/// Calls of [`long_eager_runs`] in each run: past the deepest eager depth (64 sets) twice.
pub const LONG_RUN: usize = 150;

/// Runs of eager calls longer than any path's depth, so a sender cycles through its sets
/// several times and must wait for its receivers' dones: broadcasts from rank 0 (whose
/// receiver rank 1 starts late), reduces to rank 1, broadcasts from rank 2.
pub fn long_eager_runs() -> Vec<EagerStep> {
    use EagerStep::{Broadcast, Reduce};
    let mut steps = vec![Broadcast { root: 0 }; LONG_RUN];
    steps.extend([Reduce { root: 1 }; LONG_RUN]);
    steps.extend([Broadcast { root: 2 }; 10]);
    steps
}

/// Runs `steps` ([`eager_steps`], [`long_eager_runs`]) on 3 ranks with `config`, `count`
/// i32 elements a call (`label` names the setting in failures): every call enqueued back
/// to back with no host barrier, while rank 1 enqueues its calls late and the others
/// stall in the middle; every output is checked at the end.
pub fn eager_calls_case(config: InProcessConfig, steps: &[EagerStep], count: usize, label: &str) {
    use EagerStep::{AllReduce, Barrier, Broadcast, LargeAllReduce, Reduce};
    in_process::run(3, config, |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let stream = comm.device().stream()?;
        let mut outputs = vec![];
        for (call, &step) in steps.iter().enumerate() {
            let call = call as u32;
            if (rank, call) == (1, 0) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if (rank, call) == (2, 4) || (rank, call) == (0, 12) {
                std::thread::sleep(Duration::from_millis(30));
            }
            let len = match step {
                LargeAllReduce => count * LARGE,
                _ => count,
            };
            let send = marked(comm, &inputs::<i32>(rank, len, call))?;
            let mut recv = marked(comm, &vec![0; len])?;
            match step {
                Broadcast { root } => comm.broadcast(&send, &mut recv, len, root, &stream)?,
                Reduce { root } => {
                    comm.reduce(&send, &mut recv, len, ReduceOp::Sum, root, &stream)?
                }
                AllReduce | LargeAllReduce => {
                    comm.all_reduce(&send, &mut recv, len, ReduceOp::Sum, &stream)?
                }
                Barrier => comm.barrier_on(&stream)?,
            }
            // Kept until the end: the calls run on after the loop has gone on.
            outputs.push((step, call, len, send, recv));
        }
        comm.synchronize(&stream)?;
        for (step, call, len, _, recv) in &outputs {
            let sum = |i| (0..n).map(|p| value::<i32>(p, i, *call)).sum::<i32>();
            let want: Vec<i32> = match *step {
                Broadcast { root } => inputs::<i32>(root, *len, *call),
                Reduce { root } if root == rank => (0..*len).map(sum).collect(),
                Reduce { .. } => vec![0; *len],
                AllReduce | LargeAllReduce => (0..*len).map(sum).collect(),
                Barrier => vec![0; *len],
            };
            let what = format!("rank {rank}, call {call}: {step:?} over {label}");
            assert_same(&what, &read(&what, recv, *len)?, &want);
        }
        Ok(())
    })
    .unwrap();
}

/// Runs three broadcasts from rank 0 of `count` i32 elements then a device barrier that the
/// last of 3 ranks reaches late, twice (the first barrier call agrees on its shape through
/// the bootstrap, a host barrier): no rank may get past the barrier before the last rank
/// reaches it, and every broadcast is checked. `arrived` is the test's own flag.
pub fn barrier_after_eager_broadcasts_case(
    config: InProcessConfig,
    count: usize,
    arrived: &AtomicBool,
) {
    in_process::run(3, config, |comm| {
        let rank = comm.rank();
        let stream = comm.device().stream()?;
        for round in 0..2 {
            let mut kept = vec![];
            for call in 0..3 {
                let mut buf = marked(comm, &inputs::<i32>(rank, count, call))?;
                comm.broadcast_in_place(&mut buf, count, 0, &stream)?;
                kept.push(buf);
            }
            late_last_rank_at_barrier(comm, &stream, round, arrived)?;
            for (call, buf) in kept.iter().enumerate() {
                let want = inputs::<i32>(0, count, call as u32);
                assert_same(&format!("broadcast {call}"), &read("", buf, count)?, &want);
            }
        }
        Ok(())
    })
    .unwrap();
}

/// The last rank reaches the device barrier late: it finishes its stream's work, sleeps,
/// then marks `arrived` and calls the barrier; no rank's stream may get past the barrier
/// before the mark. Then the ranks meet on the host and the last rank clears the mark.
pub fn late_last_rank_at_barrier(
    comm: &mut Communicator,
    stream: &Stream,
    round: u32,
    arrived: &AtomicBool,
) -> Result<()> {
    let (rank, last) = (comm.rank(), comm.rank() == comm.size() - 1);
    if last {
        comm.synchronize(stream)?;
        std::thread::sleep(std::time::Duration::from_millis(100));
        arrived.store(true, Ordering::SeqCst);
    }
    comm.barrier_on(stream)?;
    comm.synchronize(stream)?;
    assert!(
        arrived.load(Ordering::SeqCst),
        "round {round}: rank {rank} got past the barrier before the last rank reached it"
    );
    comm.barrier()?;
    if last {
        arrived.store(false, Ordering::SeqCst);
    }
    comm.barrier()
}
