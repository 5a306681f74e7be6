//! Connections: how the proxy reaches one peer over one transport.
//!
//! The proxy calls a connection only with ranges it has checked against the registered
//! sizes. Calls for one connection come from one proxy thread, in trigger order.
//!
//! A call that finds the peer gone (its end of the connection closed or reset with no
//! reason given) returns [`ProxyError::PeerLost`], which the proxy reports as it is, the
//! same error other watchers of the peer report; any other failure is reported as the
//! channel's [`ProxyError::Connection`] failure.

use crate::error::ProxyError;
use crate::memory_region::MemoryRegion;

/// The store of a [`Connection::update_and_sync`]: `value` into the u64 at `dst_off` of
/// `dst`.
#[derive(Clone, Copy, Debug)]
pub struct Signal<'a> {
    /// The peer's memory holding the semaphore.
    pub dst: &'a MemoryRegion,
    /// Offset of the semaphore's u64 in `dst`.
    pub dst_off: u64,
    /// The value stored.
    pub value: u64,
}

/// One peer over one transport: the operations a trigger turns into.
pub trait Connection: Send + Sync {
    /// Copies `bytes` from `src` (this rank's memory) at `src_off` to `dst` (the peer's) at
    /// `dst_off`. May return before the copy is complete; [`Self::flush`] waits for it.
    ///
    /// # Errors
    /// The transport failed; the message says how.
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), ProxyError>;

    /// Stores `value` into the u64 at `dst_off` of `dst` (a peer's semaphore) after every
    /// earlier `write` of this connection has landed, with release semantics for the peer.
    ///
    /// # Errors
    /// The transport failed.
    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> Result<(), ProxyError>;

    /// [`Self::write`], then [`Self::update_and_sync`] of `signal`: a put with its signal,
    /// which a transport may send together (Ethernet: in one system call).
    ///
    /// # Errors
    /// As [`Self::write`] and [`Self::update_and_sync`].
    fn write_and_signal(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
        signal: Signal<'_>,
    ) -> Result<(), ProxyError> {
        self.write(dst, dst_off, src, src_off, bytes)?;
        self.update_and_sync(signal.dst, signal.dst_off, signal.value)
    }

    /// Waits until every earlier operation of this connection is complete at the peer.
    ///
    /// # Errors
    /// The transport failed or did not complete in time.
    fn flush(&self) -> Result<(), ProxyError>;

    /// Rank of the peer.
    fn peer(&self) -> u32;

    /// Name of the transport, for messages (`"host-ipc"`, `"cuda-ipc"`, `"ib"`, `"ethernet"`).
    fn transport(&self) -> &'static str;
}
