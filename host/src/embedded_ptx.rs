//! Kernel modules embedded in the library at build time, for deployments that carry one
//! binary and no `target/ptx`: with the `embed-ptx` feature, `build.rs` embeds every
//! `<arch>/<crate>.ptx` that `cargo xtask build-ptx` (or `oxccl-build`) left in the target
//! directory, or in `$OXCCL_PTX_DIR` at build time, and each cubin beside one whose recorded
//! hash says it was assembled from that PTX. Build the PTX first, then the program:
//!
//! ```text
//! cargo xtask build-ptx --check --arch sm_80,sm_90
//! cargo build --release --features oxccl/embed-ptx
//! ```
//!
//! The CUDA backend looks for files first ([`crate::ptx`]'s search, `$OXCCL_PTX_DIR` first:
//! a deployment can still override what is embedded), then here. Without the feature
//! nothing is embedded: a binary carrying the collectives grows by some 20 MB of PTX and
//! 9 MB of cubin an architecture.

use crate::ptx::{arch_number, cubin_runs_on, ptx_runs_on};

/// One kernel crate's module for one architecture, embedded at build time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbeddedModule {
    /// Its architecture (`sm_90`).
    pub arch: &'static str,
    /// Its crate, with underscores (`oxccl_kernels`).
    pub crate_name: &'static str,
    /// The file it was embedded from, at build time.
    pub source: &'static str,
    /// The PTX.
    pub ptx: &'static str,
    /// The cubin ptxas assembled from that PTX for that architecture, if there was one.
    pub cubin: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/embedded_ptx.rs"));

/// Every module embedded in this build (none without the `embed-ptx` feature).
pub fn modules() -> &'static [EmbeddedModule] {
    MODULES
}

/// The embedded PTX of `crate_name` (`oxccl-kernels` or `oxccl_kernels`) for the newest
/// architecture a device of compute capability `major.minor` runs (`sm_XY`, `XY <= major *
/// 10 + minor`), as [`crate::ptx::locate_for_device`] picks among files.
pub fn ptx_for_device(crate_name: &str, major: u32, minor: u32) -> Option<&'static EmbeddedModule> {
    newest(MODULES.iter(), crate_name, |n| {
        ptx_runs_on(n, major * 10 + minor)
    })
}

/// The embedded cubin of `crate_name` a device of compute capability `major.minor` runs as
/// it is (`sm_XY` with `X == major`, `Y <= minor`, the newest such), with its module.
pub fn cubin_for_device(
    crate_name: &str,
    major: u32,
    minor: u32,
) -> Option<(&'static [u8], &'static EmbeddedModule)> {
    let with_cubin = MODULES.iter().filter(|m| m.cubin.is_some());
    let m = newest(with_cubin, crate_name, |n| cubin_runs_on(n, major, minor))?;
    Some((m.cubin?, m))
}

/// Among `modules` of `crate_name`, the one of the newest plain `sm_XY` whose number
/// `accept`s (`sm_90a` and the like run on one GPU alone and are skipped).
fn newest<'m>(
    modules: impl IntoIterator<Item = &'m EmbeddedModule>,
    crate_name: &str,
    accept: impl Fn(u32) -> bool,
) -> Option<&'m EmbeddedModule> {
    let crate_name = crate_name.replace('-', "_");
    modules
        .into_iter()
        .filter(|m| m.crate_name == crate_name)
        .filter_map(|m| Some((arch_number(m.arch)?, m)))
        .filter(|(n, _)| accept(*n))
        .max_by_key(|(n, _)| *n)
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(arch: &'static str, cubin: bool) -> EmbeddedModule {
        EmbeddedModule {
            arch,
            crate_name: "oxccl_kernels",
            source: "",
            ptx: arch,
            cubin: cubin.then_some(arch.as_bytes()),
        }
    }

    /// Guards against picking a module a device cannot run (a newer architecture's PTX, a
    /// cubin of another major architecture or a newer minor one), or not the newest it can.
    #[test]
    fn the_newest_module_a_device_runs_is_picked() {
        let table = [
            module("sm_70", true),
            module("sm_80", false),
            module("sm_86", true),
            module("sm_90", true),
            module("sm_90a", true),
        ];
        let ptx = |major: u32, minor: u32| {
            newest(&table, "oxccl-kernels", |n| {
                ptx_runs_on(n, major * 10 + minor)
            })
        };
        assert_eq!(ptx(9, 0).map(|m| m.arch), Some("sm_90"));
        assert_eq!(ptx(8, 9).map(|m| m.arch), Some("sm_86"));
        assert_eq!(ptx(8, 0).map(|m| m.arch), Some("sm_80"));
        assert_eq!(ptx(6, 0), None);
        let cubin = |major: u32, minor: u32| {
            let with = table.iter().filter(|m| m.cubin.is_some());
            newest(with, "oxccl_kernels", |n| cubin_runs_on(n, major, minor)).map(|m| m.arch)
        };
        assert_eq!(cubin(8, 9), Some("sm_86"));
        // sm_80 has no cubin, and sm_86's does not run on an sm_80 device.
        assert_eq!(cubin(8, 0), None);
        assert_eq!(cubin(10, 0), None);
        assert_eq!(newest(&table, "other_kernels", |_| true), None);
    }

    /// Guards against a build with `embed-ptx` that embeds nothing, or other bytes than the
    /// files it names, or a cubin not assembled from its PTX: run after `cargo xtask
    /// build-ptx --check`, which leaves both and the record of the PTX a cubin came from.
    #[cfg(feature = "embed-ptx")]
    #[test]
    fn embedded_modules_are_the_files_they_came_from() {
        let kernels: Vec<_> = modules()
            .iter()
            .filter(|m| m.crate_name == "oxccl_kernels")
            .collect();
        assert!(
            !kernels.is_empty(),
            "nothing embedded: build the PTX first (`cargo xtask build-ptx --check`)"
        );
        for m in modules() {
            let file = std::fs::read_to_string(m.source).expect("the embedded file");
            assert!(file == m.ptx, "{} differs from what was embedded", m.source);
            if let Some(cubin) = m.cubin {
                let path = std::path::Path::new(m.source).with_extension("cubin");
                assert_eq!(std::fs::read(&path).expect("the cubin"), cubin, "{m:?}");
            }
        }
        assert!(
            kernels.iter().any(|m| m.cubin.is_some()),
            "`build-ptx --check` assembles cubins: none embedded"
        );
        let newest = kernels.iter().max_by_key(|m| m.arch).expect("one");
        let (major, minor) = newest.arch[3..].split_at(1);
        let (major, minor) = (major.parse().unwrap(), minor.parse().unwrap());
        assert_eq!(ptx_for_device("oxccl-kernels", major, minor), Some(*newest));
        if newest.cubin.is_some() {
            let (_, m) = cubin_for_device("oxccl_kernels", major, minor).expect("a cubin");
            assert_eq!(m, *newest);
        }
    }
}
