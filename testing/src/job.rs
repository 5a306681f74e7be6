//! `Job`: N child processes of the current test binary, each running one `#[ignore]`d
//! test, started together, read while they run, and waited for under one deadline.
//!
//! Lifecycle: [`Job::run`] spawns every child (killing the ones started if a later spawn
//! fails), starts two reader threads per child (`pipe.rs`), polls the children until all
//! have exited or the deadline passes, kills every child still running at the deadline,
//! then collects each one's output. Children are held by a guard that kills them on drop,
//! so a panic in between leaves no process behind. Processes the children start
//! themselves are theirs to end.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::outcome::ChildOutcome;
use crate::pipe::PipeReader;

/// Variable holding a child's index in its job (`0..ranks`); see [`child_rank`].
pub const CHILD_RANK_ENV: &str = "OXCCL_TEST_CHILD_RANK";

/// Deadline of a job unless [`Job::deadline`] sets another.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// Bytes of each stream kept per child unless [`Job::max_output_bytes`] sets another.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 16 << 20;

/// How often the children are checked for exit.
const POLL: Duration = Duration::from_millis(10);

/// How long output is still read after the last child ended, for pipes that something
/// else holds open (a process the child started).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// In a child of a [`Job`], its index in the job; `None` in a process no job started (so
/// a child role can refuse to run on its own).
pub fn child_rank() -> Option<usize> {
    std::env::var(CHILD_RANK_ENV).ok()?.parse().ok()
}

/// A job of child processes of the current test binary; see the crate docs.
#[derive(Clone, Debug)]
pub struct Job {
    ranks: usize,
    child_test: Option<String>,
    env_all: Vec<(OsString, OsString)>,
    env_rank: Vec<(usize, OsString, OsString)>,
    deadline: Duration,
    max_output_bytes: usize,
}

