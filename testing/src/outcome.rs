//! `ChildOutcome`: how one child of a job ended, and what it wrote.

use std::borrow::Cow;
use std::fmt;
use std::process::ExitStatus;

/// Bytes of each stream [`ChildOutcome`]'s `Display` shows (the end of it).
const SHOWN_BYTES: usize = 32 << 10;

/// One child's exit status and output.
#[derive(Debug)]
pub struct ChildOutcome {
    /// The child's index in the job (its [`CHILD_RANK_ENV`](crate::CHILD_RANK_ENV)).
    pub rank: usize,
    /// How the process ended (by a signal if it was killed).
    pub status: ExitStatus,
    /// Whether it was killed because the job's deadline passed.
    pub killed: bool,
    /// The end of its standard output: the last
    /// [`max_output_bytes`](crate::Job::max_output_bytes).
    pub stdout: Vec<u8>,
    /// The end of its standard error, likewise.
    pub stderr: Vec<u8>,
    /// Bytes of standard output dropped before `stdout` to keep within the limit.
    pub stdout_dropped: u64,
    /// Bytes of standard error dropped before `stderr`.
    pub stderr_dropped: u64,
    /// Whether both pipes were read to their end (false if something the child started
    /// still held them open when the job ended).
    pub output_complete: bool,
}

impl ChildOutcome {
    /// Whether the child exited by itself with status 0 after running exactly one test
    /// that passed. A child test name that matches no test runs nothing and exits 0: that
    /// is not a success.
    pub fn success(&self) -> bool {
        !self.killed && self.status.success() && self.ran_one_test()
    }

    /// Whether the test harness of the child reported exactly one test run and passed.
    pub fn ran_one_test(&self) -> bool {
        self.stdout_text()
            .lines()
            .any(|l| l.starts_with("test result: ok. 1 passed;"))
    }

    /// Standard output as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stdout)
    }

    /// Standard error as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.stderr)
    }

    /// The first line of standard output that contains `marker`, from `marker` on. (The
    /// child's test harness may print the test's name on the same line before it.)
    pub fn find_line(&self, marker: &str) -> Option<&str> {
        // Lossless where the output is UTF-8, which the lines of interest are.
        let text = std::str::from_utf8(&self.stdout).ok()?;
        text.lines().find_map(|l| l.find(marker).map(|i| &l[i..]))
    }
}

/// A report for a failed assertion: rank, status, and the end of both streams.
impl fmt::Display for ChildOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "child {}: {}", self.rank, self.status)?;
        if self.killed {
            f.write_str(" (killed at the job's deadline)")?;
        } else if self.status.success() && !self.ran_one_test() {
            f.write_str(" (no test ran: is the child test's name right, and is it #[ignore]d?)")?;
        }
        if !self.output_complete {
            f.write_str(" (output still open when the job ended)")?;
        }
        for (name, bytes, dropped) in [
            ("stdout", &self.stdout, self.stdout_dropped),
            ("stderr", &self.stderr, self.stderr_dropped),
        ] {
            let start = bytes.len().saturating_sub(SHOWN_BYTES);
            let hidden = dropped + start as u64;
            write!(f, "\n--- {name}")?;
            if hidden > 0 {
                write!(
                    f,
                    " (last {} bytes; {hidden} before them)",
                    bytes.len() - start
                )?;
            }
            write!(f, " ---\n{}", String::from_utf8_lossy(&bytes[start..]))?;
        }
        Ok(())
    }
}
