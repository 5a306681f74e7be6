//! The ports `free_loopback_port` hands out: bindable, distinct, and never ones the system gives
//! to outgoing connections.

#![allow(missing_docs)]

use std::collections::HashSet;
use std::net::TcpListener;

/// The system's ephemeral port range (`ip_local_port_range`), where it picks the local
/// port of every outgoing connection.
fn ephemeral_range() -> std::ops::RangeInclusive<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("reading ip_local_port_range");
    let mut it = text.split_whitespace().map(|w| w.parse::<u16>().unwrap());
    it.next().unwrap()..=it.next().unwrap()
}

// Guards against a rank 0 failing to bind its port (`AddrInUse`) because, between the
// port being chosen and the rank binding it, a connection elsewhere on the machine was
// given the same port as its local end: ports from the ephemeral range can be taken so
// at any moment.
#[test]
fn free_port_is_outside_the_ephemeral_range() {
    let range = ephemeral_range();
    for _ in 0..50 {
        let port = oxccl_bootstrap::free_loopback_port().unwrap();
        assert!(
            !range.contains(&port),
            "port {port} is in the ephemeral range {range:?}"
        );
    }
}

// Guards against two tests of one binary, running at once, being given the same port.
#[test]
fn free_port_never_repeats_and_is_bindable() {
    let mut seen = HashSet::new();
    for _ in 0..200 {
        let port = oxccl_bootstrap::free_loopback_port().unwrap();
        assert!(seen.insert(port), "port {port} handed out twice");
        TcpListener::bind(("127.0.0.1", port)).expect("binding the handed-out port");
    }
}

// Guards against a handed-out port that a job's rank 0 cannot bind because the check that
// found it free left a listener behind for a moment: a child process forked by another
// thread in that moment (any `Command`) holds a copy of the checking socket until it
// execs, and a listening copy keeps the port from everyone else. Each port is bound at
// once, as a rank 0 binds its root listener, while another thread spawns processes.
#[test]
fn a_port_is_free_at_once_while_other_threads_spawn_processes() {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let status = std::process::Command::new("true").status().unwrap();
                assert!(status.success());
            }
        });
        for _ in 0..300 {
            let port = oxccl_bootstrap::free_loopback_port().unwrap();
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            if let Err(e) = oxccl_bootstrap::RootListener::bind(addr) {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("port {port} handed out but not bindable: {e}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}
