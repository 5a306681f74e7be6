//! What the channel and collective tests share: job settings, data patterns, ring buffers,
//! and kernels that fill and check buffers on the device, in stream order, so a test can
//! check every launch of a back-to-back sequence without a host barrier between them.
#![allow(dead_code, missing_docs)]

pub mod eager_steps;
pub mod gather_scatter_cases;

use oxccl::in_process::InProcessConfig;
use oxccl::{
    Communicator, CommunicatorConfig, DeviceBuffer, ReduceElement, RegisteredMemory, Result, Stream,
};
use oxccl_device::arch::atomic::{self, Ordering, Scope};
use oxccl_device::coop::{Block, Coop};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::{DevicePtr, DeviceSlice, kernel};
use oxccl_kernels::ring_exchange::{memory_ring_exchange, port_ring_exchange};
use std::time::Duration;

/// Settings of a test job. Proxy assist is off unless a test is about it: with it, a put
/// completes before `put` returns, which hides a missing flush.
pub fn config() -> InProcessConfig {
    config_with_assist(false)
}

pub fn config_with_assist(proxy_assist: bool) -> InProcessConfig {
    InProcessConfig {
        communicator: CommunicatorConfig {
            wait_timeout: Duration::from_secs(20),
            proxy_assist,
            ..Default::default()
        },
        exchange_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// A job whose collectives take `algorithm` with `blocks` blocks of `threads` threads and
/// rounds of 256 bytes (so a few thousand elements take many rounds).
pub fn small_round_job(
    algorithm: oxccl::collectives::AlgorithmChoice,
    blocks: u32,
    threads: u32,
) -> InProcessConfig {
    let mut config = config();
    let c = &mut config.communicator.collectives;
    c.launch = Some(LaunchConfig::grid(blocks).block(threads));
    c.algorithm = algorithm;
    c.round_bytes = 256;
    c.port_round_bytes = 256;
    config
}

/// The ranks' values `x(rank)` combined by `op` and finished, as the collectives combine
/// them: in rank order (`((x0 ⊕ x1) ⊕ x2) ⊕ x3`), or as recursive doubling and halving do,
/// a balanced tree in rank order (`(x0 ⊕ x1) ⊕ (x2 ⊕ x3)`; a power of two of ranks).
#[allow(dead_code)]
pub fn combined<T: ReduceElement>(
    ranks: u32,
    op: oxccl::ReduceOp,
    tree: bool,
    x: &impl Fn(u32) -> T,
) -> T {
    fn subtree<T: ReduceElement>(
        first: u32,
        n: u32,
        op: oxccl::ReduceOp,
        x: &impl Fn(u32) -> T,
    ) -> T {
        match n {
            1 => x(first),
            _ => subtree(first, n / 2, op, x).combine(subtree(first + n / 2, n / 2, op, x), op),
        }
    }
    let acc = if tree {
        subtree(0, ranks, op, x)
    } else {
        (1..ranks).fold(x(0), |acc, p| acc.combine(x(p), op))
    };
    acc.finish(op, ranks)
}

/// Rank `rank`'s element `i` of call `call`: small integers (negative ones too, where the
/// type has them), exact in every type.
pub fn small_value<T: ReduceElement>(rank: u32, i: usize, call: u32) -> T {
    let v = ((rank as usize * 7 + i * 13 + call as usize * 5) % 23) as f64;
    let signed = !matches!(
        T::TYPE,
        oxccl::DataType::U8 | oxccl::DataType::U32 | oxccl::DataType::U64
    );
    T::from_f64(if signed { v - 9.0 } else { v + 1.0 })
}

/// The value rank `rank` puts at element `i` of its own chunk in round `round`.
pub const fn pattern(rank: u32, i: u64, round: u32) -> u32 {
    rank.wrapping_mul(0x9e37_79b9)
        ^ (i as u32).wrapping_mul(2_654_435_761)
        ^ round.wrapping_mul(0x85eb_ca6b)
        ^ 0x5bd1_e995
}

/// Next and previous rank of the ring.
pub fn neighbours(comm: &Communicator) -> (u32, u32) {
    let (rank, n) = (comm.rank(), comm.size());
    ((rank + 1) % n, (rank + n - 1) % n)
}

/// A buffer of `ranks * chunk` elements holding this rank's chunk of round 0 (the rest
/// filled with garbage), and its registration on every rank.
pub fn ring_buffer(
    comm: &Communicator,
    chunk: usize,
) -> Result<(DeviceBuffer<u32>, Vec<RegisteredMemory>)> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut host = vec![0xdead_beef_u32; chunk * ranks as usize];
    for i in 0..chunk {
        host[rank as usize * chunk + i] = pattern(rank, i as u64, 0);
    }
    let buf = comm.device().alloc_from(&host)?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    Ok((buf, all))
}

/// The ring all-gather over port channels (`port_ring_exchange`, thread 0 drives), then
/// over memory channels (`memory_ring_exchange` on one block of `memory_threads`), each on
/// fresh ring buffers of `chunk` words, each checked on the host once this rank's own
/// kernel is done (no barrier: a missing signal order would show).
pub fn exchange_over_both_rings(
    comm: &mut Communicator,
    stream: &Stream,
    chunk: usize,
    memory_threads: u32,
) -> Result<()> {
    exchange_over_port_ring(comm, stream, chunk)?;
    let (rank, ranks, bytes) = (comm.rank(), comm.size(), (chunk * 4) as u64);
    let (buf, all) = ring_buffer(comm, chunk)?;
    let (to_next, from_prev) = comm.ring_memory_channels(&all, &all[rank as usize], None)?;
    let (next, prev) = (to_next.device_handle(), from_prev.device_handle());
    let block = LaunchConfig::grid(1).block(memory_threads);
    memory_ring_exchange::launch(stream, block, next, prev, rank, ranks, bytes)?;
    comm.synchronize(stream)?;
    assert_all_gathered(comm, &buf, chunk, 0);
    Ok(())
}

/// The ring all-gather over port channels alone (see [`exchange_over_both_rings`]): what
/// ranks that reach each other only through the proxy can run.
pub fn exchange_over_port_ring(
    comm: &mut Communicator,
    stream: &Stream,
    chunk: usize,
) -> Result<()> {
    let (rank, ranks, bytes) = (comm.rank(), comm.size(), (chunk * 4) as u64);
    let (buf, all) = ring_buffer(comm, chunk)?;
    let (to_next, to_prev) = comm.ring_port_channels(&all, &all[rank as usize])?;
    let (next, prev) = (to_next.device_handle(), to_prev.device_handle());
    let one = LaunchConfig::grid(1).block(1);
    port_ring_exchange::launch(stream, one, next, prev, rank, ranks, bytes)?;
    comm.synchronize(stream)?;
    assert_all_gathered(comm, &buf, chunk, 0);
    Ok(())
}

/// The communicator's all-reduce (f32 sum) of `count` elements, out of place and then in
/// place, rank `r` contributing `value(r, i)` at element `i`, checked on the host against
/// the sum over every rank; `what` names it in a failure. With `registered`, on buffers
/// registered for zero-copy collectives (each rank reads the peers' inputs and writes the
/// peers' outputs in place).
pub fn assert_all_reduce_sums(
    comm: &mut Communicator,
    stream: &Stream,
    count: usize,
    value: impl Fn(u32, usize) -> f32,
    what: &str,
    registered: bool,
) -> Result<()> {
    let rank = comm.rank();
    let mine: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
    let mut send = comm.device().alloc_from(&mine)?;
    let mut recv = comm.alloc::<f32>(count)?;
    if registered {
        comm.register_collective_buffer(&send)?;
        comm.register_collective_buffer(&recv)?;
    }
    comm.all_reduce(&send, &mut recv, count, oxccl::ReduceOp::Sum, stream)?;
    comm.all_reduce_in_place(&mut send, count, oxccl::ReduceOp::Sum, stream)?;
    comm.synchronize(stream)?;
    check_sums(comm, &recv, count, &value, &format!("{what}, out of place"))?;
    check_sums(comm, &send, count, &value, &format!("{what}, in place"))?;
    if registered {
        comm.deregister_collective_buffer(&send, stream)?;
        comm.deregister_collective_buffer(&recv, stream)?;
    }
    Ok(())
}

/// Checks that `buf` holds, at each element `i < count`, the sum over every rank `r` of
/// `value(r, i)`.
fn check_sums(
    comm: &Communicator,
    buf: &DeviceBuffer<f32>,
    count: usize,
    value: &impl Fn(u32, usize) -> f32,
    what: &str,
) -> Result<()> {
    let (rank, ranks) = (comm.rank(), comm.size());
    for (i, &have) in buf.to_vec()?.iter().take(count).enumerate() {
        let want: f32 = (0..ranks).map(|r| value(r, i)).sum();
        assert_eq!(have, want, "{what}: rank {rank} element {i}");
    }
    Ok(())
}

/// Checks, on the host, that `buf` holds every rank's chunk of round `round`.
pub fn assert_all_gathered(comm: &Communicator, buf: &DeviceBuffer<u32>, chunk: usize, round: u32) {
    let got = buf.to_vec().unwrap();
    for r in 0..comm.size() {
        for i in 0..chunk {
            assert_eq!(
                got[r as usize * chunk + i],
                pattern(r, i as u64, round),
                "rank {}: element {i} of rank {r}'s chunk, round {round}",
                comm.rank()
            );
        }
    }
}

/// Writes rank `rank`'s chunk of round `round` at element `first` of `buf` (`count`
/// elements), split among the block.
///
/// # Safety
/// `buf` must hold `first + count` writable elements nobody else touches meanwhile.
#[kernel(max_blocks = 1)]
pub unsafe fn fill_chunk(buf: DeviceSlice<u32>, first: u64, count: u64, rank: u32, round: u32) {
    for i in Block.split(count) {
        // SAFETY: `first + i < first + count`, inside the buffer (contract).
        unsafe { buf.write(first + i, pattern(rank, i, round)) };
    }
}

/// Counts, into `errors`, the elements of `buf` from element `first` on that differ from
/// `ranks` consecutive chunks of round `round`, `chunk` elements each, of the ranks
/// `first_rank`, `first_rank + 1`, ...: every rank's chunk after an all-gather
/// (`first` 0, `first_rank` 0), or one rank's chunk where it was received.
///
/// # Safety
/// `buf` must hold `first + ranks * chunk` readable elements, and `errors` be one `u64` only
/// accessed atomically, until the launch completes.
#[kernel(max_blocks = 1)]
pub unsafe fn count_wrong(
    buf: DeviceSlice<u32>,
    first: u64,
    chunk: u64,
    ranks: u32,
    first_rank: u32,
    round: u32,
    errors: DevicePtr<u64>,
) {
    let mut wrong = 0;
    for e in Block.split(chunk * ranks as u64) {
        let (r, i) = (first_rank + (e / chunk) as u32, e % chunk);
        // SAFETY: `first + e < first + ranks * chunk` (contract).
        if unsafe { buf.read(first + e) } != Some(pattern(r, i, round)) {
            wrong += 1;
        }
    }
    // SAFETY: the contract.
    unsafe { add_errors(errors, wrong) };
}

/// Adds `wrong` to the error count at `errors` (nothing if 0).
///
/// # Safety
/// `errors` must point to a live `u64` only accessed atomically.
pub unsafe fn add_errors(errors: DevicePtr<u64>, wrong: u64) {
    if wrong > 0 {
        // SAFETY: the caller's contract.
        let cell = unsafe { atomic::cell(errors.addr()) };
        atomic::fetch_add(cell, wrong, Ordering::Relaxed, Scope::System);
    }
}

/// Bitwise equality (so NaN compares, and -0.0 differs from 0.0), with the first mismatch.
pub fn assert_same<T: ReduceElement>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let (g, w): (&[u8], &[u8]) = (bytemuck::cast_slice(got), bytemuck::cast_slice(want));
    if g != w {
        let i = got
            .iter()
            .zip(want)
            .position(|(a, b)| bytemuck::bytes_of(a) != bytemuck::bytes_of(b))
            .unwrap_or(0);
        panic!(
            "{what}: element {i} of {} is {}, expected {}",
            got.len(),
            got[i].to_f64(),
            want[i].to_f64()
        );
    }
}

/// A check run once per element type by [`every_type`]: `run::<T>` checks `counts`
/// elements of `T`, one call per count.
pub trait TypedCase {
    fn run<T: ReduceElement>(&self, comm: &mut Communicator, counts: &[usize]) -> Result<()>;
}

/// Runs `case` for every element type: many rounds (1000 and 3001 elements of f32, 1001
/// of i64), then every type over a few elements (1, 7, 100), where the ends of a round and
/// the cuts between blocks and threads fall elsewhere.
pub fn every_type(comm: &mut Communicator, case: &impl TypedCase) -> Result<()> {
    case.run::<f32>(comm, &[1000, 3001])?;
    case.run::<i64>(comm, &[1001])?;
    let counts = [1usize, 7, 100];
    case.run::<f32>(comm, &counts)?;
    case.run::<f64>(comm, &counts)?;
    case.run::<oxccl::f16>(comm, &counts)?;
    case.run::<oxccl::bf16>(comm, &counts)?;
    case.run::<i8>(comm, &counts)?;
    case.run::<u8>(comm, &counts)?;
    case.run::<i32>(comm, &counts)?;
    case.run::<u32>(comm, &counts)?;
    case.run::<i64>(comm, &counts)?;
    case.run::<u64>(comm, &counts)
}
