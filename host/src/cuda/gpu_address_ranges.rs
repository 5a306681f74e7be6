//! The address ranges of the CUDA device memory alive in this process, so that the CPU
//! emulator can refuse a kernel parameter that names GPU memory: a `DeviceView` carries no
//! device, and a view of a CUDA buffer passed to a launch on a CPU stream would otherwise be
//! dereferenced on the host (a crash, or worse, another mapping's bytes).
//!
//! Every CUDA allocation is entered when made and removed before it is freed. A CPU launch
//! looks only while some are alive ([`any_live`], one atomic load), and looks at each
//! 8-byte-aligned word of each parameter's value: views and handles hold their addresses as
//! aligned `u64`s (their layouts are `repr(C)` with 8-byte fields). Memory a parameter only
//! points to is not looked into.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Live allocations: start -> end (exclusive).
static RANGES: RwLock<BTreeMap<u64, u64>> = RwLock::new(BTreeMap::new());
/// How many are in `RANGES`: read without the lock by every CPU launch.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Enters `bytes` bytes of device memory at `start` (a new allocation).
pub(crate) fn enter(start: u64, bytes: u64) {
    let mut ranges = RANGES.write();
    if ranges.insert(start, start.saturating_add(bytes)).is_none() {
        // Relaxed: the lock orders the map; the count only says whether to take it.
        LIVE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Removes the allocation at `start` (before it is freed).
pub(crate) fn remove(start: u64) {
    let mut ranges = RANGES.write();
    if ranges.remove(&start).is_some() {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether any device memory is alive: until some is, a CPU launch need not look.
pub(crate) fn any_live() -> bool {
    LIVE.load(Ordering::Relaxed) != 0
}

/// The first 8-byte-aligned word of `value` that holds an address inside live device
/// memory: its byte offset and the address.
pub(crate) fn first_gpu_address(value: &[u8]) -> Option<(usize, u64)> {
    let ranges = RANGES.read();
    value.chunks_exact(8).enumerate().find_map(|(i, word)| {
        let addr = u64::from_ne_bytes(word.try_into().ok()?);
        let (_, &end) = ranges.range(..=addr).next_back()?;
        (addr < end).then_some((i * 8, addr))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a CPU launch taking a GPU address for host memory, or refusing an
    /// address next to an allocation. The range is far above any address a host or GPU
    /// allocation gets, so tests running at the same time are not refused because of it.
    #[test]
    fn words_inside_a_live_range_are_found_and_only_those() {
        let start = 0x7ead_0000_0000_0000u64;
        enter(start, 4096);
        let value =
            |words: &[u64]| -> Vec<u8> { words.iter().flat_map(|w| w.to_ne_bytes()).collect() };
        assert_eq!(
            first_gpu_address(&value(&[1, start - 1, start + 4096])),
            None
        );
        assert_eq!(
            first_gpu_address(&value(&[7, start + 4095])),
            Some((8, start + 4095))
        );
        assert_eq!(first_gpu_address(&value(&[start, 0])), Some((0, start)));
        // A partial last word is not a word.
        assert_eq!(first_gpu_address(&start.to_ne_bytes()[..7]), None);
        remove(start);
        assert_eq!(first_gpu_address(&value(&[start])), None);
    }
}
