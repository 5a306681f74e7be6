//! One rank's broadcast: the buffer the root's proxy copies into, a port channel to every
//! peer, `launches` launches of [`port_broadcast()`] back to back, and the check of every
//! output.

use crate::data::{Outcome, chunk};
use crate::options::Options;
use custom_collective_kernels::peers::others;
use custom_collective_kernels::{BroadcastArgs, port_broadcast};
use oxccl::{ChannelSet, Communicator, DeviceBuffer, PortChannel, Result};
use oxccl_device::launch::LaunchConfig;

/// Runs the broadcast from `opts.root` on this rank (every rank of `comm` calls it at the
/// same point) and checks what each launch delivered.
///
/// # Errors
/// As [`crate::all_gather::run_rank`].
pub fn run_rank(comm: &mut Communicator, opts: &Options) -> Result<Outcome> {
    let (rank, n_ranks, root) = (comm.rank(), comm.size(), opts.root);
    let count = opts.count;

    // The buffer the proxy copies from (on the root) and into (everywhere else).
    let buf = comm.alloc::<u32>(count)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;

    // A port channel to every peer: the proxy copies from our `buf` into the peer's. Only
    // the root's channels carry data; the others carry their ready signals to the root.
    let mut channels: Vec<PortChannel> = Vec::new();
    for peer in others(rank, n_ranks) {
        channels.push(comm.port_channel(peer, &all[peer as usize], &all[rank as usize])?);
    }
    let peers = ChannelSet::new(comm.device(), &channels)?;

    // Every rank has data of its own per launch (only the root's is sent: a rank that sent
    // its own would show up in the check) and an output per launch.
    let inputs = (0..opts.launches)
        .map(|launch| comm.device().alloc_from(&chunk(rank, launch, count)))
        .collect::<Result<Vec<DeviceBuffer<u32>>>>()?;
    let outputs = (0..opts.launches)
        .map(|_| comm.alloc::<u32>(count))
        .collect::<Result<Vec<DeviceBuffer<u32>>>>()?;

    let stream = comm.device().stream()?;
    let config = LaunchConfig::grid(1).block(opts.threads);
    for (input, output) in inputs.iter().zip(&outputs) {
        let args = BroadcastArgs {
            peers: peers.device_handle(),
            input: input.view(),
            buf: buf.view_mut(),
            output: output.view_mut(),
            rank,
            root,
            n_ranks,
            reserved: 0,
        };
        port_broadcast::launch(&stream, config, args)?;
    }
    comm.synchronize(&stream)?;

    // Launch `l`'s output holds the root's data of launch `l`, on every rank.
    let mut outcome = Outcome::default();
    for (launch, output) in (0..).zip(&outputs) {
        outcome.compare(
            "broadcast",
            rank,
            launch,
            &output.to_vec()?,
            &chunk(root, launch, count),
        );
    }
    Ok(outcome)
}
