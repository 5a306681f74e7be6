//! The collectives the benchmark measures, and what each one's sizes mean: how a size in
//! bytes becomes the `count` of the call, how much data every rank holds, which bus-bandwidth
//! factor applies (nccl-tests' `PERFORMANCE.md`), and its MPI counterpart.
//!
//! A size is what nccl-tests prints in its `size` column: the bytes of the whole result an
//! all-reduce, broadcast or reduce produces, and of every rank's whole buffer for all-gather
//! (the gathered result), reduce-scatter (the input), all-to-all and all-to-all-v (what each
//! rank sends). All-to-all-v uses [`alltoallv_count`], an uneven pattern the MPI baseline
//! (`examples/mpi/collectives_mpi.c`) repeats.

use clap::ValueEnum;

/// A collective of `oxccl::Communicator`, as the benchmark names it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum Collective {
    /// `all_reduce`.
    #[value(name = "allreduce")]
    AllReduce,
    /// `all_gather`.
    #[value(name = "allgather")]
    AllGather,
    /// `reduce_scatter`.
    #[value(name = "reducescatter")]
    ReduceScatter,
    /// `broadcast`.
    #[value(name = "broadcast")]
    Broadcast,
    /// `reduce`.
    #[value(name = "reduce")]
    Reduce,
    /// `all_to_all`.
    #[value(name = "alltoall")]
    AllToAll,
    /// `all_to_allv`, with the counts of [`alltoallv_count`].
    #[value(name = "alltoallv")]
    AllToAllV,
}

impl Collective {
    /// Every collective, in the order the collectives program lists them.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::AllToAllV,
    ];

    /// The collective of the library this one measures.
    pub fn library(self) -> oxccl::collectives::Collective {
        use oxccl::collectives::Collective as C;
        match self {
            Collective::AllReduce => C::AllReduce,
            Collective::AllGather => C::AllGather,
            Collective::ReduceScatter => C::ReduceScatter,
            Collective::Broadcast => C::Broadcast,
            Collective::Reduce => C::Reduce,
            Collective::AllToAll => C::AllToAll,
            Collective::AllToAllV => C::AllToAllV,
        }
    }

    /// The name `--collective` takes, and the MPI baseline's first argument.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::AllToAllV => "alltoallv",
        }
    }

    /// The name headers print (`all-reduce`, ...).
    pub fn title(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all-to-all",
            Collective::AllToAllV => "all-to-all-v",
        }
    }

    /// The MPI function the baseline times.
    pub fn mpi_function(self) -> &'static str {
        match self {
            Collective::AllReduce => "MPI_Allreduce",
            Collective::AllGather => "MPI_Allgather",
            Collective::ReduceScatter => "MPI_Reduce_scatter_block",
            Collective::Broadcast => "MPI_Bcast",
            Collective::Reduce => "MPI_Reduce",
            Collective::AllToAll => "MPI_Alltoall",
            Collective::AllToAllV => "MPI_Alltoallv",
        }
    }

    /// Whether the collective combines values with an operation (`--op` applies).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether the collective has a root (`--root` applies).
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// Whether the communicator has an in-place form of it (all-to-all-v has none).
    pub fn has_in_place(self) -> bool {
        self != Collective::AllToAllV
    }

    /// Whether a size counts every rank's share (`count × ranks` elements per size).
    fn per_rank_share(self) -> bool {
        matches!(
            self,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::AllToAllV
        )
    }

    /// The call's `count` for a size of `bytes` with elements of `elem_bytes` on `ranks`
    /// ranks (rounded down; 0 if the size is too small for one element per rank).
    pub fn count_for(self, bytes: u64, elem_bytes: u64, ranks: u32) -> u64 {
        let elems = bytes / elem_bytes.max(1);
        if self.per_rank_share() {
            elems / u64::from(ranks.max(1))
        } else {
            elems
        }
    }

    /// The size in bytes of a call with `count` (the inverse of [`Self::count_for`]).
    pub fn bytes_for(self, count: u64, elem_bytes: u64, ranks: u32) -> u64 {
        if self == Collective::AllToAllV {
            // The mean of what the ranks send, so that a size means the same data as an
            // all-to-all's.
            let n = ranks.max(1);
            let total: u64 = (0..n)
                .flat_map(|from| (0..n).map(move |to| alltoallv_count(from, to, count)))
                .sum();
            return total * elem_bytes / u64::from(n);
        }
        let elems = if self.per_rank_share() {
            count * u64::from(ranks.max(1))
        } else {
            count
        };
        elems * elem_bytes
    }

    /// nccl-tests' bus-bandwidth factor: bus bandwidth = algorithm bandwidth × factor, the
    /// share of the data each rank's link carries with an optimal algorithm.
    pub fn bus_factor(self, ranks: u32) -> f64 {
        let n = f64::from(ranks.max(1));
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce => 1.0,
            _ => (n - 1.0) / n,
        }
    }
}

/// Elements rank `from` sends rank `to` in an all-to-all-v of `count`: `count / 2` when
/// `from + to` is even (to itself, among others), `3 * count / 2` when odd, so every rank
/// of an even-sized job sends `count × ranks` elements in all, unevenly spread. The MPI
/// baseline uses the same formula.
pub fn alltoallv_count(from: u32, to: u32, count: u64) -> u64 {
    if (from + to).is_multiple_of(2) {
        count / 2
    } else {
        3 * count / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against sizes and counts drifting from nccl-tests' meaning (a gathered size
    /// counted per rank would double every bandwidth of a 2-rank all-gather).
    #[test]
    fn sizes_and_counts_round_trip() {
        for c in Collective::ALL {
            let count = c.count_for(1 << 20, 4, 2);
            assert_eq!(c.bytes_for(count, 4, 2), 1 << 20, "{c:?}");
        }
        assert_eq!(Collective::AllReduce.count_for(1024, 4, 2), 256);
        assert_eq!(Collective::AllGather.count_for(1024, 4, 2), 128);
        assert_eq!(Collective::AllGather.count_for(4, 4, 2), 0);
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(alltoallv_count(0, 0, 10), 5);
        assert_eq!(alltoallv_count(0, 1, 10), 15);
    }
}
