//! Kernels shipped with oxccl, each written once for the GPU and the CPU emulator.
//!
//! Conventions: a kernel that fails (a wait times out, a call is refused) returns early;
//! the failing call has raised its handle's abort flag, which the host turns into an error
//! naming the channel. Where one thread waits for the block, the block decides together
//! whether to stop with `arch::sync_threads_or`, so no thread is left waiting at a barrier
//! the others will never reach. Calls that every thread makes with the same arguments
//! (bounds checks of a split copy) fail alike on every thread.

pub mod all_reduce;
pub mod packet_all_reduce;
pub mod packet_exchange;
pub mod pingpong;
pub mod ring_exchange;
