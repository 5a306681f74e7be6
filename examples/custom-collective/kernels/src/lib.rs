//! The kernels of the custom-collective example, written with the public device API of
//! `oxccl-device` only, as a kernel crate of your own would be:
//!
//! | kernel | channels | what it does |
//! |---|---|---|
//! | [`memory_all_gather()`] | a memory channel to every peer | each rank stores its chunk straight into every peer's buffer, then signals it |
//! | [`port_broadcast()`] | a port channel to every peer | the root asks the host proxy to copy its buffer into every peer's, with a signal after each copy |
//!
//! One source, two targets: on the host this is an `rlib` the example's program links, and
//! the CPU emulator runs every thread of a launch as a thread of the process; for the GPU,
//! `oxccl-build` builds it to PTX (`nvptx64-nvidia-cuda`). Both kernels may be launched again
//! on the same channels right away, with no host barrier in between: each starts with a
//! ready handshake (see [`oxccl_device::handshake`]). `examples/custom-collective/README.md`
//! walks through them line by line.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

pub mod all_gather;
pub mod broadcast;
pub mod peers;

pub use all_gather::{AllGatherArgs, memory_all_gather};
pub use broadcast::{BroadcastArgs, port_broadcast};

/// Bytes of one element: views count elements, channels count bytes.
pub const ELEM_BYTES: u64 = core::mem::size_of::<u32>() as u64;
