//! Channel sets on the CPU emulator: kernels that talk to every peer through one parameter,
//! a custom all-gather over memory channels and a broadcast over port channels, written with
//! safe device code only (views, sets, the block helpers).
#![allow(missing_docs)]

mod common;

use common::{config, pattern};
use oxccl::{ChannelSet, Communicator, Error, MemoryChannel, PortChannel, RegisteredMemory};
use oxccl::{Result, in_process};
use oxccl_device::block::{block_signal_and_wait, block_wait};
use oxccl_device::channel_set::{MemoryChannelSetDeviceHandle, PortChannelSetDeviceHandle};
use oxccl_device::coop::{Block, Coop};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DeviceError, DeviceView, DeviceViewMut, arch, kernel};

/// Every other rank, ascending.
fn others(rank: u32, n_ranks: u32) -> impl Iterator<Item = u32> {
    (0..n_ranks).filter(move |&p| p != rank)
}

/// All-gather over a channel to every peer: each rank's chunk (at `rank * chunk_bytes` of
/// every rank's buffer) goes straight to every peer. Back to back safe: a ready handshake
/// with every peer first, so no rank writes into a buffer whose last round a peer has not
/// checked yet.
#[kernel(max_blocks = 1)]
fn set_all_gather(
    peers: MemoryChannelSetDeviceHandle<'_>,
    rank: u32,
    n_ranks: u32,
    chunk_bytes: u64,
) -> Result<(), DeviceError> {
    block_wait(|| {
        for p in others(rank, n_ranks) {
            peers.get(p)?.signal()?;
        }
        for p in others(rank, n_ranks) {
            peers.get(p)?.wait()?;
        }
        Ok(())
    })?;
    let off = rank as u64 * chunk_bytes;
    for p in others(rank, n_ranks) {
        peers.get(p)?.put(Block, off, off, chunk_bytes)?;
    }
    block_signal_and_wait(
        || {
            for p in others(rank, n_ranks) {
                peers.get(p)?.signal()?;
            }
            Ok(())
        },
        || {
            for p in others(rank, n_ranks) {
                peers.get(p)?.wait()?;
            }
            Ok(())
        },
    )
}

/// Broadcast of `bytes` from the start of `root`'s buffer to the start of every other rank's,
/// through the proxy. Every rank first tells the root it is ready for the next round.
#[kernel]
fn set_broadcast(
    peers: PortChannelSetDeviceHandle<'_>,
    rank: u32,
    root: u32,
    n_ranks: u32,
    bytes: u64,
) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() != 0 {
        return Ok(());
    }
    if rank != root {
        let from_root = peers.get(root)?;
        from_root.signal()?;
        return from_root.wait();
    }
    for p in others(rank, n_ranks) {
        peers.get(p)?.wait()?;
    }
    for p in others(rank, n_ranks) {
        peers.get(p)?.put_with_signal(0, 0, bytes)?;
    }
    for p in others(rank, n_ranks) {
        peers.get(p)?.flush()?;
    }
    Ok(())
}

/// Writes `count` elements of rank `rank`'s pattern of round `round` at element `first`.
#[kernel(max_blocks = 1)]
fn fill_pattern(
    buf: DeviceViewMut<'_, u32>,
    first: u64,
    count: u64,
    rank: u32,
    round: u32,
) -> Result<(), DeviceError> {
    let part = buf.slice(first..first + count)?;
    for i in Block.split(count) {
        part.set(i, pattern(rank, i, round))?;
    }
    Ok(())
}

/// Counts, into each thread's element of `wrong`, the elements of `buf` that are not
/// `ranks` consecutive chunks of `chunk` elements of round `round`, of ranks `first_rank`,
/// `first_rank + 1`, ...
#[kernel(max_blocks = 1)]
fn count_wrong_chunks(
    buf: DeviceView<'_, u32>,
    chunk: u64,
    ranks: u32,
    first_rank: u32,
    round: u32,
    wrong: DeviceViewMut<'_, u64>,
) -> Result<(), DeviceError> {
    let mut bad = 0;
    for e in Block.split(chunk * ranks as u64) {
        let (r, i) = (first_rank + (e / chunk) as u32, e % chunk);
        if buf.get(e)? != pattern(r, i, round) {
            bad += 1;
        }
    }
    let me = Block.thread_rank();
    wrong.set(me, wrong.get(me)? + bad)
}

/// A channel to every other rank, built in ascending peer order on every rank (which pairs
/// each rank's channel to a peer with the peer's channel to it).
fn to_every_peer<C>(
    comm: &mut Communicator,
    mut make: impl FnMut(&mut Communicator, u32) -> Result<C>,
) -> Result<Vec<C>> {
    let (rank, n) = (comm.rank(), comm.size());
    others(rank, n).map(|peer| make(comm, peer)).collect()
}

/// A buffer of `ranks * chunk` elements (this rank's chunk of round 0 in place) and every
/// rank's registration of theirs.
fn gather_buffer(
    comm: &Communicator,
    chunk: usize,
) -> Result<(oxccl::DeviceBuffer<u32>, Vec<RegisteredMemory>)> {
    let buf = comm.alloc::<u32>(chunk * comm.size() as usize)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    Ok((buf, all))
}

