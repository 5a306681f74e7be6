//! Ranks as threads of one process exchanging data over port and memory channels, driven by
//! the kernels shipped in `oxccl_device::kernels`, on the CPU emulator.
#![allow(missing_docs)]

use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, CommunicatorConfig, DeviceBuffer, RegisteredMemory, Result};
use oxccl_device::kernels::packet_exchange::{ll8_exchange, ll16_exchange};
use oxccl_device::kernels::ring_exchange::{memory_ring_exchange, port_ring_exchange};
use oxccl_device::launch::LaunchConfig;
use std::time::Duration;

fn config() -> InProcessConfig {
    config_with_assist(true)
}

fn config_with_assist(proxy_assist: bool) -> InProcessConfig {
    InProcessConfig {
        communicator: CommunicatorConfig {
            wait_timeout: Duration::from_secs(20),
            proxy_assist,
            ..Default::default()
        },
        exchange_timeout: Duration::from_secs(20),
    }
}

/// The value rank `rank` puts at element `i` of its own chunk.
fn pattern(rank: u32, i: usize) -> u32 {
    rank.wrapping_mul(0x9e37_79b9) ^ (i as u32).wrapping_mul(2_654_435_761) ^ 0x5bd1_e995
}

/// A buffer of `ranks * chunk` elements holding only this rank's chunk, and its registration
/// on every rank.
fn ring_buffer(
    comm: &Communicator,
    chunk: usize,
) -> Result<(DeviceBuffer<u32>, Vec<RegisteredMemory>)> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut host = vec![0u32; chunk * ranks as usize];
    for i in 0..chunk {
        host[rank as usize * chunk + i] = pattern(rank, i);
    }
    let buf = comm.device().alloc_from(&host)?;
    let all = comm.all_gather_memory(&comm.register(&buf))?;
    Ok((buf, all))
}

fn check_all_gathered(comm: &Communicator, buf: &DeviceBuffer<u32>, chunk: usize) -> Result<()> {
    let got = buf.to_vec()?;
    for r in 0..comm.size() {
        for i in 0..chunk {
            let (want, have) = (pattern(r, i), got[r as usize * chunk + i]);
            assert_eq!(
                have,
                want,
                "rank {}: element {i} of rank {r}'s chunk",
                comm.rank()
            );
        }
    }
    Ok(())
}

fn neighbours(comm: &Communicator) -> (u32, u32) {
    let (rank, n) = (comm.rank(), comm.size());
    ((rank + 1) % n, (rank + n - 1) % n)
}

fn port_ring(ranks: u32, chunk: usize) {
    // Both ways triggers get executed: by kernel threads assisting, and by proxy threads only.
    for assist in [true, false] {
        port_ring_with(ranks, chunk, assist);
    }
}

fn port_ring_with(ranks: u32, chunk: usize, assist: bool) {
    in_process::run(ranks, config_with_assist(assist), |comm| {
        let (buf, all) = ring_buffer(comm, chunk)?;
        let mine = all[comm.rank() as usize].clone();
        let (to_next, to_prev) = comm.ring_port_channels(&all, &mine)?;
        let stream = comm.device().stream()?;
        let bytes = (chunk * 4) as u64;
        port_ring_exchange::launch(
            &stream,
            LaunchConfig::grid(1).block(1),
            (
                to_next.device_handle(),
                to_prev.device_handle(),
                comm.rank(),
                ranks,
                bytes,
            ),
        )?;
        comm.synchronize(&stream)?;
        comm.barrier()?;
        check_all_gathered(comm, &buf, chunk)
    })
    .unwrap();
}

