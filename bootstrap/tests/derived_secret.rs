//! The warning about a secret derived from launcher variables. It is logged once per
//! process, so it is tested in a process of its own.

#![allow(missing_docs)]

mod common;

use std::collections::HashMap;

use oxccl_bootstrap::{Bootstrap, LaunchEnv};

/// Guards against a derived secret (which anyone who can reach the root port and guess
/// the launcher's variables can compute) going unmentioned, being mentioned without
/// naming the launcher and the way to a real secret, or flooding the log with one warning
/// per bootstrap.
#[test]
fn derived_secret_is_warned_about_once() {
    let port = || oxccl_testing::free_port().to_string();
    let job = |port: String| {
        let map: HashMap<&str, String> = [
            ("RANK", "0".to_owned()),
            ("WORLD_SIZE", "1".to_owned()),
            ("MASTER_ADDR", "127.0.0.1".to_owned()),
            ("MASTER_PORT", port),
        ]
        .into_iter()
        .collect();
        LaunchEnv::from_lookup(|k| map.get(k).cloned()).unwrap()
    };
    let (secrets, log) = common::capture_logs(|| {
        (0..2)
            .map(|_| {
                let e = job(port());
                drop(Bootstrap::from_launch_env(&e, &common::config()).unwrap());
                e.secret().to_hex()
            })
            .collect::<Vec<_>>()
    });
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("derived"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    let w = warnings[0];
    for needle in [
        "torchrun",
        "OXCCL_SECRET",
        "OXCCL_SECRET_FILE",
        "OXCCL_UNIQUE_ID",
    ] {
        assert!(w.contains(needle), "no {needle:?} in: {w}");
    }
    for hex in secrets {
        assert!(!log.contains(&hex), "the secret is in the log: {log}");
    }
}
