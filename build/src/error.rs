//! What can go wrong building or checking a kernel crate: one error type for the crate.
//!
//! Each variant's message says what was being done and, where there is one, the command or
//! file involved; the cause, if any, is its [`source`](std::error::Error::source), as
//! `anyhow`'s `{:#}` or any error reporter prints it.

use crate::bounded::CommandError;
use std::path::PathBuf;
use std::process::ExitStatus;

/// An error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument cannot be used: an architecture name below the floor, a package that is
    /// not in the workspace or is not a kernel crate, a path that is not a file.
    #[error("{0}")]
    InvalidUsage(String),
    /// The Rust toolchain lacks rustup components the nvptx build needs.
    #[error(
        "the Rust toolchain lacks the rustup component(s) {}, needed to build for \
         nvptx64-nvidia-cuda; add them with `rustup component add {}`",
        missing.join(", "),
        missing.join(" ")
    )]
    MissingComponents {
        /// The components missing, by rustup's name (`llvm-bitcode-linker`).
        missing: Vec<String>,
    },
    /// A command failed, ran past its time limit, or was stopped.
    #[error("{doing}")]
    Command {
        /// What the command was for (`building my-kernels for sm_90`).
        doing: String,
        /// How it failed.
        #[source]
        source: CommandError,
    },
    /// Reading, writing or copying a file failed.
    #[error("{doing}")]
    Io {
        /// What was being done (`copying <from> to <to>`).
        doing: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `cargo metadata` failed, or its output could not be read.
    #[error("reading the workspace with `cargo metadata`: {0}")]
    Metadata(String),
    /// Cargo built the crate but left no `.ptx` where llvm-bitcode-linker writes it.
    #[error("cargo built {package} for {arch} but left no {file} in {}", dir.display())]
    NoPtx {
        /// The package.
        package: String,
        /// The architecture.
        arch: String,
        /// The file looked for (`my_kernels.ptx`).
        file: String,
        /// Where it was looked for (and in its `deps/`).
        dir: PathBuf,
    },
    /// ptxas could not be found or installed.
    #[error("{0}")]
    PtxasUnavailable(String),
    /// ptxas rejected a PTX module.
    #[error("ptxas rejected {} for {arch} ({status}):\n{errors}", ptx.display())]
    PtxasRejected {
        /// The module.
        ptx: PathBuf,
        /// The architecture it was assembled for.
        arch: String,
        /// ptxas's exit status.
        status: ExitStatus,
        /// ptxas's error lines (all of its stderr if it printed none).
        errors: String,
    },
}

/// `e` and each of its causes, after a colon: what `anyhow`'s `{:#}` shows, for a build
/// script's `panic!` or a tool's message.
///
/// ```
/// let e = oxccl_build::Ptx::new("my-kernels").arch("sm_60").build().unwrap_err();
/// assert!(oxccl_build::error::with_causes(&e).contains("below sm_70"));
/// ```
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Command`] for `source`, which was `doing`.
    pub(crate) fn command(doing: impl Into<String>, source: CommandError) -> Error {
        Error::Command {
            doing: doing.into(),
            source,
        }
    }

    /// An [`Error::Io`] for `source`, which was `doing`.
    pub(crate) fn io(doing: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            doing: doing.into(),
            source,
        }
    }
}
