//! Transports: the ways a rank can reach a peer's memory, and how a communicator chooses
//! one for its port channels.

use serde::{Deserialize, Serialize};

/// A way to reach a peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Transport {
    /// Same node, CPU emulator: the peer's memory is mapped into this process (shared
    /// memory between processes, plain addresses between ranks of one process). The
    /// analogue of [`Transport::CudaIpc`].
    HostIpc,
    /// Same node, GPU to GPU through CUDA IPC handles.
    CudaIpc,
    /// RDMA verbs on the given InfiniBand / RoCE device index.
    Ib(u8),
    /// TCP, driven by the proxy.
    Ethernet,
}

impl Transport {
    /// Short name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Transport::HostIpc => "host-ipc",
            Transport::CudaIpc => "cuda-ipc",
            Transport::Ib(_) => "ib",
            Transport::Ethernet => "ethernet",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Ib(n) => write!(f, "ib{n}"),
            t => f.write_str(t.name()),
        }
    }
}

/// Environment variable that chooses the transport of port channels: `auto`, `host-ipc`,
/// `ethernet` or `ib` (see [`TransportChoice`]).
pub const TRANSPORT_ENV: &str = "OXCCL_TRANSPORT";

/// Which transport a communicator's port channels use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TransportChoice {
    /// Host IPC to a peer on the same node whose memory can be mapped here; to a peer on
    /// another node InfiniBand / RoCE where oxccl is built with the `ib` feature and an
    /// RDMA device with an active port is present, else Ethernet.
    #[default]
    Auto,
    /// Host IPC only (a peer on another node is an error).
    HostIpc,
    /// Ethernet (TCP) for every port channel, even on one node. Memory channels, which
    /// need load/store access to the peer's memory, are refused.
    Ethernet,
    /// InfiniBand / RoCE (RDMA writes and atomics) for every port channel, even on one
    /// node: an error where oxccl is built without the `ib` feature or no RDMA device with
    /// an active port is present. Memory channels are refused, as over Ethernet.
    Ib,
}

impl TransportChoice {
    /// The choice named `name` (`auto`, `host-ipc`, `ethernet`; case and `_` for `-` are
    /// forgiven).
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "auto" | "" => Ok(TransportChoice::Auto),
            "host-ipc" | "hostipc" => Ok(TransportChoice::HostIpc),
            "ethernet" | "tcp" => Ok(TransportChoice::Ethernet),
            "ib" | "rdma" | "infiniband" | "roce" => Ok(TransportChoice::Ib),
            _ => Err(format!(
                "{TRANSPORT_ENV}={name:?} is not a transport: use auto, host-ipc, ethernet or ib"
            )),
        }
    }

    /// The choice in `OXCCL_TRANSPORT`, if set.
    ///
    /// # Errors
    /// The variable names no transport (or is not Unicode).
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(TRANSPORT_ENV) {
            Ok(name) => Self::parse(&name).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("{TRANSPORT_ENV} is not valid Unicode"))
            }
        }
    }

    /// Short name, as `OXCCL_TRANSPORT` spells it.
    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::HostIpc => "host-ipc",
            TransportChoice::Ethernet => "ethernet",
            TransportChoice::Ib => "ib",
        }
    }

    /// Whether every port channel goes through a network transport, even between ranks of
    /// one node, so that no rank loads or stores another's memory (no memory channels).
    pub fn network_only(self) -> bool {
        matches!(self, TransportChoice::Ethernet | TransportChoice::Ib)
    }
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a misspelt `OXCCL_TRANSPORT` silently falling back to another
    /// transport.
    #[test]
    fn choice_parses_known_names_only() {
        assert_eq!(TransportChoice::parse("auto"), Ok(TransportChoice::Auto));
        assert_eq!(
            TransportChoice::parse("HOST_IPC"),
            Ok(TransportChoice::HostIpc)
        );
        assert_eq!(
            TransportChoice::parse("ethernet"),
            Ok(TransportChoice::Ethernet)
        );
        assert_eq!(TransportChoice::parse("IB"), Ok(TransportChoice::Ib));
        assert!(
            TransportChoice::parse("infiniband-ish")
                .unwrap_err()
                .contains("auto, host-ipc")
        );
        for choice in [
            TransportChoice::Auto,
            TransportChoice::HostIpc,
            TransportChoice::Ethernet,
            TransportChoice::Ib,
        ] {
            assert_eq!(TransportChoice::parse(choice.name()), Ok(choice));
        }
    }
}
