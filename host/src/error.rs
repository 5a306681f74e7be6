//! The error type of the host API.
//!
//! Every variant carries what a user needs to act on it as fields (rank, peer, channel,
//! offsets, counts), and [`Error::kind`] sorts it into the kinds MSCCL++ uses.

use oxccl_device::DeviceError;
use oxccl_device::error::DeviceOp;
use std::fmt;
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
    /// A host-side wait passed its deadline.
    #[error("timeout after {after:?}: {what}")]
    Timeout {
        /// What was being waited for, with rank / peer / channel.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// A device call on a channel failed: a wait timed out, a call was refused, the
    /// channel was stopped.
    #[error(transparent)]
    Channel(Box<ChannelError>),
    /// Work was stopped because something else failed first (another channel, another
    /// rank, the host).
    #[error("aborted: {0}")]
    Aborted(String),
    /// A kernel thread panicked (on the CPU backend) or trapped.
    #[error("kernel `{kernel}` failed: {message}")]
    KernelFailed {
        /// Name of the kernel.
        kernel: &'static str,
        /// The panic message or trap reason, with the thread and block.
        message: String,
    },
    /// A kernel returned an error (its threads' first failed device call is described).
    #[error("kernel `{kernel}` returned an error: {error}: {message}")]
    KernelError {
        /// Name of the kernel.
        kernel: &'static str,
        /// What the kernel returned.
        error: DeviceError,
        /// Which thread, which call, with what.
        message: String,
    },
    /// The out-of-band bootstrap failed (a peer did not answer, a wrong secret, ...).
    #[error(transparent)]
    Bootstrap(#[from] oxccl_bootstrap::Error),
    /// The proxy refused a trigger, a connection failed, or the FIFO stalled.
    #[error(transparent)]
    Proxy(#[from] oxccl_proxy::ProxyError),
    /// The requested backend cannot be used on this machine.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// An RDMA verbs call failed (the InfiniBand / RoCE transport).
    #[error("{context}: {call} failed: {detail}")]
    Verbs {
        /// What was being done, with rank, peer and device.
        context: String,
        /// The verbs function (`ibv_reg_mr`).
        call: &'static str,
        /// What the library said (errno and its description, or a completion status).
        detail: String,
    },
    /// A CUDA driver call failed.
    #[error("{context}: {call} failed: {code}")]
    Cuda {
        /// What was being done, with device, kernel or buffer.
        context: String,
        /// The driver function (`cuMemAlloc`).
        call: &'static str,
        /// The driver's name and description of the error (`CUDA_ERROR_OUT_OF_MEMORY: out of
        /// memory`).
        code: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    System {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Ranks of a job failed: every failing rank's error, the root cause first.
    #[error("{}", RankFailures(.0))]
    Ranks(Vec<RankFailure>),
    /// A bug in oxccl: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The kinds of [`Error`], as MSCCL++ sorts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The caller asked for something that cannot work.
    InvalidUsage,
    /// Something did not happen in time.
    Timeout,
    /// Stopped because something else failed first.
    Aborted,
    /// A peer (or what it sent) is at fault: a refused trigger, a failed connection, a bad
    /// handle, a bootstrap peer.
    Remote,
    /// The operating system or the machine refused.
    System,
    /// A bug in oxccl, or a kernel that failed.
    Internal,
}

impl Error {
    /// The kind of error, for callers that branch on it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidUsage(_) => ErrorKind::InvalidUsage,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Channel(c) => c.kind(),
            Error::Aborted(_) => ErrorKind::Aborted,
            Error::KernelFailed { .. } => ErrorKind::Internal,
            Error::KernelError { error, .. } => device_error_kind(*error),
            Error::Bootstrap(e) => match e.kind() {
                oxccl_bootstrap::ErrorKind::Timeout => ErrorKind::Timeout,
                oxccl_bootstrap::ErrorKind::InvalidUsage => ErrorKind::InvalidUsage,
                oxccl_bootstrap::ErrorKind::System => ErrorKind::System,
                _ => ErrorKind::Remote,
            },
            Error::Proxy(p) => match p {
                oxccl_proxy::ProxyError::InvalidUsage(_) => ErrorKind::InvalidUsage,
                oxccl_proxy::ProxyError::Thread(_) => ErrorKind::System,
                oxccl_proxy::ProxyError::FifoStalled { .. } => ErrorKind::Aborted,
                _ => ErrorKind::Remote,
            },
            Error::BackendUnavailable(_)
            | Error::System { .. }
            | Error::Cuda { .. }
            | Error::Verbs { .. } => ErrorKind::System,
            Error::Ranks(failures) => failures
                .first()
                .map_or(ErrorKind::Internal, |f| f.error.kind()),
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The rank whose failure caused this error, for an error of a job ([`Error::Ranks`]).
    pub fn root_rank(&self) -> Option<u32> {
        match self {
            Error::Ranks(failures) => failures.first().map(|f| f.rank),
            _ => None,
        }
    }
}

fn device_error_kind(e: DeviceError) -> ErrorKind {
    match e {
        DeviceError::Timeout => ErrorKind::Timeout,
        DeviceError::Aborted => ErrorKind::Aborted,
        DeviceError::OutOfBounds | DeviceError::InvalidArgument => ErrorKind::InvalidUsage,
        DeviceError::NullHandle | DeviceError::UnsupportedLaunch | DeviceError::OutOfRange => {
            ErrorKind::InvalidUsage
        }
    }
}

/// Which kind of channel a failure happened on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelKind {
    /// A proxy-driven [`PortChannel`](crate::PortChannel).
    Port,
    /// A load/store [`MemoryChannel`](crate::MemoryChannel).
    Memory,
}

impl fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChannelKind::Port => "port channel",
            ChannelKind::Memory => "memory channel",
        })
    }
}

