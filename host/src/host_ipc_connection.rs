//! The HostIpc connection: the proxy copies with the CPU into peer memory mapped in this
//! process (the CPU emulator's DMA engine).
//!
//! Copies complete before `write` returns, so `flush` has nothing to wait for; the
//! semaphore store is a release, so the peer's acquire of its semaphore sees the data.

use oxccl_proxy::{Connection, MemoryRegion, ProxyError};
use std::sync::atomic::{AtomicU64, Ordering};

/// A connection to a peer whose memory is mapped in this process.
#[derive(Debug)]
pub struct HostIpcConnection {
    peer: u32,
}

impl HostIpcConnection {
    /// A connection to `peer`.
    pub fn new(peer: u32) -> Self {
        HostIpcConnection { peer }
    }
}

impl Connection for HostIpcConnection {
    fn write(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        src: &MemoryRegion,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), ProxyError> {
        let (to, from) = (dst.address(dst_off)?, src.address(src_off)?);
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the proxy checked both ranges against the registered sizes; registered
        // memory stays mapped while channels using it exist. `copy` tolerates overlap (a
        // rank may put into its own buffer).
        unsafe {
            std::ptr::copy(
                from as usize as *const u8,
                to as usize as *mut u8,
                bytes as usize,
            )
        };
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &MemoryRegion,
        dst_off: u64,
        value: u64,
    ) -> Result<(), ProxyError> {
        let address = dst.semaphore_address(dst_off)?;
        // SAFETY: in bounds and aligned (checked); semaphore cells are only accessed atomically.
        let cell = unsafe { AtomicU64::from_ptr(address as usize as *mut u64) };
        // Release: pairs with the peer kernel's Acquire load of its inbound counter, so the
        // copies above are visible to it.
        cell.store(value, Ordering::Release);
        Ok(())
    }

    fn flush(&self) -> Result<(), ProxyError> {
        Ok(())
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn transport(&self) -> &'static str {
        "host-ipc"
    }
}
