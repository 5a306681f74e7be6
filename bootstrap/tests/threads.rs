//! Ranks as threads of one process: every operation at N = 1, 2, 3, 7 and 64, and the
//! point-to-point semantics (tags, ordering, concurrency, bounds).

#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{config, contribution, run_ranks, run_ranks_with};
use oxccl_bootstrap::{Bootstrap, Config, Error, Peer};

/// Everything a rank can do, checked against what the other ranks must have sent.
fn exercise(bs: Bootstrap) {
    let (me, n) = (bs.rank(), bs.size());
    assert!(me < n);
    // All threads share the OS host name.
    assert_eq!((bs.local_rank(), bs.local_size()), (me, n));
    // Guards against a rank reporting the unspecified address it is bound to as the one
    // peers dial: a network transport listening there is unreachable from another node.
    assert!(
        !bs.listen_addr().ip().is_unspecified(),
        "rank {me} listens on {}",
        bs.listen_addr()
    );

    let expected: Vec<Vec<u8>> = (0..n).map(contribution).collect();
    assert_eq!(bs.all_gather(&contribution(me)).unwrap(), expected);
    assert_eq!(bs.all_gather_ring(&contribution(me)).unwrap(), expected);
    // Twice more, to catch state left over from one call spoiling the next.
    assert_eq!(bs.all_gather(&contribution(me)).unwrap(), expected);

    let typed: Vec<(u32, String)> = bs.all_gather_value(&(me as u32, format!("r{me}"))).unwrap();
    assert_eq!(
        typed,
        (0..n)
            .map(|r| (r as u32, format!("r{r}")))
            .collect::<Vec<_>>()
    );

    bs.barrier().unwrap();
    bs.barrier().unwrap();

    for root in [0, n - 1, n / 2] {
        let data = format!("from root {root}").into_bytes();
        let mine = if me == root {
            data.clone()
        } else {
            b"ignored".to_vec()
        };
        assert_eq!(bs.broadcast(root, &mine).unwrap(), data);
    }

    // Point-to-point around the ring, tags sent in the opposite order of receipt.
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    bs.send(right, 2, format!("two from {me}").as_bytes())
        .unwrap();
    bs.send(right, 1, format!("one from {me}").as_bytes())
        .unwrap();
    assert_eq!(
        bs.recv(left, 1).unwrap(),
        format!("one from {left}").into_bytes()
    );
    assert_eq!(
        bs.recv(left, 2).unwrap(),
        format!("two from {left}").into_bytes()
    );
    bs.send_value(right, 3, &vec![me as u64; 3]).unwrap();
    assert_eq!(
        bs.recv_value::<Vec<u64>>(left, 3).unwrap(),
        vec![left as u64; 3]
    );

    // A message to oneself.
    bs.send(me, 4, b"self").unwrap();
    assert_eq!(bs.recv(me, 4).unwrap(), b"self");

    // Nobody drops its bootstrap (closing connections) while others still need it.
    bs.barrier().unwrap();
}

// Guards against the single-rank case dialling anyone or dividing by zero in the
// algorithms' layouts.
#[test]
fn threads_n1() {
    run_ranks(1, exercise);
}

// Guards against the smallest real exchange (where left == right in the ring) breaking.
#[test]
fn threads_n2() {
    run_ranks(2, exercise);
}

// Guards against the fold of a non-power-of-two size (one extra rank) breaking.
#[test]
fn threads_n3() {
    run_ranks(3, exercise);
}

// Guards against the fold with several extra ranks, and broadcast trees not rooted at 0.
#[test]
fn threads_n7() {
    run_ranks(7, exercise);
}

// Guards against problems that only show at scale: lazy connections, the root's join
// wait, dial races and backlog.
#[test]
fn threads_n64() {
    run_ranks(64, exercise);
}

// Guards against local ranks being computed from global ranks instead of host names, and
// against a launcher's local rank being ignored.
#[test]
fn local_rank_follows_hostnames_and_launcher() {
    let hosts = ["a", "b", "a", "c", "b", "a"];
    let got = run_ranks_with(
        6,
        |r| config().with_hostname(hosts[r]),
        |bs| (bs.local_rank(), bs.local_size(), bs.hostname().to_owned()),
    );
    let got: Vec<_> = got.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        vec![(0, 3), (0, 2), (1, 3), (0, 1), (1, 2), (2, 3)]
    );
    assert_eq!(got[3].2, "c");

    let got = run_ranks_with(
        2,
        |r| {
            config()
                .with_hostname("same")
                .with_local_rank(Some(1 - r), Some(2))
        },
        |bs| bs.local_rank(),
    );
    assert_eq!(
        got.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![1, 0]
    );
}

// Guards against large collectives deadlocking when both partners block writing into full
// socket buffers (messages far above the inline-send threshold).
#[test]
fn large_contributions_do_not_deadlock() {
    const BYTES: usize = 3 << 20;
    let got = run_ranks_with(
        3,
        |_| config().with_max_frame_bytes(16 << 20),
        |bs| {
            let me = bs.rank();
            let mine = vec![me as u8; BYTES];
            let all = bs.all_gather(&mine).unwrap();
            let ring = bs.all_gather_ring(&mine).unwrap();
            let bc = bs.broadcast(2, &mine).unwrap();
            bs.barrier().unwrap();
            (all, ring, bc)
        },
    );
    for res in got {
        let (all, ring, bc) = res.unwrap();
        for (r, block) in all.iter().enumerate() {
            assert_eq!(block.len(), BYTES);
            assert!(block.iter().all(|&b| b == r as u8));
        }
        assert_eq!(all, ring);
        assert_eq!(bc, vec![2u8; BYTES]);
    }
}

