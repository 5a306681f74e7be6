//! oxccl: one-sided, GPU-initiated communication primitives.
#![warn(missing_docs)]

pub mod error;

pub use error::{Error, Result};
