//! `cargo xtask gpu-bundle`: everything that needs a GPU, packed to run on a Linux machine
//! with an NVIDIA driver but no Rust toolchain and no network.
//!
//! `target/gpu-bundle/` holds stripped release binaries (the test programs with GPU tests,
//! the example programs), the PTX and ptxas cubins of every kernel crate (`ptx.tar.gz`,
//! unpacked by the script to `ptx/<arch>/<crate>.{ptx,cubin}` and found through
//! `OXCCL_PTX_DIR`), and `run.sh`, which runs each step under a deadline, prints one
//! `gpu-check <step> ok|FAILED <figure>` line per step and exits non-zero if any failed.
//! The GPU tests print "skipped" where no driver is found; on the GPU machine a skip fails
//! its step, so a bundle run on a machine without a working driver cannot pass.

use crate::build_ptx;
use anyhow::{Context, Result, ensure};
use oxccl_build::Workspace;
use oxccl_build::arch::DEFAULT_ARCHES;
use oxccl_build::bounded::{output_bounded, run_bounded};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Largest bundle: small enough to copy to a GPU machine as one file.
pub const MAX_BUNDLE_BYTES: u64 = 48 << 20;

/// Longest a release build of the bundle's programs may take.
const BUILD_LIMIT: Duration = Duration::from_secs(40 * 60);

/// Test programs (package, integration test) whose tests need a GPU.
const GPU_TESTS: &[(&str, &str)] = &[
    ("oxccl", "cuda_backend"),
    ("oxccl", "device_checks"),
    ("oxccl", "bad_input"),
    ("oxccl", "registered_memory"),
    ("oxccl", "port_memory_ids"),
];

/// Example programs the bundle runs.
const PROGRAMS: &[(&str, &str)] = &[
    ("oxccl-examples", "pingpong"),
    ("oxccl-examples", "allreduce"),
    ("oxccl-examples", "fifo_bench"),
    ("oxccl-examples", "launch_bench"),
];

/// Builds `target/gpu-bundle/` for `arches` (every default architecture if empty). Builds
/// the PTX first unless `reuse_ptx` and every architecture's modules are there already.
pub fn run_gpu_bundle(ws: &Workspace, reuse_ptx: bool, arches: &[String]) -> Result<()> {
    let arches: Vec<String> = if arches.is_empty() {
        DEFAULT_ARCHES.iter().map(|s| s.to_string()).collect()
    } else {
        arches.to_vec()
    };
    let ptx_dir = ws.target_dir.join("ptx");
    let have_ptx = arches.iter().all(|a| {
        let ptx = ptx_dir.join(a).join("oxccl_kernels.ptx");
        ptx.is_file() && ptx.with_extension("cubin").is_file()
    });
    if !(reuse_ptx && have_ptx) {
        build_ptx::run_build_ptx(
            ws,
            &build_ptx::Options {
                packages: Vec::new(),
                arches: arches.clone(),
                // The cubins the bundle carries are ptxas's output of the check.
                check: true,
                allow_spills: true,
            },
        )?;
    }
    let bundle = ws.target_dir.join("gpu-bundle");
    if bundle.exists() {
        std::fs::remove_dir_all(&bundle)
            .with_context(|| format!("removing the old {}", bundle.display()))?;
    }
    let bin = bundle.join("bin");
    std::fs::create_dir_all(&bin)?;

    let mut programs = Vec::new();
    for (package, name) in PROGRAMS {
        let mut cmd = cargo(ws);
        cmd.args(["build", "--release", "-p", package, "--bin", name]);
        run_bounded(&mut cmd, BUILD_LIMIT)?;
        programs.push(ws.target_dir.join("release").join(name));
    }
    for (package, test) in GPU_TESTS {
        let mut cmd = cargo(ws);
        cmd.args([
            "test",
            "--release",
            "-p",
            package,
            "--test",
            test,
            "--no-run",
            "--message-format=json",
        ]);
        let out = output_bounded(&mut cmd, BUILD_LIMIT)?;
        ensure!(
            out.status.success(),
            "building test `{test}` of {package} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let exe = test_executable(&String::from_utf8_lossy(&out.stdout), test)
            .with_context(|| format!("cargo named no executable for test `{test}`"))?;
        programs.push(exe);
    }
    for (src, name) in programs.iter().map(|p| (p, file_name(p))) {
        // Test executables carry a hash in their name: the bundle names them plainly.
        let plain = name.split('-').next().unwrap_or(&name).to_string();
        let dst = bin.join(&plain);
        std::fs::copy(src, &dst).with_context(|| format!("copying {}", src.display()))?;
        let mut strip = Command::new("strip");
        strip.arg(&dst);
        run_bounded(&mut strip, Duration::from_secs(120))
            .context("stripping the bundle's programs (`strip`, from binutils)")?;
    }
    // The PTX compresses about tenfold: packed, the bundle stays far below its limit as
    // kernels are added; `run.sh` unpacks it next to its logs.
    let staging = ws.target_dir.join("gpu-bundle-ptx");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    // Only the architectures asked for: a stale module of another one would be loaded on a
    // GPU it matches better.
    for arch in &arches {
        let from = ptx_dir.join(arch);
        for entry in
            std::fs::read_dir(&from).with_context(|| format!("reading {}", from.display()))?
        {
            let ptx = entry?.path();
            if ptx.extension().is_some_and(|e| e == "ptx") {
                // Without its cubin, a GPU compiles the PTX at the first launch: minutes.
                ensure!(
                    ptx.with_extension("cubin").is_file(),
                    "{} has no cubin beside it: run `cargo xtask build-ptx --check`",
                    ptx.display()
                );
            }
        }
        copy_dir(&from, &staging.join("ptx").join(arch))?;
    }
    let mut tar = Command::new("tar");
    tar.arg("-czf")
        .arg(bundle.join("ptx.tar.gz"))
        .arg("-C")
        .arg(&staging)
        .arg("ptx");
    run_bounded(&mut tar, Duration::from_secs(300)).context("packing the PTX (`tar`)")?;
    std::fs::remove_dir_all(&staging)?;
    let run = bundle.join("run.sh");
    std::fs::write(&run, RUN_SH)?;
    set_executable(&run)?;
    std::fs::write(bundle.join("README.txt"), README)?;

    let bytes = dir_bytes(&bundle)?;
    ensure!(
        bytes <= MAX_BUNDLE_BYTES,
        "the bundle holds {bytes} bytes, more than its limit of {MAX_BUNDLE_BYTES}"
    );
    println!(
        "gpu-bundle: {} ({:.1} MiB); on a GPU machine: bash {}/run.sh",
        bundle.display(),
        bytes as f64 / f64::from(1 << 20),
        bundle.display()
    );
    Ok(())
}

fn cargo(ws: &Workspace) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(&ws.root);
    cmd
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The executable cargo's JSON messages name for integration test `test`.
fn test_executable(messages: &str, test: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter(|l| l.contains(&format!("\"name\":\"{test}\"")) && l.contains("\"test\""))
        .find_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = start + l[start..].find('"')?;
            Some(PathBuf::from(&l[start..end]))
        })
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if entry
            .path()
            .extension()
            .is_some_and(|e| e == "ptx" || e == "cubin" || e == "sha256")
        {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = std::fs::metadata(path)?.permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(path, perms)?;
    Ok(())
}

