//! Which algorithm a collective call runs: chosen by message size and rank count, or by the
//! caller (`OXCCL_ALGO`, or an argument), and named in what benchmarks print.

use crate::error::{Error, Result};
use std::fmt;

/// An algorithm of the collectives library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank sends its whole input (all-reduce, all-gather) or each peer its block
    /// (reduce-scatter, all-to-all) into the peer's scratch, as LL packets (data and flag
    /// in one store: no separate signal) or, from
    /// [`CollectiveConfig::packet_data_bytes`](super::CollectiveConfig::packet_data_bytes)
    /// on, as the data and one signal, and every rank reduces or copies what arrives: one
    /// step, no meeting; broadcast and reduce send data one way, eager: the sender waits
    /// only for answers of calls a set cycle before (up to 64), so back-to-back calls
    /// overlap. For small messages, where latency is everything.
    Packets,
    /// Ranks load and store each other's buffers directly (memory channels): each rank
    /// reduces its share of the elements reading every peer's input, and stores the result
    /// into every peer's output. For large messages: every byte crosses once each way.
    Direct,
    /// Ranks put their data into each other's scratch through the proxy (port channels),
    /// two-shot in rounds: what runs between ranks that cannot load and store each
    /// other's memory (several nodes, or the Ethernet transport). Every collective has one.
    Ports,
    /// All-reduce through the proxy in a ring: each rank puts chunks to the next rank only
    /// and hears from the previous one only, `2 (n - 1)` steps a round, so each link carries
    /// one stream of chunks however many ranks there are. For many ranks across nodes
    /// (chosen from [`CollectiveConfig::ring_min_ranks`](super::CollectiveConfig::ring_min_ranks)
    /// ranks on). All-gather and reduce-scatter go round the ring with it (its two halves);
    /// the other collectives take their [`Algorithm::Ports`] algorithms.
    Ring,
    /// All-reduce through the proxy by recursive doubling: at step `k` each rank exchanges
    /// what it has reduced so far with rank `r ^ 2^k`, `log2 n` puts and waits a round
    /// where [`Algorithm::Ports`] makes `n - 1` puts. For small messages among a power of
    /// two of ranks across nodes (chosen up to
    /// [`CollectiveConfig::doubling_max_bytes`](super::CollectiveConfig::doubling_max_bytes)).
    /// All-gather (recursive doubling) and reduce-scatter (recursive halving) take it too,
    /// at every size where a small all-reduce would, and broadcast (recursive doubling)
    /// where it is asked for at every size; other rank counts, and the other collectives,
    /// take [`Algorithm::Ports`].
    Doubling,
}

impl Algorithm {
    /// The name `OXCCL_ALGO` and `--algo` take and benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Packets => "packets",
            Algorithm::Direct => "direct",
            Algorithm::Ports => "ports",
            Algorithm::Ring => "ring",
            Algorithm::Doubling => "doubling",
        }
    }

    /// Whether it runs through the proxy over port channels ([`Algorithm::Ports`],
    /// [`Algorithm::Ring`], [`Algorithm::Doubling`]), which needs no load/store path
    /// between ranks.
    pub fn through_proxy(self) -> bool {
        matches!(
            self,
            Algorithm::Ports | Algorithm::Ring | Algorithm::Doubling
        )
    }

    /// What runs of it among `ranks` ranks: recursive doubling pairs the ranks off, so other
    /// counts than a power of two take the all-pairs [`Algorithm::Ports`] instead.
    pub(crate) fn for_ranks(self, ranks: u32) -> Algorithm {
        match self {
            Algorithm::Doubling if !ranks.is_power_of_two() => Algorithm::Ports,
            algo => algo,
        }
    }

    /// Parses a name (`packets`, `direct`, `ports`, `ring`, `doubling`).
    ///
    /// # Errors
    /// A name that is not an algorithm's.
    pub fn parse(name: &str) -> Result<Algorithm> {
        match name.trim() {
            "packets" => Ok(Algorithm::Packets),
            "direct" => Ok(Algorithm::Direct),
            "ports" => Ok(Algorithm::Ports),
            "ring" => Ok(Algorithm::Ring),
            "doubling" => Ok(Algorithm::Doubling),
            other => Err(Error::InvalidUsage(format!(
                "`{other}` is not an algorithm: `packets`, `direct`, `ports`, `ring` or \
                 `doubling`"
            ))),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The environment variable that forces an algorithm for every collective call that does
/// not choose one itself. Read once per process, at the first collective call that looks.
pub const ALGO_ENV: &str = "OXCCL_ALGO";

/// The value of [`ALGO_ENV`] when the process first looked (reading the environment on
/// every call cost about 2 % of a 1 KiB all-reduce, for a value that does not change).
pub(crate) fn algo_from_env() -> Option<&'static str> {
    static VALUE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    VALUE
        .get_or_init(|| std::env::var(ALGO_ENV).ok())
        .as_deref()
}

/// Where the automatic choice changes algorithm
/// ([`CollectiveConfig::thresholds`](super::CollectiveConfig::thresholds)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Largest message, in bytes, that goes as packets.
    pub packet_limit: u64,
    /// Fewest ranks that take the ring where the ranks reach each other through the proxy.
    pub ring_min_ranks: u32,
    /// Largest message, in bytes, that takes recursive doubling where the ranks reach each
    /// other through the proxy and are a power of two, more than two.
    pub doubling_max_bytes: u64,
}

