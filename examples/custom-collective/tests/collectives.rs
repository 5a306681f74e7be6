//! The example's whole run on the CPU emulator, checked: every element of every launch of
//! both kernels, for several job shapes.

use oxccl_custom_collective::ptx::{KERNEL_CRATE, kernel_manifest};
use oxccl_custom_collective::{Options, run};
use std::time::Duration;

fn options(ranks: u32, count: usize, root: u32, proxy_assist: bool) -> Options {
    Options {
        ranks,
        count,
        launches: 6,
        threads: 3,
        root,
        proxy_assist,
        wait_timeout: Duration::from_secs(20),
        ..Options::default()
    }
}

/// Guards against a kernel that puts a chunk at the wrong offset or into the wrong peer,
/// signals or waits on the wrong channel, or lets a launch overwrite a buffer a peer's
/// previous launch still reads: every element of every output of every launch must hold
/// the value of its rank, launch and index. Counts that are no multiple of 4 elements put
/// the chunks at offsets no 16-byte copy is aligned to; proxy assist off sends every port
/// channel copy through the proxy thread, so a missing flush would show.
#[test]
fn every_element_of_every_launch_arrives() {
    for (ranks, count, root, assist) in
        [(2, 1001, 0, false), (3, 257, 2, true), (4, 1000, 1, false)]
    {
        let opts = options(ranks, count, root, assist);
        let report = run(&opts).unwrap();
        let launches = opts.launches as u64;
        let (n, count) = (ranks as u64, count as u64);
        let shape = format!("{ranks} ranks, {count} elements, root {root}, assist {assist}");
        assert!(
            report.all_gather.wrong.is_empty(),
            "{shape}: {} wrong, first {}",
            report.all_gather.wrong.len(),
            report.all_gather.wrong[0]
        );
        assert!(
            report.broadcast.wrong.is_empty(),
            "{shape}: {} wrong, first {}",
            report.broadcast.wrong.len(),
            report.broadcast.wrong[0]
        );
        // Every output was looked at: n ranks x launches x (n chunks | 1 chunk).
        assert_eq!(
            report.all_gather.checked,
            n * launches * n * count,
            "{shape}"
        );
        assert_eq!(report.broadcast.checked, n * launches * count, "{shape}");
        assert!(report.ok());
    }
}

/// Guards against options the values cannot tell apart (more than 256 ranks or launches,
/// more than 65536 elements) or a root outside the job running instead of being refused.
#[test]
fn options_out_of_range_are_refused() {
    for bad in [
        Options {
            ranks: 1,
            ..Options::default()
        },
        Options {
            count: 0,
            ..Options::default()
        },
        Options {
            count: 1 << 17,
            ..Options::default()
        },
        Options {
            launches: 0,
            ..Options::default()
        },
        Options {
            threads: 0,
            ..Options::default()
        },
        Options {
            root: 4,
            ..Options::default()
        },
    ] {
        let err = run(&bad).unwrap_err();
        assert!(
            matches!(err, oxccl::Error::InvalidUsage(_)),
            "{bad:?}: {err}"
        );
    }
}

/// Guards against `--build-ptx` pointing at a crate that oxccl-build would refuse (moved,
/// renamed, or no longer opting in as a kernel crate). The build itself runs in
/// `cargo xtask build-ptx`, which builds every kernel crate of the workspace.
#[test]
fn the_kernel_crate_is_one_oxccl_build_builds() {
    let ws = oxccl_build::Workspace::load_manifest(&kernel_manifest()).unwrap();
    let pkg = ws.kernel_crate(KERNEL_CRATE).unwrap();
    assert_eq!(pkg.lib_name(), Some("custom_collective_kernels"));
}

/// Guards against a launch that writes into a peer's buffer before the peer has copied out
/// its previous launch's result (a kernel without its ready handshake, or a broadcast root
/// that changes its buffer before its copies are flushed): many launches back to back on 4
/// ranks, every launch's output checked. The race needs a rank to run a launch ahead while a
/// peer is still copying out, so a kernel with the bug fails this test in most runs (about
/// 3 in 4 on two cores), not every run; the offsets and sizes above fail every run.
#[test]
fn launches_back_to_back_do_not_overwrite_each_other() {
    let opts = Options {
        launches: 200,
        ..options(4, 8192, 3, false)
    };
    let report = run(&opts).unwrap();
    for outcome in [&report.all_gather, &report.broadcast] {
        assert!(
            outcome.wrong.is_empty(),
            "{} wrong, first {}",
            outcome.wrong.len(),
            outcome.wrong[0]
        );
    }
}
