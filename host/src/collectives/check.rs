//! Checks of a collective's arguments against its buffers, before anything is launched: a
//! call that would read or write outside a buffer is refused with an error that says which
//! buffer, how many elements it needed and how many it has.

use crate::error::{Error, Result};
use oxccl_kernels::collectives::AllToAllvCounts;
use smallvec::SmallVec;

/// What a collective needs of one buffer: at least `needed` elements.
pub(crate) struct Need<'a> {
    /// The buffer's role, as the error names it (`send`, `recv`).
    pub(crate) role: &'a str,
    /// Elements it has.
    pub(crate) len: usize,
    /// Elements the call reads or writes.
    pub(crate) needed: usize,
}

/// Refuses `collective` unless every buffer holds what the call needs.
pub(crate) fn buffers_fit<'a>(
    rank: u32,
    collective: &str,
    needs: impl IntoIterator<Item = Need<'a>>,
) -> Result<()> {
    for n in needs {
        if n.len < n.needed {
            return Err(Error::InvalidUsage(format!(
                "rank {rank}: {collective}: the {} buffer holds {} elements, the call needs {}",
                n.role, n.len, n.needed
            )));
        }
    }
    Ok(())
}

/// `count * ranks` elements, or an error if it overflows.
pub(crate) fn times_ranks(rank: u32, collective: &str, count: usize, ranks: u32) -> Result<usize> {
    count.checked_mul(ranks as usize).ok_or_else(|| {
        Error::InvalidUsage(format!(
            "rank {rank}: {collective}: {count} elements per rank times {ranks} ranks overflows"
        ))
    })
}

/// Checks the counts and displacements of an all-to-all-v on one side (`send` or `recv`):
/// one entry per rank, each range `displs[i] .. displs[i] + counts[i]` inside a buffer of
/// `len` elements, and no two ranges overlapping on the receive side (two peers would write
/// the same elements).
pub(crate) fn counts_and_displs(
    rank: u32,
    side: &str,
    counts: &[usize],
    displs: &[usize],
    ranks: u32,
    len: usize,
    disjoint: bool,
) -> Result<()> {
    let err = |what: String| {
        Err(Error::InvalidUsage(format!(
            "rank {rank}: all_to_allv: {side}: {what}"
        )))
    };
    if counts.len() != ranks as usize || displs.len() != ranks as usize {
        return err(format!(
            "{} counts and {} displacements for {ranks} ranks: one of each per rank",
            counts.len(),
            displs.len()
        ));
    }
    // On the stack: a call allocates nothing (`ranks` is at most the kernel's limit, which
    // the caller checked first).
    let mut ranges: SmallVec<[(usize, usize, usize); AllToAllvCounts::MAX_RANKS]> = SmallVec::new();
    for (peer, (&count, &displ)) in counts.iter().zip(displs).enumerate() {
        match displ.checked_add(count) {
            Some(end) if end <= len => {
                if count > 0 {
                    ranges.push((displ, end, peer));
                }
            }
            _ => {
                return err(format!(
                    "rank {peer}'s {count} elements at displacement {displ} end past the \
                     buffer's {len} elements"
                ));
            }
        }
    }
    if disjoint {
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            let ((_, end_a, a), (start_b, _, b)) = (w[0], w[1]);
            if start_b < end_a {
                return err(format!(
                    "the ranges of ranks {a} and {b} overlap (elements {start_b}..{end_a}): \
                     two peers would write the same elements"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against an all-to-all-v whose ranges leave the buffer, wrap around, overlap on
    /// the receive side, or come in the wrong number being accepted.
    #[test]
    fn counts_and_displacements_are_checked() {
        let ok = counts_and_displs(0, "recv", &[2, 0, 3], &[0, 2, 2], 3, 5, true);
        assert!(ok.is_ok(), "{ok:?}");
        /// Counts, displacements, buffer length, disjoint, what the error says.
        type Case<'a> = (&'a [usize], &'a [usize], usize, bool, &'a str);
        let cases: [Case<'_>; 5] = [
            (&[2, 2], &[0, 2], 5, true, "one of each per rank"),
            (&[2, 2, 2], &[0, 2, 4], 5, true, "end past"),
            (&[1, 1, 1], &[0, usize::MAX, 3], 5, true, "end past"),
            (&[2, 2, 1], &[0, 1, 4], 5, true, "overlap"),
            (&[2, 2, 1], &[0, 1, 4], 5, false, ""),
        ];
        for (counts, displs, len, disjoint, want) in cases {
            let r = counts_and_displs(0, "recv", counts, displs, 3, len, disjoint);
            match (want.is_empty(), r) {
                (true, Ok(())) => {}
                (false, Err(e)) => assert!(e.to_string().contains(want), "{e}"),
                (_, r) => panic!("{counts:?} {displs:?}: {r:?}"),
            }
        }
    }

    /// Guards against a size check that passes a buffer too small, or whose error does not
    /// say which buffer and by how much.
    #[test]
    fn buffer_sizes_are_checked() {
        let need = |len, needed| Need {
            role: "recv",
            len,
            needed,
        };
        assert!(buffers_fit(1, "all_gather", [need(8, 8)]).is_ok());
        let e = buffers_fit(1, "all_gather", [need(7, 8)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("the recv buffer holds 7 elements, the call needs 8"),
            "{e}"
        );
        assert!(times_ranks(0, "all_gather", usize::MAX, 2).is_err());
    }
}
