//! One rank of the benchmark: its buffers, its channels, the launches of both all-reduce
//! kernels, the check of a result, and the timing of back-to-back calls.

use crate::Args;
use crate::table::Row;
use oxccl::{Communicator, DeviceBuffer, MemoryChannel, Result, Stream};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};
use oxccl_kernels::packet_all_reduce::{
    PacketAllReduceArgs, packet_all_reduce_sum_f32, packet_scratch_bytes,
};
use std::cell::Cell;
use std::time::Instant;

/// Small integers, so every sum is exact in f32 whatever the order of additions.
pub(crate) fn value(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 101) as f32
}

pub(crate) struct Rank {
    /// Elements the ring's `work` buffers were sized for (their second half is scratch).
    capacity: usize,
    work: DeviceBuffer<f32>,
    input: DeviceBuffer<f32>,
    next: MemoryChannel,
    prev: MemoryChannel,
    /// LL-packet channels over every rank's scratch, if any size takes packets.
    packets: Option<PacketPath>,
    stream: Stream,
}

/// What the LL-packet all-reduce needs: the scratch peers write, channels over it, and the
/// number of calls made on them (every rank makes the same calls, so the numbers agree).
struct PacketPath {
    _scratch: DeviceBuffer<u64>,
    next: MemoryChannel,
    prev: MemoryChannel,
    /// Elements the scratch was sized for.
    capacity: u64,
    calls: Cell<u64>,
}

impl PacketPath {
    /// The next call's number on these channels.
    fn next_sequence(&self) -> u64 {
        let sequence = self.calls.get();
        self.calls.set(sequence + 1);
        sequence
    }
}

impl Rank {
    pub(crate) fn new(
        comm: &mut Communicator,
        max_n: usize,
        max_packet_bytes: u64,
    ) -> Result<Rank> {
        let rank = comm.rank();
        let work = comm.alloc::<f32>(2 * max_n)?;
        let input = comm
            .device()
            .alloc_from(&(0..max_n).map(|i| value(rank, i)).collect::<Vec<_>>())?;
        let all = comm.all_gather_memory(&comm.register(&work))?;
        let mine = all[rank as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let packet_n = (max_packet_bytes.min(max_n as u64 * 4) / 4) as usize;
        let packets = if packet_n > 0 {
            let bytes = packet_scratch_bytes(packet_n as u64, comm.size()).max(16);
            // Zeroed: a packet's flag is never 0, so zeroed scratch reads as "not arrived".
            let scratch = comm.alloc_zeroed::<u64>(bytes.div_ceil(8) as usize)?;
            let all = comm.all_gather_memory(&comm.register(&scratch))?;
            let mine = all[rank as usize].clone();
            let (next, prev) = comm.ring_memory_channels(&all, &mine, Some(&mine))?;
            Some(PacketPath {
                _scratch: scratch,
                next,
                prev,
                capacity: packet_n as u64,
                calls: Cell::new(0),
            })
        } else {
            None
        };
        Ok(Rank {
            capacity: max_n,
            work,
            input,
            next,
            prev,
            packets,
            stream: comm.device().stream()?,
        })
    }

    fn launch(&self, comm: &Communicator, n: usize, in_place: bool, threads: u32) -> Result<()> {
        let config = LaunchConfig::grid(1).block(threads);
        if let Some(p) = self.packets.as_ref().filter(|p| n as u64 <= p.capacity) {
            let input = if in_place {
                self.work.addr()
            } else {
                self.input.addr()
            };
            let args = PacketAllReduceArgs {
                next: p.next.device_handle(),
                prev: p.prev.device_handle(),
                input,
                output: self.work.addr(),
                n: n as u64,
                capacity: p.capacity,
                sequence: p.next_sequence(),
                rank: comm.rank(),
                n_ranks: comm.size(),
            };
            // SAFETY: `input` (our input buffer, or `work` in place) and `work` hold at least
            // `n` elements each and are touched by nothing else until the stream is done.
            return unsafe { packet_all_reduce_sum_f32::launch(&self.stream, config, args) };
        }
        let args = RingAllReduceArgs {
            next: self.next.device_handle(),
            prev: self.prev.device_handle(),
            input: if in_place {
                self.work.view()
            } else {
                self.input.view()
            },
            work: self.work.view_mut(),
            n: n as u64,
            capacity: self.capacity as u64,
            rank: comm.rank(),
            n_ranks: comm.size(),
        };
        ring_all_reduce_sum_f32::launch(&self.stream, config, args)
    }

    /// Runs once from fresh inputs and counts wrong elements.
    fn check(
        &mut self,
        comm: &Communicator,
        n: usize,
        in_place: bool,
        threads: u32,
    ) -> Result<u64> {
        let fresh: Vec<f32> = (0..n).map(|i| value(comm.rank(), i)).collect();
        let mut host = self.work.to_vec()?;
        host[..n].copy_from_slice(&fresh);
        self.work.copy_from_host(&host)?;
        comm.barrier()?;
        self.launch(comm, n, in_place, threads)?;
        comm.synchronize(&self.stream)?;
        comm.barrier()?;
        let got = self.work.to_vec()?;
        let ranks = comm.size();
        Ok((0..n)
            .filter(|&i| got[i] != (0..ranks).map(|r| value(r, i)).sum::<f32>())
            .count() as u64)
    }

    /// Mean time of one all-reduce over `iters` back-to-back launches, in microseconds.
    fn time(&self, comm: &Communicator, n: usize, in_place: bool, a: &Args) -> Result<f64> {
        for _ in 0..a.warmup {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..a.iters {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        let us = start.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64;
        comm.check()?;
        comm.barrier()?;
        Ok(us)
    }
}

/// Every size, out of place and in place, on this rank: (bytes, (µs, wrong), (µs, wrong)).
pub(crate) fn bench_rank(comm: &mut Communicator, a: &Args, sizes: &[u64]) -> Result<Vec<Row>> {
    let max_n = (sizes.last().copied().unwrap_or(4) / 4) as usize;
    let mut rank = Rank::new(comm, max_n, a.packet_max_bytes)?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let n = (bytes / 4) as usize;
        let mut row = (bytes, (0.0, 0), (0.0, 0));
        for in_place in [false, true] {
            let wrong = rank.check(comm, n, in_place, a.threads)?;
            let us = rank.time(comm, n, in_place, a)?;
            *(if in_place { &mut row.2 } else { &mut row.1 }) = (us, wrong);
        }
        rows.push(row);
    }
    Ok(rows)
}
