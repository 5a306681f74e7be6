//! Running external commands under a deadline, in a process group of their own.
//!
//! Every command this crate runs goes through here (and so does every command of oxccl's
//! `cargo xtask`), so none can hold a build or a CI step forever: past its limit the
//! command's whole process group gets SIGKILL, then the command is reaped, and the error
//! names the command and the limit. The group is what makes that complete: `cargo` starts
//! `rustc`, `pip` starts builds, and a process whose parent exited is still in the group,
//! though no longer anyone's descendant.
//!
//! The group is not the terminal's foreground group, so Ctrl-C reaches this process only,
//! which passes it on to the group (see [`crate::interrupt`]). For the same reason standard
//! input is `/dev/null`: a process of a background group that reads the terminal is stopped
//! (SIGTTIN), and no command run here has anything to read.

use crate::interrupt::{self, InFlight};
use parking_lot::Mutex;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// How often the supervisor looks at the command, its deadline and the signals.
const POLL: Duration = Duration::from_millis(50);

/// How long a command has to stop after this process passed a SIGINT or SIGTERM on to it,
/// before its group gets SIGKILL (a shell's background jobs ignore SIGINT).
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// How long to wait, once the command ended, for the end of its output: a process it left
/// running may hold the pipe open.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Why a command run here did not succeed. Each variant names the command as a shell would
/// read it (see [`show`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The program could not be started (not found, not executable).
    #[error("cannot start `{command}`")]
    Spawn {
        /// The command.
        command: String,
        /// Why `spawn` failed; [`std::io::ErrorKind::NotFound`] for a missing program.
        #[source]
        source: std::io::Error,
    },
    /// The command exited unsuccessfully.
    #[error("`{command}` failed ({status})")]
    Failed {
        /// The command.
        command: String,
        /// Its exit status.
        status: ExitStatus,
    },
    /// The command ran past its time limit; its process group was killed.
    #[error(
        "`{command}` did not finish within {} and was killed with everything it started{seen}",
        fmt_duration(*limit)
    )]
    TimedOut {
        /// The command.
        command: String,
        /// The limit it ran past.
        limit: Duration,
        /// What it had said: the end of its stderr where it was captured, or a pointer to
        /// the output above where it went to the terminal; may be empty.
        seen: String,
    },
    /// This process received a stop signal (SIGINT, SIGTERM, SIGHUP) while the command ran,
    /// and passed it on to the command's process group.
    #[error(
        "`{command}` stopped: this process received {signal} and passed it on to the \
         command's process group (what still ran {} later was killed)",
        fmt_duration(INTERRUPT_GRACE)
    )]
    Interrupted {
        /// The command.
        command: String,
        /// The signal's name (`SIGINT`).
        signal: &'static str,
    },
    /// This process had received a stop signal before the command would have started.
    #[error("`{command}` not started: this process received {signal}")]
    NotStarted {
        /// The command.
        command: String,
        /// The signal's name (`SIGINT`).
        signal: &'static str,
    },
    /// Waiting for the command failed.
    #[error("waiting for `{command}`")]
    Wait {
        /// The command.
        command: String,
        /// The error of `waitid`.
        #[source]
        source: std::io::Error,
    },
    /// The handlers that pass stop signals on to commands could not be installed.
    #[error("installing the handlers that pass SIGINT and SIGTERM on to commands: {reason}")]
    Signals {
        /// The error of the installation.
        reason: String,
    },
}

/// Prints `cmd` (with the environment it sets) and its limit, runs it with this process's
/// stdout and stderr, and fails if it does not exit successfully within `limit`.
///
/// # Errors
///
/// Any [`CommandError`]: the command could not start, failed, ran past `limit`, or this
/// process was told to stop.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<(), CommandError> {
    announce(cmd, limit);
    let out = supervise(cmd, limit, Mode::Inherit)?;
    succeeded(cmd, &out)
}

