//! What a test binary of `cargo test` (libtest, the standard harness) says it ran.
//!
//! Each binary ends its run with one line on stdout:
//!
//! ```text
//! test result: ok. 4 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished in 3.21s
//! ```
//!
//! (`FAILED` instead of `ok` when a test failed; the word is coloured when libtest colours
//! its output, the counts never are.)

/// The counts of one `test result:` line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Tests that ran and passed.
    pub passed: u64,
    /// Tests that ran and failed.
    pub failed: u64,
    /// Tests marked `#[ignore]`, not run.
    pub ignored: u64,
    /// Tests a name filter left out, not run.
    pub filtered_out: u64,
}

/// The `test result:` lines of `stdout`, one per test binary, in order; lines that do not
/// parse are left out.
pub fn summaries(stdout: &str) -> Vec<Summary> {
    stdout.lines().filter_map(summary).collect()
}

/// The counts of `line`, if it is a `test result:` line.
fn summary(line: &str) -> Option<Summary> {
    let rest = line.trim().strip_prefix("test result: ")?;
    // Past the verdict (`ok`, `FAILED`, maybe inside colour codes) and its full stop.
    let (_, counts) = rest.split_once(". ")?;
    let mut s = Summary::default();
    let mut any = false;
    for item in counts.split(';') {
        let Some((n, what)) = item.trim().split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse() else {
            continue;
        };
        let field = match what {
            "passed" => &mut s.passed,
            "failed" => &mut s.failed,
            "ignored" => &mut s.ignored,
            "filtered out" => &mut s.filtered_out,
            _ => continue,
        };
        *field = n;
        any = true;
    }
    any.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against missing the counts of a run that passed.
    #[test]
    fn reads_a_passing_run() {
        let out = "\nrunning 4 tests\ntest fifo_push_pop ... ok\n\n\
                   test result: ok. 4 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; \
                   finished in 12.34s\n\n";
        assert_eq!(
            summaries(out),
            [Summary {
                passed: 4,
                failed: 0,
                ignored: 1,
                filtered_out: 0
            }]
        );
    }

    /// Guards against taking a run that matched nothing for one that ran tests: libtest
    /// says `ok` for it.
    #[test]
    fn reads_a_run_that_a_filter_emptied() {
        let out = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; \
                   0 measured; 4 filtered out; finished in 0.00s\n";
        let s = summaries(out);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].passed, s[0].filtered_out), (0, 4));
    }

    /// Guards against losing a binary when several report, or the counts of a failed run.
    #[test]
    fn reads_every_binary_and_failures() {
        let out = "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n\
                   test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.50s\n";
        let s = summaries(out);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].passed, s[1].passed, s[1].failed), (2, 1, 2));
    }

    /// Guards against colour codes around the verdict hiding the counts.
    #[test]
    fn reads_coloured_output() {
        let out = "test result: \x1b[32mok\x1b[0m. 3 passed; 0 failed; 0 ignored; 0 measured; \
                   0 filtered out; finished in 0.10s\r\n";
        assert_eq!(summaries(out)[0].passed, 3);
    }

    /// Guards against a panic, or counts made up, on lines that only look like a summary.
    #[test]
    fn ignores_other_lines() {
        let out = "test result:\ntest result: ok.\ntest result: ok. x passed\n\
                   a test result: ok. 9 passed;\ntest result_parse ... ok\n";
        assert!(summaries(out).is_empty());
        assert!(summaries("").is_empty());
    }
}