impl Job {
    /// A job of `ranks` children.
    pub fn new(ranks: usize) -> Self {
        Job {
            ranks,
            child_test: None,
            env_all: Vec::new(),
            env_rank: Vec::new(),
            deadline: DEFAULT_DEADLINE,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    /// The `#[ignore]`d test every child runs, by its name as the test harness lists it
    /// (`module::name` for a test inside a module).
    pub fn child_test(&mut self, name: impl Into<String>) -> &mut Self {
        self.child_test = Some(name.into());
        self
    }

    /// Sets `key` in the environment of child `rank`; it wins over [`Job::env_all`].
    pub fn env(
        &mut self,
        rank: usize,
        key: impl AsRef<OsStr>,
        value: impl AsRef<OsStr>,
    ) -> &mut Self {
        self.env_rank
            .push((rank, key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Sets `key` in the environment of every child.
    pub fn env_all(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.env_all
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Longest the whole job may run, counted from the start of [`Job::run`]; every child
    /// still running then is killed. Default [`DEFAULT_DEADLINE`].
    pub fn deadline(&mut self, deadline: Duration) -> &mut Self {
        self.deadline = deadline;
        self
    }

    /// Bytes kept of each child's stdout and of its stderr (the last ones). Default
    /// [`DEFAULT_MAX_OUTPUT_BYTES`].
    pub fn max_output_bytes(&mut self, bytes: usize) -> &mut Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Runs the job: starts every child, waits for all of them until the deadline (killing
    /// those still running then), and returns each one's outcome, by rank. A child that
    /// fails or hangs is reported in its outcome, not as an error.
    ///
    /// # Errors
    /// [`Error::NoChildTest`] or [`Error::NoSuchRank`] for a job set up wrong;
    /// [`Error::Io`] if this binary's path cannot be found or a child or thread cannot be
    /// started (the children already started are killed).
    pub fn run(&self) -> Result<Vec<ChildOutcome>, Error> {
        let test = self.child_test.as_deref().ok_or(Error::NoChildTest)?;
        if let Some((rank, key, _)) = self.env_rank.iter().find(|(r, _, _)| *r >= self.ranks) {
            return Err(Error::NoSuchRank {
                rank: *rank,
                ranks: self.ranks,
                key: key.to_string_lossy().into_owned(),
            });
        }
        let exe = std::env::current_exe()
            .map_err(|e| Error::io("finding the path of this test binary", e))?;
        let deadline = Instant::now() + self.deadline;
        let mut children = Children(Vec::with_capacity(self.ranks));
        let mut readers = Vec::with_capacity(self.ranks);
        for rank in 0..self.ranks {
            let mut child = self
                .command(&exe, test, rank)
                .spawn()
                .map_err(|e| Error::io(format!("starting child {rank} ({test})"), e))?;
            let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
                // Cannot happen: both are piped. `children` kills the others on return.
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::io(
                    format!("child {rank}: no pipe"),
                    std::io::ErrorKind::Other.into(),
                ));
            };
            children.0.push(child);
            let limit = self.max_output_bytes;
            readers.push((
                reader(rank, "stdout", stdout, limit)?,
                reader(rank, "stderr", stderr, limit)?,
            ));
        }
        let ended = children.wait(deadline);
        let output_until = deadline.max(Instant::now()) + OUTPUT_GRACE;
        Ok(ended
            .into_iter()
            .zip(readers)
            .enumerate()
            .map(|(rank, ((status, killed), (out, err)))| {
                let (out, out_ended) = out.finish(output_until);
                let (err, err_ended) = err.finish(output_until);
                ChildOutcome {
                    rank,
                    status,
                    killed,
                    stdout: out.bytes.into(),
                    stderr: err.bytes.into(),
                    stdout_dropped: out.dropped,
                    stderr_dropped: err.dropped,
                    output_complete: out_ended && err_ended,
                }
            })
            .collect())
    }

    fn command(&self, exe: &Path, test: &str, rank: usize) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        for var in oxccl_bootstrap::LAUNCHER_VARS {
            cmd.env_remove(var);
        }
        cmd.env(CHILD_RANK_ENV, rank.to_string());
        for (k, v) in &self.env_all {
            cmd.env(k, v);
        }
        for (_, k, v) in self.env_rank.iter().filter(|(r, _, _)| *r == rank) {
            cmd.env(k, v);
        }
        cmd
    }
}

/// Starts the thread reading `name` (stdout or stderr) of child `rank`.
fn reader(
    rank: usize,
    name: &str,
    pipe: impl Read + Send + 'static,
    limit: usize,
) -> Result<PipeReader, Error> {
    PipeReader::spawn(format!("child-{rank}-{name}"), pipe, limit)
        .map_err(|e| Error::io(format!("starting the {name} reader of child {rank}"), e))
}

/// The running children of a job; kills every one still running when dropped.
struct Children(Vec<Child>);

impl Children {
    /// Waits for every child until `deadline`, then kills the rest. Returns each one's
    /// status and whether it was killed.
    fn wait(&mut self, deadline: Instant) -> Vec<(ExitStatus, bool)> {
        let mut ended: Vec<Option<(ExitStatus, bool)>> = vec![None; self.0.len()];
        loop {
            for (child, end) in self.0.iter_mut().zip(&mut ended) {
                if end.is_none()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    *end = Some((status, false));
                }
            }
            if ended.iter().all(Option::is_some) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                for (child, end) in self.0.iter_mut().zip(&mut ended) {
                    if end.is_none() {
                        let _ = child.kill();
                        // SIGKILL cannot be ignored, so this wait ends.
                        if let Ok(status) = child.wait() {
                            *end = Some((status, true));
                        }
                    }
                }
                break;
            }
            thread::sleep(POLL.min(deadline - now));
        }
        ended
            .into_iter()
            .map(|e| e.unwrap_or((killed_status(), true)))
            .collect()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // Already ended is fine: `kill` does nothing to a child that was waited for.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The status of a process killed by `SIGKILL`, for a child whose own status could not be
/// read after the kill.
fn killed_status() -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    const SIGKILL: i32 = 9;
    ExitStatus::from_raw(SIGKILL)
}
