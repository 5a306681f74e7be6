//! Builds oxccl kernel crates to PTX, and checks the PTX with ptxas.
//!
//! Every external command runs under a deadline, killed with everything it started if it
//! runs past it ([`bounded`]).

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
