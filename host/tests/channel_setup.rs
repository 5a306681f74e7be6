//! Channel setups pair up per peer in the order both ranks make them; the kind and key of
//! each are checked on both sides.
#![allow(missing_docs)]

mod common;

use common::config;
use oxccl::in_process;

/// Guards against two ranks that build their channels to each other in different orders
/// silently taking each other's semaphores (the keys say which channel is which), and
/// against a port channel on one side meeting a memory channel on the other running into
/// a timeout instead of an error that names both.
#[test]
fn channels_built_in_different_orders_are_refused() {
    let results = in_process::run(2, config(), |comm| {
        let buf = comm.alloc_zeroed::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let (mine, theirs) = (all[rank as usize].clone(), all[peer as usize].clone());
        // Keys in the same order: both succeed.
        comm.memory_channel_keyed(peer, 7, &theirs, &mine, None)?;
        comm.port_channel_keyed(peer, 8, &theirs, &mine)?;
        // Keys in opposite orders.
        let keys = if rank == 0 { [1, 2] } else { [2, 1] };
        let swapped = comm
            .memory_channel_keyed(peer, keys[0], &theirs, &mine, None)
            .map(drop)
            .map_err(|e| e.to_string());
        // A port channel against a memory channel.
        let mixed = if rank == 0 {
            comm.port_channel(peer, &theirs, &mine).map(drop)
        } else {
            comm.memory_channel(peer, &theirs, &mine, None).map(drop)
        }
        .map_err(|e| e.to_string());
        Ok((swapped, mixed))
    })
    .unwrap();
    for (rank, (swapped, mixed)) in results.iter().enumerate() {
        let e = swapped.as_ref().expect_err("swapped keys must be refused");
        assert!(
            e.contains("key 1") && e.contains("key 2"),
            "rank {rank}: {e}"
        );
        let e = mixed.as_ref().expect_err("mixed kinds must be refused");
        assert!(
            e.contains("port channel") && e.contains("memory channel"),
            "rank {rank}: {e}"
        );
    }
}
