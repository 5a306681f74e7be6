//! How a direct collective splits its data into rounds that fit one half of the scratch.
//! Host and kernels both call these, so they agree on how many call numbers a call takes.

use super::scratch_layout::ScratchLayout;

/// Elements of each window one direct round moves when a round stages `windows` windows
/// of `elem_bytes`-byte elements into one half of `layout`'s scratch: 0 if not even one
/// element of each fits (the host refuses such a layout before launching).
pub const fn elements_per_round(layout: &ScratchLayout, elem_bytes: u64, windows: u64) -> u64 {
    match layout.half_bytes.checked_div(elem_bytes * windows) {
        Some(n) => n,
        None => 0,
    }
}

/// Rounds a direct call of up to `elements` elements per window takes, at
/// `per_round` elements per window and round: each takes one call number.
pub const fn rounds(elements: u64, per_round: u64) -> u64 {
    match per_round {
        0 => 0,
        _ => elements.div_ceil(per_round),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a round count that leaves elements out or adds an empty round.
    #[test]
    fn rounds_cover_the_elements_exactly() {
        let layout = ScratchLayout::new(4, 64, 4096, 0);
        assert_eq!(elements_per_round(&layout, 4, 1), 1024);
        assert_eq!(elements_per_round(&layout, 8, 4), 128);
        assert_eq!(elements_per_round(&layout, 8, 1000), 0);
        assert_eq!(rounds(0, 1024), 0);
        assert_eq!(rounds(1024, 1024), 1);
        assert_eq!(rounds(1025, 1024), 2);
        assert_eq!(rounds(7, 0), 0);
    }
}
