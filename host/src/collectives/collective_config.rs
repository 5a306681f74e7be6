//! How a communicator runs its collectives: sizes of its scratch, launch shape, algorithm.

use super::algorithm::AlgorithmChoice;
use oxccl_device::launch::LaunchConfig;

/// Settings of a communicator's collectives ([`crate::CommunicatorConfig::collectives`]).
/// Every rank must use the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveConfig {
    /// Largest all-reduce, in bytes, the packet algorithm takes, and the packet region of
    /// the scratch per peer (each byte of data takes two bytes of packets). The default,
    /// 2 KiB, is where the direct algorithm overtakes packets on the CPU emulator (`allreduce
    /// --algo packets|direct` measures it); on a GPU, where a packet costs no thread hand-off,
    /// packets pay off to tens of KiB.
    pub packet_limit: u64,
    /// Bytes one round of a direct algorithm stages per rank: larger messages run in
    /// several rounds. The scratch holds two rounds. The default, 256 KiB, keeps a round's
    /// staged data in the caches of the CPU emulator's cores.
    pub round_bytes: u64,
    /// The grid and block of direct kernels; `None` picks one for the device (on the CPU
    /// emulator one block of one thread: each thread is a thread of the host). Packet
    /// kernels run one block of the same size.
    pub launch: Option<LaunchConfig>,
    /// The algorithm: [`AlgorithmChoice::Auto`] chooses by size (and honours `OXCCL_ALGO`).
    pub algorithm: AlgorithmChoice,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            packet_limit: 2 << 10,
            round_bytes: 256 << 10,
            launch: None,
            algorithm: AlgorithmChoice::Auto,
        }
    }
}
