//! The options both benchmark programs take, and the communicator settings they make.

use crate::parse_bytes;
use clap::ValueEnum;
use oxccl::collectives::{Algorithm, AlgorithmChoice};
use oxccl::{Backend, CollectiveConfig, CommunicatorConfig, DataType, ReduceOp};
use oxccl_device::launch::LaunchConfig;
use std::path::PathBuf;

/// How results are checked against the host reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CheckMode {
    /// One checked call before the timed ones, which then run back to back.
    First,
    /// Every timed call is checked: each runs and is synchronized alone, its time excludes
    /// the check and the reset of the buffers.
    Every,
}

/// Whether the benchmark registers its buffers for the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Register {
    /// Each size's buffers are registered on every rank
    /// (`Communicator::register_collective_buffer`): collectives that can read the peers'
    /// buffers in place do (all-reduce); through the proxy, the port all-reduce puts from
    /// the registered input (from `CollectiveConfig::port_direct_bytes` on).
    On,
    /// Plain buffers: every call stages its data through the communicator's scratch.
    Off,
}

/// What the program prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The nccl-tests table, with `#` headers and footers.
    Table,
    /// One JSON object per size and line, nothing else.
    Json,
}

/// Options of `allreduce` and `collectives`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    /// Smallest size, in bytes (suffixes K, M, G); see the table's `size` column.
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: u64,
    /// Largest size, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    pub max_bytes: u64,
    /// Factor between consecutive sizes (at least 2).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    pub step_factor: u64,
    /// Timed iterations per size (at least 1).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Element type: f32, f64, f16, bf16, i8, u8, i32, u32, i64 or u64.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DataType,
    /// Reduction of the reducing collectives: sum, prod, min, max or avg.
    #[arg(long, default_value = "sum", value_parser = parse_op)]
    pub op: ReduceOp,
    /// Root of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    pub root: u32,
    /// Algorithm: auto (by size, or `OXCCL_ALGO`), packets, direct, ports, ring or doubling.
    /// The other collectives take it as the library does: `ports`, `ring` and `doubling` send
    /// them through the proxy (the ring for all-gather and reduce-scatter, recursive
    /// doubling for all-gather among a power of two of ranks, else their port algorithm);
    /// `packets` is all-reduce's alone.
    #[arg(long, default_value = "auto", value_parser = parse_algo)]
    pub algo: AlgorithmChoice,
    /// Largest all-reduce sent as packets under `--algo auto` (default: the library's;
    /// under `--algo packets`, at least `--max-bytes`).
    #[arg(long, value_parser = parse_bytes)]
    pub packet_limit: Option<u64>,
    /// Smallest packet message (bytes to one peer) sent as data and one signal instead of
    /// LL16 packets (default: the library's choice for the device; 0: always data).
    #[arg(long, value_parser = parse_bytes)]
    pub packet_data_bytes: Option<u64>,
    /// Bytes one round of a collective stages per rank, over memory and over port channels
    /// alike (default: the library's, which differ); larger messages take several rounds.
    #[arg(long, value_parser = parse_bytes)]
    pub round_bytes: Option<u64>,
    /// Blocks of every collective kernel (default: the library's choice).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub blocks: Option<u32>,
    /// Threads per block of every collective kernel (default: the library's choice).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// Check the first call of each size (`first`) or every timed call (`every`).
    #[arg(long, value_enum, default_value_t = CheckMode::First)]
    pub check: CheckMode,
    /// With `--check first`, synchronize the stream after every timed call (nccl-tests'
    /// `-z 1`): the time a caller that waits for each call sees, launch to completion, where
    /// back-to-back calls overlap one's launch with the previous one's run.
    #[arg(long)]
    pub blocking: bool,
    /// Register each size's buffers for zero-copy collectives (`on`), or not (`off`).
    #[arg(long, value_enum, default_value_t = Register::On)]
    pub register: Register,
    /// Instead of the sweep: calls of random sizes (between the smallest and largest size),
    /// types, operations, roots and placements for this many seconds, every result
    /// checked; prints the calls made and the wrong elements.
    #[arg(long, value_name = "SECONDS")]
    pub soak: Option<f64>,
    /// Seed of `--soak`'s random calls.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output: the nccl-tests table or one JSON object per size.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also draw bus bandwidth against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run each rank as its own process (this program, started `--ranks` times) instead of
    /// as threads of one process.
    #[arg(long)]
    pub processes: bool,
    /// Backend of every rank's device: `auto`, `cpu` (the emulator) or `cuda`; `OXCCL_BACKEND`
    /// when not given, as for the library's `Backend::from_env`.
    #[arg(long, env = oxccl::backend::BACKEND_ENV, default_value = "cpu", value_parser = parse_backend)]
    pub backend: Backend,
    /// Also time Open MPI's counterpart with the same ranks, sizes, type, operation and
    /// iterations in the same run (needs mpicc and mpirun).
    #[arg(long)]
    pub mpi: bool,
}

