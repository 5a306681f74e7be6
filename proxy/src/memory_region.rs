//! What the proxy knows of a registered memory: whose it is, how big, and where it is
//! reachable from this process.

/// A registered memory as the proxy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryRegion {
    /// Rank that owns the memory.
    pub owner_rank: u32,
    /// Address at which this process reaches the memory (its own, or a mapping of a peer's
    /// over a same-node transport); 0 where the memory is reachable only through a
    /// connection's own addressing (network transports).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
}

impl MemoryRegion {
    /// A region of `size` bytes at `addr`, owned by `owner_rank`.
    pub fn new(owner_rank: u32, addr: u64, size: u64) -> Self {
        MemoryRegion {
            owner_rank,
            addr,
            size,
        }
    }

    /// Whether `offset..offset+bytes` lies inside the region.
    pub fn contains(&self, offset: u64, bytes: u64) -> bool {
        offset <= self.size && bytes <= self.size - offset
    }
}