/// What `run.sh` does, said to whoever opens the bundle.
const README: &str = "\
oxccl GPU check bundle

Run on a Linux x86-64 machine with an NVIDIA driver and glibc 2.34 or newer (Ubuntu 22.04,
Debian 12, RHEL 9; no Rust toolchain or network needed):

    bash run.sh

Each step runs under a deadline and prints `gpu-check <step> ok|FAILED <figure>`; the script
exits non-zero if any step failed. Logs of each step are in $OUT (or ./logs). bin/ holds the
programs, ptx.tar.gz the kernels as PTX and cubins (unpacked next to the logs, found through
OXCCL_PTX_DIR).
";

/// The bundle's script.
const RUN_SH: &str = include_str!("gpu_bundle/run.sh");

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the bundle copying a build script or a library instead of the test
    /// program, or none.
    #[test]
    fn finds_the_test_executable() {
        let messages = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"oxccl"},"executable":null}
{"reason":"compiler-artifact","target":{"kind":["test"],"crate_types":["bin"],"name":"channels","test":true},"executable":"/t/release/deps/channels-1"}
{"reason":"compiler-artifact","target":{"kind":["test"],"crate_types":["bin"],"name":"cuda_backend","test":true},"executable":"/t/release/deps/cuda_backend-2"}
"#;
        assert_eq!(
            test_executable(messages, "cuda_backend"),
            Some(PathBuf::from("/t/release/deps/cuda_backend-2"))
        );
        assert_eq!(test_executable(messages, "nothing"), None);
    }

    /// Guards against a script that cannot fail: every step's outcome decides the exit
    /// status, and a skipped GPU test counts as a failure.
    #[test]
    fn run_script_fails_on_any_failed_or_skipped_step() {
        assert!(RUN_SH.contains("exit $failed"));
        assert!(RUN_SH.contains("skipped:"));
        for (_, test) in GPU_TESTS {
            assert!(RUN_SH.contains(&format!("bin/{test}")), "{test} is not run");
        }
        for (_, program) in PROGRAMS {
            assert!(
                RUN_SH.contains(&format!("bin/{program}")),
                "{program} is not run"
            );
        }
    }
}
