//! The data: what each element holds in each launch, and how what arrived is compared.

use std::fmt;

/// Element `i` of rank `rank`'s data in launch `launch`: `0xLLRRIIII` in hex (launch,
/// rank, index), so that a wrong element says where it came from.
pub const fn value(rank: u32, launch: u32, i: usize) -> u32 {
    (launch & 0xff) << 24 | (rank & 0xff) << 16 | (i as u32 & 0xffff)
}

/// Rank `rank`'s `count` elements of launch `launch`.
pub fn chunk(rank: u32, launch: u32, count: usize) -> Vec<u32> {
    (0..count).map(|i| value(rank, launch, i)).collect()
}

/// An element of an output that does not hold what it should.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wrong {
    /// The kernel: `all-gather` or `broadcast`.
    pub collective: &'static str,
    /// The rank whose output it is.
    pub rank: u32,
    /// The launch.
    pub launch: u32,
    /// Its index in the output.
    pub index: usize,
    /// What it holds.
    pub got: u32,
    /// What it should hold.
    pub expected: u32,
}

impl fmt::Display for Wrong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rank {} launch {} element {}: got {:#010x}, expected {:#010x}",
            self.collective, self.rank, self.launch, self.index, self.got, self.expected
        )
    }
}

/// What one collective's check found on one rank, or on all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Elements compared.
    pub checked: u64,
    /// Those that were wrong.
    pub wrong: Vec<Wrong>,
}

impl Outcome {
    /// Compares the output of launch `launch` on rank `rank`, `got`, with `expected`.
    pub fn compare(
        &mut self,
        collective: &'static str,
        rank: u32,
        launch: u32,
        got: &[u32],
        expected: &[u32],
    ) {
        self.checked += expected.len() as u64;
        for (index, (&got, &expected)) in got.iter().zip(expected).enumerate() {
            if got != expected {
                self.wrong.push(Wrong {
                    collective,
                    rank,
                    launch,
                    index,
                    got,
                    expected,
                });
            }
        }
    }

    /// Adds another rank's outcome to this one.
    pub fn merge(&mut self, other: Outcome) {
        self.checked += other.checked;
        self.wrong.extend(other.wrong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against values that two ranks, launches or indices share: a chunk landing in
    /// the wrong place or from the wrong launch must compare wrong.
    #[test]
    fn values_name_rank_launch_and_index() {
        assert_eq!(value(3, 2, 16), 0x0203_0010);
        assert_ne!(value(1, 0, 5), value(0, 1, 5));
        assert_ne!(value(1, 0, 5), value(1, 0, 6));
        let mut o = Outcome::default();
        o.compare("all-gather", 0, 1, &[1, 2, 9], &[1, 2, 3]);
        assert_eq!(o.checked, 3);
        assert_eq!(o.wrong.len(), 1);
        assert_eq!(o.wrong[0].index, 2);
        assert!(
            o.wrong[0]
                .to_string()
                .contains("got 0x00000009, expected 0x00000003")
        );
    }
}