/// A channel as users know it: its kind, its peer, and its place among this rank's
/// channels of that kind to that peer (0 for the first one built).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChannelRef {
    /// Port or memory channel.
    pub kind: ChannelKind,
    /// The rank at the other end.
    pub peer: u32,
    /// Index among this rank's channels of `kind` to `peer`, in creation order.
    pub index: u32,
}

impl fmt::Display for ChannelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{} to peer {}", self.kind, self.index, self.peer)
    }
}

/// A device call on a channel that failed, as the channel's abort record tells it.
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: {channel}{}: {cause}", in_kernel(*.kernel))]
pub struct ChannelError {
    /// The rank where it failed.
    pub rank: u32,
    /// The channel.
    pub channel: ChannelRef,
    /// What failed.
    pub cause: ChannelFailure,
    /// The kernel that failed on it, when known (from a `synchronize`).
    pub kernel: Option<&'static str>,
}

fn in_kernel(kernel: Option<&'static str>) -> String {
    kernel.map_or(String::new(), |k| format!(" in kernel `{k}`"))
}

impl ChannelError {
    /// The kind of the failure.
    pub fn kind(&self) -> ErrorKind {
        match self.cause {
            ChannelFailure::WaitTimedOut { .. } | ChannelFailure::PacketTimedOut { .. } => {
                ErrorKind::Timeout
            }
            ChannelFailure::FifoFull { .. } => ErrorKind::Timeout,
            ChannelFailure::OutOfBounds { .. } | ChannelFailure::InvalidArgument { .. } => {
                ErrorKind::InvalidUsage
            }
            ChannelFailure::Stopped { .. } => ErrorKind::Aborted,
            ChannelFailure::Other { error, .. } => device_error_kind(error),
        }
    }
}

/// What went wrong on a channel.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelFailure {
    /// A `wait` for a signal ran past the limit.
    WaitTimedOut {
        /// The signal number it waited for (1 for the first ever on the channel).
        expected: u64,
        /// Signals that had arrived when it gave up.
        arrived: u64,
        /// The wait limit.
        after: Duration,
    },
    /// A packet read (`read_packet`, `unpack_packets`) ran past the limit.
    PacketTimedOut {
        /// The call.
        op: DeviceOp,
        /// Byte offset of the packet in the packet buffer.
        offset: u64,
        /// The flag it waited for.
        flag: u32,
        /// The flag the packet carried when it gave up.
        seen: u32,
        /// The wait limit.
        after: Duration,
    },
    /// A push found the FIFO full (or a flush found it not drained) past the limit: the
    /// proxy is not executing.
    FifoFull {
        /// The call.
        op: DeviceOp,
        /// The FIFO position of the push or flush.
        position: u64,
        /// Positions the proxy had executed.
        executed: u64,
        /// The wait limit.
        after: Duration,
    },
    /// A call's offset and size fall outside the registered memory.
    OutOfBounds {
        /// The call.
        op: DeviceOp,
        /// The offset asked for.
        offset: u64,
        /// The bytes asked for.
        size: u64,
        /// The registered size of the buffer it fell outside of.
        registered: u64,
    },
    /// A call's argument cannot be accepted (flag 0, a misaligned offset, a size that is
    /// not whole packets, a kernel's own check).
    InvalidArgument {
        /// The call.
        op: DeviceOp,
        /// The call's details, as the device recorded them (see [`DeviceOp`]).
        detail: [u64; 3],
    },
    /// The channel was stopped by an earlier failure (a refused trigger, a failed
    /// connection): its later requests were skipped.
    Stopped {
        /// The call.
        op: DeviceOp,
    },
    /// Any other device failure.
    Other {
        /// The error.
        error: DeviceError,
        /// The call.
        op: DeviceOp,
        /// The recorded details, if any.
        detail: Option<[u64; 3]>,
    },
}

