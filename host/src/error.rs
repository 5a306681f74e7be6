//! The error type of the host API.

use std::time::Duration;

/// Result of host API calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a host call of oxccl can fail with. Each variant names the rank, peer, channel
/// or id involved where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The call was given arguments or state it cannot work with.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A wait passed its deadline.
    #[error("timeout after {after:?}: {what}")]
    Timeout {
        /// What was being waited for, with rank / peer / channel.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// A kernel or the proxy gave up and raised an abort flag.
    #[error("aborted: {0}")]
    Aborted(String),
    /// A kernel thread panicked (on the CPU backend) or trapped.
    #[error("kernel `{kernel}` failed: {message}")]
    KernelFailed {
        /// Name of the kernel.
        kernel: &'static str,
        /// The panic message or trap reason.
        message: String,
    },
    /// The out-of-band bootstrap failed (a peer did not answer, a wrong secret, ...).
    #[error(transparent)]
    Bootstrap(#[from] oxccl_bootstrap::Error),
    /// The proxy refused a trigger or a connection failed.
    #[error(transparent)]
    Proxy(#[from] oxccl_proxy::ProxyError),
    /// The requested backend cannot be used on this machine.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    System {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A rank of a job failed; the error says why.
    #[error("rank {rank}: {source}")]
    Rank {
        /// The rank.
        rank: u32,
        /// What it failed with.
        #[source]
        source: Box<Error>,
    },
    /// A bug in oxccl: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The message of a caught panic: its payload if it is a string, else a placeholder.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic with a non-string payload")
}