/// A backend named as `OXCCL_BACKEND` names it.
pub fn parse_backend(name: &str) -> Result<Backend, String> {
    // Empty (`OXCCL_BACKEND=`) means unset, as for `Backend::from_env`.
    if name.trim().is_empty() {
        return Ok(Backend::Cpu);
    }
    name.parse::<Backend>().map_err(|e| e.to_string())
}

impl BenchArgs {
    /// The sizes of the sweep: `--min-bytes`, times `--step-factor`, up to `--max-bytes`.
    pub fn sizes(&self) -> Vec<u64> {
        std::iter::successors(Some(self.min_bytes.max(1)), |&b| {
            b.checked_mul(self.step_factor.max(2))
        })
        .take_while(|&b| b <= self.max_bytes.max(1))
        .collect()
    }

    /// The launch shape `--blocks` and `--threads` ask for, if either is given.
    pub fn launch(&self) -> Option<LaunchConfig> {
        (self.blocks.is_some() || self.threads.is_some()).then(|| {
            LaunchConfig::grid(self.blocks.unwrap_or(1).max(1))
                .block(self.threads.unwrap_or(1).max(1))
        })
    }

    /// The communicator settings of every rank.
    pub fn communicator_config(&self) -> CommunicatorConfig {
        let default = CollectiveConfig::default();
        // `--max-bytes`, not the sweep's largest size: a soak's sizes go up to it.
        let packet_limit = self.packet_limit.unwrap_or(match self.algo {
            AlgorithmChoice::Use(Algorithm::Packets) => default.packet_limit.max(self.max_bytes),
            _ => default.packet_limit,
        });
        CommunicatorConfig {
            collectives: CollectiveConfig {
                packet_limit,
                packet_data_bytes: self.packet_data_bytes.or(default.packet_data_bytes),
                round_bytes: self.round_bytes.unwrap_or(default.round_bytes),
                port_round_bytes: self.round_bytes.unwrap_or(default.port_round_bytes),
                launch: self.launch(),
                algorithm: self.algo,
                ..default
            },
            ..CommunicatorConfig::default()
        }
    }
}

/// The short names `--dtype` takes, by type.
pub const DTYPE_NAMES: [(&str, DataType); 10] = [
    ("f32", DataType::F32),
    ("f64", DataType::F64),
    ("f16", DataType::F16),
    ("bf16", DataType::Bf16),
    ("i8", DataType::I8),
    ("u8", DataType::U8),
    ("i32", DataType::I32),
    ("u32", DataType::U32),
    ("i64", DataType::I64),
    ("u64", DataType::U64),
];

/// The short name of `dtype` (`f32`, `bf16`, ...), as `--dtype` takes it.
pub fn dtype_name(dtype: DataType) -> &'static str {
    DTYPE_NAMES
        .iter()
        .find(|(_, d)| *d == dtype)
        .map_or("?", |(name, _)| name)
}

/// Parses `--dtype`.
///
/// # Errors
/// A name that is not one of [`DTYPE_NAMES`].
pub fn parse_dtype(s: &str) -> Result<DataType, String> {
    DTYPE_NAMES
        .iter()
        .find(|(name, _)| *name == s.trim())
        .map(|&(_, d)| d)
        .ok_or_else(|| {
            let names: Vec<&str> = DTYPE_NAMES.iter().map(|(n, _)| *n).collect();
            format!("`{s}` is not a type: one of {}", names.join(", "))
        })
}

/// Parses `--op` (`sum`, `prod`, `min`, `max`, `avg`).
///
/// # Errors
/// A name that is not an operation's.
pub fn parse_op(s: &str) -> Result<ReduceOp, String> {
    ReduceOp::ALL
        .into_iter()
        .find(|op| op.name() == s.trim())
        .ok_or_else(|| format!("`{s}` is not an operation: sum, prod, min, max or avg"))
}

/// Parses `--algo` (`auto`, `packets`, `direct`, `ports`, `ring`, `doubling`).
///
/// # Errors
/// A name that is none of those.
pub fn parse_algo(s: &str) -> Result<AlgorithmChoice, String> {
    match s.trim() {
        "auto" => Ok(AlgorithmChoice::Auto),
        name => Algorithm::parse(name)
            .map(AlgorithmChoice::Use)
            .map_err(|_| {
                format!("`{s}` is not an algorithm: auto, packets, direct, ports, ring or doubling")
            }),
    }
}