/// How a call's algorithm is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlgorithmChoice {
    /// By size: [`Algorithm::Packets`] up to the communicator's packet limit, else
    /// [`Algorithm::Direct`]; where ranks cannot load and store each other's memory,
    /// [`Algorithm::Doubling`] for small messages among a power of two of ranks (more than
    /// two), else [`Algorithm::Ring`] from the ring's number of ranks on, else
    /// [`Algorithm::Ports`]; `OXCCL_ALGO` overrides when set.
    #[default]
    Auto,
    /// This one, whatever the size.
    Use(Algorithm),
}

impl AlgorithmChoice {
    /// The algorithm for a message of `bytes` (per rank) among `ranks` ranks, `env` the value
    /// of `OXCCL_ALGO` if set, `load_store` whether every rank can load and store every
    /// other's memory, `at` where the automatic choice changes.
    ///
    /// # Errors
    /// `env` names no algorithm.
    pub fn resolve(
        self,
        bytes: u64,
        ranks: u32,
        env: Option<&str>,
        load_store: bool,
        at: Thresholds,
    ) -> Result<Algorithm> {
        match (self, env) {
            (AlgorithmChoice::Use(a), _) => Ok(a),
            (AlgorithmChoice::Auto, Some(name)) if !name.trim().is_empty() => {
                Algorithm::parse(name).map_err(|e| Error::InvalidUsage(format!("{ALGO_ENV}: {e}")))
            }
            (AlgorithmChoice::Auto, _)
                if !load_store
                    && ranks > 2
                    && ranks.is_power_of_two()
                    && bytes <= at.doubling_max_bytes =>
            {
                Ok(Algorithm::Doubling)
            }
            (AlgorithmChoice::Auto, _) if !load_store && ranks >= at.ring_min_ranks => {
                Ok(Algorithm::Ring)
            }
            (AlgorithmChoice::Auto, _) if !load_store => Ok(Algorithm::Ports),
            (AlgorithmChoice::Auto, _) if bytes <= at.packet_limit => Ok(Algorithm::Packets),
            (AlgorithmChoice::Auto, _) => Ok(Algorithm::Direct),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the size and rank-count rules, the override order (argument, then
    /// environment, then size) or the names drifting.
    #[test]
    fn choices_resolve_in_order() {
        let auto = AlgorithmChoice::Auto;
        let at = Thresholds {
            packet_limit: 4096,
            ring_min_ranks: 8,
            doubling_max_bytes: 1 << 16,
        };
        let pick = |choice: AlgorithmChoice, bytes, ranks, env, load_store| {
            choice.resolve(bytes, ranks, env, load_store, at).unwrap()
        };
        assert_eq!(pick(auto, 1024, 2, None, true), Algorithm::Packets);
        assert_eq!(pick(auto, 4097, 2, None, true), Algorithm::Direct);
        // Many ranks on one node keep the load/store algorithms.
        assert_eq!(pick(auto, 4097, 16, None, true), Algorithm::Direct);
        assert_eq!(pick(auto, 1024, 2, None, false), Algorithm::Ports);
        assert_eq!(pick(auto, 1024, 7, None, false), Algorithm::Ports);
        assert_eq!(pick(auto, 1 << 17, 8, None, false), Algorithm::Ring);
        // Small messages among a power of two of ranks, more than two, through the proxy.
        assert_eq!(pick(auto, 1 << 16, 4, None, false), Algorithm::Doubling);
        assert_eq!(pick(auto, 1024, 8, None, false), Algorithm::Doubling);
        assert_eq!(pick(auto, 1 << 16, 32, None, false), Algorithm::Doubling);
        assert_eq!(pick(auto, (1 << 16) + 1, 4, None, false), Algorithm::Ports);
        assert_eq!(pick(auto, 1024, 2, None, false), Algorithm::Ports);
        assert_eq!(pick(auto, 1024, 12, None, false), Algorithm::Ring);
        assert_eq!(pick(auto, 1024, 4, None, true), Algorithm::Packets);
        assert_eq!(
            pick(auto, 1 << 20, 3, Some("doubling"), true),
            Algorithm::Doubling
        );
        assert_eq!(pick(auto, 8, 2, Some("direct"), true), Algorithm::Direct);
        assert_eq!(
            pick(auto, 1 << 20, 2, Some("ports"), true),
            Algorithm::Ports
        );
        assert_eq!(
            pick(auto, 1 << 20, 2, Some(" ring "), true),
            Algorithm::Ring
        );
        assert_eq!(
            pick(auto, 1 << 20, 9, Some("ports"), false),
            Algorithm::Ports
        );
        let forced = AlgorithmChoice::Use(Algorithm::Packets);
        assert_eq!(
            pick(forced, 1 << 30, 2, Some("direct"), true),
            Algorithm::Packets
        );
        let e = auto
            .resolve(8, 2, Some("tree"), true, at)
            .unwrap_err()
            .to_string();
        assert!(e.contains("OXCCL_ALGO") && e.contains("`tree`"), "{e}");
        let all = [
            Algorithm::Packets,
            Algorithm::Direct,
            Algorithm::Ports,
            Algorithm::Ring,
            Algorithm::Doubling,
        ];
        // Recursive doubling only where the ranks pair off.
        assert_eq!(Algorithm::Doubling.for_ranks(3), Algorithm::Ports);
        assert_eq!(Algorithm::Doubling.for_ranks(4), Algorithm::Doubling);
        assert_eq!(Algorithm::Ring.for_ranks(3), Algorithm::Ring);
        for a in all {
            assert_eq!(Algorithm::parse(a.name()).unwrap(), a);
            let proxy = matches!(a, Algorithm::Ports | Algorithm::Ring | Algorithm::Doubling);
            assert_eq!(a.through_proxy(), proxy, "{a}");
        }
    }
}
