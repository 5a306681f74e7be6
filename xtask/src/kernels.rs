//! Finding the `#[kernel]` functions of a crate in its sources: to check that each one
//! became a `.entry` in the PTX, and to tell the PTX rules what each kernel's parameters
//! are and how many block barriers its source has.
//!
//! Sources are parsed with `syn`, so a `#[kernel]` inside a comment or a doc example does not
//! count, and any path ending in `kernel` does (`#[kernel]`, `#[oxccl_device::kernel]`,
//! `#[kernel(...)]`). Every `.rs` file under the crate's `src/` is read, whether or not a
//! `mod` includes it.

use crate::barrier_sites::CallGraph;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A `#[kernel]` function found in the sources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFn {
    /// The function's name.
    pub name: String,
    /// The file it is defined in.
    pub file: PathBuf,
    /// Its parameters, in order (the PTX names parameter `i` `<name>_param_<i>`).
    pub params: Vec<KernelParam>,
    /// Block barrier sites its source reaches (see [`crate::barrier_sites`]).
    pub barrier_sites: usize,
}

/// One parameter of a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelParam {
    /// Its name.
    pub name: String,
    /// Its type: the last segment of the type's path, without generics
    /// (`PortChannelDeviceHandle` for `oxccl_device::PortChannelDeviceHandle<'_>`).
    pub ty: String,
}

/// All `#[kernel]` functions in the `.rs` files under `src_dir`, sorted by file then name,
/// with their barrier sites counted through every function of those files and of the
/// library whose sources are under `library_src` (the device library the kernels call).
pub fn scan_dir(src_dir: &Path, library_src: Option<&Path>) -> Result<Vec<KernelFn>> {
    let mut paths = Vec::new();
    collect_rs_files(src_dir, &mut paths)?;
    paths.sort();
    let own = paths.len();
    if let Some(lib) = library_src {
        let mut lib_paths = Vec::new();
        collect_rs_files(lib, &mut lib_paths)?;
        lib_paths.sort();
        paths.extend(lib_paths);
    }
    let mut files = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
        files.push((path, file));
    }
    let graph = CallGraph::new(&files);
    let mut out = Vec::new();
    for (path, file) in &files[..own] {
        let mut v = KernelVisitor::default();
        v.visit_file(file);
        for (name, params) in v.kernels {
            let barrier_sites = graph
                .sites(&name, path)
                .with_context(|| format!("counting the barriers of kernel `{name}`"))?;
            out.push(KernelFn {
                name,
                file: path.clone(),
                params,
                barrier_sites,
            });
        }
    }
    Ok(out)
}

/// Names of the `#[kernel]` functions in one Rust source file, in source order.
#[cfg(test)]
pub fn scan_source(text: &str) -> Result<Vec<String>> {
    let file = syn::parse_file(text)?;
    let mut v = KernelVisitor::default();
    v.visit_file(&file);
    Ok(v.kernels.into_iter().map(|(name, _)| name).collect())
}

/// Whether a PTX entry named `entry` is the one `#[kernel] fn kernel` produced: the same name
/// (kernels are `#[no_mangle]`), or a mangled symbol that contains it.
pub fn entry_is_kernel(entry: &str, kernel: &str) -> bool {
    if entry == kernel {
        return true;
    }
    let mangled = entry.starts_with("_ZN") || entry.starts_with("_R");
    mangled && entry.contains(&format!("{}{kernel}", kernel.len()))
}

fn collect_rs_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[derive(Default)]
struct KernelVisitor {
    kernels: Vec<(String, Vec<KernelParam>)>,
}

fn param(arg: &syn::FnArg) -> Option<KernelParam> {
    let syn::FnArg::Typed(t) = arg else {
        return None;
    };
    let name = match &*t.pat {
        syn::Pat::Ident(p) => p.ident.to_string(),
        _ => String::new(),
    };
    let ty = match &*t.ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    };
    Some(KernelParam { name, ty })
}

impl<'ast> Visit<'ast> for KernelVisitor {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let is_kernel = f.attrs.iter().any(|a| {
            a.path()
                .segments
                .last()
                .is_some_and(|s| s.ident == "kernel")
        });
        if is_kernel {
            let params = f.sig.inputs.iter().filter_map(param).collect();
            self.kernels.push((f.sig.ident.to_string(), params));
        }
        syn::visit::visit_item_fn(self, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against kernels missed under another spelling of the attribute, or found in
    /// comments and doc examples.
    #[test]
    fn finds_kernels_in_all_spellings() {
        let src = r#"
            //! A module with kernels.
            //! ```
            //! #[kernel]
            //! fn in_doc_example() {}
            //! ```
            use oxccl_device::kernel;

            // #[kernel] fn commented_out() {}

            /// Exchanges data with the next rank.
            #[kernel]
            pub fn port_ring_exchange(bytes: u64) {}

            #[inline]
            #[oxccl_device::kernel]
            pub(crate) unsafe fn memory_pingpong() {}

            #[kernel(something)]
            fn ll8_exchange() {}

            #[inline(always)]
            fn not_a_kernel() {}

            mod inner {
                #[crate::kernel]
                pub fn nested() {}
            }
        "#;
        assert_eq!(
            scan_source(src).unwrap(),
            [
                "port_ring_exchange",
                "memory_pingpong",
                "ll8_exchange",
                "nested"
            ]
        );
    }

    /// Guards against a source that does not parse crashing build-ptx.
    #[test]
    fn bad_source_is_an_error_not_a_panic() {
        assert!(scan_source("fn (").is_err());
    }

    /// Guards against a PTX entry matched to the wrong kernel (a prefix of its name).
    #[test]
    fn entry_names() {
        assert!(entry_is_kernel("port_pingpong", "port_pingpong"));
        assert!(!entry_is_kernel("port_pingpong2", "port_pingpong"));
        assert!(entry_is_kernel(
            "_ZN12oxccl_device7kernels13port_pingpong17h0123456789abcdefE",
            "port_pingpong"
        ));
    }

    /// Guards against kernels of nested files missed, non-Rust files read, and against wrong
    /// parameters or barrier sites handed to the PTX rules.
    #[test]
    fn scans_a_directory_tree() {
        let dir = std::env::temp_dir().join(format!("xtask-kernels-{}", std::process::id()));
        let sub = dir.join("kernels");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(
            dir.join("lib.rs"),
            "#[kernel] fn a(chan: oxccl_device::PortChannelDeviceHandle<'_>, flag: u32) {}\n\
             pub fn agree() { arch::sync_threads_or(true); }",
        )
        .unwrap();
        std::fs::write(
            sub.join("b.rs"),
            "#[kernel] fn b() { agree(); arch::sync_threads(); } #[kernel] fn c() {}",
        )
        .unwrap();
        std::fs::write(sub.join("notes.txt"), "#[kernel] fn d() {}").unwrap();
        let found = scan_dir(&dir, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<_> = found.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "a"]);
        let sites: Vec<_> = found.iter().map(|k| k.barrier_sites).collect();
        assert_eq!(sites, [2, 0, 0]);
        let a = &found[2].params;
        assert_eq!(
            (a[0].name.as_str(), a[0].ty.as_str()),
            ("chan", "PortChannelDeviceHandle")
        );
        assert_eq!((a[1].name.as_str(), a[1].ty.as_str()), ("flag", "u32"));
    }
}
