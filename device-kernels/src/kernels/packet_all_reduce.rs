//! Ring all-reduce (sum of `f32`) with LL16 packets, for small messages.
//!
//! The ring of [`crate::kernels::all_reduce`] signals and waits on a semaphore at every
//! step, and its threads meet at a barrier around each signal. Here every value travels in
//! a packet whose flag says it has arrived, so a thread waits only for the packets it
//! needs, no thread waits for another, and a step costs one pass over the data. The price
//! is bandwidth: a packet carries 8 bytes of data in 16. Use it where latency dominates.
//!
//! Each packet carries two neighbouring elements (`2p`, `2p + 1`; an odd `n` pads the last
//! with zero, never written). The `ceil(n / 2)` packets are split into `n_ranks` chunks; in
//! `n_ranks - 1` reduce-scatter steps each rank adds the chunk it receives from `prev` to
//! its own input and sends the sum on to `next`, then `n_ranks - 1` all-gather steps pass
//! the reduced chunks round. A step's packets go to a slot of their own in the receiver's
//! scratch, so one flag serves a whole call.
//!
//! **Calls.** Every rank passes the same `flag` to the same call, different from the
//! previous call's (a counter from 1, skipping 0). The scratch holds two sets of slots and
//! a call uses the set of its flag's parity: a rank one call ahead of its neighbour writes
//! the other set, and cannot get two calls ahead (its next call needs the neighbour's
//! packets of the call in between). So calls may be launched back to back, with no
//! barrier and no clearing of the scratch.
//!
//! **Channels.** `next` writes the next rank's scratch (its `remote`); `prev` reads our
//! scratch (its `packets`), which the previous rank writes. Each rank registers
//! [`packet_scratch_bytes`] of scratch for the largest `n` it will reduce.

use crate::coop::{Block, Coop, contiguous_chunk};
use crate::error::DeviceError;
use crate::kernel;
use crate::memory_channel::MemoryChannelDeviceHandle;
use crate::packet::{Ll16Packet, Packet};

/// Arguments of [`packet_all_reduce_sum_f32`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PacketAllReduceArgs {
    /// Channel whose `remote` is the next rank's scratch.
    pub next: MemoryChannelDeviceHandle,
    /// Channel whose `packets` is our scratch (the previous rank writes it).
    pub prev: MemoryChannelDeviceHandle,
    /// Address of the `n` input elements.
    pub input: u64,
    /// Address of the `n` output elements (may equal `input`).
    pub output: u64,
    /// Elements to reduce.
    pub n: u64,
    /// This call's packet flag: non-zero, the same on every rank, new for every call.
    pub flag: u32,
    /// This rank.
    pub rank: u32,
    /// Ranks in the ring.
    pub n_ranks: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<PacketAllReduceArgs>() == 2 * 104 + 40);
const _: () = assert!(core::mem::offset_of!(PacketAllReduceArgs, flag) == 232);

/// Packets of one step's slot: a chunk of the `ceil(n / 2)` packets, rounded up.
const fn slot_packets(n: u64, n_ranks: u32) -> u64 {
    let ranks = if n_ranks == 0 { 1 } else { n_ranks as u64 };
    n.div_ceil(2).div_ceil(ranks)
}

/// Bytes of scratch each rank registers to reduce up to `n` elements over `n_ranks`
/// ranks: two sets (call parities) of `2 * (n_ranks - 1)` step slots of 16-byte packets.
pub const fn packet_scratch_bytes(n: u64, n_ranks: u32) -> u64 {
    let steps = 2 * n_ranks.saturating_sub(1) as u64;
    2 * steps * slot_packets(n, n_ranks) * Ll16Packet::PACKET_BYTES
}

/// Sums `n` `f32`s across the ring into every rank's `output`. Launch one block (any
/// number of threads) per rank; see the module docs for `flag` and the channels.
#[kernel]
pub fn packet_all_reduce_sum_f32(args: PacketAllReduceArgs) {
    let _ = all_reduce(&args);
}

/// Input packet `p`: elements `2p` and `2p + 1` (zero past `n`), as the bits of a payload.
///
/// # Safety
/// `input` holds `n` `f32`s and `2p < n`.
#[inline(always)]
unsafe fn load_pair(input: u64, n: u64, p: u64) -> u64 {
    let base = input as usize as *const f32;
    let e = 2 * p;
    // SAFETY: `e < n` (caller); `e + 1` is read only when below `n`.
    let (lo, hi) = unsafe {
        (
            *base.add(e as usize),
            if e + 1 < n {
                *base.add(e as usize + 1)
            } else {
                0.0
            },
        )
    };
    lo.to_bits() as u64 | (hi.to_bits() as u64) << 32
}

