//! Kernels shipped with oxccl, each written once for the GPU and the CPU emulator.
//!
//! Conventions: a kernel that fails (a wait times out, a call is refused) returns early;
//! the failing call has raised its handle's abort flag, which the host turns into an error
//! naming the channel. Where threads of a block meet at a barrier after a wait, every thread
//! checks the abort flag after the barrier, so a block fails together instead of leaving
//! threads stuck at the next barrier.

pub mod all_reduce;
pub mod packet_exchange;
pub mod pingpong;
pub mod ring_exchange;
