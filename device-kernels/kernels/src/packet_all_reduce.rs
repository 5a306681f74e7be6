//! Ring all-reduce (sum of `f32`) with LL16 packets, for small messages.
//!
//! The ring of [`crate::all_reduce`] signals and waits on a semaphore at every
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
//! **Calls.** Every rank passes the same `sequence` to the same call: a counter that grows
//! by one per call on these channels. The call's packet flag is [`packet_flag`]`(sequence)`
//! (never 0, so a zeroed scratch never reads as arrived) and its slot set is the parity of
//! `sequence` itself, not of the flag, so the alternation survives the flag's wrap-around.
//! The scratch holds two sets of slots, placed by the `capacity` the scratch was sized
//! for, not by the call's `n`: a rank one call ahead of its neighbour writes the other set
//! whatever the two calls' sizes, and it cannot get two calls ahead (its next call needs
//! packets that the neighbour sends only from the call in between). So calls may be
//! launched back to back, with changing `n`, no barrier and no clearing of the scratch. A
//! stale packet could only be taken for a new one if its flag came round again: after
//! `2^32 - 1` calls without that slot being rewritten.
//!
//! **Channels.** `next` writes the next rank's scratch (its `remote`); `prev` reads our
//! scratch (its `packets`), which the previous rank writes. Each rank registers
//! [`packet_scratch_bytes`]`(capacity, n_ranks)` of scratch, zeroed, for calls of up to
//! `capacity` elements.

use oxccl_device::KernelArg;
use oxccl_device::coop::{Block, Coop, contiguous_chunk};
use oxccl_device::error::{DeviceError, DeviceOp};
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::packet::{Ll16Packet, Packet};

/// Arguments of [`packet_all_reduce_sum_f32()`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, KernelArg)]
pub struct PacketAllReduceArgs<'a> {
    /// Channel whose `remote` is the next rank's scratch.
    pub next: MemoryChannelDeviceHandle<'a>,
    /// Channel whose `packets` is our scratch (the previous rank writes it).
    pub prev: MemoryChannelDeviceHandle<'a>,
    /// Address of the `n` input elements.
    pub input: u64,
    /// Address of the `n` output elements (may equal `input`).
    pub output: u64,
    /// Elements to reduce: at most `capacity`.
    pub n: u64,
    /// Elements the scratch was sized for ([`packet_scratch_bytes`]), the same on every rank.
    pub capacity: u64,
    /// This call's number on these channels: the same on every rank, one more than the
    /// previous call's.
    pub sequence: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks in the ring.
    pub n_ranks: u32,
}

const _: () = assert!(core::mem::size_of::<PacketAllReduceArgs<'static>>() == 2 * 104 + 48);

/// The packet flag of call `sequence`: in `1..=u32::MAX`, and different from the flag of
/// the call two before (the last one that used the same slot set).
pub const fn packet_flag(sequence: u64) -> u32 {
    (sequence % u32::MAX as u64) as u32 + 1
}

/// The slot set (0 or 1) of call `sequence`: the parity of the call's number, so two calls
/// in a row never share a set, whatever their flags (which skip 0 when they wrap).
pub const fn slot_set(sequence: u64) -> u64 {
    sequence & 1
}

/// Packets of one step's slot: a chunk of the `ceil(capacity / 2)` packets, rounded up.
const fn slot_packets(capacity: u64, n_ranks: u32) -> u64 {
    let ranks = if n_ranks == 0 { 1 } else { n_ranks as u64 };
    capacity.div_ceil(2).div_ceil(ranks)
}

/// Bytes of scratch each rank registers to reduce up to `capacity` elements over `n_ranks`
/// ranks: two sets (call parities) of `2 * (n_ranks - 1)` step slots of 16-byte packets.
pub const fn packet_scratch_bytes(capacity: u64, n_ranks: u32) -> u64 {
    let steps = 2 * n_ranks.saturating_sub(1) as u64;
    2 * steps * slot_packets(capacity, n_ranks) * Ll16Packet::PACKET_BYTES
}

/// Sums `n` `f32`s across the ring into every rank's `output`. Launch one block (any
/// number of threads) per rank; see the module docs for `sequence`, `capacity` and the
/// channels.
///
/// # Errors
/// [`DeviceError::InvalidArgument`] (recorded on `next`) if `n` exceeds `capacity` or
/// `rank` is not below `n_ranks`; channel errors (a short scratch is refused as out of
/// bounds).
///
/// # Safety
/// `input` must hold `n` readable `f32`s and `output` `n` writable ones (they may be the
/// same buffer, or not overlap at all), untouched by anything else until the kernel
/// completes.
#[kernel(max_blocks = 1)]
pub unsafe fn packet_all_reduce_sum_f32(args: PacketAllReduceArgs<'_>) -> Result<(), DeviceError> {
    // SAFETY: the caller's contract.
    unsafe { all_reduce(&args) }
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

/// # Safety
/// As [`packet_all_reduce_sum_f32()`].
unsafe fn all_reduce(a: &PacketAllReduceArgs<'_>) -> Result<(), DeviceError> {
    let (r, nr, n) = (a.rank, a.n_ranks, a.n);
    if n > a.capacity || r >= nr {
        return Err(a.next.semaphore().wait_policy().raise(
            DeviceError::InvalidArgument,
            DeviceOp::Kernel,
            [n, a.capacity, r as u64],
        ));
    }
    let flag = packet_flag(a.sequence);
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
    let slot = slot_packets(a.capacity, nr);
    let steps = 2 * (nr as u64 - 1);
    // First packet of step `s`'s slot in this call's set.
    let slot_start = |s: u64| (slot_set(a.sequence) * steps + s) * slot;
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

    /// Guards against a flag of 0 (a zeroed scratch would read as arrived), and against two
    /// calls that use the same slot set sharing a flag, across the flag's wrap-around.
    #[test]
    fn flags_never_zero_and_differ_two_calls_apart() {
        let wrap = u32::MAX as u64;
        for seq in (0..6)
            .chain(wrap - 4..wrap + 4)
            .chain(2 * wrap - 2..2 * wrap + 2)
        {
            assert_ne!(packet_flag(seq), 0, "sequence {seq}");
            assert_ne!(packet_flag(seq), packet_flag(seq + 2), "sequence {seq}");
        }
        assert_eq!(packet_flag(0), 1);
        assert_eq!(packet_flag(wrap - 1), u32::MAX);
        assert_eq!(packet_flag(wrap), 1);
    }

    /// Guards against two calls in a row using the same slot set (a rank one call ahead
    /// would overwrite packets its neighbour has not read), across the flag's wrap-around:
    /// the flags `u32::MAX` and 1 that follow each other there are both odd.
    #[test]
    fn slot_sets_alternate_across_the_flag_wrap() {
        let wrap = u32::MAX as u64;
        for seq in (0..6).chain(wrap - 4..wrap + 4) {
            assert_ne!(slot_set(seq), slot_set(seq + 1), "sequence {seq}");
        }
    }

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
