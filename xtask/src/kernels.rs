//! Finding the `#[kernel]` functions of a crate in its sources, to check that each one
//! became a `.entry` in the PTX.
//!
//! Sources are parsed with `syn`, so a `#[kernel]` inside a comment or a doc example does not
//! count, and any path ending in `kernel` does (`#[kernel]`, `#[oxccl_device::kernel]`,
//! `#[kernel(...)]`). Every `.rs` file under the crate's `src/` is read, whether or not a
//! `mod` includes it.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A `#[kernel]` function found in the sources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFn {
    /// The function's name.
    pub name: String,
    /// The file it is defined in.
    pub file: PathBuf,
}

/// All `#[kernel]` functions in the `.rs` files under `src_dir`, sorted by file then name.
pub fn scan_dir(src_dir: &Path) -> Result<Vec<KernelFn>> {
    let mut files = Vec::new();
    collect_rs_files(src_dir, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let names = scan_source(&text).with_context(|| format!("parsing {}", file.display()))?;
        out.extend(names.into_iter().map(|name| KernelFn {
            name,
            file: file.clone(),
        }));
    }
    Ok(out)
}

/// Names of the `#[kernel]` functions in one Rust source file, in source order.
pub fn scan_source(text: &str) -> Result<Vec<String>> {
    let file = syn::parse_file(text)?;
    let mut v = KernelVisitor::default();
    v.visit_file(&file);
    Ok(v.names)
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
    names: Vec<String>,
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
            self.names.push(f.sig.ident.to_string());
        }
        syn::visit::visit_item_fn(self, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn bad_source_is_an_error_not_a_panic() {
        assert!(scan_source("fn (").is_err());
    }

    #[test]
    fn entry_names() {
        assert!(entry_is_kernel("port_pingpong", "port_pingpong"));
        assert!(!entry_is_kernel("port_pingpong2", "port_pingpong"));
        assert!(entry_is_kernel(
            "_ZN12oxccl_device7kernels13port_pingpong17h0123456789abcdefE",
            "port_pingpong"
        ));
    }

    #[test]
    fn scans_a_directory_tree() {
        let dir = std::env::temp_dir().join(format!("xtask-kernels-{}", std::process::id()));
        let sub = dir.join("kernels");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(dir.join("lib.rs"), "#[kernel] fn a() {}").unwrap();
        std::fs::write(sub.join("b.rs"), "#[kernel] fn b() {} #[kernel] fn c() {}").unwrap();
        std::fs::write(sub.join("notes.txt"), "#[kernel] fn d() {}").unwrap();
        let found: Vec<_> = scan_dir(&dir)
            .unwrap()
            .into_iter()
            .map(|k| k.name)
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, ["b", "c", "a"]);
    }
}