impl fmt::Display for ChannelFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelFailure::WaitTimedOut {
                expected,
                arrived,
                after,
            } => write!(
                f,
                "wait timed out after {after:?}: waited for signal {expected}, {arrived} had \
                 arrived (the peer never signalled, or signalled fewer times than waited)"
            ),
            ChannelFailure::PacketTimedOut {
                op,
                offset,
                flag,
                seen,
                after,
            } => write!(
                f,
                "{op} timed out after {after:?}: the packet at byte {offset} never carried flag \
                 {flag} (it carries {seen})"
            ),
            ChannelFailure::FifoFull {
                op,
                position,
                executed,
                after,
            } => write!(
                f,
                "{op} timed out after {after:?} at FIFO position {position}: the proxy had \
                 executed {executed} (is it running?)"
            ),
            ChannelFailure::OutOfBounds {
                op,
                offset,
                size,
                registered,
            } => write!(
                f,
                "{op} refused: {size} bytes at offset {offset} do not fit the {registered} \
                 registered bytes"
            ),
            ChannelFailure::InvalidArgument { op, detail } => {
                write!(f, "{op} refused: invalid argument (details {detail:?})")
            }
            ChannelFailure::Stopped { op } => write!(
                f,
                "{op} failed: the channel was stopped by an earlier failure; its requests \
                 were skipped"
            ),
            ChannelFailure::Other { error, op, detail } => match detail {
                Some(d) => write!(f, "{op} failed: {error} (details {d:?})"),
                None => write!(f, "{op} failed: {error}"),
            },
        }
    }
}

/// One failing rank of a job.
#[derive(Debug)]
pub struct RankFailure {
    /// The rank.
    pub rank: u32,
    /// Its error.
    pub error: Error,
    /// Whether it failed only because another rank failed first (it was stopped).
    pub consequence: bool,
}

struct RankFailures<'a>(&'a [RankFailure]);

/// A rank's failure as `rank N: error`, without naming the rank twice when the error's
/// own message names it (most do: `rank N: ...`, `invalid usage: rank N: ...`).
struct Ranked<'a>(&'a RankFailure);

impl fmt::Display for Ranked<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.0.error.to_string();
        let prefix = format!("rank {}:", self.0.rank);
        if message.contains(&prefix) {
            f.write_str(&message)
        } else {
            write!(f, "{prefix} {message}")
        }
    }
}

impl fmt::Display for RankFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.0.iter();
        let Some(first) = iter.next() else {
            return f.write_str("a job failed");
        };
        write!(f, "{}", Ranked(first))?;
        for other in iter {
            let how = if other.consequence {
                "then stopped"
            } else {
                "also"
            };
            write!(f, "\n  {how}: {}", Ranked(other))?;
        }
        Ok(())
    }
}

/// The message of a caught panic: its payload if it is a string, else a placeholder.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic with a non-string payload")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a job's error naming a rank twice ("rank 1: rank 1: ...") when the
    /// rank's own error already starts with it, or not at all when it does not.
    #[test]
    fn job_errors_name_each_rank_once() {
        let e = Error::Ranks(vec![
            RankFailure {
                rank: 1,
                error: Error::InvalidUsage("rank 1: bad count".into()),
                consequence: false,
            },
            RankFailure {
                rank: 0,
                error: Error::Internal("stopped".into()),
                consequence: true,
            },
        ]);
        let text = e.to_string();
        assert!(
            text.starts_with("invalid usage: rank 1: bad count"),
            "{text}"
        );
        assert!(text.contains("then stopped: rank 0: "), "{text}");
        assert_eq!(text.matches("rank 1:").count(), 1, "{text}");
    }
}
