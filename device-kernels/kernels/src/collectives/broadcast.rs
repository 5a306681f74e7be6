//! Broadcast, direct: every rank reads the root's staged data, or the root's input itself
//! when it is registered.

use super::collective_args::CollectiveArgs;
use super::peer_handshake::all_peers_meet;
use super::published_buffers::{
    self, INPUT_OFFSET, INPUT_SLOT, OUTPUT_OFFSET, OUTPUT_SLOT, Path, Reads,
};
use super::round_views::{my_half, peer_half, per_round, typed, typed_mut, window, window_mut};
use super::scratch_layout::parity;
use oxccl_device::coop::Grid;
use oxccl_device::dispatch_element;
use oxccl_device::error::DeviceError;
use oxccl_device::kernel;
use oxccl_device::peer_buffer_table::NO_SLOT;
use oxccl_device::reduce::ReduceElement;
use oxccl_device::{DeviceView, DeviceViewMut};

/// Broadcast: the root's `count` elements of `input` land in every rank's `output` (the
/// root's too, unless `output` is `input`). Only the root's `input` is read.
///
/// # Errors
/// Invalid ids, short buffers, channel and barrier errors.
#[kernel(cooperative)]
pub fn collective_broadcast(args: CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (dtype, _) = args.check()?;
    dispatch_element!(dtype, T => broadcast::<T>(&args))
}

