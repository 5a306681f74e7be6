//! Jobs whose ranks fail: what `in_process::run` reports, and how fast.
#![allow(missing_docs)]

mod common;

use common::{config, ring_buffer};
use oxccl::in_process;
use oxccl::{Error, ErrorKind};
use oxccl_device::DeviceError;
use oxccl_device::coop::Block;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::{arch, kernel};
use std::time::{Duration, Instant};

/// Puts `bytes` of our buffer into `next`'s, signals it, and waits for `prev`'s signal,
/// with no ready handshake: it writes into `next`'s memory whatever `next` is doing.
#[kernel(max_blocks = 1)]
fn put_signal_wait(
    next: MemoryChannelDeviceHandle<'_>,
    prev: MemoryChannelDeviceHandle<'_>,
    bytes: u64,
) -> Result<(), DeviceError> {
    next.put(Block, 0, 0, bytes)?;
    arch::sync_threads();
    if arch::thread_rank_in_block() == 0 {
        next.signal()?;
        prev.wait()?;
    }
    Ok(())
}

/// Guards against a job that reports a consequence instead of the cause, drops the other
/// ranks' errors, waits out every rank's deadline for a rank that has failed, or crashes
/// because a rank that failed freed memory its peers were writing into.
///
/// Rank 2 of 4 fails right after building its channels, dropping its buffers; the others
/// write into their next rank's memory (rank 1 into rank 2's) and wait for their previous
/// rank's signal, which rank 3 will never get from rank 2. The run must return rank 2's
/// error first, then every other failing rank's (rank 3's at least, stopped), and do so long
/// before the 20 s wait limit. (Ranks 0 and 1 may finish: their signals do come.)
#[test]
fn one_failing_rank_reports_its_error() {
    let started = Instant::now();
    let err = in_process::run(4, config(), |comm| {
        let chunk = 4096;
        let (buf, all) = ring_buffer(comm, chunk)?;
        let mine = all[comm.rank() as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        // Every rank's channels exist before rank 2 gives up, so the others' kernels run.
        comm.barrier()?;
        if comm.rank() == 2 {
            drop((buf, all, mine, next, prev));
            return Err(Error::InvalidUsage("rank 2 gives up".into()));
        }
        let stream = comm.device().stream()?;
        put_signal_wait::launch(
            &stream,
            LaunchConfig::grid(1).block(2),
            next.device_handle(),
            prev.device_handle(),
            (chunk * 4) as u64,
        )?;
        comm.synchronize(&stream)
    })
    .unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_eq!(err.root_rank(), Some(2), "{err}");
    let Error::Ranks(failures) = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(&failures[0].error, Error::InvalidUsage(m) if m == "rank 2 gives up"),
        "{err}"
    );
    assert!(!failures[0].consequence);
    let mut ranks: Vec<u32> = failures.iter().map(|f| f.rank).collect();
    ranks.sort();
    ranks.dedup();
    assert_eq!(ranks.len(), failures.len(), "each rank once: {err}");
    for f in &failures[1..] {
        assert!(f.consequence, "{err}");
    }
    let rank3 = failures
        .iter()
        .find(|f| f.rank == 3)
        .expect("rank 3 must fail");
    assert_eq!(rank3.error.kind(), ErrorKind::Aborted, "{err}");
    assert!(
        rank3.error.to_string().contains("rank 2 of the job failed"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("rank 2: invalid usage: rank 2 gives up"),
        "{text}"
    );
}
