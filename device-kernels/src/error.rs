//! What a device call returns when it cannot do what was asked, and which call it was.

/// Why a device operation gave up. Device calls never hang and never write out of bounds:
/// they return one of these, and the first failure on a channel also records it in the
/// channel's abort record (see [`crate::abort`]) so the host can tell which rank, channel and
/// operation failed, and why.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// A wait ran past its handle's time limit.
    Timeout = 1,
    /// Another thread, channel or rank failed (or the host stopped the rank); this call
    /// stopped early.
    Aborted = 2,
    /// An offset and size fall outside the memory the handle describes.
    OutOfBounds = 3,
    /// An argument the call cannot accept (zero-sized element, misaligned offset, flag 0, a
    /// zero time limit, ...).
    InvalidArgument = 4,
    /// The handle was never set up by the host (a zeroed handle).
    NullHandle = 5,
    /// The kernel was launched with a grid or block it does not support.
    UnsupportedLaunch = 6,
    /// An index a device view or a channel set does not hold: past the end of a view, or a
    /// peer the set has no channel to. Nothing was accessed. No channel record carries it,
    /// so on the GPU a kernel that returns it traps (see [`crate::kernel_return`]).
    OutOfRange = 7,
}

impl DeviceError {
    /// The error's code, as written into an abort record.
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
            5 => Some(DeviceError::NullHandle),
            6 => Some(DeviceError::UnsupportedLaunch),
            7 => Some(DeviceError::OutOfRange),
            _ => None,
        }
    }
}

impl core::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DeviceError::Timeout => "wait timed out",
            DeviceError::Aborted => "aborted: another thread, channel or rank failed first",
            DeviceError::OutOfBounds => "offset and size out of bounds",
            DeviceError::InvalidArgument => "invalid argument",
            DeviceError::NullHandle => {
                "handle never set up by the host (zeroed): build handles with `device_handle()`"
            }
            DeviceError::UnsupportedLaunch => "launch shape not supported by the kernel",
            DeviceError::OutOfRange => "index out of range of a device view or channel set",
        })
    }
}

impl core::error::Error for DeviceError {}

/// Which device call failed, as recorded with the error. The detail words of an abort
/// record (see [`crate::abort::AbortRecord`]) mean what each variant's doc says.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// Not known (a record raised by an older layout, or by the host).
    Unknown = 0,
    /// `FifoDeviceHandle::push` waiting for room: `[position, tail, slots]`.
    FifoPush = 1,
    /// `FifoDeviceHandle::sync` waiting for the proxy: `[position, tail, 0]`.
    FifoSync = 2,
    /// A semaphore `wait`: `[signal number waited for, signals arrived, 0]`.
    SemaphoreWait = 3,
    /// A semaphore `signal`: no details.
    SemaphoreSignal = 4,
    /// `PortChannelDeviceHandle::put` (and its `_with_signal` forms): `[dst_off, src_off, bytes]`.
    PortPut = 5,
    /// `MemoryChannelDeviceHandle::put`: `[dst_off, bytes, registered bytes of the side out of bounds]`.
    MemoryPut = 6,
    /// `MemoryChannelDeviceHandle::get`: as [`DeviceOp::MemoryPut`].
    MemoryGet = 7,
    /// `MemoryChannelDeviceHandle::read`: `[byte offset, element bytes, registered bytes]`.
    MemoryRead = 8,
    /// `MemoryChannelDeviceHandle::write`: as [`DeviceOp::MemoryRead`].
    MemoryWrite = 9,
    /// `put_packets`: `[packet offset, data bytes, flag]`.
    PutPackets = 10,
    /// `unpack_packets`: `[packet offset, data bytes, flag]`; on timeout
    /// `[packet byte offset, flag waited for, flag seen]`.
    UnpackPackets = 11,
    /// `write_packet`: `[packet byte offset, packet bytes, registered bytes]`.
    WritePacket = 12,
    /// `read_packet`: as [`DeviceOp::WritePacket`]; on timeout
    /// `[packet byte offset, flag waited for, flag seen]`.
    ReadPacket = 13,
    /// A kernel's own check of its arguments or launch shape: kernel-defined details.
    Kernel = 14,
    /// An element access or sub-view of a [`crate::device_view`] view:
    /// `[index or range start, range end (or 0), view length]`.
    View = 15,
    /// `ChannelSetDeviceHandle::get`: `[peer, set length, 0]`.
    ChannelSet = 16,
    /// A grid barrier: on timeout `[barrier waited for, blocks arrived, blocks expected]`;
    /// for a call it cannot accept `[blocks asked for, blocks in the grid, caller's block]`.
    GridBarrier = 17,
}

impl DeviceOp {
    /// The op with code `code`, or [`DeviceOp::Unknown`].
    pub const fn from_code(code: u8) -> DeviceOp {
        match code {
            1 => DeviceOp::FifoPush,
            2 => DeviceOp::FifoSync,
            3 => DeviceOp::SemaphoreWait,
            4 => DeviceOp::SemaphoreSignal,
            5 => DeviceOp::PortPut,
            6 => DeviceOp::MemoryPut,
            7 => DeviceOp::MemoryGet,
            8 => DeviceOp::MemoryRead,
            9 => DeviceOp::MemoryWrite,
            10 => DeviceOp::PutPackets,
            11 => DeviceOp::UnpackPackets,
            12 => DeviceOp::WritePacket,
            13 => DeviceOp::ReadPacket,
            14 => DeviceOp::Kernel,
            15 => DeviceOp::View,
            16 => DeviceOp::ChannelSet,
            17 => DeviceOp::GridBarrier,
            _ => DeviceOp::Unknown,
        }
    }

    /// The call, as a user wrote it.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceOp::Unknown => "a device call",
            DeviceOp::FifoPush => "FIFO push",
            DeviceOp::FifoSync => "FIFO sync (flush)",
            DeviceOp::SemaphoreWait => "wait",
            DeviceOp::SemaphoreSignal => "signal",
            DeviceOp::PortPut => "put",
            DeviceOp::MemoryPut => "put",
            DeviceOp::MemoryGet => "get",
            DeviceOp::MemoryRead => "read",
            DeviceOp::MemoryWrite => "write",
            DeviceOp::PutPackets => "put_packets",
            DeviceOp::UnpackPackets => "unpack_packets",
            DeviceOp::WritePacket => "write_packet",
            DeviceOp::ReadPacket => "read_packet",
            DeviceOp::Kernel => "the kernel's argument check",
            DeviceOp::View => "a device view access",
            DeviceOp::ChannelSet => "a channel set lookup",
            DeviceOp::GridBarrier => "a grid barrier",
        }
    }
}

impl core::fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
