//! Transports: the ways a rank can reach a peer's memory.

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
