//! External programs, and the facts about the environment that decide how to get them.

use crate::bounded::output_bounded;
use std::process::Command;
use std::time::Duration;

/// Longest a program's `--version` may take when asking whether it exists: it reads local
/// files only.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(60);

/// An external program, looked up on `PATH`.
#[derive(Clone, Debug)]
pub struct Tool {
    program: String,
}

impl Tool {
    /// The program `name`.
    pub fn new(name: &str) -> Self {
        Tool {
            program: name.to_string(),
        }
    }

    /// The cargo that runs this program (`$CARGO`, which cargo sets for what it runs: build
    /// scripts, `cargo run`), else `cargo` on `PATH`, so every build uses the same toolchain.
    pub fn cargo() -> Self {
        Tool {
            program: std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()),
        }
    }

    /// A command running this program.
    pub fn cmd(&self) -> Command {
        Command::new(&self.program)
    }

    /// Whether the program can be started (and answers `--version` in time).
    pub fn exists(&self) -> bool {
        output_bounded(self.cmd().arg("--version"), QUERY_TIME_LIMIT).is_ok()
    }
}

/// Whether we run under CI (`CI=true`, as GitHub Actions, GitLab and most runners set it).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the process runs as root (then apt-get may install packages).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
