//! External programs, installing rustup components, and facts about the environment.

use crate::bounded::{output_bounded, run_bounded};
use anyhow::Result;
use std::ffi::OsStr;
use std::process::Command;
use std::time::Duration;

/// Longest `rustup component list` or a program's `--version` may take: they read local
/// files only.
pub const QUERY_TIME_LIMIT: Duration = Duration::from_secs(60);

/// Longest `rustup component add` may take: it downloads the components (tens of MB).
pub const RUSTUP_INSTALL_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

/// An external program, looked up on `PATH`.
pub struct Tool {
    program: String,
}

impl Tool {
    /// The program `name`.
    pub fn new(name: &str) -> Self {
        Tool {
            program: name.to_string(),
        }
    }

    /// The cargo that runs this xtask (`$CARGO`), so every step uses the same toolchain.
    pub fn cargo() -> Self {
        Tool {
            program: std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()),
        }
    }

    /// A command running this program.
    pub fn cmd(&self) -> Command {
        Command::new(&self.program)
    }

    /// Whether the program can be started (and answers `--version` in time).
    pub fn exists(&self) -> bool {
        output_bounded(self.cmd().arg("--version"), QUERY_TIME_LIMIT).is_ok()
    }
}

/// The command line as a shell would read it, with the variables it sets first.
pub fn show(cmd: &Command) -> String {
    let quote = |s: &OsStr| {
        let s = s.to_string_lossy();
        if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
            format!("'{}'", s.replace('\'', r"'\''"))
        } else {
            s.into_owned()
        }
    };
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), quote(v))))
        .collect();
    let program = cmd.get_program().to_string_lossy();
    // `$CARGO` is an absolute path into the toolchain; `cargo` reads better.
    let program = match program.rsplit('/').next() {
        Some("cargo") => "cargo".to_string(),
        _ => program.into_owned(),
    };
    parts.push(program);
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

/// Whether we run under CI (`CI=true`, as GitHub Actions, GitLab and most runners set it).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the process runs as root (then apt-get may install packages).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Adds the rustup `components` that are not installed yet, saying so; `who` prefixes the
/// message (`build-ptx`, `ci`).
pub fn ensure_components(who: &str, components: &[&str]) -> Result<()> {
    let rustup = Tool::new("rustup");
    let listed = output_bounded(
        rustup.cmd().args(["component", "list", "--installed"]),
        QUERY_TIME_LIMIT,
    );
    let missing_rustup = |e: &anyhow::Error| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    };
    let installed = match listed {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        // A rustup that hangs fails the step instead of reading as no rustup.
        Err(e) if !missing_rustup(&e) => return Err(e.context("listing rustup components")),
        _ => {
            // Without rustup (a distribution's Rust) the components may still be present;
            // say what is needed and let the build show whether it works.
            println!(
                "{who}: rustup not available; make sure the toolchain has: {}",
                components.join(", ")
            );
            return Ok(());
        }
    };
    let missing: Vec<&str> = components
        .iter()
        .copied()
        .filter(|c| !is_installed(&installed, c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("{who}: installing rustup components {}", missing.join(", "));
    run_bounded(
        rustup.cmd().args(["component", "add"]).args(&missing),
        RUSTUP_INSTALL_TIME_LIMIT,
    )
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

/// A duration as `1m23.4s` or `4.2s`.
pub fn fmt_duration(d: Duration) -> String {
    // Rounded to tenths before splitting, so that 59.96 s reads `1m00.0s`, not `60.0s`.
    let tenths = (d.as_secs_f64() * 10.0).round() as u64;
    let (minutes, secs) = (tenths / 600, (tenths % 600) as f64 / 10.0);
    if minutes > 0 {
        format!("{minutes}m{secs:04.1}s")
    } else {
        format!("{secs:.1}s")
    }
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

    /// Guards against durations shown with 60 seconds in a minute's place (`19m60.0s`) when
    /// the tenths round up.
    #[test]
    fn durations() {
        assert_eq!(fmt_duration(Duration::from_millis(4200)), "4.2s");
        assert_eq!(fmt_duration(Duration::from_millis(83_400)), "1m23.4s");
        assert_eq!(fmt_duration(Duration::from_millis(1_199_960)), "20m00.0s");
        assert_eq!(fmt_duration(Duration::from_millis(59_960)), "1m00.0s");
        assert_eq!(fmt_duration(Duration::from_millis(59_940)), "59.9s");
    }

    #[test]
    fn shows_env_and_quotes() {
        let mut c = Command::new("/x/bin/cargo");
        c.env("RUSTFLAGS", "-C target-cpu=sm_70")
            .args(["rustc", "-p", "a b"]);
        assert_eq!(
            show(&c),
            "RUSTFLAGS='-C target-cpu=sm_70' cargo rustc -p 'a b'"
        );
    }
}
