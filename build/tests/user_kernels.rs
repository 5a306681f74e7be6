//! A kernel crate outside this workspace (`tests/fixtures/user-kernels`, a workspace of its
//! own that depends on `oxccl-device` by path), built to PTX the ways a user builds theirs:
//! through the library, as a build script would, and through the `oxccl-build` command.
//!
//! The build is `#[ignore]`d: it compiles `core` for nvptx64 in a target directory of its
//! own, a minute or two on two cores. `cargo xtask ci` runs it in its build-ptx step; by hand:
//!
//! ```text
//! cargo test -p oxccl-build --test user_kernels -- --ignored
//! ```

use oxccl_build::arch::MIN_ARCH;
use oxccl_build::bounded::run_bounded;
use oxccl_build::error::with_causes;
use oxccl_build::{Ptx, Ptxas, Workspace};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The fixture's path dependency on the device crate, as its manifest writes it.
const DEVICE_DEP: &str = r#"oxccl-device = { path = "../../../../device-kernels" }"#;

/// The one kernel of the fixture.
const KERNEL: &str = "add_to_each";

/// Longest the command's build and check may take (the library's build ran just before, so
/// cargo finds everything fresh).
const COMMAND_TIME_LIMIT: Duration = Duration::from_secs(10 * 60);

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/user-kernels")
}

/// This workspace's root.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Guards against the fixture passing for a user's crate while cargo reads it as a member of
/// this workspace (which `cargo xtask` can already build): it must be a workspace of its own,
/// and a kernel crate there.
#[test]
fn the_fixture_is_a_kernel_crate_outside_this_workspace() {
    let ours = Workspace::load_manifest(&workspace_root().join("Cargo.toml")).unwrap();
    assert!(ours.package("user-kernels").is_err());
    let theirs = Workspace::load_manifest(&fixture().join("Cargo.toml")).unwrap();
    assert_eq!(theirs.root, fixture());
    assert_eq!(theirs.packages.len(), 1);
    let pkg = theirs.kernel_crate("user-kernels").unwrap();
    assert_eq!(pkg.lib_name(), Some("user_kernels"));
}

/// Guards against a build that works only for crates of this workspace: paths, target
/// directory and metadata all come from the user's crate, and the module holds its kernel
/// as an entry that ptxas accepts.
#[test]
#[ignore = "builds core for nvptx64 (minutes); cargo xtask ci runs it"]
fn a_kernel_crate_outside_the_workspace_builds_to_ptx() {
    let dir = copy_fixture();
    let manifest = dir.join("Cargo.toml");
    let target = dir.join("target");

    // The library, as a build script or a tool calls it.
    let ptx = Ptx::new("user-kernels")
        .manifest_path(&manifest)
        .arch(MIN_ARCH)
        .target_dir(&target)
        .build()
        .unwrap_or_else(|e| panic!("{}", with_causes(&e)));
    assert_eq!(
        ptx,
        target.join("ptx").join(MIN_ARCH).join("user_kernels.ptx")
    );
    let text = std::fs::read_to_string(&ptx).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(".entry") && l.contains(KERNEL)),
        "no `.entry {KERNEL}` in {}",
        ptx.display()
    );

    // ptxas: `OXCCL_PTXAS`, or the one this workspace's build-ptx installed (installed here
    // otherwise), not a second installation in the fixture's target directory.
    let ours = Workspace::load_manifest(&workspace_root().join("Cargo.toml")).unwrap();
    let ptxas = Ptxas::locate(&ours.target_dir).unwrap_or_else(|e| panic!("{}", with_causes(&e)));
    let stats = ptxas
        .assemble(&ptx, MIN_ARCH, &ptx.with_extension("cubin"))
        .unwrap_or_else(|e| panic!("{}", with_causes(&e)));
    let kernel = stats
        .iter()
        .find(|f| f.name == KERNEL)
        .unwrap_or_else(|| panic!("ptxas reported no `{KERNEL}`: {stats:?}"));
    assert!(kernel.is_entry && kernel.registers.is_some(), "{kernel:?}");

    // The command, as a user runs it, writing the module elsewhere.
    let deploy = dir.join("deploy");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxccl-build"));
    cmd.arg("--manifest-path")
        .arg(&manifest)
        .args(["--package", "user-kernels", "--arch", MIN_ARCH, "--check"])
        .arg("--target-dir")
        .arg(&target)
        .arg("--out-dir")
        .arg(&deploy)
        .env("OXCCL_PTXAS", ptxas.path());
    run_bounded(&mut cmd, COMMAND_TIME_LIMIT).unwrap_or_else(|e| panic!("{}", with_causes(&e)));
    let deployed = deploy.join(MIN_ARCH).join("user_kernels.ptx");
    assert_eq!(std::fs::read_to_string(&deployed).unwrap(), text);
}

/// A copy of the fixture under this workspace's target directory, its path dependency made
/// absolute, with this workspace's `Cargo.lock` so that it resolves the versions already
/// downloaded instead of asking crates.io. Builds here never write into the source tree.
fn copy_fixture() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("user-kernels");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let manifest = std::fs::read_to_string(fixture().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(DEVICE_DEP),
        "the fixture's manifest changed"
    );
    let device = workspace_root().join("device-kernels");
    let manifest = manifest.replace(
        DEVICE_DEP,
        &format!(
            "oxccl-device = {{ path = {:?} }}",
            device.display().to_string()
        ),
    );
    write_if_changed(&dir.join("Cargo.toml"), &manifest);
    let lib = std::fs::read_to_string(fixture().join("src/lib.rs")).unwrap();
    write_if_changed(&src.join("lib.rs"), &lib);
    if !dir.join("Cargo.lock").exists() {
        std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    }
    dir
}

/// Writes `text` unless the file holds it already, so that a second run finds the build
/// fresh.
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).unwrap();
    }
}
