//! What the proxy knows of a registered memory: whose it is, how big, where it is reachable
//! from this process, and what keeps it there.

use crate::error::ProxyError;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A peer's memory as an RDMA device writes it: the address in the owner's address space
/// and the remote key the owner's device gave its registration. The owner's device refuses
/// any access outside that registration (or without the key), whatever the writer sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RdmaKey {
    /// Address of the region's first byte in its owner's address space.
    pub addr: u64,
    /// The registration's remote key.
    pub rkey: u32,
}

/// A registered memory as the proxy sees it.
///
/// A region may hold a share of whatever owns its memory ([`Self::with_keep_alive`]): the
/// proxy keeps its regions as long as it may execute triggers naming them, so memory it
/// writes or reads is never freed under it, whatever the host program drops meanwhile.
#[derive(Clone)]
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
    /// The id the owner gave the memory, for transports that name it by id instead of by
    /// address (Ethernet): the owner resolves (id, offset, length) against its own table, so
    /// no address of one rank is ever trusted by another.
    pub registration_id: Option<u32>,
    /// Where an RDMA transport writes the memory, for a peer's memory reached over
    /// InfiniBand / RoCE (whose address here is 0): see [`RdmaKey`].
    pub rdma: Option<RdmaKey>,
    /// A share of the owner of the memory at `addr`, if the region keeps it alive.
    keep_alive: Option<Arc<dyn Any + Send + Sync>>,
}

impl MemoryRegion {
    /// A region of `size` bytes at `addr`, owned by `owner_rank`, kept alive by nobody.
    pub fn new(owner_rank: u32, addr: u64, size: u64) -> Self {
        MemoryRegion {
            owner_rank,
            addr,
            size,
            registration_id: None,
            rdma: None,
            keep_alive: None,
        }
    }

    /// The same region, named by its owner's registration `id` (see
    /// [`Self::registration_id`]).
    pub fn with_registration_id(mut self, id: u32) -> Self {
        self.registration_id = Some(id);
        self
    }

    /// The same region, written through an RDMA device at `key` (see [`Self::rdma`]).
    pub fn with_rdma_key(mut self, key: RdmaKey) -> Self {
        self.rdma = Some(key);
        self
    }

    /// The same region, holding a share of `owner` (the allocation or mapping at `addr`) for
    /// as long as the region or a clone of it exists.
    pub fn with_keep_alive(mut self, owner: Arc<dyn Any + Send + Sync>) -> Self {
        self.keep_alive = Some(owner);
        self
    }

    /// Whether the region holds a share of its memory's owner.
    pub fn keeps_alive(&self) -> bool {
        self.keep_alive.is_some()
    }

    /// Whether `offset..offset+bytes` lies inside the region.
    pub fn contains(&self, offset: u64, bytes: u64) -> bool {
        offset <= self.size && bytes <= self.size - offset
    }

    /// The address of the semaphore counter at `offset`, for a connection about to raise
    /// it: the region must be reachable here (a non-zero address) and the 8 bytes inside
    /// it and aligned.
    ///
    /// # Errors
    /// [`ProxyError::InvalidUsage`] saying which of those fails.
    pub fn semaphore_address(&self, offset: u64) -> Result<u64, ProxyError> {
        let address = self.address(offset)?;
        if !self.contains(offset, 8) || !address.is_multiple_of(8) {
            return Err(ProxyError::InvalidUsage(format!(
                "semaphore at offset {offset} of rank {}'s {}-byte region is out of bounds or \
                 misaligned",
                self.owner_rank, self.size
            )));
        }
        Ok(address)
    }

    /// The address of byte `offset` of the region, where this process reaches it (the
    /// caller has checked the range against the region).
    ///
    /// # Errors
    /// [`ProxyError::InvalidUsage`]: the region is not reachable here (its address is 0:
    /// memory a peer names by id, over Ethernet).
    pub fn address(&self, offset: u64) -> Result<u64, ProxyError> {
        if self.addr == 0 {
            return Err(ProxyError::InvalidUsage(format!(
                "memory of rank {} is not mapped in this process",
                self.owner_rank
            )));
        }
        Ok(self.addr + offset)
    }
}

impl PartialEq for MemoryRegion {
    /// Regions are equal when they name the same bytes of the same rank, whoever keeps them.
    fn eq(&self, other: &Self) -> bool {
        (
            self.owner_rank,
            self.addr,
            self.size,
            self.registration_id,
            self.rdma,
        ) == (
            other.owner_rank,
            other.addr,
            other.size,
            other.registration_id,
            other.rdma,
        )
    }
}

impl Eq for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("owner_rank", &self.owner_rank)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("registration_id", &self.registration_id)
            .field("rdma", &self.rdma)
            .field("keeps_alive", &self.keeps_alive())
            .finish()
    }
}