#[inline(always)]
fn broadcast<T: ReduceElement>(a: &CollectiveArgs<'_>) -> Result<(), DeviceError> {
    let (c, r, root) = (a.count, a.rank, a.root);
    let output = typed_mut::<T>(a.output, 0, c)?;
    let input = if r == root {
        typed::<T>(a.input, 0, c)?
    } else {
        DeviceView::default()
    };
    let per = per_round::<T>(a, 1)?;
    let mine = published_buffers::publish(a, Reads::RootInput, true)?;
    if !mine {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    let path = published_buffers::survey(a, Reads::RootInput, true, mine)?;
    if path == Path::StageFirst {
        stage(a, input, output, 0, per.min(c), a.sequence)?;
    }
    if path == Path::InPlace {
        // The root's input is registered: it is copied straight into the outputs, by
        // shares when every output that needs it is registered (see `shared`), else by
        // each rank into its own output.
        copy_root_input(a, input, output, per)?;
        return all_peers_meet(a);
    }
    published_buffers::meet_again(a, path)?;
    let (mut off, mut seq) = (0, a.sequence);
    loop {
        let len = per.min(c - off);
        if r != root {
            let half_off = a.layout.half(parity(seq));
            let dst = window_mut(output, off, len)?;
            dst.copy_from(Grid, peer_half::<T>(a, root, half_off, 0, len)?)?;
        }
        off += len;
        seq += 1;
        if off >= c {
            return Ok(());
        }
        stage(a, input, output, off, per.min(c - off), seq)?;
        all_peers_meet(a)?;
    }
}

/// Whether a broadcast run in place of the root's registered input is copied by shares:
/// every rank copies its share of the root's input ([`share_bounds`]) into every output
/// that needs it (every other rank's, and the root's own unless the root is in place),
/// which needs all of those registered. Every rank reads the same descriptors, so all
/// agree.
///
/// Why: one core copying the whole message is what bounds a large broadcast on the
/// emulator. In place (2 ranks, 16 MiB: 694 µs, one `memmove` of about 24 GB/s, while the
/// root waited at the meeting), shared out every rank stores or loads about the same. Out
/// of place, where the root copied its input into its own output while each peer loaded
/// all of it, the root's input is read once instead of once a rank, and each share once a
/// round for every output it goes to (2 threads copying 64 MiB each from one source took
/// 1.4-1.5x the time of 2 each copying half of it into both destinations, 256 KiB at a
/// time).
#[inline(always)]
fn shared(a: &CollectiveArgs<'_>, root_in_place: bool) -> Result<bool, DeviceError> {
    let (r, root, seq) = (a.rank, a.root, a.sequence);
    let none = NO_SLOT as u64;
    for p in (0..a.n_ranks).filter(|&p| p != root || !root_in_place) {
        let registered = if p == r {
            a.output_slot != NO_SLOT
        } else {
            published_buffers::peer_word(a, p, seq, OUTPUT_SLOT)? != none
        };
        if !registered {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the root's output is its input (every rank can tell: the root by address, the
/// others by the root's descriptor).
#[inline(always)]
fn root_in_place<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
) -> Result<bool, DeviceError> {
    if a.rank == a.root {
        return Ok(output.addr() == input.addr());
    }
    let word = |w| published_buffers::peer_word(a, a.root, a.sequence, w);
    Ok(word(INPUT_SLOT)? == word(OUTPUT_SLOT)? && word(INPUT_OFFSET)? == word(OUTPUT_OFFSET)?)
}

/// Elements `first..end` of the root's input that rank `r` of `n` copies in a [`shared`]
/// broadcast of `count`: an `n`th each, cut at multiples of 64 elements (whole 16-byte
/// units for any element type), the last rank taking the remainder.
#[inline(always)]
fn share_bounds(count: u64, n: u32, r: u32) -> (u64, u64) {
    let cut = |k: u32| match k >= n {
        true => count,
        false => (count / n as u64 * k as u64) & !63,
    };
    (cut(r), cut(r + 1))
}

/// Copies of a broadcast run in place of the root's registered input: our share into
/// every output that needs it where the call is [`shared`], else the whole input into our
/// own output (unless we are the root in place). `per` elements at a time, each piece read
/// from the root's input once and stored into every output it goes to while still in
/// cache. One copy in the loop: on the GPU each copy site is a copy loop of its own.
#[inline(always)]
fn copy_root_input<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    per: u64,
) -> Result<(), DeviceError> {
    let (r, root, seq) = (a.rank, a.root, a.sequence);
    let skip_root = root_in_place(a, input, output)?;
    let shared = shared(a, skip_root)?;
    let (first, end) = match shared {
        true => share_bounds(a.count, a.n_ranks, r),
        false => (0, a.count),
    };
    // The part of the root's input we copy, named and checked once, before anything is
    // written.
    let source = match r == root {
        true => window(input, first, end - first)?,
        false => published_buffers::peer_input::<T>(a, root, seq, first, end - first)?,
    };
    let mut off = first;
    while off < end {
        let len = per.min(end - off);
        let src = window(source, off - first, len)?;
        for p in 0..a.n_ranks {
            if (p == root && skip_root) || (p != r && !shared) {
                continue;
            }
            let dst = match p == r {
                true => window_mut(output, off, len)?,
                false => published_buffers::peer_output_mut::<T>(a, p, seq, off, len)?,
            };
            dst.copy_from(Grid, src)?;
        }
        off += len;
    }
    Ok(())
}

/// The root stages round `off..off + len` of its input into its half of round `seq`, and
/// copies it into its output (unless in place); the other ranks have nothing to stage.
#[inline(always)]
fn stage<T: ReduceElement>(
    a: &CollectiveArgs<'_>,
    input: DeviceView<'_, T>,
    output: DeviceViewMut<'_, T>,
    off: u64,
    len: u64,
    seq: u64,
) -> Result<(), DeviceError> {
    if a.rank == a.root {
        let (_, half) = my_half::<T>(a, seq)?;
        let src = window(input, off, len)?;
        window_mut(half, 0, len)?.copy_from(Grid, src)?;
        let dst = window_mut(output, off, len)?;
        if dst.addr() != src.addr() {
            dst.copy_from(Grid, src)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::share_bounds;

    /// Guards against shares that overlap, leave a gap, run past the count or cut an
    /// element run at other than a multiple of 64 (but at the end).
    #[test]
    fn shares_cover_the_count_once() {
        for n in 1..=9u32 {
            for count in [0u64, 1, 63, 64, 65, 127, 1000, 3001, 1_000_003] {
                let mut next = 0;
                for r in 0..n {
                    let (first, end) = share_bounds(count, n, r);
                    assert_eq!(first, next, "n={n} count={count} r={r}");
                    assert!(first <= end && end <= count, "n={n} count={count} r={r}");
                    assert!(end == count || end % 64 == 0, "n={n} count={count} r={r}");
                    next = end;
                }
                assert_eq!(next, count, "n={n} count={count}");
            }
        }
    }
}
