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
//! - Shared layouts, each `#[repr(C)]` with size and offset asserts, each in the file of its
//!   concept: the plain-data parts ([`fifo::ProxyTrigger`], [`fifo::FifoRawParts`],
//!   [`semaphore::SemaphoreRawParts`], [`memory_channel::MemoryChannelBuffers`],
//!   [`port_channel::PortChannelIds`], the LL packets in [`packet`]) are
//!   [`bytemuck::Pod`]; the device handles built from them are not (see below).
//! - Failure reporting: [`wait`] (every wait bounded), [`abort`] (what the host reads).
//! - Safe device APIs on the handles, [`coop`] to split work among cooperating threads,
//!   [`block`] for a block that decides together, [`handshake`] for kernels launched again
//!   and again on the same channels.
//! - Safe kernel parameters for what kernels used raw addresses for: [`device_view`] (typed,
//!   bounds-checked views of device buffers), [`channel_set`] (a channel to every peer, the
//!   handles in device memory), [`grid_barrier`] (every block of a launch waits for all),
//!   [`peer_buffer_table`] (the buffers every rank registered, reached by slot).
//! - [`kernel`]: one function, a PTX entry point on the GPU and a launcher on the host.
//!
//! The crate holds no kernel of its own: the kernels oxccl ships are in `oxccl-kernels`, a
//! kernel crate like any user's, so that a user's kernels link beside them without clashing
//! names.
//!
//! # Soundness: handles cannot be forged
//!
//! A device handle's safe methods dereference the addresses it carries, so safe code must
//! not be able to choose them. The fields are private, only `unsafe` constructors take raw
//! addresses (the host's, which keeps the memory alive for the handle's lifetime `'a`), a
//! handle is not `Pod` (no cast from bytes), and a zeroed handle (`Default`) refuses every
//! call. Kernels that dereference raw addresses they are given are `unsafe fn`, and so is
//! their `launch` (see [`kernel`]). Each of these is a compile error in safe code:
//!
//! ```compile_fail,E0451
//! // The fields are private.
//! let forged = oxccl_device::memory_channel::MemoryChannelDeviceHandle {
//!     semaphore: Default::default(),
//!     buffers: Default::default(),
//! };
//! ```
//! ```compile_fail,E0277
//! // Not `Pod`: bytes cannot be cast into a handle.
//! let forged: oxccl_device::port_channel::PortChannelDeviceHandle<'static> =
//!     bytemuck::cast([0u8; 152]);
//! ```
//! ```compile_fail,E0133
//! use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
//! // Raw addresses go in through an `unsafe` constructor only.
//! let buffers = MemoryChannelBuffers { remote: 0xdead_beef, remote_size: 1 << 20, ..Default::default() };
//! let forged = MemoryChannelDeviceHandle::from_raw_parts(Default::default(), buffers);
//! ```
//! ```compile_fail,E0277
//! // Views are no `Pod` either: an address and a length cannot be cast into one.
//! let forged: oxccl_device::DeviceViewMut<'static, u32> = bytemuck::cast([0xdead_beef_u64, 1 << 20]);
//! ```
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, link_llvm_intrinsics)
)]
// `link_llvm_intrinsics` is internal to rustc; `arch::nvptx` needs it for the one convergent
// barrier core does not offer (`__syncthreads_or`).
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

// Lets `#[kernel]` expansions name `::oxccl_device` from inside this crate too.
extern crate self as oxccl_device;

pub mod abort;
pub mod arch;
pub mod block;
pub mod channel_set;
pub mod coop;
pub mod copy;
pub mod device_slice;
pub mod device_view;
pub mod error;
pub mod fifo;
pub mod grid_barrier;
pub mod handshake;
pub mod kernel_return;
pub mod launch;
pub mod memory_channel;
pub mod packet;
pub mod peer_buffer_table;
pub mod port_channel;
pub mod reduce;
pub mod semaphore;
pub mod wait;

pub use device_slice::{DevicePtr, DeviceSlice};
pub use device_view::{DeviceView, DeviceViewMut};
pub use error::DeviceError;
pub use oxccl_device_macros::{KernelArg, kernel};

/// Version of every layout shared between host and device; sent in handshakes so that
/// ranks built from different layouts refuse each other instead of misreading handles.
pub const LAYOUT_VERSION: u32 = 1;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    arch::trap()
}
