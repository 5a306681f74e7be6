//! Ranks as threads of one process exchanging data over port and memory channels, driven by
//! the kernels shipped in `oxccl_kernels`, on the CPU emulator.
#![allow(missing_docs)]

mod common;

use common::{
    assert_all_gathered, config, config_with_assist, count_wrong, fill_chunk, neighbours,
    ring_buffer,
};
use oxccl::in_process;
use oxccl::{Communicator, MemoryChannel, PortChannel, Result, Stream};
use oxccl_device::launch::LaunchConfig;
use oxccl_kernels::packet_exchange::{ll8_exchange, ll16_exchange};
use oxccl_kernels::ring_exchange::{memory_ring_exchange, port_ring_exchange};

/// The two channels of a ring, of either kind.
enum Ring {
    Port(Box<(PortChannel, PortChannel)>),
    Memory(Box<(MemoryChannel, MemoryChannel)>),
}

impl Ring {
    fn build(comm: &mut Communicator, all: &[oxccl::RegisteredMemory], port: bool) -> Result<Ring> {
        let mine = all[comm.rank() as usize].clone();
        Ok(if port {
            Ring::Port(Box::new(comm.ring_port_channels(all, &mine)?))
        } else {
            Ring::Memory(Box::new(comm.ring_memory_channels(all, &mine, None)?))
        })
    }

    /// Launches one ring all-gather of `chunk` elements per rank.
    fn launch(
        &self,
        comm: &Communicator,
        stream: &Stream,
        chunk: usize,
        threads: u32,
    ) -> Result<()> {
        let (rank, ranks, bytes) = (comm.rank(), comm.size(), (chunk * 4) as u64);
        match self {
            Ring::Port(pair) => port_ring_exchange::launch(
                stream,
                LaunchConfig::grid(1).block(threads),
                pair.0.device_handle(),
                pair.1.device_handle(),
                rank,
                ranks,
                bytes,
            ),
            Ring::Memory(pair) => memory_ring_exchange::launch(
                stream,
                LaunchConfig::grid(1).block(threads),
                pair.0.device_handle(),
                pair.1.device_handle(),
                rank,
                ranks,
                bytes,
            ),
        }
    }
}

fn ring_once(ranks: u32, chunk: usize, threads: u32, port: bool, assist: bool) {
    in_process::run(ranks, config_with_assist(assist), |comm| {
        let (buf, all) = ring_buffer(comm, chunk)?;
        let ring = Ring::build(comm, &all, port)?;
        let stream = comm.device().stream()?;
        ring.launch(comm, &stream, chunk, threads)?;
        comm.synchronize(&stream)?;
        assert_all_gathered(comm, &buf, chunk, 0);
        Ok(())
    })
    .unwrap();
}

/// Guards against lost, misplaced or reordered data and signals through the proxy, both
/// ways triggers get executed: by the proxy thread alone, and by pushing kernel threads.
#[test]
fn port_ring_exchange_2_ranks() {
    for assist in [false, true] {
        ring_once(2, 1000, 1, true, assist);
    }
}

/// Guards against channels to different peers getting each other's ids or semaphores.
#[test]
fn port_ring_exchange_4_ranks() {
    for assist in [false, true] {
        ring_once(4, 4099, 1, true, assist);
    }
}

/// Guards against direct copies racing their signal, or split copies missing bytes.
#[test]
fn memory_ring_exchange_2_ranks() {
    ring_once(2, 1000, 3, false, false);
}

/// As above, with more peers and an uneven split among threads.
#[test]
fn memory_ring_exchange_4_ranks() {
    ring_once(4, 4099, 4, false, false);
}

/// `rounds` ring all-gathers on the same buffer and channels, launched back to back with no
/// host barrier: before each, a kernel writes this rank's chunk of that round; after each, a
/// kernel counts the elements that are not every rank's chunk of that round, in stream
/// order, as a rank that races ahead would see them. Returns the count.
fn ring_back_to_back(
    comm: &mut Communicator,
    chunk: usize,
    port: bool,
    rounds: u32,
) -> Result<u64> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let (buf, all) = ring_buffer(comm, chunk)?;
    let ring = Ring::build(comm, &all, port)?;
    let errors = comm.alloc_zeroed::<u64>(1)?;
    let stream = comm.device().stream()?;
    let one = LaunchConfig::grid(1).block(2);
    for round in 0..rounds {
        // SAFETY: our chunk lies inside `buf`; only this stream's kernels write it, and peers
        // write only their own chunks of it.
        unsafe {
            fill_chunk::launch(
                &stream,
                one,
                buf.device_slice(),
                (rank as usize * chunk) as u64,
                chunk as u64,
                rank,
                round,
            )?
        };
        ring.launch(comm, &stream, chunk, 2)?;
        // SAFETY: `buf` holds `ranks * chunk` elements, `errors` one u64.
        unsafe {
            count_wrong::launch(
                &stream,
                one,
                buf.device_slice(),
                0,
                chunk as u64,
                ranks,
                0,
                round,
                errors.device_ptr(),
            )?
        };
    }
    comm.synchronize(&stream)?;
    Ok(errors.to_vec()?[0])
}

