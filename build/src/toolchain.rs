//! The rustup components the nvptx build needs, and whether the toolchain has them.
//!
//! `nvptx64-nvidia-cuda` has no prebuilt `rust-std`, so `core` is built from source
//! (`rust-src`), and the module is linked to PTX by `llvm-bitcode-linker`, which runs tools
//! of `llvm-tools`. rustup does not install a toolchain file's components by itself on every
//! setup, so [`Ptx::build`](crate::Ptx::build) checks for them first and says which are
//! missing and how to add them, rather than failing deep inside cargo.

use crate::bounded::{output_bounded, run_bounded};
use crate::error::{Error, Result};
use crate::tool::{QUERY_TIME_LIMIT, Tool};
use std::time::Duration;

/// Rustup components the nvptx build needs.
pub const COMPONENTS: &[&str] = &["rust-src", "llvm-tools", "llvm-bitcode-linker"];

/// Longest `rustup component add` may take: it downloads the components (tens of MB).
pub const RUSTUP_INSTALL_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

/// Which of `components` rustup lists as not installed for the active toolchain, or `None`
/// without rustup (a distribution's Rust may still have them; the build will tell).
///
/// # Errors
///
/// [`Error::Command`] if `rustup component list` fails or hangs.
pub fn missing_components(components: &[&str]) -> Result<Option<Vec<String>>> {
    let listed = output_bounded(
        Tool::new("rustup")
            .cmd()
            .args(["component", "list", "--installed"]),
        QUERY_TIME_LIMIT,
    );
    let installed = match listed {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        // A rustup that hangs is an error, not the same as no rustup.
        Err(e) if !is_not_found(&e) => {
            return Err(Error::command("listing rustup components", e));
        }
        _ => return Ok(None),
    };
    Ok(Some(missing_in(&installed, components)))
}

/// Fails if rustup lists any of `components` as missing, naming them and the command that
/// adds them.
///
/// # Errors
///
/// [`Error::MissingComponents`], or as [`missing_components`].
pub fn require_components(components: &[&str]) -> Result<()> {
    match missing_components(components)? {
        Some(missing) if !missing.is_empty() => Err(Error::MissingComponents { missing }),
        _ => Ok(()),
    }
}

/// Adds the rustup `components` that are not installed yet, saying so; `who` prefixes the
/// message (`build-ptx`, `ci`).
///
/// # Errors
///
/// [`Error::Command`] if rustup fails or hangs listing or adding them.
pub fn ensure_components(who: &str, components: &[&str]) -> Result<()> {
    let Some(missing) = missing_components(components)? else {
        // Without rustup the components may still be present; say what is needed and let
        // the build show whether it works.
        println!(
            "{who}: rustup not available; make sure the toolchain has: {}",
            components.join(", ")
        );
        return Ok(());
    };
    if missing.is_empty() {
        return Ok(());
    }
    println!("{who}: installing rustup components {}", missing.join(", "));
    run_bounded(
        Tool::new("rustup")
            .cmd()
            .args(["component", "add"])
            .args(&missing),
        RUSTUP_INSTALL_TIME_LIMIT,
    )
    .map_err(|e| Error::command(format!("installing {}", missing.join(", ")), e))
}

/// The `components` absent from `rustup component list --installed` output.
fn missing_in(installed: &str, components: &[&str]) -> Vec<String> {
    components
        .iter()
        .filter(|c| !is_installed(installed, c))
        .map(|c| c.to_string())
        .collect()
}

fn is_not_found(e: &crate::bounded::CommandError) -> bool {
    matches!(e, crate::bounded::CommandError::Spawn { source, .. }
        if source.kind() == std::io::ErrorKind::NotFound)
}

/// Whether `component` appears in `rustup component list --installed` output, where host
/// components carry the target triple (`clippy-x86_64-unknown-linux-gnu`) and others do not
/// (`rust-src`).
fn is_installed(list: &str, component: &str) -> bool {
    list.lines().map(str::trim).any(|l| {
        l == component
            || l.strip_prefix(component)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(is_target_triple)
    })
}

/// Whether `s` reads as a target triple (`x86_64-unknown-linux-gnu`), not as the rest of a
/// longer component name (`tools-x86_64-...` after `llvm`).
fn is_target_triple(s: &str) -> bool {
    const ARCHES: &[&str] = &[
        "x86_64",
        "aarch64",
        "i686",
        "i586",
        "arm",
        "armv7",
        "riscv64gc",
        "powerpc64",
        "powerpc64le",
        "s390x",
        "loongarch64",
    ];
    let arch = s.split('-').next().unwrap_or("");
    s.split('-').count() >= 3 && ARCHES.contains(&arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_names() {
        let list = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\n\
                    llvm-tools-x86_64-unknown-linux-gnu\nrust-src\n\
                    rust-std-x86_64-unknown-linux-gnu\n";
        assert!(is_installed(list, "clippy"));
        assert!(is_installed(list, "rust-src"));
        assert!(is_installed(list, "llvm-tools"));
        assert!(!is_installed(list, "llvm-bitcode-linker"));
        assert!(!is_installed(list, "rustfmt"));
        // `rust` is not `rust-src` nor `rust-std-...`.
        assert!(!is_installed(list, "rust"));
        assert!(!is_installed(list, "llvm"));
    }

    /// Guards against a missing component reported without its name or without the command
    /// that adds it, leaving the user to decode a linker error from deep inside cargo.
    #[test]
    fn missing_components_are_named_with_the_fix() {
        let list = "cargo-x86_64-unknown-linux-gnu\nrust-src\n\
                    llvm-tools-x86_64-unknown-linux-gnu\n";
        let missing = missing_in(list, COMPONENTS);
        assert_eq!(missing, ["llvm-bitcode-linker"]);
        let msg = Error::MissingComponents { missing }.to_string();
        assert!(msg.contains("llvm-bitcode-linker, needed"), "{msg}");
        assert!(
            msg.contains("`rustup component add llvm-bitcode-linker`"),
            "{msg}"
        );
        let all = missing_in("", COMPONENTS);
        let msg = Error::MissingComponents { missing: all }.to_string();
        assert!(
            msg.contains("`rustup component add rust-src llvm-tools llvm-bitcode-linker`"),
            "{msg}"
        );
    }
}
