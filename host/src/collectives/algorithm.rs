//! Which algorithm a collective call runs: chosen by message size and rank count, or by the
//! caller (`OXCCL_ALGO`, or an argument), and named in what benchmarks print.

use crate::error::{Error, Result};
use std::fmt;

/// An algorithm of the collectives library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank sends its whole input to every peer as LL packets (data and flag in one
    /// store) into the peer's scratch, and every rank reduces or copies what arrives: one
    /// step, no separate signal. For small messages, where latency is everything.
    Packets,
    /// Ranks load and store each other's buffers directly (memory channels): each rank
    /// reduces its share of the elements reading every peer's input, and stores the result
    /// into every peer's output. For large messages: every byte crosses once each way.
    Direct,
    /// Ranks put their data into each other's scratch through the proxy (port channels),
    /// two-shot in rounds: what runs between ranks that cannot load and store each
    /// other's memory (several nodes, or the Ethernet transport). All-reduce only.
    Ports,
}

impl Algorithm {
    /// The name `OXCCL_ALGO` and `--algo` take and benchmarks print.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Packets => "packets",
            Algorithm::Direct => "direct",
            Algorithm::Ports => "ports",
        }
    }

    /// Parses a name (`packets`, `direct`, `ports`).
    ///
    /// # Errors
    /// A name that is not an algorithm's.
    pub fn parse(name: &str) -> Result<Algorithm> {
        match name.trim() {
            "packets" => Ok(Algorithm::Packets),
            "direct" => Ok(Algorithm::Direct),
            "ports" => Ok(Algorithm::Ports),
            other => Err(Error::InvalidUsage(format!(
                "`{other}` is not an algorithm: `packets`, `direct` or `ports`"
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

/// How a call's algorithm is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlgorithmChoice {
    /// By size: [`Algorithm::Packets`] up to the communicator's packet limit, else
    /// [`Algorithm::Direct`]; [`Algorithm::Ports`] where ranks cannot load and store each
    /// other's memory; `OXCCL_ALGO` overrides when set.
    #[default]
    Auto,
    /// This one, whatever the size.
    Use(Algorithm),
}

impl AlgorithmChoice {
    /// The algorithm for a message of `bytes` (per rank), `packet_limit` the largest message
    /// that goes as packets, `env` the value of `OXCCL_ALGO` if set, `load_store` whether
    /// every rank can load and store every other's memory.
    ///
    /// # Errors
    /// `env` names no algorithm.
    pub fn resolve(
        self,
        bytes: u64,
        packet_limit: u64,
        env: Option<&str>,
        load_store: bool,
    ) -> Result<Algorithm> {
        match (self, env) {
            (AlgorithmChoice::Use(a), _) => Ok(a),
            (AlgorithmChoice::Auto, Some(name)) if !name.trim().is_empty() => {
                Algorithm::parse(name).map_err(|e| Error::InvalidUsage(format!("{ALGO_ENV}: {e}")))
            }
            (AlgorithmChoice::Auto, _) if !load_store => Ok(Algorithm::Ports),
            (AlgorithmChoice::Auto, _) if bytes <= packet_limit => Ok(Algorithm::Packets),
            (AlgorithmChoice::Auto, _) => Ok(Algorithm::Direct),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the size rule, the override order (argument, then environment, then
    /// size) or the names drifting.
    #[test]
    fn choices_resolve_in_order() {
        let auto = AlgorithmChoice::Auto;
        assert_eq!(
            auto.resolve(1024, 4096, None, true).unwrap(),
            Algorithm::Packets
        );
        assert_eq!(
            auto.resolve(4097, 4096, None, true).unwrap(),
            Algorithm::Direct
        );
        assert_eq!(
            auto.resolve(1024, 4096, None, false).unwrap(),
            Algorithm::Ports
        );
        assert_eq!(
            auto.resolve(8, 4096, Some("direct"), true).unwrap(),
            Algorithm::Direct
        );
        assert_eq!(
            auto.resolve(1 << 20, 4096, Some("ports"), true).unwrap(),
            Algorithm::Ports
        );
        assert_eq!(
            AlgorithmChoice::Use(Algorithm::Packets)
                .resolve(1 << 30, 4096, Some("direct"), true)
                .unwrap(),
            Algorithm::Packets
        );
        let e = auto
            .resolve(8, 4096, Some("ring"), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("OXCCL_ALGO") && e.contains("`ring`"), "{e}");
        for a in [Algorithm::Packets, Algorithm::Direct, Algorithm::Ports] {
            assert_eq!(Algorithm::parse(a.name()).unwrap(), a);
        }
    }
}
