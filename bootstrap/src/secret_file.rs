//! Reading the secret from the file `OXCCL_SECRET_FILE` names.
//!
//! The file holds the secret as 32 hex digits; whitespace around them is ignored (a final
//! newline, an indented line). What the reading guarantees, whatever the path names:
//! - it never blocks: the file is opened non-blocking, and anything but a regular file (a
//!   FIFO, a device, a directory) is refused before a byte is read;
//! - it reads at most [`MAX_SECRET_FILE_BYTES`] (plus one, to tell a longer file);
//! - no error message repeats any of the file's content, which is (part of) a secret;
//! - a file that group or others may read is used, with a warning: on a shared machine
//!   they can join the job.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;

use rustix::fs::{Mode, OFlags};

use crate::env::{ENV_SECRET_FILE, secret_problem};
use crate::error::{Error, Result};
use crate::unique_id::Secret;

/// Largest secret file read: 32 hex digits need far less, and a larger file is a mistake
/// (a wrong path) that must not make this rank read without bound.
pub(crate) const MAX_SECRET_FILE_BYTES: usize = 4096;

/// Permission bits that let group or others read a file.
const READABLE_BY_OTHERS: u32 = 0o044;

/// Reads the secret from `path`, the value of `OXCCL_SECRET_FILE`.
///
/// # Errors
/// [`Error::System`] if the file cannot be opened or read; [`Error::InvalidUsage`] if it is
/// not a regular file, is larger than [`MAX_SECRET_FILE_BYTES`], or does not hold exactly
/// 32 hex digits. Each names the variable and the path, never the content.
pub(crate) fn read(path: &str) -> Result<Secret> {
    let what = format!("{ENV_SECRET_FILE}={path:?}");
    // Non-blocking, so a FIFO with no writer cannot stall the open; the flag has no effect
    // on the regular file read below.
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::system(format!("opening the secret file {what}"), e.into()))?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| Error::system(format!("reading the metadata of {what}"), e))?;
    if !meta.is_file() {
        return Err(Error::InvalidUsage(format!(
            "{what} is not a regular file; it must hold the secret as 32 hex digits"
        )));
    }
    let mode = meta.permissions().mode();
    if mode & READABLE_BY_OTHERS != 0 {
        tracing::warn!(
            "oxccl bootstrap: the secret file {what} may be read by group or others (mode \
             {:03o}); whoever can read it can join this job: chmod 600 it",
            mode & 0o777
        );
    }
    let mut bytes = Vec::with_capacity(64);
    file.take(MAX_SECRET_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::system(format!("reading the secret file {what}"), e))?;
    if bytes.len() > MAX_SECRET_FILE_BYTES {
        return Err(Error::InvalidUsage(format!(
            "{what} holds more than {MAX_SECRET_FILE_BYTES} bytes; it must hold the secret \
             as 32 hex digits"
        )));
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        Error::InvalidUsage(format!(
            "{what} is not text; it must hold the secret as 32 hex digits"
        ))
    })?;
    Secret::from_hex(text)
        .map_err(|e| Error::InvalidUsage(format!("{what}: {}", secret_problem(e))))
}
