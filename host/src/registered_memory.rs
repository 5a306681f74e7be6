//! Registered memory: a buffer plus what a peer needs to reach it, serializable so it can
//! travel to the peer through the out-of-band exchange.

use crate::error::{Error, Result};
use crate::host_ipc::{HostIpcHandle, node_name};
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
    /// Node and process that own the memory: a rank of the same process uses `addr` as is.
    node: String,
    process_id: u32,
    /// The shared object holding the memory, and the memory's offset in it, for ranks in
    /// other processes of the node.
    host_ipc: Option<(HostIpcHandle, u64)>,
}

impl RegisteredMemory {
    pub(crate) fn new(
        rank: u32,
        addr: u64,
        size: u64,
        transports: Vec<Transport>,
        host_ipc: Option<(HostIpcHandle, u64)>,
    ) -> Self {
        RegisteredMemory {
            rank,
            addr,
            size,
            transports,
            node: node_name().to_owned(),
            process_id: std::process::id(),
            host_ipc,
        }
    }

    /// Whether the memory belongs to this process (its address is usable as is).
    pub fn is_local(&self) -> bool {
        self.process_id == std::process::id() && self.node == node_name()
    }

    /// The shared object holding the memory and the memory's offset in it, if it can be
    /// mapped by other processes.
    pub fn host_ipc(&self) -> Option<&(HostIpcHandle, u64)> {
        self.host_ipc.as_ref()
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

    /// The memory as reachable from this process without mapping: its address, for the
    /// proxy and for memory channels. Memory of other processes is reached through
    /// [`Communicator`](crate::Communicator), which maps it.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the memory is in another process.
    pub fn region(&self) -> Result<MemoryRegion> {
        if !self.is_local() {
            return Err(Error::InvalidUsage(format!(
                "memory of rank {} lives in process {} on `{}`: map it first",
                self.rank, self.process_id, self.node
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
            Some((HostIpcHandle::of_this_process(7, 99, 8192), 4096)),
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