// Guards against concurrent receives of different tags from one peer stealing or losing
// each other's messages (one thread reads the socket for both).
#[test]
fn concurrent_recvs_on_one_peer() {
    run_ranks(2, |bs| {
        if bs.rank() == 0 {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..8u64)
                    .map(|tag| {
                        let bs = &bs;
                        s.spawn(move || {
                            for i in 0..20u64 {
                                let got = bs.recv(1, tag).unwrap();
                                assert_eq!(got, (tag * 1000 + i).to_le_bytes());
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().unwrap();
                }
            });
        } else {
            // Interleave tags; within a tag, order must be kept.
            for i in 0..20u64 {
                for tag in (0..8u64).rev() {
                    bs.send(0, tag, &(tag * 1000 + i).to_le_bytes()).unwrap();
                }
            }
        }
        bs.barrier().unwrap();
    });
}

// Guards against a peer dropping its bootstrap leaving the other side hanging until the
// deadline instead of reporting the close.
#[test]
fn peer_closed_is_reported() {
    let got = run_ranks_with(
        2,
        |_| config(),
        |bs| {
            bs.barrier().unwrap();
            if bs.rank() == 1 {
                drop(bs);
                return None;
            }
            let t = std::time::Instant::now();
            let e = bs.recv(1, 7).unwrap_err();
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "took {:?}",
                t.elapsed()
            );
            Some(e)
        },
    );
    let e = got.into_iter().next().unwrap().unwrap().unwrap();
    assert!(
        matches!(
            e,
            Error::PeerClosed {
                rank: 0,
                peer: Peer::Rank(1)
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("rank 1 closed the connection"),
        "{e}"
    );
}

// Guards against a message above the frame limit being sent (or half-sent, breaking the
// connection) instead of refused up front.
#[test]
fn oversized_send_is_refused_and_connection_survives() {
    run_ranks_with(
        2,
        |_| Config::default().with_max_frame_bytes(8 << 10),
        |bs| {
            if bs.rank() == 0 {
                let e = bs.send(1, 1, &vec![0u8; 9 << 10]).unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::MessageTooLarge {
                            rank: 0,
                            peer: 1,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert!(e.to_string().contains("to rank 1"), "{e}");
                bs.send(1, 1, b"small").unwrap();
            } else {
                assert_eq!(bs.recv(0, 1).unwrap(), b"small");
            }
            bs.barrier().unwrap();
        },
    );
}

// Guards against unclaimed messages growing without bound: past the pending limit the
// peer is reported, not buffered.
#[test]
fn pending_messages_are_bounded() {
    let got = run_ranks_with(
        2,
        |_| config().with_max_pending(1 << 20, 4),
        |bs| {
            if bs.rank() == 1 {
                for i in 0..10u64 {
                    // The receiver may already have given up on this peer.
                    let _ = bs.send(0, 100 + i, b"unclaimed");
                }
                let _ = bs.recv(0, 0);
                None
            } else {
                let e = bs.recv(1, 99).unwrap_err();
                let _ = bs.send(1, 0, b"done");
                Some(e)
            }
        },
    );
    let e = got.into_iter().next().unwrap().unwrap().unwrap();
    assert!(matches!(e, Error::Overflow { messages: 5, .. }), "{e:?}");
}

// Guards against out-of-range peers and roots being used as indexes (panic) instead of
// reported.
#[test]
fn bad_arguments_are_errors() {
    run_ranks(2, |bs| {
        assert!(matches!(bs.send(2, 0, b""), Err(Error::InvalidUsage(_))));
        assert!(matches!(
            bs.recv(usize::MAX, 0),
            Err(Error::InvalidUsage(_))
        ));
        assert!(matches!(bs.broadcast(5, b""), Err(Error::InvalidUsage(_))));
        bs.barrier().unwrap();
    });
    let id = oxccl_bootstrap::UniqueId::new("127.0.0.1:1".parse().unwrap()).unwrap();
    assert!(matches!(
        Bootstrap::init(&id, 2, 2),
        Err(Error::InvalidUsage(_))
    ));
    assert!(matches!(
        Bootstrap::init(&id, 0, 0),
        Err(Error::InvalidUsage(_))
    ));
    let bad = Config::default().with_max_frame_bytes(10);
    assert!(matches!(
        Bootstrap::init_with_config(&id, 0, 1, &bad),
        Err(Error::InvalidUsage(_))
    ));
}

// Guards against simultaneous dials between two ranks (both send first) ending with two
// connections per pair, or with neither, or with lost messages: all-to-all sends with no
// connection made beforehand.
#[test]
fn simultaneous_dials_share_one_connection() {
    let n = 8;
    let got = run_ranks(n, |bs| {
        let me = bs.rank();
        for round in 0..3u64 {
            for peer in (0..n).filter(|&p| p != me) {
                bs.send(peer, round, &[me as u8, round as u8]).unwrap();
            }
            for peer in (0..n).filter(|&p| p != me) {
                assert_eq!(bs.recv(peer, round).unwrap(), [peer as u8, round as u8]);
            }
        }
        bs.barrier().unwrap();
        (
            bs.connections(),
            bs.rejected_connections(),
            bs.recent_rejections(),
        )
    });
    for (r, (conns, rejected, why)) in got.into_iter().enumerate() {
        assert_eq!(conns, n - 1, "rank {r}");
        assert_eq!(rejected, 0, "rank {r}: {why:?}");
    }
}
