//! The host side of the custom-collective example: runs the two kernels of
//! `custom-collective-kernels` (an all-gather over memory channels, a broadcast over port
//! channels) on ranks that are threads of one process, each with its own emulated device,
//! launching each kernel several times back to back, and checks every element of every
//! launch on the host. `--build-ptx` builds the same kernels to PTX instead.
//!
//! | file | what it does |
//! |---|---|
//! | [`options`] | what to run: ranks, elements, launches, threads |
//! | [`data`] | the value each element holds, and the comparison with what arrived |
//! | [`all_gather`] | one rank's all-gather: buffers, memory channels, launches, check |
//! | [`broadcast`] | one rank's broadcast: buffers, port channels, launches, check |
//! | [`job`] | every rank, both collectives, one [`job::Report`] |
//! | [`ptx`] | the kernel crate to PTX through `oxccl-build` |
//!
//! `examples/custom-collective/README.md` walks through it.
#![warn(missing_docs)]

pub mod all_gather;
pub mod broadcast;
pub mod data;
pub mod job;
pub mod options;
pub mod ptx;

pub use job::{Report, run};
pub use options::Options;
