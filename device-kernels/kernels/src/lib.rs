//! Kernels shipped with oxccl, each written once for the GPU and the CPU emulator, with the
//! public device API of [`oxccl_device`] as any kernel crate is: this crate is built to PTX
//! like a user's (`cargo xtask build-ptx`), and `oxccl-device` itself holds no kernel, so a
//! user's kernel crate links beside it without clashing names.
//!
//! Conventions:
//! - A kernel returns `Result<(), DeviceError>`: a failing call has recorded its error in its
//!   channel's abort record (the host names the channel), and the emulator also reports the
//!   returned error from `synchronize`.
//! - Where one thread signals or waits for the block, the block decides together whether to
//!   stop with the helpers of [`oxccl_device::block`] (`block_signal`, `block_wait`,
//!   `block_signal_and_wait`), so no thread is left waiting at a barrier the others never
//!   reach.
//!   Calls that every thread makes with the same arguments (bounds checks of a split copy)
//!   fail alike on every thread.
//! - Every kernel may be launched again on the same channels right after the previous
//!   launch, with no host barrier: kernels that write into a peer's buffer first take part
//!   in a ready handshake ([`oxccl_device::handshake::ready_handshake`]) or use per-call flags and slot sets.
//! - Kernels written for one block say so (`#[kernel(max_blocks = 1)]`): a larger grid is
//!   refused before it runs.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod all_reduce;
pub mod collectives;
pub mod device_check;
pub mod packet_all_reduce;
pub mod packet_exchange;
pub mod pingpong;
pub mod probes;
pub mod put_bandwidth;
pub mod ring_exchange;
