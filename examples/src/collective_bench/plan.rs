//! What a run measures, as every rank derives it from the options: the collective, the
//! element type, operation and root, the counts of the sizes, and the iterations.

use super::collective::Collective;
use super::options::{BenchArgs, CheckMode, Register};
use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::{Communicator, DataType, Error, ReduceOp, Result};

/// One run's measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (for collectives that reduce).
    pub op: ReduceOp,
    /// Root (for rooted collectives).
    pub root: u32,
    /// Ranks of the job.
    pub ranks: u32,
    /// The `count` of each size, ascending, without repeats and without zero.
    pub counts: Vec<u64>,
    /// Timed calls per size and placement.
    pub iters: u32,
    /// Untimed calls before them.
    pub warmup: u32,
    /// How results are checked.
    pub check: CheckMode,
    /// Whether each timed call is synchronized before the next (see `BenchArgs::blocking`).
    pub blocking: bool,
    /// Whether each size's buffers are registered for the collectives.
    pub register: bool,
}

impl Plan {
    /// The plan `args` describe for `collective` on `ranks` ranks.
    ///
    /// # Errors
    /// A root that is not a rank, `--algo packets` for a collective other than all-reduce, too many
    /// ranks for all-to-all-v, or no size large enough for one element per rank.
    pub fn new(collective: Collective, args: &BenchArgs, ranks: u32) -> Result<Plan> {
        let bad = |what: String| Err(Error::InvalidUsage(what));
        if ranks == 0 || ranks > oxccl::in_process::MAX_RANKS {
            return bad(format!(
                "--ranks {ranks}: at least one rank and at most {} on this host, as threads or \
                 as processes",
                oxccl::in_process::MAX_RANKS
            ));
        }
        if collective.rooted() && args.root >= ranks {
            return bad(format!("--root {}: the job has {ranks} ranks", args.root));
        }
        if collective != Collective::AllReduce
            && args.algo == AlgorithmChoice::Use(Algorithm::Packets)
        {
            return bad(format!(
                "--algo packets: only all-reduce has a packet algorithm; {} has direct, \
                 ports and others through the proxy",
                collective.title()
            ));
        }
        let max_v = oxccl_kernels::collectives::AllToAllvCounts::MAX_RANKS;
        if collective == Collective::AllToAllV && ranks as usize > max_v {
            return bad(format!("all-to-all-v supports at most {max_v} ranks"));
        }
        let mut counts: Vec<u64> = args
            .sizes()
            .into_iter()
            .map(|bytes| collective.count_for(bytes, args.dtype.size(), ranks))
            .filter(|&c| c > 0)
            .collect();
        counts.dedup();
        if counts.is_empty() && args.soak.is_none() {
            return bad(format!(
                "no size from --min-bytes to --max-bytes holds one {} element per rank",
                args.dtype.name()
            ));
        }
        Ok(Plan {
            collective,
            dtype: args.dtype,
            op: args.op,
            root: args.root,
            ranks,
            counts,
            iters: args.iters,
            warmup: args.warmup,
            check: args.check,
            blocking: args.blocking,
            register: args.register == Register::On,
        })
    }

    /// The size in bytes of a call of `count`.
    pub fn bytes_for(&self, count: u64) -> u64 {
        self.collective
            .bytes_for(count, self.dtype.size(), self.ranks)
    }

    /// The name of the algorithm a call takes on `comm`, `bytes` the bytes of its `count`
    /// elements (for all-gather, reduce-scatter and all-to-all, what each rank sends each
    /// peer): what `Communicator::collective_algorithm` says, `zerocopy` for a direct one
    /// on registered buffers.
    ///
    /// # Errors
    /// `OXCCL_ALGO` names no algorithm, or packets are forced on a size past the limit.
    pub fn algorithm(&self, comm: &Communicator, bytes: u64) -> Result<String> {
        match comm.collective_algorithm(self.collective.library(), bytes)? {
            Algorithm::Direct if self.collective != Collective::AllReduce => {
                Ok(if self.registers() {
                    "zerocopy"
                } else {
                    "direct"
                }
                .into())
            }
            Algorithm::Direct if self.registers() => Ok("zerocopy".into()),
            algo => Ok(algo.name().to_string()),
        }
    }

    /// Whether the sweep registers its buffers: asked for (every collective reads the
    /// peers' registered buffers in place; all-reduce only in its direct algorithm, which
    /// then shows as `zerocopy`).
    pub fn registers(&self) -> bool {
        self.register
    }
}
