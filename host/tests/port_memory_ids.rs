//! Port-channel puts naming other registered memories than the channel's own
//! (`Communicator::port_dst_memory` / `port_src_memory`, `with_memories` on the device),
//! over the node's transport and Ethernet, on the emulator and on GPU 0 where there is one
//! (the GPU bundle runs this program), and the ids' misuse refused.
#![allow(missing_docs)]

mod common;

use common::config_with_assist;
use oxccl::Backend;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, DeviceBuffer, Error, RegisteredMemory, Result, TransportChoice};
use oxccl_device::DeviceError;
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::device_check::{put_between_memories, put_then_flush};
use oxccl_proxy::{ProxyError, Refusal, Side};

/// Bytes of each buffer.
const BYTES: usize = 3000;

/// Byte `i` of source buffer `which` of `rank`.
fn byte(rank: u32, which: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(7) ^ (rank as u8 * 40) ^ (which * 101)
}

/// Each buffer's registration on every rank, by rank.
type Gathered = Vec<Vec<RegisteredMemory>>;

/// Two source buffers and two destination buffers of this rank (the destinations filled
/// with 0xee), each registered and gathered from every rank: `(buffers, gathered)`, in the
/// order source 0, source 1, destination 0, destination 1.
fn buffers(comm: &mut Communicator) -> Result<(Vec<DeviceBuffer<u8>>, Gathered)> {
    let rank = comm.rank();
    let mut bufs = Vec::new();
    let mut all = Vec::new();
    for which in 0..4_u8 {
        let host: Vec<u8> = (0..BYTES)
            .map(|i| {
                if which < 2 {
                    byte(rank, which, i)
                } else {
                    0xee
                }
            })
            .collect();
        let buf = comm.device().alloc_from(&host)?;
        all.push(comm.all_gather_memory(&comm.register(&buf)?)?);
        bufs.push(buf);
    }
    Ok((bufs, all))
}

fn job(backend: Backend, transport: TransportChoice, assist: bool) -> InProcessConfig {
    let mut config = config_with_assist(assist);
    config.communicator.transport = transport;
    config.backend = backend;
    config
}

/// The emulator, and the CUDA backend where a driver and GPU are present (else the reason
/// it is skipped is printed).
fn backends(test: &str) -> Vec<Backend> {
    let mut backends = vec![Backend::Cpu];
    match Backend::cuda_device_count() {
        Ok(_) => backends.push(Backend::Cuda),
        Err(why) => println!("{test}: the cuda part is skipped: {why}"),
    }
    backends
}

/// Guards against a put naming other memories writing the channel's own destination (or
/// reading its own source), against the channel's own puts going astray after one, and
/// against ids that mean something else over Ethernet (by the owner's registration) than
/// over host IPC (by mapping).
#[test]
fn one_channel_puts_between_several_memories() {
    let cases = backends("one_channel_puts_between_several_memories")
        .into_iter()
        .flat_map(|b| [TransportChoice::HostIpc, TransportChoice::Ethernet].map(|t| (b, t)));
    for (backend, transport) in cases {
        // Assist exists on the emulator alone.
        let assists: &[bool] = if backend == Backend::Cpu {
            &[false, true]
        } else {
            &[false]
        };
        for &assist in assists {
            in_process::run(2, job(backend, transport, assist), |comm| {
                let (rank, peer) = (comm.rank(), 1 - comm.rank());
                let (bufs, all) = buffers(comm)?;
                let (p, r) = (peer as usize, rank as usize);
                // The channel's own memories: source 0 into the peer's destination 0.
                let chan = comm.port_channel(peer, &all[2][p], &all[0][r])?;
                let dst = comm.port_dst_memory(&chan, &all[3][p])?;
                let src = comm.port_src_memory(&all[1][r])?;
                assert_eq!(
                    comm.port_dst_memory(&chan, &all[3][p])?,
                    dst,
                    "same id again"
                );
                let stream = comm.device().stream()?;
                put_between_memories::launch(
                    &stream,
                    LaunchConfig::grid(1),
                    chan.device_handle(),
                    dst,
                    src,
                    BYTES as u64,
                )?;
                comm.synchronize(&stream)?;
                let (own, other) = (bufs[2].to_vec()?, bufs[3].to_vec()?);
                for i in 0..BYTES {
                    let want_own = if i < 16 { 0xee } else { byte(peer, 0, i) };
                    assert_eq!(
                        own[i], want_own,
                        "{transport:?} rank {rank}: byte {i} of dst 0"
                    );
                    assert_eq!(
                        other[i],
                        byte(peer, 1, i),
                        "{transport:?}: byte {i} of dst 1"
                    );
                }
                comm.barrier()
            })
            .unwrap();
        }
    }
}

/// Guards against a destination id of one peer's memory being written through a channel
/// to another peer (the proxy knows whose memory each id is), and against the host handing
/// out ids for memory of the wrong rank.
#[test]
fn ids_of_the_wrong_rank_are_refused() {
    in_process::run(
        3,
        job(Backend::Cpu, TransportChoice::HostIpc, false),
        |comm| {
            let rank = comm.rank();
            let (bufs, all) = buffers(comm)?;
            let r = rank as usize;
            if rank == 0 {
                let to_1 = comm.port_channel(1, &all[2][1], &all[0][0])?;
                let to_2 = comm.port_channel(2, &all[2][2], &all[0][0])?;
                // The host refuses memory of a rank that is not the channel's peer, or not ours.
                for e in [
                    comm.port_dst_memory(&to_1, &all[3][2]).unwrap_err(),
                    comm.port_dst_memory(&to_1, &all[3][0]).unwrap_err(),
                ] {
                    assert!(
                        matches!(&e, Error::InvalidUsage(m) if m.contains("peer 1")),
                        "{e}"
                    );
                }
                let e = comm.port_src_memory(&all[1][1]).unwrap_err();
                assert!(
                    matches!(&e, Error::InvalidUsage(m) if m.contains("rank 1")),
                    "{e}"
                );
                // An id of rank 2's memory, named on the channel to rank 1.
                let of_2 = comm.port_dst_memory(&to_2, &all[3][2])?;
                let src = comm.port_src_memory(&all[1][r])?;
                let stream = comm.device().stream()?;
                let handle = to_1.device_handle().with_memories(of_2, src);
                put_then_flush::launch(&stream, LaunchConfig::grid(1), handle, 0, 0, 16)?;
                // The kernel learns the channel stopped; the host is told why.
                match stream.synchronize() {
                    Err(Error::KernelError { error, .. }) => {
                        assert_eq!(error, DeviceError::Aborted)
                    }
                    other => panic!("expected the flush to fail, got {other:?}"),
                }
                match comm.check() {
                    Err(Error::Proxy(ProxyError::TriggerRefused {
                        peer: Some(1),
                        refusal:
                            Refusal::WrongRank {
                                side: Side::Dst,
                                owner: 2,
                                expected: 1,
                                ..
                            },
                        ..
                    })) => {}
                    other => panic!("expected the put to be refused, got {other:?}"),
                }
            } else {
                // The other end of rank 0's channel (set up pairwise).
                let _to_0 = comm.port_channel(0, &all[2][0], &all[0][r])?;
            }
            comm.barrier()?;
            let untouched = bufs[3].to_vec()?.iter().all(|&b| b == 0xee);
            assert!(untouched, "rank {rank}: a refused put wrote destination 1");
            Ok(())
        },
    )
    .unwrap();
}
