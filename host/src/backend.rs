//! Which machine kernels and device memory live on.
//!
//! [`Backend::Cpu`] is the emulator: kernels run on OS threads and device memory is host
//! memory; it is always available. [`Backend::Cuda`] is an NVIDIA GPU through the CUDA
//! driver (loaded at run time: a machine without one gets a clear error, never a crash).
//! [`Backend::Auto`] is Cuda when a driver and a device are present, else Cpu, and says which
//! and why in the log (`tracing`, level `info`).

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
    /// An NVIDIA GPU, through the CUDA driver API.
    Cuda,
    /// [`Backend::Cuda`] if the CUDA driver loads and reports a device, else
    /// [`Backend::Cpu`]; [`Backend::resolve`] tells which.
    Auto,
}

impl Backend {
    /// The backend named by `OXCCL_BACKEND`, or [`Backend::Cpu`] when it is unset or empty.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] if the variable names no backend (`auto`, `cpu` or
    /// `cuda`, case-insensitive) or is not valid Unicode.
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
                "{BACKEND_ENV}={raw:?} is not valid Unicode; expected `auto`, `cpu` or `cuda`"
            ))),
        }
    }

    /// The backend's name as `OXCCL_BACKEND` spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Auto => "auto",
        }
    }

    /// How many CUDA devices the driver reports.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] with the reason when the CUDA backend cannot be used
    /// here: no driver library, a driver that fails to initialize, no device.
    pub fn cuda_device_count() -> Result<u32> {
        crate::cuda::driver::device_count().map_err(Error::BackendUnavailable)
    }

    /// The backend devices open on: `Cpu` and `Cuda` as they are (whether `Cuda` can be
    /// used is found when a device is opened), `Auto` as Cuda if the CUDA driver loads and
    /// reports a device, else Cpu, logged with the reason.
    pub fn resolve(self) -> Backend {
        match self {
            Backend::Auto => match crate::cuda::driver::device_count() {
                Ok(devices) => {
                    tracing::info!(devices, "backend auto: cuda (the driver reports devices)");
                    Backend::Cuda
                }
                Err(why) => {
                    tracing::info!(%why, "backend auto: cpu (the CPU emulator)");
                    Backend::Cpu
                }
            },
            other => other,
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

    /// Parses a backend name (`auto`, `cpu` or `cuda`, case-insensitive, surrounding
    /// blanks ignored).
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] for any other name, saying which ones exist.
    fn from_str(s: &str) -> Result<Backend> {
        let name = s.trim();
        [Backend::Cpu, Backend::Cuda, Backend::Auto]
            .into_iter()
            .find(|b| name.eq_ignore_ascii_case(b.name()))
            .ok_or_else(|| {
                Error::BackendUnavailable(format!(
                    "unknown backend `{name}`; the backends are `auto`, `cpu` (the CPU \
                     emulator) and `cuda`"
                ))
            })
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
        assert_eq!("cuda".parse::<Backend>().unwrap(), Backend::Cuda);
        assert_eq!("Auto".parse::<Backend>().unwrap(), Backend::Auto);
        for bad in ["gpu", "cpus", "cuda12", ""] {
            let err = bad.parse::<Backend>().unwrap_err();
            assert!(matches!(err, Error::BackendUnavailable(_)), "{bad}: {err}");
            assert!(err.to_string().contains("cpu"), "{err}");
        }
        assert_eq!(Backend::Cpu.to_string(), "cpu");
        assert_eq!(Backend::Cuda.to_string(), "cuda");
    }
}
