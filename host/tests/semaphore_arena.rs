//! A communicator's channels share few semaphore allocations, so a peer maps few of them.
//! Alone in its test program: it counts the process's mappings of device memory.
#![allow(missing_docs)]

mod common;

use common::config;
use oxccl::host_ipc::MEMFD_NAME;
use oxccl::in_process;

/// Mappings of emulated device memory in this process now: each allocation is mapped once
/// where it is made and once by each peer (in another process or, as here, in this one)
/// that reaches it.
fn device_memory_mappings() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| l.contains(MEMFD_NAME)).count()
}

/// Guards against one allocation per semaphore: 60 memory channels and 60 port channels
/// a rank, 2 ranks, would map 480 objects (each semaphore where it is made and by the
/// peer); from chunks of 64 they take a few. (That the slots are distinct is the arena's
/// unit test; that channels on them signal and wait, every channel test.)
#[test]
fn channels_to_a_peer_share_their_semaphores_mappings() {
    const EACH: usize = 60;
    let results = in_process::run(2, config(), |comm| {
        let buf = comm.alloc_zeroed::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let (mine, theirs) = (all[rank as usize].clone(), all[peer as usize].clone());
        comm.barrier()?;
        let before = device_memory_mappings();
        let mut memory = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..EACH {
            memory.push(comm.memory_channel(peer, &theirs, &mine, None)?);
            ports.push(comm.port_channel(peer, &theirs, &mine)?);
        }
        comm.barrier()?;
        let after = device_memory_mappings();
        drop((memory, ports));
        Ok(after.saturating_sub(before))
    })
    .unwrap();
    for (rank, added) in results.iter().enumerate() {
        // Both ranks' channels, as both run in this process: 4 chunks made (120 semaphores
        // a rank, 64 a chunk), 4 mapped by the other rank, and each rank's mapping of the
        // other's buffer, made by its first channel.
        assert!(
            *added <= 10,
            "rank {rank}: {added} device-memory mappings for {} channels",
            4 * EACH
        );
    }
}
