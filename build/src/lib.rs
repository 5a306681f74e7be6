//! Builds oxccl kernel crates to PTX, from a build script, a tool or the command line, and
//! checks the PTX with ptxas.
//!
//! This is how oxccl's own kernels are built (`cargo xtask build-ptx` calls it), and how you
//! build yours, in your own project:
//!
//! ```no_run
//! let ptx = oxccl_build::Ptx::new("my-kernels").arch("sm_90").build()?;
//! for kernel in oxccl_build::assemble_check(&ptx, "sm_90")? {
//!     println!("{}: {:?} registers", kernel.name, kernel.registers);
//! }
//! # Ok::<(), oxccl_build::Error>(())
//! ```
//!
//! | item | what it does |
//! |---|---|
//! | [`Ptx`] | builds one kernel crate for one architecture: `Ptx::new(crate).arch("sm_90").build()` returns the path of `<target>/ptx/<arch>/<crate>.ptx` |
//! | [`assemble_check`] | runs ptxas on a module and returns registers, spills and shared memory per function ([`FunctionStats`]) |
//! | [`Ptxas`] | a ptxas found or installed, for more control over where |
//! | [`Workspace`], [`Package`] | what `cargo metadata` says, and which crates are kernel crates |
//! | [`Error`] | every failure, each saying what to do about it where there is something to do |
//! | [`arch`], [`toolchain`], [`report`] | architectures, rustup components, ptxas report tables |
//! | [`bounded`], [`interrupt`] | every command under a deadline (killed with everything it started past it), and Ctrl-C passed on to it |
//!
//! The `oxccl-build` command (the default feature `cli`) does the same from a shell.
//!
//! # Your own kernels
//!
//! ## 1. A kernel crate
//!
//! A kernel crate is a library crate whose library depends on `oxccl-device` and whose
//! manifest opts in (a host crate that depends on `oxccl-device` for its layouts is not
//! one). Its `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "my-kernels"
//! version = "0.1.0"
//! edition = "2024"
//!
//! [lib]
//! # `rlib` for the host (the CPU emulator links the kernels like any Rust code);
//! # oxccl-build asks for a `cdylib` on nvptx64.
//! crate-type = ["rlib"]
//!
//! [dependencies]
//! oxccl-device = { git = "https://github.com/oxccl/oxccl" } # or a path to device-kernels/
//!
//! [package.metadata.oxccl]
//! kernels = true
//! ```
//!
//! and its `src/lib.rs`, `no_std`, with the unstable features nvptx64 needs on that target
//! only (the build enables them, see step 2), one `#[kernel]` per entry point:
//!
//! ```ignore
//! #![no_std]
//! #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]
//!
//! // Optional: lets host-only code (tests) use std.
//! #[cfg(not(target_arch = "nvptx64"))]
//! extern crate std;
//!
//! use oxccl_device::{DeviceSlice, arch, kernel};
//!
//! /// Each thread of the grid adds `value` to its own element of `data`.
//! ///
//! /// # Safety
//! /// `data` must hold one element per thread of the grid, which nothing else touches
//! /// until the launch completes.
//! #[kernel]
//! pub unsafe fn add_to_each(data: DeviceSlice<u32>, value: u32) {
//!     let i = arch::thread_rank_in_grid();
//!     // SAFETY: the contract above; each thread touches only its own element.
//!     unsafe {
//!         if let Some(v) = data.read(i) {
//!             data.write(i, v.wrapping_add(value));
//!         }
//!     }
//! }
//! ```
//!
//! `build/tests/fixtures/user-kernels/` in the oxccl repository is such a crate, built by
//! this crate's tests; `device-kernels/kernels/` (`oxccl-kernels`) is a larger one.
//!
//! ## 2. The toolchain
//!
//! A stable Rust toolchain (oxccl's `rust-version` or later) with three rustup components:
//!
//! ```text
//! rustup component add rust-src llvm-tools llvm-bitcode-linker
//! ```
//!
//! `rust-src` because nvptx64 has no prebuilt standard library, so `core` is built from
//! source (`-Zbuild-std=core`); `llvm-bitcode-linker` (with `llvm-tools`) links the crate
//! into one PTX module. [`Ptx::build`] checks for them first and, if any is missing, fails
//! with [`Error::MissingComponents`], naming them and that command (`oxccl-build
//! --install-components` adds them instead). No nightly toolchain: the build sets
//! `RUSTC_BOOTSTRAP=1` for itself only, for `-Zbuild-std` and the `"ptx-kernel"` ABI (see
//! [`ptx`] for the whole command and why each flag). No GPU and no CUDA installation either.
//! The first build of an architecture also compiles `core`, about half a minute on two cores.
//!
//! ## 3. Build it to PTX
//!
//! From a shell, with the command (from an oxccl checkout `cargo run -p oxccl-build --`, or
//! installed with `cargo install --path build`):
//!
//! ```text
//! oxccl-build --manifest-path my-kernels/Cargo.toml --package my-kernels --arch sm_80,sm_90 --check
//! ```
//!
//! which writes `<target>/ptx/sm_80/my_kernels.ptx` and `<target>/ptx/sm_90/my_kernels.ptx`
//! (`<target>` being the target directory of the kernel crate's workspace) and, with
//! `--check`, prints registers, spills and shared memory per kernel.
//!
//! Or from the build script of the host crate that launches the kernels, so that `cargo
//! build` rebuilds the PTX when the kernels change:
//!
//! ```toml
//! [build-dependencies]
//! oxccl-build = { git = "https://github.com/oxccl/oxccl", default-features = false }
//! ```
//!
//! ```no_run
//! // build.rs
//! fn main() {
//!     println!("cargo:rerun-if-changed=../my-kernels/src");
//!     println!("cargo:rerun-if-changed=../my-kernels/Cargo.toml");
//!     for arch in ["sm_80", "sm_90"] {
//!         oxccl_build::Ptx::new("my-kernels")
//!             .manifest_path("../my-kernels/Cargo.toml")
//!             .arch(arch)
//!             .build()
//!             .unwrap_or_else(|e| panic!("{}", oxccl_build::error::with_causes(&e)));
//!     }
//! }
//! ```
//!
//! The build runs cargo again, in a target directory of its own (`<target>/nvptx/<arch>`), so
//! it does not wait for the lock the outer build holds; it leaves out what cargo tells a
//! build script about its own package.
//!
//! ## 4. Load it
//!
//! **On the CPU emulator** nothing is loaded: the kernel crate is an ordinary dependency of
//! the host crate, and `#[kernel]` gives each kernel a module with a typed `launch`:
//!
//! ```ignore
//! use oxccl_device::launch::LaunchConfig;
//!
//! let device = oxccl::Device::cpu(0);
//! let stream = device.stream()?;
//! let data = device.alloc_zeroed::<u32>(64)?;
//! // SAFETY: `data` holds one element for each of the 2 x 32 threads, and lives until the
//! // launch is synchronized.
//! unsafe {
//!     my_kernels::add_to_each::launch(&stream, LaunchConfig::grid(2).block(32), data.device_slice(), 7)?
//! };
//! stream.synchronize()?;
//! assert!(data.to_vec()?.iter().all(|&v| v == 7));
//! ```
//!
//! **On a GPU** (the CUDA backend, not written yet) the launcher loads the crate's PTX, which
//! `oxccl::ptx::locate("my-kernels", "sm_90")` finds, or `oxccl::ptx::locate_for_device`
//! for the newest architecture a device can run. It looks for `<arch>/my_kernels.ptx` under,
//! in order: `$OXCCL_PTX_DIR`; `$CARGO_TARGET_DIR/ptx`; and `<target>/ptx` of the target
//! directory the running program lies in. A kernel crate of the host crate's own workspace
//! is found with no setup; one built elsewhere (another workspace, or [`Ptx::out_dir`]) is
//! found through `OXCCL_PTX_DIR`, set to the directory holding `<arch>/`. To deploy, copy
//! that directory anywhere and point `OXCCL_PTX_DIR` at it.
//!
//! # Checking with ptxas
//!
//! [`assemble_check`] and `--check` run `ptxas -arch=<arch> -v`, which validates the module
//! as a CUDA driver would load it and reports each kernel's registers, stack, spills and
//! shared memory. ptxas is `$OXCCL_PTXAS` if set; otherwise it is installed on first use
//! from the PyPI wheel [`ptxas::WHEEL`] into `<target>/ptxas-venv`, which needs `python3`
//! with `venv` (`apt-get install python3-venv`) and network access to PyPI.
//!
//! # Time limits
//!
//! Every external command (cargo, rustup, ptxas, pip) runs under a deadline
//! ([`ptx::BUILD_TIME_LIMIT`], [`ptxas::RUN_TIME_LIMIT`], ...; [`Ptx::time_limit`] and
//! [`Ptxas::time_limit`] change them); past it the command is killed with every process it
//! started and the error names it. While a command runs, SIGINT, SIGTERM and SIGHUP are
//! passed on to it (see [`interrupt`] for what that means for a program with handlers of
//! its own).

// The build script example above is a whole `build.rs`: its `fn main` is the point.
#![allow(clippy::needless_doctest_main)]

pub mod arch;
pub mod bounded;
pub mod error;
pub mod interrupt;
pub mod ptx;
pub mod ptxas;
pub mod report;
pub mod tool;
pub mod toolchain;
pub mod workspace;

pub use error::{Error, Result};
pub use ptx::Ptx;
pub use ptxas::{FunctionStats, Ptxas, assemble_check};
pub use workspace::{DEVICE_CRATE, Package, Workspace};
