//! The memory baseline: what two threads reach computing `c = a + b` over 64 MiB `f32`
//! arrays, each thread half of them; the ceiling a 2-rank collective on the CPU emulator,
//! which also streams through memory on two threads, is set beside.

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Bytes of each of `a`, `b` and `c`.
pub const ARRAY_BYTES: u64 = 64 << 20;

/// The baseline's figure.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryBaseline {
    /// Bytes of each array.
    pub array_bytes: u64,
    /// Threads that shared the work.
    pub threads: u32,
    /// Bytes moved per second, in GB/s, counting the reads of `a` and `b` and the write of
    /// `c` (three arrays per pass); the best of the passes.
    pub gbps: f64,
}

impl MemoryBaseline {
    /// Bytes per second, in GB/s, that memory moves while `c = a + b` runs: a store to a
    /// line not in the cache reads the line first (write-allocate caches), so the pass
    /// moves four arrays for the three [`Self::gbps`] counts.
    pub fn moved_gbps(&self) -> f64 {
        self.gbps * 4.0 / 3.0
    }

    /// The least time, in µs, an all-reduce of `bytes` on `ranks` ranks of this machine can
    /// take at the rate memory moved for `c = a + b` ([`Self::moved_gbps`]): it reads every
    /// rank's input and writes every rank's output at least once, and out of place reads
    /// each output line before writing it (as `c = a + b` does `c`'s): `3 * ranks * bytes`
    /// through memory out of place, `2 * ranks * bytes` in place (whose outputs are lines
    /// it has just read). What a zero-copy all-reduce moves.
    ///
    /// Its bus bandwidth (`bytes / time` times `2 (ranks - 1) / ranks`) is then at most
    /// [`Self::gbps`] times `8 (ranks - 1) / (9 ranks²)` out of place and `4 (ranks - 1) /
    /// (3 ranks²)` in place: 0.22x and 0.33x on 2 ranks, however good the all-reduce.
    pub fn all_reduce_floor_us(&self, bytes: u64, ranks: u32, in_place: bool) -> f64 {
        let passes = if in_place { 2.0 } else { 3.0 };
        passes * f64::from(ranks) * bytes as f64 / (self.moved_gbps() * 1e9) * 1e6
    }
}

/// Times `passes` passes of `c = a + b` over arrays of `array_bytes`, each of `threads`
/// threads taking an equal share, after one untimed pass (which also faults the pages in).
pub fn add_bandwidth(array_bytes: u64, threads: u32, passes: u32) -> MemoryBaseline {
    let n = (array_bytes / 4) as usize;
    let a: Vec<f32> = (0..n).map(|i| (i % 1024) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 512) as f32).collect();
    let mut c = vec![0.0f32; n];
    let threads = threads.max(1);
    let share = n.div_ceil(threads as usize).max(1);
    let mut best = f64::INFINITY;
    for pass in 0..=passes.max(1) {
        let start = Instant::now();
        std::thread::scope(|s| {
            for ((c, a), b) in c
                .chunks_mut(share)
                .zip(a.chunks(share))
                .zip(b.chunks(share))
            {
                s.spawn(move || {
                    for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
                        *c = a + b;
                    }
                });
            }
        });
        let seconds = start.elapsed().as_secs_f64();
        std::hint::black_box(&mut c);
        if pass > 0 {
            best = best.min(seconds);
        }
    }
    MemoryBaseline {
        array_bytes,
        threads,
        gbps: 3.0 * array_bytes as f64 / best / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::add_bandwidth;

    /// Guards against a baseline that skips work or reports a figure that is not a rate.
    #[test]
    fn small_baseline_is_a_positive_rate() {
        let m = add_bandwidth(1 << 16, 2, 2);
        assert!(m.gbps.is_finite() && m.gbps > 0.0, "{m:?}");
        assert_eq!((m.array_bytes, m.threads), (1 << 16, 2));
    }

    /// Guards against a floor that counts other traffic than every input read and every
    /// output written once (and, out of place, read first).
    #[test]
    fn all_reduce_floor_counts_each_input_and_output_once() {
        let m = super::MemoryBaseline {
            array_bytes: 1 << 20,
            threads: 2,
            gbps: 3.0,
        };
        // Memory moves 4 GB/s; 2 ranks x 64 MB: 3 passes out of place, 2 in place.
        assert!((m.all_reduce_floor_us(64_000_000, 2, false) - 96_000.0).abs() < 1e-6);
        assert!((m.all_reduce_floor_us(64_000_000, 2, true) - 64_000.0).abs() < 1e-6);
        assert!((m.all_reduce_floor_us(64_000_000, 4, true) - 128_000.0).abs() < 1e-6);
    }
}