/// LL exchanges of `rounds` rounds on the same channels, back to back as above: each round
/// a kernel writes the send half, the exchange runs with the round's flag, and a kernel
/// counts the received elements that are not the previous rank's data of that round.
fn packets_back_to_back(
    comm: &mut Communicator,
    kind: u32,
    words: usize,
    rounds: u32,
) -> Result<u64> {
    let (rank, prev) = (comm.rank(), neighbours(comm).1);
    // Layout of `data`: words 0..words to send, words..2*words received.
    let data = comm.alloc::<u32>(2 * words)?;
    let packets = comm.alloc_zeroed::<u8>(8 * words)?;
    let data_mem = comm.all_gather_memory(&comm.register(&data)?)?;
    let packet_mem = comm.all_gather_memory(&comm.register(&packets)?)?;
    let me = rank as usize;
    let (to_next, from_prev) =
        comm.ring_memory_channels(&packet_mem, &data_mem[me], Some(&packet_mem[me]))?;
    let errors = comm.alloc_zeroed::<u64>(1)?;
    let stream = comm.device().stream()?;
    let one = LaunchConfig::grid(1).block(2);
    let bytes = (words * 4) as u64;
    for round in 0..rounds {
        // SAFETY: the send half of `data`, written only by this stream's kernels.
        unsafe {
            fill_chunk::launch(
                &stream,
                one,
                data.device_slice(),
                0,
                words as u64,
                rank,
                round,
            )?
        };
        let (send, receive) = (to_next.device_handle(), from_prev.device_handle());
        if kind == 8 {
            ll8_exchange::launch(&stream, one, send, receive, bytes, round + 1)?;
        } else {
            ll16_exchange::launch(&stream, one, send, receive, bytes, round + 1)?;
        }
        // SAFETY: the received half of `data`; `errors` one u64.
        unsafe {
            count_wrong::launch(
                &stream,
                one,
                data.device_slice(),
                words as u64,
                words as u64,
                1,
                prev,
                round,
                errors.device_ptr(),
            )?
        };
    }
    comm.synchronize(&stream)?;
    Ok(errors.to_vec()?[0])
}

/// Guards against exchange kernels that overwrite what `next` has not consumed when launched
/// again at once: a rank may run ahead of `next` by a whole launch (or more, in a ring of
/// more than two), and without a ready handshake its next launch's writes land in data
/// `next` is still forwarding, checking or unpacking. Every kernel kind, 2 to 4 ranks, no
/// host barrier between launches, every round checked on the device.
#[test]
fn exchange_kernels_back_to_back() {
    for ranks in [2, 3, 4] {
        for port in [true, false] {
            let wrong = in_process::run(ranks, config(), |comm| {
                ring_back_to_back(comm, 257, port, 12)
            })
            .unwrap();
            assert!(
                wrong.iter().all(|&w| w == 0),
                "{ranks} ranks, {} ring: wrong elements by rank {wrong:?}",
                if port { "port" } else { "memory" }
            );
        }
        for kind in [8, 16] {
            let wrong = in_process::run(ranks, config(), |comm| {
                packets_back_to_back(comm, kind, 250, 12)
            })
            .unwrap();
            assert!(
                wrong.iter().all(|&w| w == 0),
                "{ranks} ranks, LL{kind}: wrong elements by rank {wrong:?}"
            );
        }
    }
}

/// Guards against torn 8-byte packets or a stale flag read as fresh on buffer reuse.
#[test]
fn ll8_packet_exchange() {
    for (ranks, words) in [(2, 1024), (4, 251)] {
        let wrong = in_process::run(ranks, config(), |comm| {
            packets_back_to_back(comm, 8, words, 3)
        })
        .unwrap();
        assert!(wrong.iter().all(|&w| w == 0), "{wrong:?}");
    }
}

/// Guards against a 16-byte packet whose halves are accepted from different rounds.
#[test]
fn ll16_packet_exchange() {
    for (ranks, words) in [(2, 1024), (4, 250)] {
        let wrong = in_process::run(ranks, config(), |comm| {
            packets_back_to_back(comm, 16, words, 3)
        })
        .unwrap();
        assert!(wrong.iter().all(|&w| w == 0), "{wrong:?}");
    }
}

/// Guards against a ring helper that accepts a one-rank "ring" (which would pair a rank
/// with itself), a memory list that does not cover every rank, or a channel to oneself
/// (its local and remote buffers would alias).
#[test]
fn ring_helpers_and_channels_refuse_bad_peers() {
    in_process::run(1, config(), |comm| {
        let buf = comm.alloc::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let err = comm.ring_port_channels(&all, &all[0]).unwrap_err();
        assert!(matches!(err, oxccl::Error::InvalidUsage(_)), "{err}");
        let err = comm.memory_channel(0, &all[0], &all[0], None).unwrap_err();
        assert!(err.to_string().contains("itself"), "{err}");
        Ok(())
    })
    .unwrap();
    in_process::run(2, config(), |comm| {
        let buf = comm.alloc::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let err = comm
            .ring_memory_channels(&all[..1], &all[0], None)
            .unwrap_err();
        assert!(matches!(err, oxccl::Error::InvalidUsage(_)), "{err}");
        Ok(())
    })
    .unwrap();
}