fn memory_ring(ranks: u32, chunk: usize, threads: u32) {
    in_process::run(ranks, config(), |comm| {
        let (buf, all) = ring_buffer(comm, chunk)?;
        let mine = all[comm.rank() as usize].clone();
        let (to_next, from_prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let stream = comm.device().stream()?;
        memory_ring_exchange::launch(
            &stream,
            LaunchConfig::grid(1).block(threads),
            (
                to_next.device_handle(),
                from_prev.device_handle(),
                comm.rank(),
                ranks,
                (chunk * 4) as u64,
            ),
        )?;
        comm.synchronize(&stream)?;
        comm.barrier()?;
        check_all_gathered(comm, &buf, chunk)
    })
    .unwrap();
}

/// Guards against lost, misplaced or reordered data and signals through the proxy.
#[test]
fn port_ring_exchange_2_ranks() {
    port_ring(2, 1000);
}

/// Guards against channels to different peers getting each other's ids or semaphores.
#[test]
fn port_ring_exchange_4_ranks() {
    port_ring(4, 4099);
}

/// Guards against direct copies racing their signal, or split copies missing bytes.
#[test]
fn memory_ring_exchange_2_ranks() {
    memory_ring(2, 1000, 3);
}

/// As above, with more peers and an uneven split among threads.
#[test]
fn memory_ring_exchange_4_ranks() {
    memory_ring(4, 4099, 4);
}

/// Runs the LL exchange kernel for packet type `kind` (8 or 16) over `rounds` rounds,
/// reusing the packet buffer with a new flag each round.
fn packet_ring(ranks: u32, kind: u32, bytes: usize, rounds: u32) {
    in_process::run(ranks, config(), |comm| {
        let prev = neighbours(comm).1;
        // Layout of `data`: bytes 0..bytes to send, bytes..2*bytes received.
        let words = bytes / 4;
        let mut data = comm.alloc::<u32>(2 * words)?;
        let packets = comm.alloc::<u8>(2 * bytes)?;
        let data_mem = comm.all_gather_memory(&comm.register(&data))?;
        let packet_mem = comm.all_gather_memory(&comm.register(&packets))?;
        let me = comm.rank() as usize;
        let (to_next, from_prev) =
            comm.ring_memory_channels(&packet_mem, &data_mem[me], Some(&packet_mem[me]))?;
        let stream = comm.device().stream()?;
        for round in 1..=rounds {
            let mut host = vec![0u32; 2 * words];
            for (i, w) in host.iter_mut().take(words).enumerate() {
                *w = pattern(comm.rank(), i) ^ round;
            }
            data.copy_from_host(&host)?;
            comm.barrier()?;
            let args = (
                to_next.device_handle(),
                from_prev.device_handle(),
                bytes as u64,
                round,
            );
            let cfg = LaunchConfig::grid(1).block(2);
            if kind == 8 {
                ll8_exchange::launch(&stream, cfg, args)?;
            } else {
                ll16_exchange::launch(&stream, cfg, args)?;
            }
            comm.synchronize(&stream)?;
            let got = data.to_vec()?;
            for i in 0..words {
                assert_eq!(
                    got[words + i],
                    pattern(prev, i) ^ round,
                    "rank {me} round {round} word {i}"
                );
            }
            // Nobody rewrites its send half before everyone has unpacked this round.
            comm.barrier()?;
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against torn 8-byte packets or a stale flag read as fresh on buffer reuse.
#[test]
fn ll8_packet_exchange() {
    packet_ring(2, 8, 4096, 3);
    packet_ring(4, 8, 1004, 2);
}

/// Guards against a 16-byte packet whose halves are accepted from different rounds.
#[test]
fn ll16_packet_exchange() {
    packet_ring(2, 16, 4096, 3);
    packet_ring(4, 16, 1000, 2);
}

/// Guards against a ring helper that accepts a one-rank "ring" (which would pair a rank
/// with itself) or a memory list that does not cover every rank.
#[test]
fn ring_helpers_refuse_bad_rings() {
    in_process::run(1, config(), |comm| {
        let buf = comm.alloc::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf))?;
        let err = comm.ring_port_channels(&all, &all[0]).unwrap_err();
        assert!(matches!(err, oxccl::Error::InvalidUsage(_)), "{err}");
        Ok(())
    })
    .unwrap();
    in_process::run(2, config(), |comm| {
        let buf = comm.alloc::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf))?;
        let err = comm
            .ring_memory_channels(&all[..1], &all[0], None)
            .unwrap_err();
        assert!(matches!(err, oxccl::Error::InvalidUsage(_)), "{err}");
        Ok(())
    })
    .unwrap();
}
