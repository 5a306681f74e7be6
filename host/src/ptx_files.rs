//! What the library and its build script (`build.rs`, which includes this file) both read
//! of the files `cargo xtask build-ptx` writes: where the target directory is, and whether
//! a cubin was assembled from the PTX beside it. Defined once, so that what the build
//! embeds and what a program finds at run time follow the same rules.

use std::path::{Path, PathBuf};

/// The nearest ancestor of `path` that is a cargo target directory (named `target`, or
/// holding the `CACHEDIR.TAG` cargo writes into every target directory).
pub fn enclosing_target_dir(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .skip(1)
        .find(|d| d.file_name().is_some_and(|n| n == "target") || d.join("CACHEDIR.TAG").is_file())
        .map(PathBuf::from)
}

/// Where `oxccl-build` records the SHA-256 of the PTX a cubin was assembled from: beside
/// the cubin, its name with `.sha256` added, in lowercase hex.
pub fn cubin_source_hash_path(cubin: &Path) -> PathBuf {
    let mut name = cubin.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// Longest hash record read: a SHA-256 in hex, and room for a line end.
const HASH_RECORD_LIMIT: u64 = 128;

/// Whether the hash recorded beside `cubin` is that of `ptx`, the bytes of a PTX module.
pub fn assembled_from(cubin: &Path, ptx: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut recorded = String::new();
    let read = std::fs::File::open(cubin_source_hash_path(cubin))
        .and_then(|f| f.take(HASH_RECORD_LIMIT).read_to_string(&mut recorded));
    if read.is_err() {
        return false;
    }
    let hash: String = Sha256::digest(ptx)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    recorded.trim() == hash
}
