//! The open-file limit, which running many ranks in one process (tests, benchmarks) hits
//! long before anything else.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::error::{Error, Result};

/// A generous estimate of the file descriptors `ranks` bootstraps need when they all run
/// in one process and have each run every collective: per rank a listener (1), both ends
/// of its root connection (2) and of its ring connection (2), its share of the
/// `log2(ranks)` recursive-doubling connections (each has two ends and two owners), and a
/// margin of 2; plus 256 for the rest of the process. (Measured at 1024 ranks: 14.3k of
/// the 17.7k estimated.)
pub fn open_files_for_ranks_in_process(ranks: usize) -> u64 {
    let ranks = ranks as u64;
    let log = u64::from(ranks.max(1).ilog2());
    ranks * (7 + log) + 256
}

/// Raises this process's soft open-file limit to at least `wanted`, up to the hard limit,
/// or above it when the process may raise the hard limit too. Returns the soft limit now
/// in force, which may still be below `wanted` for an unprivileged process.
///
/// # Errors
/// [`Error::System`] if the limit cannot be read back or set.
pub fn raise_open_file_limit(wanted: u64) -> Result<u64> {
    let cur = getrlimit(Resource::Nofile);
    let soft = cur.current.unwrap_or(u64::MAX);
    if soft >= wanted {
        return Ok(soft);
    }
    let hard = cur.maximum.unwrap_or(u64::MAX);
    if hard < wanted {
        // Raising the hard limit needs privilege; try, and fall back to the hard limit.
        let both = Rlimit {
            current: Some(wanted),
            maximum: Some(wanted),
        };
        if setrlimit(Resource::Nofile, both).is_ok() {
            return Ok(wanted);
        }
    }
    let new = Rlimit {
        current: Some(wanted.min(hard)),
        maximum: cur.maximum,
    };
    setrlimit(Resource::Nofile, new)
        .map_err(|e| Error::system("raising the open-file limit (RLIMIT_NOFILE)", e.into()))?;
    Ok(wanted.min(hard))
}