/// Guards against a set whose slots do not match their peers (data from one peer landing as
/// another's, signals to the wrong rank), and against a kernel that talks to every peer
/// going wrong when launched back to back with no host barrier: each round a kernel writes
/// this rank's chunk, the all-gather runs, and a kernel counts wrong elements, in stream
/// order.
#[test]
fn all_gather_over_a_memory_channel_set() {
    for ranks in [2u32, 3, 4] {
        let wrong = in_process::run(ranks, config(), |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let chunk = 1001usize;
            let (buf, all) = gather_buffer(comm, chunk)?;
            let mine = all[rank as usize].clone();
            let channels: Vec<MemoryChannel> = to_every_peer(comm, |c, peer| {
                c.memory_channel(peer, &all[peer as usize], &mine, None)
            })?;
            let set = ChannelSet::new(comm.device(), &channels)?;
            assert_eq!(set.peers(), others(rank, n).collect::<Vec<_>>());
            let threads = 3;
            let wrong = comm.alloc_zeroed::<u64>(threads)?;
            let stream = comm.device().stream()?;
            let config = LaunchConfig::grid(1).block(threads as u32);
            for round in 0..5 {
                let first = rank as u64 * chunk as u64;
                let count = chunk as u64;
                fill_pattern::launch(&stream, config, buf.view_mut(), first, count, rank, round)?;
                let bytes = (chunk * 4) as u64;
                set_all_gather::launch(&stream, config, set.device_handle(), rank, n, bytes)?;
                let view = buf.view();
                count_wrong_chunks::launch(
                    &stream,
                    config,
                    view,
                    count,
                    n,
                    0,
                    round,
                    wrong.view_mut(),
                )?;
            }
            comm.synchronize(&stream)?;
            Ok(wrong.to_vec()?.iter().sum::<u64>())
        })
        .unwrap();
        assert!(
            wrong.iter().all(|&w| w == 0),
            "{ranks} ranks: wrong by rank {wrong:?}"
        );
    }
}

/// Guards against a port channel set whose handles do not reach the proxy as their
/// channels' would (wrong ids, wrong FIFO), and against the root's broadcast racing a
/// peer's check of the last round: back to back rounds, every rank checking on the device.
#[test]
fn broadcast_over_a_port_channel_set() {
    let wrong = in_process::run(3, config(), |comm| {
        let (rank, n, root) = (comm.rank(), comm.size(), 1);
        let count = 4099usize;
        let buf = comm.alloc::<u32>(count)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let mine = all[rank as usize].clone();
        let channels: Vec<PortChannel> = to_every_peer(comm, |c, peer| {
            c.port_channel(peer, &all[peer as usize], &mine)
        })?;
        let set = ChannelSet::new(comm.device(), &channels)?;
        let wrong = comm.alloc_zeroed::<u64>(2)?;
        let stream = comm.device().stream()?;
        let config = LaunchConfig::grid(1).block(2);
        let bytes = (count * 4) as u64;
        for round in 0..4 {
            if rank == root {
                fill_pattern::launch(
                    &stream,
                    config,
                    buf.view_mut(),
                    0,
                    count as u64,
                    root,
                    round,
                )?;
            }
            set_broadcast::launch(&stream, config, set.device_handle(), rank, root, n, bytes)?;
            let view = buf.view();
            count_wrong_chunks::launch(
                &stream,
                config,
                view,
                count as u64,
                1,
                root,
                round,
                wrong.view_mut(),
            )?;
        }
        comm.synchronize(&stream)?;
        Ok(wrong.to_vec()?.iter().sum::<u64>())
    })
    .unwrap();
    assert!(wrong.iter().all(|&w| w == 0), "wrong by rank {wrong:?}");
}

/// Thread 0 looks up the channel to `peer`.
#[kernel]
fn look_up(peers: MemoryChannelSetDeviceHandle<'_>, peer: u32) -> Result<(), DeviceError> {
    if arch::thread_rank_in_grid() == 0 {
        peers.get(peer)?;
    }
    Ok(())
}

/// Guards against a peer the set holds no channel to (this rank's own slot, past the end)
/// giving a kernel a zeroed handle or a wild reference: the lookup is an error the launch
/// reports with the peer; and against a set with two channels to one peer.
#[test]
fn unknown_peers_and_duplicate_channels_are_refused() {
    in_process::run(2, config(), |comm| {
        let rank = comm.rank();
        let peer = 1 - rank;
        let buf = comm.alloc_zeroed::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let mine = all[rank as usize].clone();
        let channels = vec![
            comm.memory_channel(peer, &all[peer as usize], &mine, None)?,
            comm.memory_channel(peer, &all[peer as usize], &mine, None)?,
        ];
        let err = ChannelSet::new(comm.device(), &channels).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidUsage(m) if m.contains("two channels to peer")),
            "{err}"
        );
        let set = ChannelSet::new(comm.device(), &channels[..1])?;
        assert_eq!(set.len(), peer + 1);
        let stream = comm.device().stream()?;
        look_up::launch(&stream, LaunchConfig::grid(1), set.device_handle(), peer)?;
        stream.synchronize()?;
        for unknown in [rank, 2, u32::MAX] {
            look_up::launch(&stream, LaunchConfig::grid(1), set.device_handle(), unknown)?;
            match stream.synchronize().unwrap_err() {
                Error::KernelError { error, message, .. } => {
                    assert_eq!(error, DeviceError::OutOfRange);
                    assert!(message.contains("a channel set lookup"), "{message}");
                    assert!(message.contains(&format!("[{unknown}, ")), "{message}");
                }
                other => panic!("unexpected error: {other}"),
            }
        }
        Ok(())
    })
    .unwrap();
}
