//! Registered memory: a buffer plus what a peer needs to reach it, serializable so it can
//! travel to the peer through the out-of-band exchange.

use crate::error::{Error, Result};
use crate::transport::Transport;
use oxccl_proxy::MemoryRegion;
use serde::{Deserialize, Serialize};

/// A buffer registered for one-sided access, as it travels between ranks.
///
/// It does not own the buffer: the owner keeps the buffer alive (and in place) while any
/// channel built from it may be used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisteredMemory {
    rank: u32,
    addr: u64,
    size: u64,
    transports: Vec<Transport>,
    /// Process that owns the memory: a HostIpc peer in the same process uses `addr` as is.
    process_id: u32,
}

impl RegisteredMemory {
    pub(crate) fn new(rank: u32, addr: u64, size: u64, transports: Vec<Transport>) -> Self {
        RegisteredMemory {
            rank,
            addr,
            size,
            transports,
            process_id: std::process::id(),
        }
    }

    /// Rank that owns the memory.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Address in the owner's address space.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Transports the memory can be reached by.
    pub fn transports(&self) -> &[Transport] {
        &self.transports
    }

    /// The memory as reachable from this process: its address here, for the proxy and for
    /// memory channels.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the memory is in another process and cannot be mapped here.
    pub fn region(&self) -> Result<MemoryRegion> {
        if self.process_id != std::process::id() {
            return Err(Error::InvalidUsage(format!(
                "memory of rank {} lives in process {}; mapping memory of another process is not \
                 available on this transport",
                self.rank, self.process_id
            )));
        }
        Ok(MemoryRegion::new(self.rank, self.addr, self.size))
    }

    /// Encodes for the out-of-band exchange (postcard).
    ///
    /// # Errors
    /// Never in practice; an encoder failure is reported as [`Error::Internal`].
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        postcard::to_stdvec(self)
            .map_err(|e| Error::Internal(format!("encoding registered memory: {e}")))
    }

    /// Decodes what [`Self::to_bytes`] produced.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for bytes that are not a registered memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes)
            .map_err(|e| Error::InvalidUsage(format!("malformed registered memory: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a registered memory that does not survive the trip to a peer.
    #[test]
    fn round_trips_through_bytes() {
        let m = RegisteredMemory::new(
            3,
            0x7f00_0000_1000,
            4096,
            vec![Transport::HostIpc, Transport::Ib(1)],
        );
        let back = RegisteredMemory::from_bytes(&m.to_bytes().unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(
            back.region().unwrap(),
            MemoryRegion::new(3, 0x7f00_0000_1000, 4096)
        );
    }

    /// Guards against garbage from a peer being accepted as memory to write into.
    #[test]
    fn garbage_is_refused() {
        assert!(matches!(
            RegisteredMemory::from_bytes(&[0xff; 3]),
            Err(Error::InvalidUsage(_))
        ));
    }
}