/// Writes packet `p`'s elements to `output`, leaving the padding of an odd `n` out.
///
/// # Safety
/// `output` holds `n` `f32`s, `2p < n`, and no other thread writes these elements.
#[inline(always)]
unsafe fn store_pair(output: u64, n: u64, p: u64, pair: u64) {
    let base = output as usize as *mut f32;
    let e = 2 * p;
    // SAFETY: as for `load_pair`, for writes.
    unsafe {
        *base.add(e as usize) = f32::from_bits(pair as u32);
        if e + 1 < n {
            *base.add(e as usize + 1) = f32::from_bits((pair >> 32) as u32);
        }
    }
}

/// Element-wise sum of two payloads of two `f32`s.
#[inline(always)]
fn add_pairs(a: u64, b: u64) -> u64 {
    let lo = f32::from_bits(a as u32) + f32::from_bits(b as u32);
    let hi = f32::from_bits((a >> 32) as u32) + f32::from_bits((b >> 32) as u32);
    lo.to_bits() as u64 | (hi.to_bits() as u64) << 32
}

fn all_reduce(a: &PacketAllReduceArgs) -> Result<(), DeviceError> {
    let (r, nr, n, flag) = (a.rank, a.n_ranks, a.n, a.flag);
    let packets = n.div_ceil(2);
    if nr <= 1 {
        if a.input != a.output {
            for p in Block.split(packets) {
                // SAFETY: `2p < n`; input and output each hold `n` elements and this
                // thread alone handles packet `p`.
                unsafe { store_pair(a.output, n, p, load_pair(a.input, n, p)) };
            }
        }
        return Ok(());
    }
    let slot = slot_packets(n, nr);
    let steps = 2 * (nr as u64 - 1);
    // First packet of step `s`'s slot in this call's set.
    let slot_start = |s: u64| ((flag & 1) as u64 * steps + s) * slot;
    let chunk = |c: u32| contiguous_chunk(c as u64, nr as u64, packets);
    // Reduce-scatter: step `s` sends chunk `r - s`, plus what `prev` sent of it at `s - 1`.
    for s in 0..nr - 1 {
        let c = chunk((r + nr - s) % nr);
        for i in Block.split(c.end - c.start) {
            // SAFETY: `c.start + i` is a packet below `ceil(n / 2)`, so `2p < n`.
            let mut v = unsafe { load_pair(a.input, n, c.start + i) };
            if s > 0 {
                let theirs = a
                    .prev
                    .read_packet::<Ll16Packet>(slot_start(s as u64 - 1) + i, flag)?;
                v = add_pairs(v, theirs);
            }
            a.next
                .write_packet::<Ll16Packet>(slot_start(s as u64) + i, v, flag)?;
        }
    }
    // All-gather: `g = 0` completes chunk `r + 1`; then chunk `r + 1 - g` arrives from
    // `prev` at slot `n_ranks - 2 + g`. Each is written out and sent on, but the last.
    let first = nr as u64 - 2;
    for g in 0..nr {
        let c = chunk((r + 1 + nr - g) % nr);
        for i in Block.split(c.end - c.start) {
            let p = c.start + i;
            let received = a
                .prev
                .read_packet::<Ll16Packet>(slot_start(first + g as u64) + i, flag)?;
            let v = if g == 0 {
                // SAFETY: as above.
                add_pairs(unsafe { load_pair(a.input, n, p) }, received)
            } else {
                received
            };
            // SAFETY: `2p < n`; packet `p` of chunk `c` is this thread's alone in this
            // split, and in place its input was read by this thread in an earlier step.
            unsafe { store_pair(a.output, n, p, v) };
            if g + 1 < nr {
                a.next
                    .write_packet::<Ll16Packet>(slot_start(first + 1 + g as u64) + i, v, flag)?;
            }
        }
    }
    Ok(())
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against scratch too small for the slots a call writes (two sets, every
    /// step, the largest chunk), which the channel would refuse mid-call.
    #[test]
    fn scratch_covers_every_slot() {
        for n_ranks in 1..=9u32 {
            for n in [0u64, 1, 2, 3, 7, 8, 1000, 1001, 4099] {
                let packets = n.div_ceil(2);
                let largest = (0..n_ranks as u64)
                    .map(|c| {
                        let r = contiguous_chunk(c, n_ranks as u64, packets);
                        r.end - r.start
                    })
                    .max()
                    .unwrap_or(0);
                let steps = 2 * (n_ranks as u64 - 1);
                // The last packet of the last slot of the second set must fit.
                let needed = if steps == 0 || largest == 0 {
                    0
                } else {
                    ((steps + steps - 1) * slot_packets(n, n_ranks) + largest) * 16
                };
                assert!(
                    packet_scratch_bytes(n, n_ranks) >= needed,
                    "n {n}, {n_ranks} ranks"
                );
            }
        }
    }

    /// Guards against a payload mixing up its two elements, or losing bits in the sum.
    #[test]
    fn pairs_add_element_wise() {
        let pair = |lo: f32, hi: f32| lo.to_bits() as u64 | (hi.to_bits() as u64) << 32;
        assert_eq!(add_pairs(pair(1.5, -2.0), pair(2.5, 8.0)), pair(4.0, 6.0));
    }
}
