//! GPU architectures: which a kernel crate can be built for, and the LLVM target.
//!
//! An architecture is named as ptxas and `-C target-cpu` name it: `sm_70`, `sm_90`, `sm_90a`.
//! PTX built for one architecture runs on it and on every later GPU (the driver compiles it
//! for the device when loading), never on an earlier one; `oxccl::ptx::locate_for_device`
//! picks the newest module a device can run.

use crate::error::{Error, Result};

/// The LLVM target of NVIDIA GPUs.
pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// The lowest architecture supported: acquire/release loads and stores and `nanosleep` need
/// Volta, and llc crashes on atomics for older targets. PTX for it runs on every GPU oxccl
/// supports.
pub const MIN_ARCH: &str = "sm_70";

/// Architectures built when none is named: Volta (the floor), Ampere, Hopper.
pub const DEFAULT_ARCHES: &[&str] = &["sm_70", "sm_80", "sm_90"];

/// Checks `arch` names an architecture kernel crates can be built for.
///
/// # Errors
///
/// [`Error::InvalidUsage`] if it is not a name like `sm_90`, or is below [`MIN_ARCH`].
pub fn validate_arch(arch: &str) -> Result<()> {
    match arch_number(arch) {
        Some(n) if n >= 70 => Ok(()),
        Some(_) => Err(Error::InvalidUsage(format!(
            "`{arch}` is below sm_70, the floor: acquire/release and nanosleep need it \
             (and llc crashes on atomics for older targets)"
        ))),
        None => Err(Error::InvalidUsage(format!(
            "`{arch}` is not an architecture name like `sm_90`"
        ))),
    }
}

/// `90` for `sm_90` and `sm_90a`.
pub(crate) fn arch_number(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_")
        .map(|n| n.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arches() {
        assert!(validate_arch("sm_70").is_ok());
        assert!(validate_arch("sm_90a").is_ok());
        assert!(validate_arch("sm_120").is_ok());
        let low = validate_arch("sm_60").unwrap_err().to_string();
        assert!(low.contains("floor"), "{low}");
        assert!(validate_arch("compute_90").is_err());
        assert!(validate_arch("sm_").is_err());
        assert!(validate_arch("").is_err());
        for arch in DEFAULT_ARCHES.iter().chain([&MIN_ARCH]) {
            assert!(validate_arch(arch).is_ok(), "{arch}");
        }
    }
}
