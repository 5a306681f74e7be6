//! A run's results, all ranks combined, with its baselines: what the table, the JSON lines
//! and the plot are printed from.

use super::measure::{SizeResult, Timing};
use super::memory_bandwidth::MemoryBaseline;
use super::mpi::{Best, MpiBaseline};
use super::plan::Plan;
use oxccl::collectives::AlgorithmChoice;
use oxccl_device::launch::LaunchConfig;

/// How the run was set up, as the header says it.
#[derive(Clone, Debug)]
pub struct Setup {
    /// What was measured.
    pub plan: Plan,
    /// `threads of one process` or `processes`.
    pub ranks_are: String,
    /// The launch shape asked for (`None`: the library's choice).
    pub launch: Option<LaunchConfig>,
    /// The algorithm choice.
    pub algo: AlgorithmChoice,
    /// The communicator's packet limit, in bytes.
    pub packet_limit: u64,
    /// The smallest packet message sent as data and a signal, in bytes (`u64::MAX`: none).
    pub packet_data_from: u64,
}

/// The results of a sweep.
#[derive(Clone, Debug)]
pub struct Report {
    /// The set-up.
    pub setup: Setup,
    /// One entry per size: the slowest rank's time, the wrong elements of all ranks.
    pub sizes: Vec<SizeResult>,
    /// The MPI baseline, with `--mpi`.
    pub mpi: Option<MpiBaseline>,
    /// The memory baseline.
    pub memory: Option<MemoryBaseline>,
}

/// Bandwidths of one placement of one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    /// Time of one call, µs.
    pub time_us: f64,
    /// Size over time, GB/s.
    pub algbw: f64,
    /// `algbw` times the collective's bus factor, GB/s.
    pub busbw: f64,
}

impl Report {
    /// Combines every rank's sizes: per size and placement the slowest rank's time and
    /// the sum of the ranks' wrong elements.
    pub fn combine(per_rank: &[Vec<SizeResult>]) -> Vec<SizeResult> {
        let Some(first) = per_rank.first() else {
            return Vec::new();
        };
        let merge = |a: Timing, b: Timing| Timing {
            time_us: a.time_us.max(b.time_us),
            wrong: a.wrong + b.wrong,
        };
        first
            .iter()
            .enumerate()
            .map(|(i, size)| {
                let mut out = size.clone();
                for rank in &per_rank[1..] {
                    if let Some(other) = rank.get(i) {
                        out.out_of_place = merge(out.out_of_place, other.out_of_place);
                        out.in_place = match (out.in_place, other.in_place) {
                            (Some(a), Some(b)) => Some(merge(a, b)),
                            (a, _) => a,
                        };
                    }
                }
                out
            })
            .collect()
    }

    /// The bandwidths of `bytes` done in `time_us`.
    pub fn bandwidth(&self, bytes: u64, time_us: f64) -> Bandwidth {
        let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
        let factor = self.setup.plan.collective.bus_factor(self.setup.plan.ranks);
        Bandwidth {
            time_us,
            algbw,
            busbw: algbw * factor,
        }
    }

    /// Wrong elements of oxccl's results, over every size and placement.
    pub fn wrong(&self) -> u64 {
        self.sizes
            .iter()
            .map(|s| s.out_of_place.wrong + s.in_place.map_or(0, |t| t.wrong))
            .sum()
    }

    /// Mean bus bandwidth over every size and placement, as nccl-tests' `Avg bus
    /// bandwidth`.
    pub fn avg_busbw(&self) -> f64 {
        let all: Vec<f64> = self
            .sizes
            .iter()
            .flat_map(|s| {
                std::iter::once(s.out_of_place)
                    .chain(s.in_place)
                    .map(|t| self.bandwidth(s.bytes, t.time_us).busbw)
            })
            .collect();
        all.iter().sum::<f64>() / all.len().max(1) as f64
    }

    /// The fastest MPI variant for `size`, out of place or in place.
    pub fn mpi_best(&self, size: &SizeResult, in_place: bool) -> Option<Best> {
        self.mpi.as_ref()?.best(size.count, in_place)
    }

    /// Geometric means of oxccl's time over the best MPI variant's, out of place and in
    /// place, over the sizes both have (`None` without any).
    pub fn x_mpi_means(&self) -> (Option<f64>, Option<f64>) {
        let mean = |in_place: bool| {
            let logs: Vec<f64> = self
                .sizes
                .iter()
                .filter_map(|s| {
                    let ours = if in_place {
                        s.in_place?
                    } else {
                        s.out_of_place
                    };
                    Some((ours.time_us / self.mpi_best(s, in_place)?.time_us).ln())
                })
                .collect();
            (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
        };
        (mean(false), mean(true))
    }

    /// The size the memory baseline is set beside (the baseline's array size), if the sweep
    /// has it.
    pub fn at_memory_size(&self) -> Option<&SizeResult> {
        let bytes = self.memory.as_ref()?.array_bytes;
        self.sizes.iter().find(|s| s.bytes == bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(t: f64, wrong: u64, ip: Option<(f64, u64)>) -> SizeResult {
        SizeResult {
            bytes: 1024,
            count: 256,
            algo: "direct".into(),
            out_of_place: Timing { time_us: t, wrong },
            in_place: ip.map(|(time_us, wrong)| Timing { time_us, wrong }),
        }
    }

    /// Guards against a size's time being a rank's other than the slowest, or wrong
    /// elements of one rank being lost.
    #[test]
    fn ranks_combine_slowest_and_sum() {
        let combined = Report::combine(&[
            vec![size(1.0, 1, Some((3.0, 0)))],
            vec![size(2.0, 2, Some((1.0, 5)))],
        ]);
        assert_eq!(combined, [size(2.0, 3, Some((3.0, 5)))]);
        let none = Report::combine(&[vec![size(1.0, 0, None)], vec![size(4.0, 0, None)]]);
        assert_eq!(none, [size(4.0, 0, None)]);
    }
}