/// Like [`run_bounded`], but also returns the command's stdout, which is printed as it comes
/// (a chunk at a time, so a half-written line such as libtest's `test name ... ` shows which
/// test still runs).
///
/// # Errors
///
/// As [`run_bounded`].
pub fn run_bounded_tee(cmd: &mut Command, limit: Duration) -> Result<String, CommandError> {
    announce(cmd, limit);
    let out = supervise(cmd, limit, Mode::TeeStdout)?;
    succeeded(cmd, &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` quietly and returns its status, stdout and stderr, like [`Command::output`],
/// but fails if it runs past `limit`. A command that exits unsuccessfully is not an error
/// here; the caller reads the status.
///
/// # Errors
///
/// Any [`CommandError`] but [`CommandError::Failed`].
pub fn output_bounded(cmd: &mut Command, limit: Duration) -> Result<Output, CommandError> {
    supervise(cmd, limit, Mode::Capture)
}

/// The command line as a shell would read it, with the variables it sets first.
pub fn show(cmd: &Command) -> String {
    let quote = |s: &OsStr| {
        let s = s.to_string_lossy();
        if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
            format!("'{}'", s.replace('\'', r"'\''"))
        } else {
            s.into_owned()
        }
    };
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), quote(v))))
        .collect();
    let program = cmd.get_program().to_string_lossy();
    // `$CARGO` is an absolute path into the toolchain; `cargo` reads better.
    let program = match program.rsplit('/').next() {
        Some("cargo") => "cargo".to_string(),
        _ => program.into_owned(),
    };
    parts.push(program);
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

/// A duration as `1m23.4s` or `4.2s`, as the messages here show time limits.
pub fn fmt_duration(d: Duration) -> String {
    // Rounded to tenths before splitting, so that 59.96 s reads `1m00.0s`, not `60.0s`.
    let tenths = (d.as_secs_f64() * 10.0).round() as u64;
    let (minutes, secs) = (tenths / 600, (tenths % 600) as f64 / 10.0);
    if minutes > 0 {
        format!("{minutes}m{secs:04.1}s")
    } else {
        format!("{secs:.1}s")
    }
}

/// What happens to the command's output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Both streams go where this process's go.
    Inherit,
    /// Stdout is printed and kept; stderr goes where this process's goes.
    TeeStdout,
    /// Both streams are kept, none printed.
    Capture,
}

fn announce(cmd: &Command, limit: Duration) {
    println!("$ {}   (time limit {})", show(cmd), fmt_duration(limit));
}

fn succeeded(cmd: &Command, out: &Output) -> Result<(), CommandError> {
    if out.status.success() {
        Ok(())
    } else {
        Err(CommandError::Failed {
            command: show(cmd),
            status: out.status,
        })
    }
}

/// Runs `cmd` in a new process group until it exits, `limit` passes, or this process is told
/// to stop; in the last two cases the group is killed and the command reaped before the
/// error returns.
fn supervise(cmd: &mut Command, limit: Duration, mode: Mode) -> Result<Output, CommandError> {
    let command = show(cmd);
    let _in_flight = InFlight::enter()?;
    if let Some(sig) = interrupt::received() {
        return Err(CommandError::NotStarted {
            command,
            signal: interrupt::name(sig),
        });
    }
    cmd.process_group(0).stdin(Stdio::null());
    if mode != Mode::Inherit {
        cmd.stdout(Stdio::piped());
    }
    if mode == Mode::Capture {
        cmd.stderr(Stdio::piped());
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(source) => return Err(CommandError::Spawn { command, source }),
    };
    let mut group = Group::new(child);
    let echo = mode == Mode::TeeStdout;
    let stdout = group.child.stdout.take().map(|p| Drain::start(p, echo));
    let stderr = group.child.stderr.take().map(|p| Drain::start(p, false));
    let collect = |stdout: Option<Drain>, stderr: Option<Drain>| {
        (
            stdout.map(Drain::finish).unwrap_or_default(),
            stderr.map(Drain::finish).unwrap_or_default(),
        )
    };

    let deadline = Instant::now() + limit;
    loop {
        let exited = match group.try_wait() {
            Ok(s) => s,
            Err(source) => return Err(CommandError::Wait { command, source }),
        };
        if let Some(status) = exited {
            let (stdout, stderr) = collect(stdout, stderr);
            return Ok(Output {
                status,
                stdout,
                stderr,
            });
        }
        if let Some(sig) = interrupt::received() {
            group.stop(sig);
            let _ = collect(stdout, stderr);
            return Err(CommandError::Interrupted {
                command,
                signal: interrupt::name(sig),
            });
        }
        if Instant::now() >= deadline {
            group.kill();
            let (_, stderr) = collect(stdout, stderr);
            let tail = last_lines(&stderr, 20);
            let seen = match mode {
                Mode::Capture if tail.is_empty() => String::new(),
                Mode::Capture => format!("; the end of its stderr:\n{tail}"),
                Mode::Inherit | Mode::TeeStdout => {
                    " (the output above shows how far it got)".to_string()
                }
            };
            return Err(CommandError::TimedOut {
                command,
                limit,
                seen,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// A running command, leader of its own process group.
///
/// Invariant: until `exited` is set the leader is not reaped, so its pid still names the
/// group and cannot be reused: signalling the group cannot reach an unrelated process.
struct Group {
    child: Child,
    pgid: Pid,
    exited: bool,
}

impl Group {
    fn new(child: Child) -> Self {
        let pgid = Pid::from_child(&child);
        Group {
            child,
            pgid,
            exited: false,
        }
    }

    /// The leader's status if it exited (then reaped).
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        self.exited |= status.is_some();
        Ok(status)
    }

    /// Sends `sig` to every process of the group.
    fn signal(&self, sig: Signal) {
        if !self.exited {
            // ESRCH only: the group is already gone.
            let _ = rustix::process::kill_process_group(self.pgid, sig);
        }
    }

    /// SIGKILL to the whole group, then reaps the leader.
    fn kill(&mut self) {
        self.signal(Signal::KILL);
        let _ = self.child.wait();
        self.exited = true;
    }

    /// Passes `sig` on to the group, gives it [`INTERRUPT_GRACE`] to stop, then kills what
    /// is left.
    fn stop(&mut self, sig: Signal) {
        self.signal(sig);
        let deadline = Instant::now() + INTERRUPT_GRACE;
        while Instant::now() < deadline && !self.leader_ended() {
            std::thread::sleep(POLL);
        }
        // Also when the leader is gone: its children may have ignored `sig`.
        self.kill();
    }

    /// Whether the leader ended, without reaping it (which keeps the group's id taken).
    fn leader_ended(&self) -> bool {
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        match rustix::process::waitid(WaitId::Pid(self.pgid), options) {
            Ok(status) => status.is_some(),
            // Nothing left to wait for.
            Err(_) => true,
        }
    }
}

impl Drop for Group {
    /// A command is never left running behind an early return.
    fn drop(&mut self) {
        if !self.exited {
            self.kill();
        }
    }
}

/// A thread reading one of the command's output pipes to its end.
struct Drain {
    buf: Arc<Mutex<Vec<u8>>>,
    done: Receiver<()>,
}

impl Drain {
    /// Starts reading `pipe`; with `echo`, each chunk is also written to this process's stdout.
    fn start(mut pipe: impl Read + Send + 'static, echo: bool) -> Drain {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (tx, done) = std::sync::mpsc::channel();
        let kept = Arc::clone(&buf);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                let n = match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                if echo {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&chunk[..n]);
                    let _ = out.flush();
                }
                kept.lock().extend_from_slice(&chunk[..n]);
            }
            let _ = tx.send(());
        });
        Drain { buf, done }
    }

    /// What was read, once the pipe closed or [`DRAIN_GRACE`] passed.
    fn finish(self) -> Vec<u8> {
        // Ended, or still held open by a process the command left behind: either way, go on.
        let _ = self.done.recv_timeout(DRAIN_GRACE);
        std::mem::take(&mut *self.buf.lock())
    }
}

/// The last `n` lines of `bytes`, as text.
fn last_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a hung step holding CI: the step fails near its limit, and what the
    /// command started in the background dies with it.
    #[test]
    fn bounded_run_kills_a_hung_command_and_its_children() {
        let dir = std::env::temp_dir().join(format!("oxccl-build-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("pid");
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "sleep 300 & echo $! > '{}'; wait",
            pid_file.display()
        ));
        let started = Instant::now();
        let err = run_bounded(&mut c, Duration::from_millis(500)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.to_string().contains("did not finish"), "{err}");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        let deadline = Instant::now() + Duration::from_secs(5);
        // Gone, or a zombie waiting for its new parent to reap it.
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z")) {
            assert!(Instant::now() < deadline, "the background sleep survived");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Guards against a timeout that misses what the command started and then left: a
    /// background process whose parent exited belongs to init, no longer to the command.
    #[test]
    fn bounded_run_kills_orphaned_grandchildren() {
        let dir = std::env::temp_dir().join(format!("oxccl-build-orphan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("pid");
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "(sleep 300 & echo $! > '{}'); exec sleep 300",
            pid_file.display()
        ));
        let err = run_bounded(&mut c, Duration::from_millis(500)).unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let stat = format!("/proc/{}/stat", pid.trim());
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z")) {
            if Instant::now() >= deadline {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
                panic!("the orphaned background sleep survived");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Where [`interrupted_command`] leaves its files; set only in the process that
    /// [`a_stop_signal_stops_the_command_and_its_group`] starts.
    const INTERRUPT_DIR: &str = "OXCCL_BUILD_TEST_INTERRUPT_DIR";

    /// Guards against a command that outlives its caller: SIGINT (Ctrl-C) or SIGTERM reaches
    /// only the caller once the command runs in a process group of its own, so the caller
    /// must pass it on, and kill what ignores it. Runs [`interrupted_command`] in a test
    /// process of its own, since the signal handlers are process-wide.
    #[test]
    fn a_stop_signal_stops_the_command_and_its_group() {
        let dir =
            std::env::temp_dir().join(format!("oxccl-build-interrupt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut test = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "bounded::tests::interrupted_command",
                "--ignored",
            ])
            .env(INTERRUPT_DIR, &dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let sleep_pid = loop {
            let read = std::fs::read_to_string(dir.join("pid")).unwrap_or_default();
            if let Ok(pid) = read.trim().parse::<i32>() {
                break pid;
            }
            assert!(Instant::now() < deadline, "the command never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        let test_pid = rustix::process::Pid::from_child(&test);
        rustix::process::kill_process(test_pid, rustix::process::Signal::INT).unwrap();
        let stat = format!("/proc/{sleep_pid}/stat");
        let deadline = Instant::now() + Duration::from_secs(20);
        let exited = loop {
            if let Some(status) = test.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the caller did not stop after SIGINT"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Gone, or a zombie waiting for its new parent to reap it.
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z")) {
            if Instant::now() >= deadline {
                let _ = Command::new("kill")
                    .args(["-9", &sleep_pid.to_string()])
                    .status();
                panic!("the command's background sleep outlived its caller");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(exited.success(), "{exited}");
        let err = std::fs::read_to_string(dir.join("error")).unwrap_or_default();
        assert!(err.contains("SIGINT"), "error: {err:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The caller's side of [`a_stop_signal_stops_the_command_and_its_group`]: runs a
    /// command whose background `sleep` ignores SIGINT, as a non-interactive shell's
    /// background jobs do, and writes the error the interrupted run returns.
    #[test]
    #[ignore = "started by a_stop_signal_stops_the_command_and_its_group"]
    fn interrupted_command() {
        let Some(dir) = std::env::var_os(INTERRUPT_DIR).map(std::path::PathBuf::from) else {
            return;
        };
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "sleep 300 & echo $! > '{}'; wait",
            dir.join("pid").display()
        ));
        let err = run_bounded(&mut c, Duration::from_secs(60)).unwrap_err();
        std::fs::write(dir.join("error"), format!("{err:#}")).unwrap();
    }

    /// Guards against a bounded run that reports a failing command as passed.
    #[test]
    fn bounded_run_reports_exit_status() {
        assert!(run_bounded(&mut Command::new("true"), Duration::from_secs(30)).is_ok());
        assert!(run_bounded(&mut Command::new("false"), Duration::from_secs(30)).is_err());
    }

    /// Guards against a quiet run that loses what the command printed, or hangs on it.
    #[test]
    fn output_is_captured() {
        let out = output_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    /// Guards against a quiet run that waits forever on a tool that hangs, and against a
    /// timeout error that hides what the tool said before it hung.
    #[test]
    fn quiet_run_is_bounded_and_shows_stderr() {
        let started = Instant::now();
        let err = output_bounded(
            Command::new("sh").args(["-c", "echo connecting >&2; exec sleep 300"]),
            Duration::from_millis(500),
        )
        .unwrap_err()
        .to_string();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(err.contains("did not finish within 0.5s"), "{err}");
        assert!(err.contains("connecting"), "{err}");
    }

    /// Guards against losing the output a tee shows, and against a tee that waits for a
    /// whole line: libtest writes `test name ... ` before the test runs.
    #[test]
    fn tee_returns_stdout() {
        let out = run_bounded_tee(
            Command::new("sh").args(["-c", "printf 'one\\ntwo\\n'"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(out, "one\ntwo\n");
        assert!(run_bounded_tee(&mut Command::new("false"), Duration::from_secs(30)).is_err());
    }

    /// Guards against a missing program that reads as a hang or a pass.
    #[test]
    fn a_missing_program_is_an_error() {
        let err = run_bounded(
            &mut Command::new("/nonexistent/oxccl-build-no-such-tool"),
            Duration::from_secs(30),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot start"), "{err}");
    }

    /// Guards against durations shown with 60 seconds in a minute's place (`19m60.0s`) when
    /// the tenths round up.
    #[test]
    fn durations() {
        assert_eq!(fmt_duration(Duration::from_millis(4200)), "4.2s");
        assert_eq!(fmt_duration(Duration::from_millis(83_400)), "1m23.4s");
        assert_eq!(fmt_duration(Duration::from_millis(1_199_960)), "20m00.0s");
        assert_eq!(fmt_duration(Duration::from_millis(59_960)), "1m00.0s");
        assert_eq!(fmt_duration(Duration::from_millis(59_940)), "59.9s");
    }

    #[test]
    fn shows_env_and_quotes() {
        let mut c = Command::new("/x/bin/cargo");
        c.env("RUSTFLAGS", "-C target-cpu=sm_70")
            .args(["rustc", "-p", "a b"]);
        assert_eq!(
            show(&c),
            "RUSTFLAGS='-C target-cpu=sm_70' cargo rustc -p 'a b'"
        );
    }
}
