//! Host side of the trigger FIFO and the proxy service.
#![warn(missing_docs)]

pub mod error;

pub use error::ProxyError;
