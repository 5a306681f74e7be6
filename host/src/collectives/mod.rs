//! Collectives on a [`Communicator`]: all-reduce, all-gather, reduce-scatter, broadcast,
//! reduce, all-to-all, all-to-all-v and a device barrier, NCCL-like in meaning and typed in
//! Rust.
//!
//! Each call checks its buffers, enqueues one kernel of [`oxccl_kernels::collectives`] on
//! the stream and returns; an error of the kernel (a peer that stopped answering, say)
//! comes back from [`Communicator::synchronize`], naming the kernel, rank and peer. Every
//! rank must make the same calls in the same order, each with the same count, type,
//! operation and root.
//!
//! **Set-up.** The first collective call on a communicator allocates its scratch (sized by
//! [`CollectiveConfig`]), exchanges it and builds a memory channel to every peer; every
//! later call reuses them, with no allocation and no exchange.
//!
//! **Agreement.** The first call of each shape (collective, count, type, operation, root;
//! for all-to-all-v the counts) exchanges the shape with every rank and refuses the call on
//! every rank if they differ: a clear error instead of a hang or a wrong result. Later calls
//! of a shape already agreed are not checked again (that would cost a round of messages
//! per call): ranks that then disagree see their kernels time out, not hang.
//!
//! **Algorithms.** All-reduce takes [`Algorithm::Packets`] (one pass: LL16 packets, or data
//! and one signal from [`CollectiveConfig::packet_data_bytes`] on) up to
//! [`CollectiveConfig::packet_limit`] bytes, [`Algorithm::Direct`] (two-shot over the
//! scratch, or over the peers' own buffers when they are registered) above;
//! `OXCCL_ALGO` or [`CollectiveConfig::algorithm`] override the choice. All-gather,
//! reduce-scatter, all-to-all, broadcast and reduce take packets too where what a rank
//! sends a peer is within the packet limit, direct algorithms above; all-to-all-v runs
//! direct. Where some rank cannot load and store another's
//! memory (ranks on several nodes, or `OXCCL_TRANSPORT=ethernet`: the first collective
//! call asks every rank for its node), all-reduce takes [`Algorithm::Ports`] (two-shot
//! through the proxy over port channels), or [`Algorithm::Ring`] (a ring through the proxy)
//! from [`CollectiveConfig::ring_min_ranks`] ranks on, or for small messages among a power
//! of two of ranks [`Algorithm::Doubling`] (recursive doubling through the proxy, up to
//! [`CollectiveConfig::doubling_max_bytes`]; among such ranks all-gather and reduce-scatter
//! take it at every size); and all-gather, reduce-scatter, all-to-all, all-to-all-v (one
//! exchange a round), broadcast and reduce (eager: data one way, the sender runs ahead of
//! its receivers) and the device barrier. Buffers registered there
//! ([`Communicator::register_collective_buffer`]) are puts' sources of their own at the
//! proxy: the port all-reduce puts from a registered input instead of staging it, from
//! [`CollectiveConfig::port_direct_bytes`] on. Forcing ports (`OXCCL_ALGO=ports`
//! or [`CollectiveConfig::algorithm`]) sends every collective through the proxy on one
//! node too; forcing `ring` (or the ring's rank count, through the proxy) sends all-reduce,
//! all-gather and reduce-scatter round the ring and the others through their port
//! algorithms.

pub mod algorithm;
mod check;
pub mod collective_config;
pub(crate) mod collective_context;
mod port_sources;
mod registered_buffers;
pub(crate) mod shape;

pub use algorithm::{ALGO_ENV, Algorithm, AlgorithmChoice, Thresholds};
pub use collective_config::CollectiveConfig;
pub use shape::Collective;

use crate::communicator::Communicator;
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::stream::Stream;
use check::{Need, buffers_fit, counts_and_displs, times_ranks};
use collective_context::CollectiveContext;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::reduce::{DataType, ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};
use oxccl_kernels::collectives::rounds::{elements_per_round, rounds};
use oxccl_kernels::collectives::{
    AllToAllvCounts, CallProtocol, PacketForm, PortLayout, all_gather, all_gather_doubling,
    all_gather_packets, all_gather_ports, all_gather_ring, all_reduce, all_reduce_doubling,
    all_reduce_packets, all_reduce_ports, all_reduce_ring, all_to_all, all_to_all_packets,
    all_to_all_ports, all_to_allv, all_to_allv_ports, barrier, barrier_ports, broadcast,
    broadcast_doubling, broadcast_packets, broadcast_ports, reduce, reduce_packets, reduce_ports,
    reduce_scatter, reduce_scatter_halving, reduce_scatter_packets, reduce_scatter_ports,
    reduce_scatter_ring,
};
use shape::Shape;

/// One call, as the generic driver runs it.
struct Call<'b> {
    shape: Shape,
    dtype: DataType,
    op: ReduceOp,
    root: u32,
    /// The kernel's `count`.
    count: u64,
    /// Windows one direct round stages, and elements per window (for the round count).
    windows: u64,
    elements: u64,
    input: DeviceView<'b, u8>,
    output: DeviceViewMut<'b, u8>,
    counts: Option<AllToAllvCounts>,
}

