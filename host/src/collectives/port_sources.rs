//! Buffers registered for the collectives where the ranks reach each other only through the
//! proxy (another node, or Ethernet asked for): each is a put source of its own at the
//! proxy, so the port all-reduce puts from a registered input instead of staging it through
//! the scratch first, and from a registered output its reduced chunk (see [`PortSource`]).
//! Registration stays local: a peer's buffer is never read in place over the network, so
//! there is nothing to exchange.
//!
//! A put's source may be written again only once the transport has read it. The kernels
//! wait until the proxy has executed their puts, which is that moment only where the
//! transport reads a put's source while the proxy executes it (Ethernet: its sender copies
//! the bytes into the socket, or through its staging buffer, before it goes on). Over
//! InfiniBand the adapter reads it later, so there buffers are registered (the calls are
//! the same on every transport) but calls stage as before.

use super::collective_context::CollectiveContext;
use crate::communicator::Communicator;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;
use oxccl_device::port_channel::SrcMemoryId;
use oxccl_kernels::collectives::PortSource;
use std::collections::BTreeMap;

/// One registered buffer.
struct Registration {
    /// Bytes of the buffer.
    bytes: u64,
    /// Its id as a put source at the proxy, where the channels' transports allow puts from
    /// it (see the module docs).
    id: Option<SrcMemoryId>,
    /// Our registration: keeps the buffer's memory allocated while the proxy may read it.
    _mine: RegisteredMemory,
}

/// A communicator's buffers registered for the port collectives.
#[derive(Default)]
pub(crate) struct PortSources {
    /// By the buffer's address.
    by_addr: BTreeMap<u64, Registration>,
}

impl PortSources {
    /// The registered buffer that holds `bytes` bytes at `addr`, as a kernel takes it
    /// (zeroed for none, or one the kernels may not put from).
    pub(crate) fn source_of(&self, addr: u64, bytes: u64) -> PortSource {
        let found = self.by_addr.range(..=addr).next_back();
        match found {
            Some((&base, s)) if addr - base + bytes <= s.bytes => match s.id {
                Some(id) => PortSource::new(id, addr - base),
                None => PortSource::default(),
            },
            _ => PortSource::default(),
        }
    }

    /// Whether a registered buffer overlaps `bytes` bytes at `addr`.
    fn overlaps(&self, addr: u64, bytes: u64) -> bool {
        let end = addr.saturating_add(bytes);
        let before = self.by_addr.range(..end).next_back();
        before.is_some_and(|(&base, s)| base + s.bytes > addr)
    }
}

/// Whether puts over `transport` have read their source once the proxy has executed them.
fn reads_source_at_once(transport: Transport) -> bool {
    match transport {
        Transport::Ethernet | Transport::HostIpc => true,
        Transport::CudaIpc | Transport::Ib(_) => false,
    }
}

impl Communicator {
    /// [`Self::register_collective_buffer`] where the ranks reach each other only through
    /// the proxy: sets up the port collectives (a collective call), then registers `buffer`
    /// here alone.
    pub(crate) fn register_port_buffer<T: bytemuck::Pod>(
        &mut self,
        buffer: &DeviceBuffer<T>,
    ) -> Result<()> {
        let rank = self.rank();
        let mut ctx = self
            .collectives
            .take()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))?;
        let set_up = ctx.ports_set_up(self);
        let ctx: &mut CollectiveContext = self.collectives.insert(ctx);
        set_up?;
        let limit = ctx.config.registered_buffers as usize;
        let (addr, bytes) = (buffer.addr(), buffer.size_bytes() as u64);
        let ports = ctx.port_path(rank)?;
        if ports.sources.overlaps(addr, bytes) {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: register_collective_buffer: the buffer at {addr:#x} ({bytes} \
                 bytes) overlaps a buffer registered already"
            )));
        }
        if ports.sources.by_addr.len() >= limit {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: register_collective_buffer: all {limit} slots are taken (raise \
                 CollectiveConfig::registered_buffers, or deregister a buffer)"
            )));
        }
        let direct = ports
            .peers
            .channels()
            .iter()
            .all(|c| reads_source_at_once(c.transport()));
        let mine = self.register(buffer)?;
        let id = match direct {
            true => Some(self.port_source(&mine)?),
            false => None,
        };
        let ports = self.collective_context_mut()?.port_path_mut(rank)?;
        let source = Registration {
            bytes,
            id,
            _mine: mine,
        };
        ports.sources.by_addr.insert(addr, source);
        tracing::debug!(
            rank,
            bytes,
            direct,
            "collective buffer registered for the port path"
        );
        Ok(())
    }

    /// [`Self::deregister_collective_buffer`] where the ranks reach each other only through
    /// the proxy: waits for `stream` and every rank (as there), then gives the buffer's id at
    /// the proxy back. Every kernel that put from the buffer waited for its puts before it
    /// completed, so none is queued.
    pub(crate) fn deregister_port_buffer<T: bytemuck::Pod>(
        &mut self,
        buffer: &DeviceBuffer<T>,
        stream: &crate::stream::Stream,
    ) -> Result<()> {
        let rank = self.rank();
        let addr = buffer.addr();
        let known = (self.collectives.as_deref())
            .and_then(|ctx| ctx.ports.as_ref())
            .is_some_and(|p| p.sources.by_addr.contains_key(&addr));
        if !known {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: deregister_collective_buffer: the buffer at {addr:#x} is not \
                 registered"
            )));
        }
        self.synchronize(stream)?;
        self.barrier()?;
        let ports = self.collective_context_mut()?.port_path_mut(rank)?;
        let removed = ports.sources.by_addr.remove(&addr);
        // The proxy's id first, then our registration (the proxy's region keeps a share of
        // the memory either way).
        if let Some(id) = removed.as_ref().and_then(|s| s.id) {
            self.release_port_source(id)?;
        }
        drop(removed);
        tracing::debug!(rank, "collective buffer deregistered from the port path");
        Ok(())
    }
}
