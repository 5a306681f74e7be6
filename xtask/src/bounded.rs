//! Running external commands under a deadline, in a process group of their own.
//!
//! Every command xtask runs goes through here, so none can hold a CI step forever: past its
//! limit the command's whole process group gets SIGKILL, then the command is reaped, and the
//! error names the command and the limit. The group is what makes that complete: `cargo
//! test` starts test binaries, `pip` starts builds, and a process whose parent exited is
//! still in the group, though no longer anyone's descendant.
//!
//! The group is not the terminal's foreground group, so Ctrl-C reaches xtask only; xtask
//! passes it on to the group (see [`crate::interrupt`]). For the same reason standard input
//! is `/dev/null`: a process of a background group that reads the terminal is stopped
//! (SIGTTIN), and no step has anything to read.

use crate::interrupt::{self, InFlight};
use crate::util::{fmt_duration, show};
use anyhow::{Context, Result, bail};
use parking_lot::Mutex;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// How often the supervisor looks at the command, its deadline and the signals.
const POLL: Duration = Duration::from_millis(50);

/// How long a command has to stop after xtask passed a SIGINT or SIGTERM on to it, before
/// its group gets SIGKILL (a shell's background jobs ignore SIGINT).
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// How long to wait, once the command ended, for the end of its output: a process it left
/// running may hold the pipe open.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Prints `cmd` (with the environment it sets) and its limit, runs it with the terminal's
/// stdout and stderr, and fails if it does not exit successfully within `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<()> {
    announce(cmd, limit);
    let shown = show(cmd);
    let out = supervise(cmd, limit, Mode::Inherit)?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    Ok(())
}

/// Like [`run_bounded`], but also returns the command's stdout, which is printed as it comes
/// (a chunk at a time, so a half-written line such as libtest's `test name ... ` shows which
/// test still runs).
pub fn run_bounded_tee(cmd: &mut Command, limit: Duration) -> Result<String> {
    announce(cmd, limit);
    let shown = show(cmd);
    let out = supervise(cmd, limit, Mode::TeeStdout)?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` quietly and returns its status, stdout and stderr, like [`Command::output`],
/// but fails if it runs past `limit`. A command that exits unsuccessfully is not an error
/// here; the caller reads the status.
pub fn output_bounded(cmd: &mut Command, limit: Duration) -> Result<Output> {
    supervise(cmd, limit, Mode::Capture)
}

/// What happens to the command's output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Both streams go where xtask's go.
    Inherit,
    /// Stdout is printed and kept; stderr goes where xtask's goes.
    TeeStdout,
    /// Both streams are kept, none printed.
    Capture,
}

fn announce(cmd: &Command, limit: Duration) {
    println!("$ {}   (time limit {})", show(cmd), fmt_duration(limit));
}

/// Runs `cmd` in a new process group until it exits, `limit` passes, or xtask is told to
/// stop; in the last two cases the group is killed and the command reaped before the error
/// returns.
fn supervise(cmd: &mut Command, limit: Duration, mode: Mode) -> Result<Output> {
    let shown = show(cmd);
    let _in_flight = InFlight::enter()?;
    if let Some(sig) = interrupt::received() {
        bail!(
            "`{shown}` not started: xtask received {}",
            interrupt::name(sig)
        );
    }
    cmd.process_group(0).stdin(Stdio::null());
    if mode != Mode::Inherit {
        cmd.stdout(Stdio::piped());
    }
    if mode == Mode::Capture {
        cmd.stderr(Stdio::piped());
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{shown}`"))?;
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
        if let Some(status) = group.try_wait()? {
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
            bail!(
                "`{shown}` stopped: xtask received {} and passed it on to the command's \
                 process group (what still ran {} later was killed)",
                interrupt::name(sig),
                fmt_duration(INTERRUPT_GRACE)
            );
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
            bail!(
                "`{shown}` did not finish within {} and was killed with everything it \
                 started{seen}",
                fmt_duration(limit)
            );
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
    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let status = self.child.try_wait().context("waiting for a command")?;
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
    /// Starts reading `pipe`; with `echo`, each chunk is also written to xtask's stdout.
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
        let dir = std::env::temp_dir().join(format!("xtask-bounded-{}", std::process::id()));
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
        let dir = std::env::temp_dir().join(format!("xtask-orphan-{}", std::process::id()));
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
    /// [`a_signal_to_xtask_stops_the_command_and_its_group`] starts.
    const INTERRUPT_DIR: &str = "XTASK_TEST_INTERRUPT_DIR";

    /// Guards against a command that outlives xtask: SIGINT (Ctrl-C) or SIGTERM reaches only
    /// xtask once the command runs in a process group of its own, so xtask must pass it on,
    /// and kill what ignores it. Runs [`interrupted_command`] in a test process of its own,
    /// since the signal handlers are process-wide.
    #[test]
    fn a_signal_to_xtask_stops_the_command_and_its_group() {
        let dir = std::env::temp_dir().join(format!("xtask-interrupt-{}", std::process::id()));
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
            assert!(Instant::now() < deadline, "xtask did not stop after SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Gone, or a zombie waiting for its new parent to reap it.
        while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z")) {
            if Instant::now() >= deadline {
                let _ = Command::new("kill")
                    .args(["-9", &sleep_pid.to_string()])
                    .status();
                panic!("the command's background sleep outlived xtask");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(exited.success(), "{exited}");
        let err = std::fs::read_to_string(dir.join("error")).unwrap_or_default();
        assert!(err.contains("SIGINT"), "error: {err:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The xtask side of [`a_signal_to_xtask_stops_the_command_and_its_group`]: runs a
    /// command whose background `sleep` ignores SIGINT, as a non-interactive shell's
    /// background jobs do, and writes the error the interrupted run returns.
    #[test]
    #[ignore = "started by a_signal_to_xtask_stops_the_command_and_its_group"]
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
            &mut Command::new("/nonexistent/xtask-no-such-tool"),
            Duration::from_secs(30),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot start"), "{err}");
    }

    /// Guards against a step that can hang CI again: outside this file, xtask starts
    /// programs only through [`run_bounded`] and its siblings, never with `Command::status`,
    /// `output` or `spawn`, which wait without a limit.
    #[test]
    fn no_command_runs_unbounded() {
        use syn::visit::Visit;

        struct Calls<'a> {
            file: &'a str,
            found: Vec<String>,
        }
        impl<'ast> Visit<'ast> for Calls<'_> {
            fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
                let is_test = m.attrs.iter().any(|a| {
                    a.path().is_ident("cfg")
                        && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
                });
                if !is_test {
                    syn::visit::visit_item_mod(self, m);
                }
            }
            fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
                let method = call.method.to_string();
                if call.args.is_empty() && ["status", "output", "spawn"].contains(&&*method) {
                    self.found.push(format!("{}: .{method}()", self.file));
                }
                syn::visit::visit_expr_method_call(self, call);
            }
        }

        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".rs") || name == "bounded.rs" {
                continue;
            }
            let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let mut calls = Calls {
                file: &name,
                found: Vec::new(),
            };
            calls.visit_file(&file);
            found.extend(calls.found);
        }
        found.sort();
        assert!(found.is_empty(), "unbounded commands: {found:#?}");
    }
}
