//! The table through which peers write this rank's memory over Ethernet: registration id →
//! (address here, size, a share of the memory).
//!
//! A peer names memory only by (id, offset, length); the receiver resolves every write and
//! signal against this table, so no address from another rank is ever trusted (MSCCL++'s
//! Ethernet receiver writes wherever the sender's pointer says). Ids are assigned here, by
//! the owner, and travel in [`RegisteredMemory`](crate::RegisteredMemory)'s wire format.
//!
//! Entries are never removed while the table lives, and each holds a share of its memory:
//! an address resolved from the table stays valid as long as the table does, so a
//! receiver (which holds the table) never writes memory that was freed under it.

use crate::error::{Error, Result};
use parking_lot::RwLock;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Most registrations one rank may make reachable over Ethernet.
pub const MAX_REGISTRATIONS: usize = 1 << 16;

/// Why a peer's (id, offset, length) does not name memory of this rank.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No registration has this id.
    #[error("unknown registration id {id}")]
    UnknownId {
        /// The id.
        id: u32,
    },
    /// The range does not lie inside the registration.
    #[error("bytes {offset}..{end} of registration {id} lie outside its {size} bytes")]
    OutOfBounds {
        /// The id.
        id: u32,
        /// Start of the range.
        offset: u64,
        /// End of the range (exclusive; saturated).
        end: u64,
        /// Size of the registration.
        size: u64,
    },
    /// A semaphore store at an address that is not 8-byte aligned.
    #[error("offset {offset} of registration {id} is not 8-byte aligned for a semaphore")]
    Misaligned {
        /// The id.
        id: u32,
        /// The offset.
        offset: u64,
    },
}

struct Entry {
    addr: u64,
    size: u64,
    /// Keeps the memory at `addr` allocated while the entry exists.
    _keep_alive: Arc<dyn Any + Send + Sync>,
}

/// This rank's memories reachable over Ethernet, by registration id.
#[derive(Default)]
pub struct EthernetRegistry {
    entries: RwLock<Vec<Entry>>,
}

impl EthernetRegistry {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `size` bytes at `addr`, kept allocated by `keep_alive`; returns its id.
    ///
    /// # Errors
    /// More than [`MAX_REGISTRATIONS`] registrations.
    pub(crate) fn add(
        &self,
        addr: u64,
        size: u64,
        keep_alive: Arc<dyn Any + Send + Sync>,
    ) -> Result<u32> {
        let mut entries = self.entries.write();
        if entries.len() >= MAX_REGISTRATIONS {
            return Err(Error::InvalidUsage(format!(
                "more than {MAX_REGISTRATIONS} registrations reachable over Ethernet"
            )));
        }
        entries.push(Entry {
            addr,
            size,
            _keep_alive: keep_alive,
        });
        Ok(entries.len() as u32 - 1)
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address here of bytes `offset..offset + len` of registration `id`, checked.
    /// The address stays valid as long as the table (see the module docs).
    ///
    /// # Errors
    /// An unknown id, or a range outside the registration.
    pub fn resolve(&self, id: u32, offset: u64, len: u64) -> Result<u64, ResolveError> {
        let entries = self.entries.read();
        let entry = entries
            .get(id as usize)
            .ok_or(ResolveError::UnknownId { id })?;
        let inside = offset <= entry.size && len <= entry.size - offset;
        if !inside {
            return Err(ResolveError::OutOfBounds {
                id,
                offset,
                end: offset.saturating_add(len),
                size: entry.size,
            });
        }
        Ok(entry.addr + offset)
    }

    /// The address here of the semaphore (an aligned u64) at `offset` of registration `id`.
    ///
    /// # Errors
    /// As [`Self::resolve`], or a misaligned address.
    pub fn resolve_semaphore(&self, id: u32, offset: u64) -> Result<u64, ResolveError> {
        let addr = self.resolve(id, offset, 8)?;
        if !addr.is_multiple_of(8) {
            return Err(ResolveError::Misaligned { id, offset });
        }
        Ok(addr)
    }
}

impl fmt::Debug for EthernetRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EthernetRegistry")
            .field("registrations", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a range check that overflows or lets a range end past the
    /// registration, and against ids that name nothing.
    #[test]
    fn resolve_checks_id_and_range() {
        let table = EthernetRegistry::new();
        let id = table.add(0x1000, 64, Arc::new(())).unwrap();
        assert_eq!(table.resolve(id, 0, 64), Ok(0x1000));
        assert_eq!(table.resolve(id, 64, 0), Ok(0x1040));
        assert!(matches!(
            table.resolve(id, 60, 8),
            Err(ResolveError::OutOfBounds { end: 68, .. })
        ));
        assert!(matches!(
            table.resolve(id, u64::MAX, 2),
            Err(ResolveError::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.resolve(id, 8, u64::MAX),
            Err(ResolveError::OutOfBounds { .. })
        ));
        assert_eq!(
            table.resolve(id + 1, 0, 0),
            Err(ResolveError::UnknownId { id: id + 1 })
        );
        assert_eq!(
            table.resolve_semaphore(id, 4),
            Err(ResolveError::Misaligned { id, offset: 4 })
        );
    }
}