/// `view` as bytes.
fn bytes<T: ReduceElement>(view: DeviceView<'_, T>) -> DeviceView<'_, u8> {
    // A view of `T`s is always a whole number of aligned bytes.
    view.cast::<u8>().unwrap_or_default()
}

/// `view` as writable bytes.
fn bytes_mut<T: ReduceElement>(view: DeviceViewMut<'_, T>) -> DeviceViewMut<'_, u8> {
    view.cast::<u8>().unwrap_or_default()
}

/// Elements `first..first + len` of `buffer`, as bytes.
fn part<T: ReduceElement>(
    buffer: &DeviceBuffer<T>,
    first: usize,
    len: usize,
) -> DeviceView<'_, u8> {
    let v = buffer.view();
    bytes(
        v.slice(first as u64..(first + len) as u64)
            .unwrap_or_default(),
    )
}

/// Elements `first..first + len` of `buffer`, as writable bytes.
fn part_mut<T: ReduceElement>(
    buffer: &DeviceBuffer<T>,
    first: usize,
    len: usize,
) -> DeviceViewMut<'_, u8> {
    let v = buffer.view_mut();
    bytes_mut(
        v.slice(first as u64..(first + len) as u64)
            .unwrap_or_default(),
    )
}

impl Communicator {
    /// Reduces `count` elements of every rank's `send` by `op` into every rank's `recv`.
    /// For in place, see [`Self::all_reduce_in_place`].
    ///
    /// # Errors
    /// A buffer shorter than `count`, ranks that disagree on the call (first call of a
    /// shape), a failed set-up or launch.
    pub fn all_reduce<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.fits(
            Collective::AllReduce,
            &[("send", send.len(), count), ("recv", recv.len(), count)],
        )?;
        self.all_reduce_views(
            part(send, 0, count),
            part_mut(recv, 0, count),
            count,
            T::TYPE,
            op,
            stream,
        )
    }

    /// [`Self::all_reduce`] with `buffer` as both input and output.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_reduce_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.fits(Collective::AllReduce, &[("buffer", buffer.len(), count)])?;
        let input = part(buffer, 0, count);
        self.all_reduce_views(
            input,
            part_mut(buffer, 0, count),
            count,
            T::TYPE,
            op,
            stream,
        )
    }

    /// The algorithm an all-reduce of `bytes` bytes takes on this communicator (what its
    /// benchmark prints).
    ///
    /// # Errors
    /// `OXCCL_ALGO` names no algorithm.
    pub fn all_reduce_algorithm(&self, bytes: u64) -> Result<Algorithm> {
        let c = &self.config().collectives;
        let load_store = self.load_store();
        let algo = c
            .algorithm
            .resolve(
                bytes,
                self.size(),
                algorithm::algo_from_env(),
                load_store,
                c.thresholds(),
            )?
            .for_ranks(self.size());
        if algo == Algorithm::Packets {
            self.packets_fit(Collective::AllReduce, bytes)?;
        }
        if !load_store && !algo.through_proxy() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: all_reduce: the {algo} algorithm needs every rank to load and store \
                 every other's memory; these ranks reach each other only through the proxy \
                 (use `ports` or `ring`)",
                self.rank()
            )));
        }
        Ok(algo)
    }

    /// The algorithm a call of `collective` takes on this communicator, `bytes` the bytes of
    /// the call's `count` elements (for all-gather, reduce-scatter and all-to-all, what each
    /// rank sends each peer): [`Self::all_reduce_algorithm`] for an all-reduce; for the
    /// others, where they run through the proxy (see the module docs), [`Algorithm::Ring`]
    /// for all-gather and reduce-scatter where the ring is chosen, [`Algorithm::Doubling`]
    /// for all-gather and reduce-scatter among a power of two of ranks where recursive
    /// doubling is chosen (at any size where a small all-reduce takes it) and for broadcast
    /// where it is chosen at every size, and [`Algorithm::Ports`] otherwise; else
    /// [`Algorithm::Packets`] for all-gathers, reduce-scatters, all-to-alls, broadcasts and
    /// reduces that send a peer at most the packet limit (where an all-reduce of that size
    /// takes packets), and [`Algorithm::Direct`] (on registered buffers, in place of the
    /// peers' buffers).
    ///
    /// # Errors
    /// `OXCCL_ALGO` names no algorithm, or packets are forced on a call past the packet
    /// limit.
    pub fn collective_algorithm(&self, collective: Collective, bytes: u64) -> Result<Algorithm> {
        if collective == Collective::AllReduce {
            return self.all_reduce_algorithm(bytes);
        }
        match self.proxy_algorithm(collective)? {
            Some(algo) => Ok(algo),
            None => self.memory_algorithm(collective, bytes),
        }
    }

    /// The algorithm of a call of `collective` (not all-reduce) of `bytes` bytes (its
    /// `count` elements) where the ranks load and store each other's memory:
    /// [`Algorithm::Packets`] for all-gather, reduce-scatter, all-to-all, broadcast and
    /// reduce where an all-reduce of `bytes` would take it (what a rank sends a peer then
    /// fits a packet slot), else [`Algorithm::Direct`].
    ///
    /// Why: their direct algorithms meet twice a call (who registered what, then the
    /// reads), each rank waiting for every other; the packets' one exchange (one round
    /// trip to the root for broadcast and reduce) is all they wait for. 4 ranks in one
    /// process on 2 cores, 4 B-1 KiB a peer (`collectives`, `OXCCL_ALGO=direct` and not,
    /// alternated, out of place and in place): all-gather 4.2-10 µs against 8.3-14 direct,
    /// reduce-scatter 5.2-11 against 10-18, all-to-all 4.3-9.8 against 5.5-13; 8-512 B
    /// broadcast 4.8-5.6 against 6.7-14, reduce 4.9-5.7 against 13-16; 2 ranks 0.5-1.4 µs
    /// against 0.6-2.1.
    fn memory_algorithm(&self, collective: Collective, bytes: u64) -> Result<Algorithm> {
        if !matches!(
            collective,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::Broadcast
                | Collective::Reduce
        ) {
            return Ok(Algorithm::Direct);
        }
        let c = &self.config().collectives;
        let algo = c.algorithm.resolve(
            bytes,
            self.size(),
            algorithm::algo_from_env(),
            true,
            c.thresholds(),
        )?;
        if algo != Algorithm::Packets {
            return Ok(Algorithm::Direct);
        }
        self.packets_fit(collective, bytes)?;
        Ok(Algorithm::Packets)
    }

    /// Refuses a packet call of `collective` whose `bytes` (what each rank sends each
    /// peer) do not fit the packet slots (the packet limit, rounded up as the layout does).
    fn packets_fit(&self, collective: Collective, bytes: u64) -> Result<()> {
        let limit = self.config().collectives.packet_limit;
        if bytes.div_ceil(8) * 8 > limit.div_ceil(64) * 64 {
            return Err(Error::InvalidUsage(format!(
                "rank {}: {}: the packet algorithm takes at most {limit} bytes (the packet \
                 limit), the call has {bytes}",
                self.rank(),
                collective.name()
            )));
        }
        Ok(())
    }

    /// Whether every rank can load and store every other's memory. Before the first
    /// collective call the communicator has not asked the ranks' nodes yet: it goes by
    /// what the bootstrap says (every call sets up first, and knows).
    fn load_store(&self) -> bool {
        match self.collectives.as_deref() {
            Some(ctx) => ctx.memory.is_some(),
            None => !self.config().transport.network_only() && self.out_of_band().single_node(),
        }
    }

    /// Whether a call of `collective` (not all-reduce) runs through the proxy, and how:
    /// where the ranks cannot load and store each other's memory, or where an algorithm
    /// through the proxy is asked for (as for all-reduce: [`CollectiveConfig::algorithm`],
    /// then `OXCCL_ALGO`), [`Algorithm::Ring`] for all-gather and reduce-scatter where the
    /// ring is chosen, [`Algorithm::Doubling`] for all-gather and reduce-scatter among a
    /// power of two of ranks where recursive doubling is chosen or would be for a small
    /// all-reduce, and for broadcast where it is chosen at every size, else
    /// [`Algorithm::Ports`]; `None` where they load and store.
    ///
    /// An all-gather by recursive doubling (a reduce-scatter by recursive halving) sends
    /// each rank's data to each peer once, as the all-pairs algorithm does, in `log2 n`
    /// messages a rank instead of `n - 1`, so they take it at every size (4 ranks over
    /// loopback Ethernet on 2 cores, all-gather 1 KiB-16 MiB: 0.6-1.0 of the all-pairs
    /// time, 3 alternated runs). Broadcast and reduce take their eager port algorithms
    /// (`n - 1` messages a round from or to the root, the dones back, the sender runs ahead):
    /// a broadcast by recursive doubling (`n log2 n` messages a round, in lockstep) is
    /// taken only where doubling is asked for at every size, as it took 1.0-1.5x the eager
    /// broadcast's time at 8 B-2 MiB with 4 ranks and 1.4-3.6x at 64 B-256 KiB with 8 (as
    /// processes over loopback Ethernet on 2 cores). A reduce by recursive doubling (the
    /// all-reduce's, written out on the root) was no faster than the all-pairs reduce at
    /// 1-16 KiB and slower from 256 KiB on (4 and 8 ranks).
    fn proxy_algorithm(&self, collective: Collective) -> Result<Option<Algorithm>> {
        let c = &self.config().collectives;
        let resolve = |bytes| {
            c.algorithm.resolve(
                bytes,
                self.size(),
                algorithm::algo_from_env(),
                self.load_store(),
                c.thresholds(),
            )
        };
        let (large, small) = (resolve(u64::MAX)?, resolve(1)?.for_ranks(self.size()));
        Ok(large.through_proxy().then_some(match (collective, large) {
            (Collective::AllGather | Collective::ReduceScatter, Algorithm::Ring) => Algorithm::Ring,
            (Collective::AllGather | Collective::ReduceScatter, _)
                if small == Algorithm::Doubling =>
            {
                Algorithm::Doubling
            }
            (Collective::Broadcast, _) if large.for_ranks(self.size()) == Algorithm::Doubling => {
                Algorithm::Doubling
            }
            _ => Algorithm::Ports,
        }))
    }

    fn all_reduce_views(
        &mut self,
        input: DeviceView<'_, u8>,
        output: DeviceViewMut<'_, u8>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        // Set up first: the algorithm depends on whether the ranks share a node.
        self.collectives_set_up()?;
        let algo = self.all_reduce_algorithm(count as u64 * dtype.size())?;
        let call = Call {
            shape: Shape::new(Collective::AllReduce, dtype, Some(op), count, None),
            dtype,
            op,
            root: 0,
            count: count as u64,
            windows: 1,
            elements: count as u64,
            input,
            output,
            counts: None,
        };
        self.run(call, stream, Some(algo))
    }

    /// Gathers `count` elements of every rank's `send` into every rank's `recv`, rank `r`'s
    /// at `r * count` (`recv` holds `size() * count`). For in place, see
    /// [`Self::all_gather_in_place`].
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_gather<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "all_gather", count, self.size())?;
        self.fits(
            Collective::AllGather,
            &[("send", send.len(), count), ("recv", recv.len(), total)],
        )?;
        let call = self.plain_call(
            Collective::AllGather,
            T::TYPE,
            count,
            part(send, 0, count),
            part_mut(recv, 0, total),
        );
        self.run(call, stream, None)
    }

    /// [`Self::all_gather`] where each rank's input is already in place: elements
    /// `rank() * count..(rank() + 1) * count` of `buffer`.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_gather_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "all_gather", count, self.size())?;
        self.fits(Collective::AllGather, &[("buffer", buffer.len(), total)])?;
        let input = part(buffer, self.rank() as usize * count, count);
        let call = self.plain_call(
            Collective::AllGather,
            T::TYPE,
            count,
            input,
            part_mut(buffer, 0, total),
        );
        self.run(call, stream, None)
    }

    /// Reduces every rank's `send` (`size() * count` elements) by `op`; rank `r`'s `recv`
    /// gets elements `r * count..(r + 1) * count` of the result. For in place, see
    /// [`Self::reduce_scatter_in_place`].
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn reduce_scatter<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "reduce_scatter", count, self.size())?;
        self.fits(
            Collective::ReduceScatter,
            &[("send", send.len(), total), ("recv", recv.len(), count)],
        )?;
        let call = self.reducing_call(
            Collective::ReduceScatter,
            T::TYPE,
            op,
            count,
            part(send, 0, total),
            part_mut(recv, 0, count),
        );
        self.run(call, stream, None)
    }

    /// [`Self::reduce_scatter`] with `buffer` (`size() * count` elements) as input, and its
    /// elements `rank() * count..(rank() + 1) * count` as output.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn reduce_scatter_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "reduce_scatter", count, self.size())?;
        self.fits(
            Collective::ReduceScatter,
            &[("buffer", buffer.len(), total)],
        )?;
        let output = part_mut(buffer, self.rank() as usize * count, count);
        let call = self.reducing_call(
            Collective::ReduceScatter,
            T::TYPE,
            op,
            count,
            part(buffer, 0, total),
            output,
        );
        self.run(call, stream, None)
    }

    /// Copies `count` elements of the root's `send` into every rank's `recv` (the root's
    /// too). Only the root's `send` is read: other ranks may pass any buffer. For in place,
    /// see [`Self::broadcast_in_place`].
    ///
    /// # Errors
    /// As [`Self::all_reduce`]; a root that is not a rank.
    pub fn broadcast<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.check_root(Collective::Broadcast, root)?;
        let send_needs = if self.rank() == root { count } else { 0 };
        self.fits(
            Collective::Broadcast,
            &[
                ("send", send.len(), send_needs),
                ("recv", recv.len(), count),
            ],
        )?;
        self.rooted(
            Collective::Broadcast,
            T::TYPE,
            None,
            root,
            count,
            part(send, 0, send_needs),
            part_mut(recv, 0, count),
            stream,
        )
    }

    /// [`Self::broadcast`] with `buffer` as the root's input and every rank's output.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn broadcast_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.check_root(Collective::Broadcast, root)?;
        self.fits(Collective::Broadcast, &[("buffer", buffer.len(), count)])?;
        let input = part(buffer, 0, count);
        self.rooted(
            Collective::Broadcast,
            T::TYPE,
            None,
            root,
            count,
            input,
            part_mut(buffer, 0, count),
            stream,
        )
    }

    /// Reduces `count` elements of every rank's `send` by `op` into the root's `recv`. Only
    /// the root's `recv` is written: other ranks may pass any buffer (`send` itself, say,
    /// through [`Self::reduce_in_place`]).
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn reduce<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.check_root(Collective::Reduce, root)?;
        let recv_needs = if self.rank() == root { count } else { 0 };
        self.fits(
            Collective::Reduce,
            &[
                ("send", send.len(), count),
                ("recv", recv.len(), recv_needs),
            ],
        )?;
        self.rooted(
            Collective::Reduce,
            T::TYPE,
            Some(op),
            root,
            count,
            part(send, 0, count),
            part_mut(recv, 0, recv_needs),
            stream,
        )
    }

    /// [`Self::reduce`] with `buffer` as every rank's input and the root's output.
    ///
    /// # Errors
    /// As [`Self::broadcast`].
    pub fn reduce_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        op: ReduceOp,
        root: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.check_root(Collective::Reduce, root)?;
        self.fits(Collective::Reduce, &[("buffer", buffer.len(), count)])?;
        let input = part(buffer, 0, count);
        self.rooted(
            Collective::Reduce,
            T::TYPE,
            Some(op),
            root,
            count,
            input,
            part_mut(buffer, 0, count),
            stream,
        )
    }

    /// Sends elements `p * count..(p + 1) * count` of `send` to rank `p`, which puts them
    /// at `rank() * count` of its `recv` (both `size() * count` elements; they may not be
    /// the same buffer: see [`Self::all_to_all_in_place`]).
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_to_all<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "all_to_all", count, self.size())?;
        self.fits(
            Collective::AllToAll,
            &[("send", send.len(), total), ("recv", recv.len(), total)],
        )?;
        let mut call = self.plain_call(
            Collective::AllToAll,
            T::TYPE,
            count,
            part(send, 0, total),
            part_mut(recv, 0, total),
        );
        call.windows = self.size() as u64;
        self.run(call, stream, None)
    }

    /// [`Self::all_to_all`] with `buffer` as both input and output.
    ///
    /// # Errors
    /// As [`Self::all_reduce`].
    pub fn all_to_all_in_place<T: ReduceElement>(
        &mut self,
        buffer: &mut DeviceBuffer<T>,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let total = times_ranks(self.rank(), "all_to_all", count, self.size())?;
        self.fits(Collective::AllToAll, &[("buffer", buffer.len(), total)])?;
        let input = part(buffer, 0, total);
        let mut call = self.plain_call(
            Collective::AllToAll,
            T::TYPE,
            count,
            input,
            part_mut(buffer, 0, total),
        );
        call.windows = self.size() as u64;
        self.run(call, stream, None)
    }

    /// All-to-all with a count and displacement per rank (in elements): `send_counts[p]`
    /// elements of `send` from `send_displs[p]` go to rank `p`, and `recv_counts[p]`
    /// elements from rank `p` land at `recv_displs[p]` of `recv`. What rank `a` sends `b`
    /// must be what `b` expects from `a`; receive ranges must not overlap. At most
    /// [`AllToAllvCounts::MAX_RANKS`] ranks.
    ///
    /// The counts are part of the call's shape: a call with counts not used before
    /// exchanges them with every rank first (see the module docs).
    ///
    /// # Errors
    /// Counts or displacements outside the buffers, of the wrong number, or that disagree
    /// with the peers'; too many ranks; as [`Self::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_allv<T: ReduceElement>(
        &mut self,
        send: &DeviceBuffer<T>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut DeviceBuffer<T>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        stream: &Stream,
    ) -> Result<()> {
        let (rank, size) = (self.rank(), self.size());
        if size as usize > AllToAllvCounts::MAX_RANKS {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: all_to_allv: {size} ranks; it supports at most {}",
                AllToAllvCounts::MAX_RANKS
            )));
        }
        counts_and_displs(
            rank,
            "send",
            send_counts,
            send_displs,
            size,
            send.len(),
            false,
        )?;
        counts_and_displs(
            rank,
            "recv",
            recv_counts,
            recv_displs,
            size,
            recv.len(),
            true,
        )?;
        let mut counts = AllToAllvCounts::default();
        for p in 0..size as usize {
            counts.send_counts[p] = send_counts[p] as u64;
            counts.send_displs[p] = send_displs[p] as u64;
            counts.recv_counts[p] = recv_counts[p] as u64;
            counts.recv_displs[p] = recv_displs[p] as u64;
        }
        let mut shape = Shape::new(Collective::AllToAllV, T::TYPE, None, 0, None);
        shape.counts = Some((counts.send_counts, counts.recv_counts));
        let call = Call {
            shape,
            dtype: T::TYPE,
            op: ReduceOp::Sum,
            root: 0,
            count: 0,
            windows: size as u64,
            elements: 0,
            input: bytes(send.view()),
            output: bytes_mut(recv.view_mut()),
            counts: Some(counts),
        };
        self.run(call, stream, None)
    }

    /// Enqueues a barrier on `stream`: the kernels each rank enqueued after it start only
    /// once every rank's kernels before it have finished, and see what those wrote. (The
    /// host-side barrier is [`Self::barrier`].)
    ///
    /// # Errors
    /// A failed set-up or launch.
    pub fn barrier_on(&mut self, stream: &Stream) -> Result<()> {
        let call = self.plain_call(
            Collective::Barrier,
            DataType::U8,
            0,
            DeviceView::default(),
            DeviceViewMut::default(),
        );
        self.run(call, stream, None)
    }

    /// Sets up the collectives (the first call of any: a collective call itself).
    fn collectives_set_up(&mut self) -> Result<()> {
        if self.collectives.is_none() {
            let ctx = CollectiveContext::new(self)?;
            self.collectives = Some(Box::new(ctx));
        }
        Ok(())
    }

    /// The collectives' state, once set up.
    fn collective_context(&self) -> Result<&CollectiveContext> {
        self.collectives
            .as_deref()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))
    }

    /// The collectives' state, once set up, to change.
    fn collective_context_mut(&mut self) -> Result<&mut CollectiveContext> {
        self.collectives
            .as_deref_mut()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))
    }

    fn fits(&self, c: Collective, needs: &[(&str, usize, usize)]) -> Result<()> {
        let needs = needs
            .iter()
            .map(|&(role, len, needed)| Need { role, len, needed });
        buffers_fit(self.rank(), c.name(), needs)
    }

    fn check_root(&self, c: Collective, root: u32) -> Result<()> {
        if root >= self.size() {
            return Err(Error::InvalidUsage(format!(
                "rank {}: {c}: root {root} is not a rank (the communicator has {})",
                self.rank(),
                self.size()
            )));
        }
        Ok(())
    }

    fn plain_call<'b>(
        &self,
        c: Collective,
        dtype: DataType,
        count: usize,
        input: DeviceView<'b, u8>,
        output: DeviceViewMut<'b, u8>,
    ) -> Call<'b> {
        Call {
            shape: Shape::new(c, dtype, None, count, None),
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count: count as u64,
            windows: 1,
            elements: count as u64,
            input,
            output,
            counts: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reducing_call<'b>(
        &self,
        c: Collective,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        input: DeviceView<'b, u8>,
        output: DeviceViewMut<'b, u8>,
    ) -> Call<'b> {
        let mut call = self.plain_call(c, dtype, count, input, output);
        call.shape.op = Some(op as u32);
        call.op = op;
        if c == Collective::ReduceScatter {
            call.windows = self.size() as u64;
        }
        call
    }

    #[allow(clippy::too_many_arguments)]
    fn rooted(
        &mut self,
        c: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: u32,
        count: usize,
        input: DeviceView<'_, u8>,
        output: DeviceViewMut<'_, u8>,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call {
            shape: Shape::new(c, dtype, op, count, Some(root)),
            dtype,
            op: op.unwrap_or(ReduceOp::Sum),
            root,
            count: count as u64,
            windows: 1,
            elements: count as u64,
            input,
            output,
            counts: None,
        };
        self.run(call, stream, None)
    }

    /// Sets up (first call), agrees on the shape (first call of it), launches the call's
    /// kernel and advances the call counter.
    fn run(&mut self, mut call: Call<'_>, stream: &Stream, algo: Option<Algorithm>) -> Result<()> {
        self.collectives_set_up()?;
        let (rank, size) = (self.rank(), self.size());
        // The agreed maximum, and whether it came from `last`: a repeated shape is compared
        // once per call.
        let known = self.collectives.as_ref().and_then(|c| match &c.last {
            Some((shape, max)) if *shape == call.shape => Some((*max, true)),
            _ => c.agreed.get(&call.shape).map(|&max| (max, false)),
        });
        let repeated = known.is_some_and(|(_, from_last)| from_last);
        let agreed = match known {
            Some((max, _)) => max,
            None => {
                let shapes = shape::agree(self.out_of_band(), &call.shape)?;
                let max = shapes
                    .iter()
                    .filter_map(|s| s.counts.as_ref())
                    .flat_map(|(send, _)| send.iter().copied())
                    .max()
                    .unwrap_or(0);
                if let Some(c) = self.collectives.as_mut() {
                    c.agreed.insert(call.shape.clone(), max);
                }
                max
            }
        };
        let direct = match &self.collectives {
            Some(ctx) => ctx.config.launch_for(self.device()),
            None => return Err(Error::Internal("collectives not set up".into())),
        };
        let ctx = self
            .collectives
            .as_mut()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))?;
        if !repeated {
            ctx.last = Some((call.shape.clone(), agreed));
        }
        if call.shape.collective == Collective::AllToAllV {
            call.count = agreed;
            call.elements = agreed;
        }
        if call.count == 0 && call.shape.collective != Collective::Barrier {
            return Ok(());
        }
        let over_proxy = match algo {
            Some(algo) => algo.through_proxy().then_some(algo),
            None => self.proxy_algorithm(call.shape.collective)?,
        };
        if let Some(algo) = over_proxy {
            return self.run_over_ports(&call, stream, direct, algo);
        }
        let ctx = self
            .collectives
            .as_deref()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))?;
        let m = ctx.memory(rank, call.shape.collective.name())?;
        let algo = match algo {
            Some(algo) => Some(algo),
            None => {
                let bytes = call.count.saturating_mul(call.dtype.size());
                Some(self.memory_algorithm(call.shape.collective, bytes)?)
            }
        };
        let taken = match algo {
            Some(Algorithm::Packets) => 1,
            _ if call.shape.collective == Collective::Barrier => 0,
            _ => {
                let per = elements_per_round(&m.layout, call.dtype.size(), call.windows);
                rounds(call.elements, per)
            }
        };
        let (kind, root) = match (call.shape.collective, algo) {
            (Collective::Broadcast, Some(Algorithm::Packets)) => {
                (CallProtocol::BROADCAST, call.root)
            }
            (Collective::Reduce, Some(Algorithm::Packets)) => (CallProtocol::REDUCE, call.root),
            _ => (CallProtocol::LOCKSTEP, 0),
        };
        let barrier_call = call.shape.collective == Collective::Barrier;
        let eager_depth = m.layout.eager_depth();
        let switch = !ctx.protocol.continues(kind, root);
        let mut args = ctx.args(m, rank, size);
        // The switch from an eager protocol is the barrier, which waits for the dones it
        // left owed; a barrier call is one already, and takes the last call's protocol to
        // do so. A switch from lockstep needs none: the eager slots are left read out by
        // the switch that ended the last eager call.
        if switch && !barrier_call {
            if ctx.protocol.kind != CallProtocol::LOCKSTEP {
                barrier::collective_barrier::launch(stream, direct, args)?;
            }
            args.protocol = CallProtocol::switched(kind, root, ctx.sequence);
        }
        let started = args.protocol;
        args.input = call.input;
        args.output = call.output;
        args.count = call.count;
        args.dtype = call.dtype as u32;
        args.op = call.op as u32;
        args.root = call.root;
        if algo == Some(Algorithm::Packets) {
            let bytes = call.count.saturating_mul(call.dtype.size());
            args.packet_form = PacketForm::for_bytes(bytes, m.packet_data_from);
        }
        if !m.buffers.is_empty() {
            args.input_slot = m.buffers.slot_of(call.input.addr(), call.input.len());
            args.output_slot = m.buffers.slot_of(call.output.addr(), call.output.len());
        }
        // Packet kernels run one block of the direct kernels' size.
        let one_block = LaunchConfig::grid(1).block(direct.block.x);
        let launched = match (call.shape.collective, algo) {
            (Collective::AllReduce, Some(Algorithm::Packets)) => {
                all_reduce_packets::collective_all_reduce_packets::launch(stream, one_block, args)
            }
            (Collective::AllGather, Some(Algorithm::Packets)) => {
                all_gather_packets::collective_all_gather_packets::launch(stream, one_block, args)
            }
            (Collective::ReduceScatter, Some(Algorithm::Packets)) => {
                reduce_scatter_packets::collective_reduce_scatter_packets::launch(
                    stream, one_block, args,
                )
            }
            (Collective::AllToAll, Some(Algorithm::Packets)) => {
                all_to_all_packets::collective_all_to_all_packets::launch(stream, one_block, args)
            }
            (Collective::Broadcast, Some(Algorithm::Packets)) => {
                broadcast_packets::collective_broadcast_packets::launch(stream, one_block, args)
            }
            (Collective::Reduce, Some(Algorithm::Packets)) => {
                reduce_packets::collective_reduce_packets::launch(stream, one_block, args)
            }
            (Collective::AllReduce, _) => {
                all_reduce::collective_all_reduce::launch(stream, direct, args)
            }
            (Collective::AllGather, _) => {
                all_gather::collective_all_gather::launch(stream, direct, args)
            }
            (Collective::ReduceScatter, _) => {
                reduce_scatter::collective_reduce_scatter::launch(stream, direct, args)
            }
            (Collective::Broadcast, _) => {
                broadcast::collective_broadcast::launch(stream, direct, args)
            }
            (Collective::Reduce, _) => reduce::collective_reduce::launch(stream, direct, args),
            (Collective::AllToAll, _) => {
                all_to_all::collective_all_to_all::launch(stream, direct, args)
            }
            (Collective::AllToAllV, _) => all_to_allv::collective_all_to_allv::launch(
                stream,
                direct,
                args,
                call.counts.unwrap_or_default(),
            ),
            (Collective::Barrier, _) => barrier::collective_barrier::launch(stream, direct, args),
        };
        if let Some(ctx) = self.collectives.as_deref_mut() {
            // A switch launched stays done whether or not the call could be.
            ctx.protocol = started;
            if launched.is_ok() {
                ctx.protocol = started.after(kind, root, rank, ctx.sequence, taken, eager_depth);
                ctx.sequence += taken;
            }
        }
        launched
    }

    /// Runs `call` over port channels, by `algo`: in a ring for [`Algorithm::Ring`]
    /// (all-reduce, all-gather and reduce-scatter), by recursive doubling for
    /// [`Algorithm::Doubling`] (all-reduce, all-gather, broadcast, and reduce-scatter by
    /// recursive halving; the caller has checked the number of ranks);
    /// the others have one port algorithm
    /// (setting them up on its first call: every rank takes this path at the same call, as
    /// they agree on the algorithm).
    fn run_over_ports(
        &mut self,
        call: &Call<'_>,
        stream: &Stream,
        launch: LaunchConfig,
        algo: Algorithm,
    ) -> Result<()> {
        let (rank, size) = (self.rank(), self.size());
        let collective = call.shape.collective;
        let ring = algo == Algorithm::Ring;
        let doubling = algo == Algorithm::Doubling;
        let direct_from = self.config().collectives.port_direct_from(self.device());
        let mut ctx = self
            .collectives
            .take()
            .ok_or_else(|| Error::Internal("collectives not set up".into()))?;
        let set_up = ctx.ports_set_up(self);
        // The kernel pushes triggers from its start: a polling proxy should be hot by then.
        self.proxy().expect_triggers();
        let ctx = &mut **self.collectives.insert(ctx);
        set_up?;
        let (kind, root) = match collective {
            Collective::Broadcast if !doubling => (CallProtocol::BROADCAST, call.root),
            Collective::Reduce => (CallProtocol::REDUCE, call.root),
            _ => (CallProtocol::LOCKSTEP, 0),
        };
        let switch = (ctx.ports.as_ref())
            .filter(|p| !p.protocol.continues(kind, root))
            .map(|p| CallProtocol::switched(kind, root, p.sequence));
        let mut args = ctx.port_args(rank, size)?;
        // The switch between protocols is a barrier, which waits for the dones an eager
        // collective left owed; a barrier call is one already, and takes the last call's
        // protocol to do so.
        if let Some(switched) = switch
            && collective != Collective::Barrier
        {
            barrier_ports::collective_barrier_ports::launch(stream, launch, args)?;
            args.protocol = switched;
        }
        let started = args.protocol;
        // Puts from registered buffers, from the size that pays (see
        // `CollectiveConfig::port_direct_bytes`).
        if collective == Collective::AllReduce
            && !ring
            && !doubling
            && call.input.len() >= direct_from
            && let Some(p) = ctx.ports.as_ref()
        {
            args.input_source = p.sources.source_of(call.input.addr(), call.input.len());
            let output = call.output.as_view();
            args.output_source = p.sources.source_of(output.addr(), output.len());
        }
        args.input = call.input;
        args.output = call.output;
        args.count = call.count;
        args.dtype = call.dtype as u32;
        args.op = call.op as u32;
        args.root = call.root;
        let (layout, item) = (args.layout, call.dtype.size());
        // The set-up refuses rounds under 8 bytes a rank, so every round holds an element.
        let taken = match collective {
            Collective::AllReduce if doubling => {
                rounds(call.count, layout.copy_round_bytes() / item)
            }
            Collective::AllReduce if ring => rounds(call.count, layout.all_reduce_round(item)),
            Collective::AllReduce => {
                rounds(call.count, layout.all_reduce_ports_round(item, call.count))
            }
            Collective::ReduceScatter => rounds(call.count, layout.block_round(item).max(1)),
            Collective::AllToAll | Collective::AllToAllV => {
                rounds(call.count * item, layout.block_round(1).max(1))
            }
            Collective::Barrier => 1,
            Collective::Reduce => rounds(call.count, layout.copy_round_bytes() / item),
            _ => rounds(call.count * item, layout.copy_round_bytes()),
        };
        let launched = match collective {
            Collective::AllGather if ring => {
                all_gather_ring::collective_all_gather_ring::launch(stream, launch, args)
            }
            Collective::AllGather if doubling => {
                all_gather_doubling::collective_all_gather_doubling::launch(stream, launch, args)
            }
            Collective::AllGather => {
                all_gather_ports::collective_all_gather_ports::launch(stream, launch, args)
            }
            Collective::ReduceScatter if ring => {
                reduce_scatter_ring::collective_reduce_scatter_ring::launch(stream, launch, args)
            }
            Collective::ReduceScatter if doubling => {
                reduce_scatter_halving::collective_reduce_scatter_halving::launch(
                    stream, launch, args,
                )
            }
            Collective::ReduceScatter => {
                reduce_scatter_ports::collective_reduce_scatter_ports::launch(stream, launch, args)
            }
            Collective::Broadcast if doubling => {
                broadcast_doubling::collective_broadcast_doubling::launch(stream, launch, args)
            }
            Collective::Broadcast => {
                broadcast_ports::collective_broadcast_ports::launch(stream, launch, args)
            }
            Collective::Reduce => {
                reduce_ports::collective_reduce_ports::launch(stream, launch, args)
            }
            Collective::AllToAll => {
                all_to_all_ports::collective_all_to_all_ports::launch(stream, launch, args)
            }
            Collective::Barrier => {
                barrier_ports::collective_barrier_ports::launch(stream, launch, args)
            }
            Collective::AllToAllV => all_to_allv_ports::collective_all_to_allv_ports::launch(
                stream,
                launch,
                args,
                call.counts.unwrap_or_default(),
            ),
            _ if doubling => {
                all_reduce_doubling::collective_all_reduce_doubling::launch(stream, launch, args)
            }
            _ if ring => all_reduce_ring::collective_all_reduce_ring::launch(stream, launch, args),
            _ => all_reduce_ports::collective_all_reduce_ports::launch(stream, launch, args),
        };
        if let Some(p) = ctx.ports.as_mut() {
            // A switch launched stays done whether or not the call could be.
            p.protocol = started;
            if launched.is_ok() {
                p.protocol = started.after(kind, root, rank, p.sequence, taken, PortLayout::EAGER);
                p.sequence += taken;
            }
        }
        launched
    }
}
