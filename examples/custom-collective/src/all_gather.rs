//! One rank's all-gather: the buffer peers write into, a memory channel to every peer,
//! `launches` launches of [`memory_all_gather()`] back to back, and the check of every output.

use crate::data::{Outcome, chunk};
use crate::options::Options;
use custom_collective_kernels::peers::others;
use custom_collective_kernels::{AllGatherArgs, memory_all_gather};
use oxccl::{ChannelSet, Communicator, DeviceBuffer, MemoryChannel, Result};
use oxccl_device::launch::LaunchConfig;

/// Runs the all-gather on this rank (every rank of `comm` calls it at the same point) and
/// checks what each launch gathered.
///
/// # Errors
/// A failed allocation, channel setup or launch, or a kernel or channel that failed
/// (`synchronize` names rank, channel and kernel).
pub fn run_rank(comm: &mut Communicator, opts: &Options) -> Result<Outcome> {
    let (rank, n_ranks) = (comm.rank(), comm.size());
    let count = opts.count;
    let total = count * n_ranks as usize;

    // The buffer peers store into: registered, and its registration sent to every rank
    // (`all[p]` is rank p's, valid on this rank once mapped by a channel).
    let buf = comm.alloc::<u32>(total)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;

    // A memory channel to every peer: kernels store into the peer's `buf` (`all[peer]`)
    // from ours (`all[rank]`). Every rank builds them in the same (ascending) order, which
    // pairs our channel to a peer with the peer's channel to us.
    let mut channels: Vec<MemoryChannel> = Vec::new();
    for peer in others(rank, n_ranks) {
        channels.push(comm.memory_channel(peer, &all[peer as usize], &all[rank as usize], None)?);
    }
    // Their device handles, by peer rank, in device memory: one 16-byte kernel parameter.
    let peers = ChannelSet::new(comm.device(), &channels)?;

    // Each launch gets data of its own and an output of its own, so that every launch can
    // be checked after one synchronize.
    let inputs = (0..opts.launches)
        .map(|launch| comm.device().alloc_from(&chunk(rank, launch, count)))
        .collect::<Result<Vec<DeviceBuffer<u32>>>>()?;
    let outputs = (0..opts.launches)
        .map(|_| comm.alloc::<u32>(total))
        .collect::<Result<Vec<DeviceBuffer<u32>>>>()?;

    // Back to back on one stream: no host barrier between launches, so a rank may run a
    // launch ahead of a peer; the kernel's ready handshake keeps that correct.
    let stream = comm.device().stream()?;
    let config = LaunchConfig::grid(1).block(opts.threads);
    for (input, output) in inputs.iter().zip(&outputs) {
        let args = AllGatherArgs {
            peers: peers.device_handle(),
            input: input.view(),
            buf: buf.view_mut(),
            output: output.view_mut(),
            rank,
            n_ranks,
        };
        memory_all_gather::launch(&stream, config, args)?;
    }
    comm.synchronize(&stream)?;

    // Launch `l`'s output holds every rank's data of launch `l`, by rank.
    let mut outcome = Outcome::default();
    for (launch, output) in (0..).zip(&outputs) {
        let expected: Vec<u32> = (0..n_ranks).flat_map(|r| chunk(r, launch, count)).collect();
        outcome.compare("all-gather", rank, launch, &output.to_vec()?, &expected);
    }
    Ok(outcome)
}
