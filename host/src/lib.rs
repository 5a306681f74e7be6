//! oxccl: one-sided, GPU-initiated communication primitives.
#![warn(missing_docs)]

pub mod backend;
mod cpu;
pub mod device;
pub mod device_buffer;
pub mod error;
pub mod stream;

pub use backend::Backend;
pub use device::Device;
pub use device_buffer::DeviceBuffer;
pub use error::{Error, Result};
pub use stream::Stream;
