//! What a device call returns when it cannot do what was asked.

/// Why a device operation gave up. Device calls never hang and never write out of bounds:
/// they return one of these, and the first one also raises the handle's abort flag so the
/// host can tell which rank, channel and operation failed.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// A wait ran past its handle's time limit.
    Timeout = 1,
    /// Another thread (or the host) raised the abort flag; this wait stopped early.
    Aborted = 2,
    /// An offset and size fall outside the memory the handle describes.
    OutOfBounds = 3,
    /// An argument the call cannot accept (zero-sized element, misaligned packet offset, ...).
    InvalidArgument = 4,
}

impl DeviceError {
    /// The error's code, as written into an abort flag.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The error with code `code`, if any.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(DeviceError::Timeout),
            2 => Some(DeviceError::Aborted),
            3 => Some(DeviceError::OutOfBounds),
            4 => Some(DeviceError::InvalidArgument),
            _ => None,
        }
    }
}

impl core::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DeviceError::Timeout => "wait timed out",
            DeviceError::Aborted => "aborted by another thread or the host",
            DeviceError::OutOfBounds => "offset and size out of bounds",
            DeviceError::InvalidArgument => "invalid argument",
        })
    }
}
