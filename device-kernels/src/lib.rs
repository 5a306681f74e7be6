//! Device side of oxccl: everything that runs inside a kernel.
//!
//! One source serves two targets:
//!
//! | target | what the `arch` layer maps to |
//! |---|---|
//! | `nvptx64-nvidia-cuda` | special registers, `bar.sync`, scoped PTX loads/stores/atomics (`asm!`) |
//! | any host target | the CPU emulator: thread-locals set by the launcher, a per-block barrier, core atomics |
//!
//! The crate is `no_std`; on host targets it links `std` for the emulator. Under
//! `--cfg oxccl_loom` every atomic comes from `loom`, so the FIFO and semaphore protocols are
//! model-checked (`cargo xtask loom`).
//!
//! Layers, from the bottom:
//! - [`arch`]: thread indices, barriers, fences, clocks and the one atomic shim
//!   ([`arch::atomic`]). All `unsafe` that touches hardware lives here.
//! - Shared layouts, each `#[repr(C)]` + [`bytemuck::Pod`] with size asserts, each in the file
//!   of its concept: [`fifo::ProxyTrigger`], [`fifo::FifoDeviceHandle`], the semaphore handles
//!   in [`semaphore`], [`port_channel::PortChannelDeviceHandle`],
//!   [`memory_channel::MemoryChannelDeviceHandle`] and the LL packets in [`packet`].
//! - Safe device APIs on those handles, and [`coop`] to split work among cooperating threads.
//! - [`kernels`]: kernels shipped with oxccl, written with [`kernel`].
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

// Lets `#[kernel]` expansions name `::oxccl_device` from inside this crate too.
extern crate self as oxccl_device;

pub mod arch;
pub mod coop;
pub mod copy;
pub mod device_slice;
pub mod error;
pub mod fifo;
pub mod kernels;
#[cfg(not(target_arch = "nvptx64"))]
pub mod launch;
pub mod memory_channel;
pub mod packet;
pub mod port_channel;
pub mod semaphore;
pub mod wait;

pub use device_slice::{DevicePtr, DeviceSlice};
pub use error::DeviceError;
pub use oxccl_device_macros::kernel;

/// Version of every layout shared between host and device; sent in handshakes so that
/// ranks built from different layouts refuse each other instead of misreading handles.
pub const LAYOUT_VERSION: u32 = 1;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    arch::trap()
}
