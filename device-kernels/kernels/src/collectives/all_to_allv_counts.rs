//! The per-peer counts and displacements of an all-to-all-v, passed by value.

/// Elements rank `r` sends to and receives from each peer, and where: `send_counts[p]`
/// elements of the input from `send_displs[p]` go to peer `p`, `recv_counts[p]` elements
/// from peer `p` land at `recv_displs[p]` of the output (all in elements). Entries past
/// the communicator's size are zero.
///
/// Passed to the kernel by value (1 KiB of parameters): the counts change from call to
/// call, and a kernel parameter is the one place the host can write them for one launch
/// without racing the launches before it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AllToAllvCounts {
    /// Elements sent to each peer.
    pub send_counts: [u64; AllToAllvCounts::MAX_RANKS],
    /// Where in the input each peer's elements start.
    pub send_displs: [u64; AllToAllvCounts::MAX_RANKS],
    /// Elements received from each peer.
    pub recv_counts: [u64; AllToAllvCounts::MAX_RANKS],
    /// Where in the output each peer's elements go.
    pub recv_displs: [u64; AllToAllvCounts::MAX_RANKS],
}

const _: () = assert!(core::mem::size_of::<AllToAllvCounts>() == 1024);

impl AllToAllvCounts {
    /// Most ranks an all-to-all-v kernel takes.
    pub const MAX_RANKS: usize = 32;
}

impl Default for AllToAllvCounts {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}
