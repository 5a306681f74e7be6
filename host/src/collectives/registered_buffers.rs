//! Buffers registered for the collectives (zero-copy): what a rank keeps of each, the table
//! its kernels read, and the calls that register and deregister them.
//!
//! A collective whose input and output are registered on every rank reads the peers'
//! buffers in place instead of staging its data through the scratch: on the CPU emulator an
//! all-reduce then moves each byte about half as often (see `allreduce --register off|on`).
//! Registration is NCCL's `ncclCommRegister`: optional, a collective call, done once per
//! buffer. A call whose buffers some rank did not register runs staged, correctly, on every
//! rank (the kernels find out together, see
//! [`published_buffers`](oxccl_kernels::collectives::published_buffers)).

use crate::communicator::Communicator;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::registered_memory::RegisteredMemory;
use crate::stream::Stream;
use oxccl_device::DeviceView;
use oxccl_device::peer_buffer_table::{ENTRY_WORDS, NO_SLOT, PeerBufferTableDeviceHandle};
use oxccl_proxy::MemoryRegion;
use std::collections::BTreeMap;

/// What a rank keeps of one registered buffer.
struct Registration {
    /// Bytes of our buffer.
    bytes: u64,
    /// Our registration: keeps our buffer's memory allocated while peers may read it.
    _mine: RegisteredMemory,
    /// The peers' buffers as mapped here (each keeps its mapping).
    _peers: Vec<MemoryRegion>,
}

/// A communicator's registered collective buffers.
pub(crate) struct RegisteredBuffers {
    /// `slots × n_ranks` entries of [`ENTRY_WORDS`] words (address here, bytes), zeroed for
    /// an empty slot: what [`PeerBufferTableDeviceHandle`] reads.
    table: DeviceBuffer<u64>,
    n_ranks: u32,
    /// The registration in each slot.
    slots: Vec<Option<Registration>>,
    /// Slot of each of our registered buffers, by its address.
    by_addr: BTreeMap<u64, u32>,
}

impl RegisteredBuffers {
    /// An empty table of `slots` slots for `comm`'s ranks.
    ///
    /// # Errors
    /// The allocation failed.
    pub(crate) fn new(comm: &Communicator, slots: u32) -> Result<Self> {
        let words = slots as usize * comm.size() as usize * ENTRY_WORDS as usize;
        Ok(RegisteredBuffers {
            table: comm.alloc_zeroed::<u64>(words)?,
            n_ranks: comm.size(),
            slots: (0..slots).map(|_| None).collect(),
            by_addr: BTreeMap::new(),
        })
    }

    /// The table as kernels take it.
    pub(crate) fn device_handle(&self) -> PeerBufferTableDeviceHandle<'_> {
        let entries: DeviceView<'_, u64> = self.table.view();
        // SAFETY: a non-empty entry is written only by `register`, with a buffer of ours
        // that `Registration::_mine` keeps allocated, or a peer's buffer mapped here, which
        // the communicator keeps mapped as long as it lives (mappings are never undone
        // before); both 16-byte aligned (page-aligned allocations). Entries are written
        // only for a slot that no kernel enqueued before uses: a new slot, or one whose
        // buffer was deregistered; a kernel of a deregistered slot that still runs reads
        // memory that stays mapped (wrong data at worst, as the docs of `deregister` say).
        unsafe { PeerBufferTableDeviceHandle::new(entries, self.n_ranks) }
    }

    /// Whether no buffer is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    /// The slot of our registered buffer that holds `bytes` bytes at `addr`, or
    /// [`NO_SLOT`].
    pub(crate) fn slot_of(&self, addr: u64, bytes: u64) -> u32 {
        let Some((&base, &slot)) = self.by_addr.range(..=addr).next_back() else {
            return NO_SLOT;
        };
        let holds = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|r| addr - base + bytes <= r.bytes);
        if holds { slot } else { NO_SLOT }
    }
}

