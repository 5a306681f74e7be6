//! Which machine kernels and device memory live on.
//!
//! [`Backend::Cpu`] is the emulator: kernels run on OS threads and device memory is host
//! memory; it is always available. A `Cuda` backend (real GPUs) and `Auto` (Cuda when a
//! driver and a device are present, else Cpu) take their place here when they land, so
//! the enum is `#[non_exhaustive]`.

use crate::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Environment variable that chooses the backend for [`Backend::from_env`].
pub const BACKEND_ENV: &str = "OXCCL_BACKEND";

/// A kind of device that oxccl can run kernels on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Backend {
    /// The CPU emulator: each kernel thread is an OS thread, device memory is page-aligned
    /// host memory. Runs everywhere.
    #[default]
    Cpu,
}

impl Backend {
    /// The backend named by `OXCCL_BACKEND`, or [`Backend::Cpu`] when it is unset or empty.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] if the variable names a backend this build cannot
    /// use (anything but `cpu`, case-insensitive) or is not valid Unicode.
    ///
    /// # Examples
    /// ```
    /// let backend = oxccl::Backend::from_env()?; // `cpu` unless OXCCL_BACKEND says otherwise
    /// let device = oxccl::Device::new(backend, 0)?;
    /// assert_eq!(device.backend(), backend);
    /// # Ok::<(), oxccl::Error>(())
    /// ```
    pub fn from_env() -> Result<Backend> {
        match std::env::var(BACKEND_ENV) {
            Ok(value) if value.trim().is_empty() => Ok(Backend::Cpu),
            Ok(value) => value.parse().map_err(|err| match err {
                Error::BackendUnavailable(why) => {
                    Error::BackendUnavailable(format!("{BACKEND_ENV}: {why}"))
                }
                other => other,
            }),
            Err(std::env::VarError::NotPresent) => Ok(Backend::Cpu),
            Err(std::env::VarError::NotUnicode(raw)) => Err(Error::BackendUnavailable(format!(
                "{BACKEND_ENV}={raw:?} is not valid Unicode; expected `cpu`"
            ))),
        }
    }

    /// The backend's name as `OXCCL_BACKEND` spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;

    /// Parses a backend name (`cpu`, case-insensitive, surrounding blanks ignored).
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] for any other name, saying which ones exist.
    fn from_str(s: &str) -> Result<Backend> {
        let name = s.trim();
        if name.eq_ignore_ascii_case("cpu") {
            Ok(Backend::Cpu)
        } else if name.eq_ignore_ascii_case("cuda") || name.eq_ignore_ascii_case("auto") {
            Err(Error::BackendUnavailable(format!(
                "backend `{name}` is not part of this build; the available backend is `cpu` \
                 (the CPU emulator)"
            )))
        } else {
            Err(Error::BackendUnavailable(format!(
                "unknown backend `{name}`; the available backend is `cpu` (the CPU emulator)"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against a typo in OXCCL_BACKEND silently running on some other backend.
    #[test]
    fn parses_names_and_refuses_others() {
        assert_eq!("cpu".parse::<Backend>().unwrap(), Backend::Cpu);
        assert_eq!(" CPU ".parse::<Backend>().unwrap(), Backend::Cpu);
        for bad in ["cuda", "gpu", "cpus", ""] {
            let err = bad.parse::<Backend>().unwrap_err();
            assert!(matches!(err, Error::BackendUnavailable(_)), "{bad}: {err}");
            assert!(err.to_string().contains("cpu"), "{err}");
        }
        assert_eq!(Backend::Cpu.to_string(), "cpu");
    }
}
