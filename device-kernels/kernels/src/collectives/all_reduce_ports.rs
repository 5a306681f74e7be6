//! All-reduce over port channels, through the proxy: for ranks that have no load/store path
//! to each other (another node, or Ethernet asked for). Two-shot, in rounds that fit the
//! scratch ([`PortLayout`](super::PortLayout)):
//!
//! 1. each rank stages the round of its input in its scratch and puts peer `p`'s chunk of
//!    it into `p`'s reduce slot of this rank, with a signal;
//! 2. once every peer's signal has come, it reduces its own chunk (its staged part and the
//!    peers' slots, in rank order) into its output and over its own staged part, and puts
//!    that into every peer's gather slot of this rank, with a signal;
//! 3. once every peer's has come, it copies the peers' reduced chunks into its output.
//!
//! Pipelined: step 1 of round `k + 1` is sent right after step 2 of round `k`, before the
//! wait of step 3, so the next round's data travel while this round's gather is awaited (over
//! a network, each wait is a round trip). Every rank sends and waits in the same order
//! (first exchange of round 0; then per round: second exchange of `k`, first of `k + 1`),
//! so each channel's signals are counted in the order they are waited for.
//!
//! With two ranks, and for a message of one round with more, it takes one exchange a round
//! instead
//! ([`PortLayout::one_shot_all_reduce`](super::PortLayout::one_shot_all_reduce)), a reduce
//! with every rank its root, in lockstep. Each rank stages its round and puts
//! it whole into its reduce slot of the peer, with a signal; once the peer's has come, it
//! stages and sends the next round, then reduces its staged round and the peer's slot, in
//! rank order, into its output.
//!
//! Where the input is registered ([`PortSource`](super::PortSource)), step 1 (and the
//! one-shot's exchange) puts each round straight from it instead of staging it, and where
//! the output is, step 2 puts our reduced chunk from it instead of copying it into the
//! staged round (see `Sources`); the peers' side, and so the protocol below, is the same.
//!
//! Round `k` takes set `k % 3` of the scratch ([`PortLayout::SETS`](super::PortLayout::SETS)).
//! A rank stages round `k + 1` (overwriting its staged round of `k - 2`, which its proxy read
//! for the puts of `k - 2`) once it has the peers' first signals of round `k`; a peer sends
//! those after it has waited for our second signal of round `k - 2`, which our proxy sends
//! after those puts, on the same channel. And a peer puts round `k + 1` into our slots of
//! that set only after our first signal of round `k`, which we send after reading
//! everything of round `k - 2`. Calls back to back, and other port collectives between,
//! keep the same set sequence (the communicator's round numbers), and their exchanges wait
//! at least as much.

use super::elementwise::reduce_ranks;
use super::port_collective_args::PortCollectiveArgs;
use super::port_exchange::{
    Part, pushed, release_before, send_to_peers, send_to_peers_from, wait_for_peers,
};
use super::reduce_ports::reduce_round;
use super::round_views::{typed, typed_mut, window, window_mut};
use oxccl_device::coop::{Grid, contiguous_chunk};
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::port_channel::SrcMemoryId;
use oxccl_device::reduce::{ReduceElement, ReduceOp};
use oxccl_device::{DeviceView, DeviceViewMut};

/// All-reduce over port channels (see the module docs): `count` elements of `input`
/// reduced by `op` across the ranks into `output` on every rank.
///
/// # Errors
/// Invalid ids, short buffers, channel (a peer that does not answer) and barrier errors.
#[kernel(cooperative)]
pub fn collective_all_reduce_ports(args: PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, op) = args.check()?;
    dispatch_element!(dtype, T => all_reduce::<T>(&args, op))
}