impl Communicator {
    /// Registers `buffer` for the collectives on every rank: calls whose input and output
    /// lie in registered buffers on every rank read the peers' buffers in place, with no
    /// staging copy. A collective call: every rank registers one buffer of its own at the
    /// same point (and then the same ranks' buffers share a slot). Optional, as NCCL's
    /// `ncclCommRegister`: unregistered buffers work as before.
    ///
    /// Where the ranks reach each other only through the proxy (another node, or
    /// `OXCCL_TRANSPORT=ethernet`), nothing is exchanged: the buffer becomes a source the
    /// proxy puts from, and the port all-reduce puts a registered input straight to the
    /// peers (see [`CollectiveConfig::port_direct_bytes`](super::CollectiveConfig::port_direct_bytes));
    /// it sets up the port collectives first, which is a collective call.
    ///
    /// The communicator keeps the buffer's memory allocated until
    /// [`Self::deregister_collective_buffer`], and its mappings of the peers' buffers until it
    /// is dropped.
    ///
    /// # Errors
    /// A buffer (or part of one) registered already, every slot taken
    /// ([`CollectiveConfig::registered_buffers`](super::CollectiveConfig::registered_buffers)),
    /// a buffer of a device whose memory cannot be shared yet (CUDA), a failed exchange or
    /// mapping. A rank that fails before the exchange leaves the others to fail at theirs,
    /// within the wait limit.
    pub fn register_collective_buffer<T: bytemuck::Pod>(
        &mut self,
        buffer: &DeviceBuffer<T>,
    ) -> Result<()> {
        let rank = self.rank();
        self.collectives_set_up()?;
        if self.collective_context()?.memory.is_none() {
            return self.register_port_buffer(buffer);
        }
        let (addr, bytes) = (buffer.addr(), buffer.size_bytes() as u64);
        let slot = {
            let b = &self
                .collective_context()?
                .memory(rank, "register_collective_buffer")?
                .buffers;
            let end = addr + bytes;
            let overlaps = b
                .by_addr
                .range(..end)
                .next_back()
                .is_some_and(|(&base, &s)| {
                    b.slots[s as usize]
                        .as_ref()
                        .is_some_and(|r| base + r.bytes > addr)
                });
            if overlaps {
                return Err(Error::InvalidUsage(format!(
                    "rank {rank}: register_collective_buffer: the buffer at {addr:#x} ({bytes} \
                     bytes) overlaps a buffer registered already"
                )));
            }
            b.slots.iter().position(Option::is_none).ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "rank {rank}: register_collective_buffer: all {} slots are taken (raise \
                     CollectiveConfig::registered_buffers, or deregister a buffer)",
                    b.slots.len()
                ))
            })?
        };
        let mine = self.register(buffer)?;
        let all = self.all_gather_memory(&mine)?;
        let mut peers = Vec::with_capacity(all.len());
        let mut entries = Vec::with_capacity(all.len() * ENTRY_WORDS as usize);
        for (p, memory) in all.iter().enumerate() {
            if p as u32 == rank {
                entries.extend([addr, bytes]);
                continue;
            }
            let region = self.reach(memory)?;
            entries.extend([region.addr, region.size]);
            peers.push(region);
        }
        let b = &mut self
            .collective_context_mut()?
            .memory_mut(rank, "register_collective_buffer")?
            .buffers;
        let at = slot * b.n_ranks as usize * ENTRY_WORDS as usize;
        b.table.copy_from_host_at(at, &entries)?;
        b.slots[slot] = Some(Registration {
            bytes,
            _mine: mine,
            _peers: peers,
        });
        b.by_addr.insert(addr, slot as u32);
        tracing::debug!(rank, slot, bytes, "collective buffer registered");
        Ok(())
    }

    /// Ends the registration of `buffer` on every rank: a collective call, made once every
    /// collective that used it has finished on every rank. It waits for `stream` (where
    /// this rank ran them) and then for every rank, then frees the slot. A collective of the
    /// buffer still running elsewhere then reads memory that is still mapped but may find
    /// the slot empty (an error) or taken by a newer buffer (wrong data): synchronize first.
    ///
    /// # Errors
    /// A buffer that is not registered, a failed wait or exchange.
    pub fn deregister_collective_buffer<T: bytemuck::Pod>(
        &mut self,
        buffer: &DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        let rank = self.rank();
        if (self.collectives.as_deref()).is_some_and(|ctx| ctx.memory.is_none()) {
            return self.deregister_port_buffer(buffer, stream);
        }
        let (addr, bytes) = (buffer.addr(), buffer.size_bytes() as u64);
        let slot = self
            .collectives
            .as_deref()
            .and_then(|ctx| ctx.memory.as_ref())
            .and_then(|m| {
                let b = &m.buffers;
                b.by_addr
                    .get(&addr)
                    .copied()
                    .filter(|&s| b.slot_of(addr, bytes) == s)
            });
        let Some(slot) = slot else {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: deregister_collective_buffer: the buffer at {addr:#x} is not \
                 registered"
            )));
        };
        self.synchronize(stream)?;
        self.barrier()?;
        let b = &mut self
            .collective_context_mut()?
            .memory_mut(rank, "deregister_collective_buffer")?
            .buffers;
        let words = b.n_ranks as usize * ENTRY_WORDS as usize;
        b.table
            .copy_from_host_at(slot as usize * words, &vec![0; words])?;
        b.slots[slot as usize] = None;
        b.by_addr.remove(&addr);
        tracing::debug!(rank, slot, "collective buffer deregistered");
        Ok(())
    }
}
