//! `--build-ptx`: the example's kernel crate to PTX, through the library of `oxccl-build`,
//! as a build script or a tool of your own would call it.

use oxccl_build::report::kernel_table;
use oxccl_build::{FunctionStats, Ptx, Ptxas, Workspace};
use std::path::{Path, PathBuf};

/// The kernel crate's package name.
pub const KERNEL_CRATE: &str = "custom-collective-kernels";

/// The kernel crate's manifest.
pub fn kernel_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/Cargo.toml")
}

/// Builds the kernel crate to PTX for `arch` (`sm_90`, say) and returns the module's path,
/// `<target>/ptx/<arch>/custom_collective_kernels.ptx` in the target directory of the
/// crate's workspace. With `check`, also assembles it with ptxas (`$OXCCL_PTXAS`, or the
/// one installed into `<target>/ptxas-venv` on first use) and returns what ptxas said of
/// each kernel as a table.
///
/// # Errors
/// A missing rustup component (named, with the command that adds it), a failed build, or
/// with `check` a ptxas that cannot be found or installed, or that rejects the module.
pub fn build_ptx(arch: &str, check: bool) -> oxccl_build::Result<(PathBuf, Option<String>)> {
    let ptx = Ptx::new(KERNEL_CRATE)
        .manifest_path(kernel_manifest())
        .arch(arch)
        .build()?;
    if !check {
        return Ok((ptx, None));
    }
    // The ptxas of the kernel crate's workspace, wherever this program runs from.
    let target_dir = Workspace::load_manifest(&kernel_manifest())?.target_dir;
    let stats = Ptxas::locate(&target_dir)?.assemble(&ptx, arch, &ptx.with_extension("cubin"))?;
    let lib = KERNEL_CRATE.replace('-', "_");
    let rows: Vec<(String, String, FunctionStats)> = stats
        .into_iter()
        .filter(|f| f.is_entry)
        .map(|f| (arch.to_string(), lib.clone(), f))
        .collect();
    let table = kernel_table(&rows, &[(arch, &lib)]);
    Ok((ptx, Some(table)))
}