#[inline(always)]
fn all_reduce<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    op: ReduceOp,
) -> Result<(), DeviceError> {
    let size = core::mem::size_of::<T>() as u64;
    if a.layout.one_shot_all_reduce(a.count.saturating_mul(size)) {
        // Rounds of `PortLayout::all_reduce_ports_round`: the reduce's.
        return one_shot::<T>(a, op);
    }
    let (n, r, nr, l) = (a.count, a.rank, a.n_ranks, a.layout);
    let per = l.all_reduce_round(size);
    if n == 0 || per == 0 {
        return Ok(());
    }
    let input = typed::<T>(a.input, 0, n)?;
    let output = typed_mut::<T>(a.output, 0, n)?;
    let scratch = a.scratch.cast::<T>()?;
    let src = Sources::of(a);
    // Round 0's first exchange; each round then sends the next one's.
    send_round::<T>(a, src.input, input, scratch, 0, per)?;
    let mut off = 0;
    let mut round = 0;
    while off < n {
        let len = per.min(n - off);
        let set = super::PortLayout::set_of(a.sequence + round);
        let staged_at = l.staged(set);
        let staged = window_mut(scratch, staged_at / size, len)?;
        wait_for_peers(a)?;
        let mine = contiguous_chunk(r as u64, nr as u64, len);
        let mine_len = mine.end - mine.start;
        let dst = window_mut(output, off + mine.start, mine_len)?;
        // Ours from the input where the first puts took it from there.
        let own = match src.input {
            Some(_) => window(input, off, len)?,
            None => staged.as_view(),
        };
        reduce_ranks(dst, nr, op, |p| {
            if p == r {
                window(own, mine.start, mine_len)
            } else {
                Ok(window_mut(scratch, l.reduce_slot(set, p) / size, mine_len)?.as_view())
            }
        })?;
        match src.output {
            // Our reduced chunk, from the output.
            Some(from) => {
                let at = a.output_source.offset + off * size;
                send_to_peers_from(
                    a,
                    from,
                    l.gather_slot(set, r),
                    at,
                    Part::OurChunk { len, size },
                )?
            }
            // Our reduced chunk, in place of our part of the staged round, for the puts: an
            // element-wise pass split as the reduction was, so each thread copies what it
            // reduced itself.
            None => {
                window_mut(staged, mine.start, mine_len)?.combine_from(
                    Grid,
                    dst.as_view(),
                    |_, x| x,
                )?;
                send_to_peers(
                    a,
                    l.gather_slot(set, r),
                    staged_at,
                    Part::OurChunk { len, size },
                )?
            }
        }
        if off + len < n {
            send_round::<T>(a, src.input, input, scratch, round + 1, per)?;
        }
        // In place from the input, the peers' chunks go where our first puts of the round
        // read theirs from: each peer's reduced chunk comes after it had our first put
        // (it waits for our first signal, which follows the put on the channel), so the
        // proxy has read it; no wait for the puts is needed.
        wait_for_peers(a)?;
        for p in (0..nr).filter(|&p| p != r) {
            let c = contiguous_chunk(p as u64, nr as u64, len);
            let src = window_mut(scratch, l.gather_slot(set, p) / size, c.end - c.start)?;
            window_mut(output, off + c.start, c.end - c.start)?.copy_from(Grid, src.as_view())?;
        }
        off += len;
        round += 1;
    }
    src.release_at_end(a)
}

/// What this rank puts from besides the scratch (see [`PortSource`](super::PortSource)): its
/// input and its output where they are registered. Not the input in place on a rank after
/// the second: the reduction into the output would have it as its third source, which
/// [`reduce_ranks`] does not take (the input is staged there).
#[derive(Clone, Copy)]
struct Sources {
    input: Option<SrcMemoryId>,
    output: Option<SrcMemoryId>,
    /// Whether the input is the output.
    in_place: bool,
}

impl Sources {
    #[inline(always)]
    fn of(a: &PortCollectiveArgs<'_>) -> Sources {
        let in_place = a.input.overlaps(a.output.as_view());
        let peers = a.n_ranks > 1;
        Sources {
            input: a
                .input_source
                .memory()
                .filter(|_| peers && !(in_place && a.rank >= 2)),
            output: a.output_source.memory().filter(|_| peers),
            in_place,
        }
    }

    /// Before the call completes: waits until the proxy has executed every put from the
    /// caller's buffers (the caller may write them once the call has completed).
    #[inline(always)]
    fn release_at_end(self, a: &PortCollectiveArgs<'_>) -> Result<(), DeviceError> {
        if self.input.is_some() || self.output.is_some() {
            release_before(a, pushed(a)?)?;
        }
        Ok(())
    }
}