/// The name of an algorithm choice, as `--algo` takes it.
pub fn algo_name(choice: AlgorithmChoice) -> &'static str {
    match choice {
        AlgorithmChoice::Auto => "auto",
        AlgorithmChoice::Use(a) => a.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    /// Guards against the defaults changing what a bare run measures (f32 sum, automatic
    /// algorithm, the library's launch shape, first-call checks, the table).
    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.dtype, a.op, a.algo),
            (DataType::F32, ReduceOp::Sum, AlgorithmChoice::Auto)
        );
        assert_eq!(
            (a.check, a.format, a.ranks),
            (CheckMode::First, Format::Table, 2)
        );
        assert_eq!(a.launch(), None);
        assert_eq!(
            a.communicator_config().collectives,
            CollectiveConfig::default()
        );
        assert_eq!(a.sizes().first(), Some(&8));
        // 8 B times powers of 4 up to 16 MiB: 8 MiB is the last.
        assert_eq!(a.sizes().last(), Some(&(8 << 20)));
    }

    /// Guards against an option being read into the wrong setting, or a name being
    /// misread, for every type, operation and algorithm.
    #[test]
    fn every_option_parses() {
        let a = parse(&[
            "--dtype",
            "bf16",
            "--op",
            "max",
            "--algo",
            "direct",
            "--blocks",
            "3",
            "--threads",
            "4",
            "--check",
            "every",
            "--soak",
            "2.5",
            "--format",
            "json",
            "--plot",
            "x.svg",
            "--min-bytes",
            "1K",
            "--max-bytes",
            "64M",
            "--step-factor",
            "2",
            "--root",
            "1",
            "--mpi",
            "--processes",
            "--seed",
            "7",
        ])
        .unwrap();
        assert_eq!((a.dtype, a.op), (DataType::Bf16, ReduceOp::Max));
        assert_eq!(a.algo, AlgorithmChoice::Use(Algorithm::Direct));
        assert_eq!(a.launch(), Some(LaunchConfig::grid(3).block(4)));
        assert_eq!(
            (a.check, a.format, a.soak),
            (CheckMode::Every, Format::Json, Some(2.5))
        );
        assert_eq!(a.plot.as_deref(), Some(std::path::Path::new("x.svg")));
        assert_eq!(a.sizes().len(), 17);
        assert!(a.mpi && a.processes && a.root == 1 && a.seed == 7);
        let c = a.communicator_config().collectives;
        assert_eq!(c.launch, Some(LaunchConfig::grid(3).block(4)));
        assert_eq!(c.algorithm, AlgorithmChoice::Use(Algorithm::Direct));
        for (name, dtype) in DTYPE_NAMES {
            assert_eq!(parse(&["--dtype", name]).unwrap().dtype, dtype);
            assert_eq!(dtype_name(dtype), name);
        }
        for op in ReduceOp::ALL {
            assert_eq!(parse(&["--op", op.name()]).unwrap().op, op);
        }
        for choice in ["auto", "packets", "direct", "ports", "ring", "doubling"] {
            assert_eq!(algo_name(parse(&["--algo", choice]).unwrap().algo), choice);
        }
        // Only --threads: one block of that many threads.
        let a = parse(&["--threads", "2"]).unwrap();
        assert_eq!(a.launch(), Some(LaunchConfig::grid(1).block(2)));
    }

    /// Guards against packets being forced on sizes past the packet limit (every call
    /// would be refused, as a soak's were when the limit followed the sweep's sizes) and
    /// against an explicit limit being overridden.
    #[test]
    fn forced_packets_cover_every_size() {
        // The sweep's largest size is 512 KiB; a soak's calls go up to 1 MiB.
        let a = parse(&["--algo", "packets", "--max-bytes", "1M"]).unwrap();
        assert_eq!(a.sizes().last(), Some(&(512 << 10)));
        assert_eq!(a.communicator_config().collectives.packet_limit, 1 << 20);
        let a = parse(&["--algo", "packets", "--packet-limit", "4K"]).unwrap();
        assert_eq!(a.communicator_config().collectives.packet_limit, 4096);
    }

    /// Guards against `--packet-data-bytes` being dropped (the library's choice for the
    /// device is the default).
    #[test]
    fn packet_data_bytes_reach_the_config() {
        let a = parse(&["--packet-data-bytes", "1K"]).unwrap();
        assert_eq!(
            a.communicator_config().collectives.packet_data_bytes,
            Some(1024)
        );
        let a = parse(&[]).unwrap();
        assert_eq!(a.communicator_config().collectives.packet_data_bytes, None);
    }

    /// Guards against bad names being accepted (and silently measuring something else).
    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--dtype", "f8"][..],
            &["--op", "xor"],
            &["--algo", "tree"],
            &["--check", "some"],
            &["--format", "csv"],
            &["--min-bytes", "1Q"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