/// Puts each peer's chunk of round `round` (of `per` elements) of the input into that peer's
/// reduce slot of this rank, with a signal; does not wait. From the input's memory at the
/// proxy, `direct`, where given; else staged in the round's set first.
#[inline(always)]
fn send_round<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    direct: Option<SrcMemoryId>,
    input: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    round: u64,
    per: u64,
) -> Result<(), DeviceError> {
    let (n, l) = (a.count, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let off = round * per;
    let len = per.min(n - off);
    let set = super::PortLayout::set_of(a.sequence + round);
    let dst = l.reduce_slot(set, a.rank);
    if let Some(from) = direct {
        let at = a.input_source.offset + off * size;
        return send_to_peers_from(a, from, dst, at, Part::TheirChunk { len, size });
    }
    let staged_at = l.staged(set);
    window_mut(scratch, staged_at / size, len)?.copy_from(Grid, window(input, off, len)?)?;
    send_to_peers(a, dst, staged_at, Part::TheirChunk { len, size })
}

/// The one-shot all-reduce: every rank's `input` reduced into every rank's `output`, in
/// rounds of [`PortLayout::copy_round_bytes`](super::PortLayout::copy_round_bytes) (see the
/// module docs).
///
/// Where the input is registered ([`PortSource`](super::PortSource)), each round is
/// put straight from it, not staged first. In place, the reduction of a round then writes
/// what that round's puts read: it waits for them to be executed first (they were pushed a
/// round before, so they mostly are). Out of place, nothing writes the input, and the call
/// waits for its puts only at its end. In place on a rank after the second, the input stays
/// staged: it would be the third source of the reduction into itself, which
/// [`reduce_ranks`] does not take.
#[inline(always)]
fn one_shot<T: ReduceElement>(a: &PortCollectiveArgs<'_>, op: ReduceOp) -> Result<(), DeviceError> {
    let (c, l) = (a.count, a.layout);
    let size = core::mem::size_of::<T>() as u64;
    let input = typed::<T>(a.input, 0, c)?;
    let output = typed_mut::<T>(a.output, 0, c)?;
    let scratch = a.scratch.cast::<T>()?;
    let per = l.copy_round_bytes() / size;
    let src = Sources::of(a);
    let direct = src.input;
    let (mut off, mut seq) = (0, a.sequence);
    if c > 0 {
        one_shot_send(a, direct, input, scratch, 0, per.min(c), seq)?;
    }
    while off < c {
        let len = per.min(c - off);
        let set = super::PortLayout::set_of(seq);
        wait_for_peers(a)?;
        // Every push so far, this round's puts included (on the thread that put them).
        let this_round = pushed(a)?;
        if off + len < c {
            let next = per.min(c - off - len);
            one_shot_send(a, direct, input, scratch, off + len, next, seq + 1)?;
        }
        let out = window_mut(output, off, len)?;
        let ours = match direct {
            Some(_) => {
                if src.in_place {
                    release_before(a, this_round)?;
                }
                window(input, off, len)?
            }
            None => window_mut(scratch, l.staged(set) / size, len)?.as_view(),
        };
        reduce_round(a, op, out, ours, scratch, set, len)?;
        off += len;
        seq += 1;
    }
    if direct.is_some() {
        // The caller may write the input once the call has completed.
        release_before(a, pushed(a)?)?;
    }
    Ok(())
}

/// Puts the `len` elements of `input` from `off` on (round number `seq`) into our reduce
/// slot of every peer, with a signal; does not wait. From `direct`, the input's memory at the
/// proxy, where given; else staged first: in place, the reduction writes its output (its
/// input) before it reads its own part. (A function, not a closure: see
/// `all_gather_ports`.)
#[inline(always)]
fn one_shot_send<T: ReduceElement>(
    a: &PortCollectiveArgs<'_>,
    direct: Option<SrcMemoryId>,
    input: DeviceView<'_, T>,
    scratch: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    let size = core::mem::size_of::<T>() as u64;
    let set = super::PortLayout::set_of(seq);
    let dst = a.layout.reduce_slot(set, a.rank);
    let bytes = len * size;
    if let Some(src) = direct {
        let at = a.input_source.offset + off * size;
        return send_to_peers_from(a, src, dst, at, Part::Whole { bytes });
    }
    let staged_at = a.layout.staged(set);
    window_mut(scratch, staged_at / size, len)?.copy_from(Grid, window(input, off, len)?)?;
    send_to_peers(a, dst, staged_at, Part::Whole { bytes })
}
