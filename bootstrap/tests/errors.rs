//! Bad input and absent peers: every case is a clear error on the side that should see it,
//! and the bootstrap goes on serving the ranks that behave.

#![allow(missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{config, loopback};
use hmac::{Hmac, KeyInit, Mac};
use oxccl_bootstrap::{
    Bootstrap, Config, Error, MAX_CONCURRENT_HANDSHAKES, Peer, Secret, UniqueId,
};
use sha2::Sha256;

/// Starts rank 0 of a 2-rank bootstrap on a thread; returns its id and the join handle.
fn root_of_two(
    cfg: Config,
) -> (
    UniqueId,
    thread::JoinHandle<oxccl_bootstrap::Result<Bootstrap>>,
) {
    let (id, listener) = UniqueId::listen(loopback()).unwrap();
    let id2 = id.clone();
    let h = thread::spawn(move || Bootstrap::init_root(&id2, listener, 2, &cfg));
    (id, h)
}

/// Reads until the peer closes (or 5 s pass); returns what it sent.
fn drain(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

// Guards against a rank holding another secret (another job's id, or an attacker's guess)
// joining: it must fail with WrongSecret, the root must record the refusal, and the
// rightful rank 1 must still get in afterwards.
#[test]
fn bootstrap_rejects_wrong_secret() {
    let (id, root) = root_of_two(config());
    let forged = UniqueId::from_parts(id.root(), Secret::random().unwrap());
    let e = Bootstrap::init_with_config(&forged, 1, 2, &config()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongSecret {
                rank: 1,
                peer: Peer::Rank(0)
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("wrong bootstrap secret"), "{e}");

    let one = Bootstrap::init_with_config(&id, 1, 2, &config()).unwrap();
    let zero = root.join().unwrap().unwrap();
    assert!(zero.rejected_connections() >= 1);
    assert!(
        zero.recent_rejections()
            .iter()
            .any(|r| r.contains("wrong bootstrap secret")),
        "{:?}",
        zero.recent_rejections()
    );
    // The admitted pair works.
    let want = vec![b"0".to_vec(), b"1".to_vec()];
    thread::scope(|s| {
        let h = s.spawn(|| one.all_gather(b"1").unwrap());
        assert_eq!(zero.all_gather(b"0").unwrap(), want);
        assert_eq!(h.join().unwrap(), want);
    });
}

// Guards against a rank of another protocol version being trusted, or being reported as
// garbage: both sides must name both versions.
#[test]
fn bootstrap_rejects_version_mismatch() {
    let (id, root) = root_of_two(config());
    let newer = config().with_protocol_version(oxccl_bootstrap::PROTOCOL_VERSION + 1);
    let e = Bootstrap::init_with_config(&id, 1, 2, &newer).unwrap_err();
    let (v, v1) = (
        oxccl_bootstrap::PROTOCOL_VERSION,
        oxccl_bootstrap::PROTOCOL_VERSION + 1,
    );
    assert!(
        matches!(e, Error::VersionMismatch { rank: 1, peer: Peer::Rank(0), expected, got } if expected == v1 && got == v),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains(&format!("expected protocol v{v1}, peer sent v{v}")),
        "{e}"
    );

    let _one = Bootstrap::init_with_config(&id, 1, 2, &config()).unwrap();
    let zero = root.join().unwrap().unwrap();
    let seen = zero.recent_rejections();
    assert!(
        seen.iter()
            .any(|r| r.contains(&format!("expected protocol v{v}, peer sent v{v1}"))),
        "{seen:?}"
    );
}

// Guards against malformed frames being trusted or crashing a rank: garbage, an oversized
// length prefix and data before the handshake are refused at the root's door; a malformed
// frame from an authenticated peer is a MalformedFrame error naming that peer.
#[test]
fn bootstrap_rejects_malformed_frame() {
    let (id, root) = root_of_two(config());
    let v = oxccl_bootstrap::PROTOCOL_VERSION as u8;
    let attempts: [(&str, Vec<u8>); 4] = [
        ("garbage payload", frame(&[0xde, 0xad, 0xbe, 0xef, 0x99])),
        ("oversized length prefix", u32::MAX.to_le_bytes().to_vec()),
        // Data { tag: User(0), body: Bytes([]) } before any handshake.
        ("data before handshake", frame(&[v, 5, 0, 0, 0, 0])),
        ("empty frame", frame(&[])),
    ];
    for (what, bytes) in &attempts {
        let mut s = TcpStream::connect(id.root()).unwrap();
        s.write_all(bytes).unwrap();
        let reply = drain(&mut s);
        // The root answers with at most a short Reject frame, then closes.
        assert!(reply.len() < 64, "{what}: {} bytes back", reply.len());
    }
    let one = Bootstrap::init_with_config(&id, 1, 2, &config()).unwrap();
    let zero = root.join().unwrap().unwrap();
    let seen = zero.recent_rejections();
    assert!(
        zero.rejected_connections() >= attempts.len() as u64,
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|r| r.contains("malformed frame")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|r| r.contains("exceeds the limit")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|r| r.contains("expected Hello, got Data")),
        "{seen:?}"
    );

    drop((zero, one));

    // An authenticated connection (an independent client of the wire protocol, holding
    // the secret) claiming rank 2, to rank 1 (which has not met rank 2 yet), that then
    // sends a malformed data frame.
    let [_zero, one, _two] = three_ranks(config());
    let mut imp = Impostor::connect(&one.id, one.bs.listen_addr(), 2, 1, 3);
    imp.send(&frame(&[v, 5, 0, 0, 0, 200])); // Bytes of length 200 with nothing after
    let e = one.bs.recv(2, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::MalformedFrame {
                rank: 1,
                peer: Peer::Rank(2),
                ..
            }
        ),
        "{e:?}"
    );
}

// Guards against an authenticated peer's oversized frame being allocated instead of
// refused by its length prefix.
#[test]
fn authenticated_oversized_frame_is_refused() {
    let [_zero, one, _two] = three_ranks(config().with_max_frame_bytes(64 << 10));
    let mut imp = Impostor::connect(&one.id, one.bs.listen_addr(), 2, 1, 3);
    imp.send(&(1u32 << 30).to_le_bytes());
    let e = one.bs.recv(2, 0).unwrap_err();
    assert!(
        matches!(e, Error::FrameTooLarge { rank: 1, peer: Peer::Rank(2), len, limit } if len == 1 << 30 && limit == 64 << 10),
        "{e:?}"
    );
}

struct Rank {
    id: UniqueId,
    bs: Bootstrap,
}

/// Three ranks as threads, initialized and returned (each has met only rank 0).
fn three_ranks(cfg: Config) -> [Rank; 3] {
    let (id, listener) = UniqueId::listen(loopback()).unwrap();
    let mut listener = Some(listener);
    let ranks: Vec<Rank> = thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let (id, cfg) = (&id, &cfg);
                let l = listener.take().filter(|_| r == 0);
                s.spawn(move || {
                    let bs = match l {
                        Some(l) => Bootstrap::init_root(id, l, 3, cfg),
                        None => Bootstrap::init_with_config(id, r, 3, cfg),
                    }
                    .unwrap();
                    Rank { id: id.clone(), bs }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    ranks.try_into().unwrap_or_else(|_| unreachable!())
}

// Guards against waits without deadlines: a root whose ranks never come, a rank whose
// root never comes, and a recv / collective whose peer never answers must each fail
// within the configured timeout, naming the ranks that did not answer.
#[test]
fn bootstrap_times_out() {
    let short = Config::default().with_timeout(Duration::from_millis(400));

    // The root of 4 ranks, of which only rank 2 comes.
    let (id, listener) = UniqueId::listen(loopback()).unwrap();
    let id2 = id.clone();
    let two = thread::spawn(move || {
        Bootstrap::init_with_config(
            &id2,
            2,
            4,
            &Config::default().with_timeout(Duration::from_secs(5)),
        )
    });
    let t = Instant::now();
    let e = Bootstrap::init_root(&id, listener, 4, &short).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    match &e {
        Error::Timeout { rank: 0, peers, .. } => assert_eq!(peers.ranks(), &[1, 3]),
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("no answer from rank(s) 1, 3"), "{e}");
    // Rank 2 learns that the root gave up rather than hanging.
    assert!(two.join().unwrap().is_err());

    // A rank whose root never listens.
    let nobody = UniqueId::listen(loopback()).map(|(id, l)| {
        drop(l);
        id
    });
    let t = Instant::now();
    let e = Bootstrap::init_with_config(&nobody.unwrap(), 1, 2, &short).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&e, Error::Timeout { rank: 1, peers, .. } if peers.ranks() == [0]),
        "{e:?}"
    );

    // A recv and a collective whose peer never answers.
    let got = common::run_ranks_with(
        2,
        |_| Config::default().with_timeout(Duration::from_millis(300)),
        |bs| {
            if bs.rank() == 0 {
                let t = Instant::now();
                let recv = bs.recv(1, 42).unwrap_err();
                let gather = bs.all_gather(b"x").unwrap_err();
                assert!(t.elapsed() < Duration::from_secs(5));
                Some((recv, gather))
            } else {
                // Rank 1 stays alive but silent until rank 0 has given up.
                thread::sleep(Duration::from_millis(1500));
                None
            }
        },
    );
    let (recv, gather) = got.into_iter().next().unwrap().unwrap().unwrap();
    assert!(
        matches!(&recv, Error::Timeout { op: "recv", peers, .. } if peers.ranks() == [1]),
        "{recv:?}"
    );
    assert!(
        matches!(&gather, Error::Timeout { op: "all_gather", peers, .. } if peers.ranks() == [1]),
        "{gather:?}"
    );
    assert!(
        gather
            .to_string()
            .contains("rank 0: all_gather timed out after 300ms; no answer from rank(s) 1"),
        "{gather}"
    );
}

// Guards against a silent stray connection to the root stalling the join of real ranks
// (handshakes run concurrently, each with its own deadline).
#[test]
fn silent_stray_connection_does_not_stall_join() {
    let (id, root) = root_of_two(config().with_handshake_timeout(Duration::from_secs(20)));
    let _silent = TcpStream::connect(id.root()).unwrap();
    let t = Instant::now();
    let _one = Bootstrap::init_with_config(&id, 1, 2, &config()).unwrap();
    let _zero = root.join().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Guards against a client that sends its handshake one byte at a time holding an acceptor
/// slot past the handshake deadline (each read was allowed the whole time left, so a byte
/// per read kept the handshake alive): `MAX_CONCURRENT_HANDSHAKES` such clients stalled
/// every join.
#[test]
fn slow_handshake_clients_do_not_stall_join() {
    let handshake_timeout = Duration::from_millis(300);
    // Below the handshake timeout, so no single read of the old code ever timed out.
    let pause = Duration::from_millis(100);
    // A join waits for at most a few handshake deadlines; a trickling client left alone
    // holds its slot for 504 pauses (about 50 s).
    let join_bound = Duration::from_secs(5);
    let test_deadline = Duration::from_secs(20);

    let (id, root) = root_of_two(config().with_handshake_timeout(handshake_timeout));
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let clients: Vec<TcpStream> = (0..MAX_CONCURRENT_HANDSHAKES + 8)
        .map(|_| TcpStream::connect(id.root()).unwrap())
        .collect();
    for mut c in clients {
        let stop = stop.0.clone();
        thread::spawn(move || {
            // A frame header claiming 500 bytes (under the handshake limit), then the bytes.
            let mut bytes = 500u32.to_le_bytes().to_vec();
            bytes.resize(4 + 500, 0);
            for b in bytes {
                if stop.load(Ordering::Relaxed) || c.write_all(&[b]).is_err() {
                    return;
                }
                thread::sleep(pause);
            }
        });
    }

    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        let one = Bootstrap::init_with_config(&id, 1, 2, &config());
        let zero = root.join().unwrap();
        let _ = tx.send((t.elapsed(), one.map(drop), zero.map(drop)));
    });
    let (elapsed, one, zero) = rx
        .recv_timeout(test_deadline)
        .unwrap_or_else(|_| panic!("ranks 0 and 1 did not join within {test_deadline:?}"));
    one.unwrap();
    zero.unwrap();
    assert!(elapsed < join_bound, "join took {elapsed:?}");
}

/// Sets the flag when dropped, so the client threads stop even when the test panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

// Guards against two processes started with the same rank both being admitted, and
// against ranks of differently sized jobs joining each other.
#[test]
fn duplicate_rank_and_size_mismatch_are_refused() {
    let (id, listener) = UniqueId::listen(loopback()).unwrap();
    let id0 = id.clone();
    let root = thread::spawn(move || Bootstrap::init_root(&id0, listener, 3, &config()));
    let e = Bootstrap::init_with_config(&id, 1, 4, &config()).unwrap_err();
    assert!(e.to_string().contains("world size mismatch"), "{e}");

    // Hold rank 1's slot with an authenticated connection, then try a real rank 1.
    let _first = Impostor::connect(&id, id.root(), 1, 0, 3);
    let e = Bootstrap::init_with_config(&id, 1, 3, &config()).unwrap_err();
    assert!(e.to_string().contains("already joined"), "{e}");
    drop(root);
}

/// An independent client of the wire protocol, written from its description, holding the
/// secret: it authenticates as `from` to rank `to`, then sends raw bytes.
struct Impostor {
    s: TcpStream,
}

impl Impostor {
    fn connect(id: &UniqueId, addr: SocketAddr, from: u32, to: u32, size: u32) -> Self {
        let v = oxccl_bootstrap::PROTOCOL_VERSION;
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let nonce_c = [0x5a; 16];
        // Hello: version, kind 0, from, to, size (varints < 128 here), nonce.
        let mut hello = vec![v as u8, 0, from as u8, to as u8, size as u8];
        hello.extend_from_slice(&nonce_c);
        s.write_all(&frame(&hello)).unwrap();
        // Challenge: version, kind 1, nonce (16), mac (32).
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut ch = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut ch).unwrap();
        assert_eq!(&ch[..2], &[v as u8, 1], "expected a Challenge");
        let nonce_a: [u8; 16] = ch[2..18].try_into().unwrap();
        let mac = |label: &[u8]| {
            let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(id.secret().as_bytes()).unwrap();
            m.update(&(label.len() as u32).to_le_bytes());
            m.update(label);
            m.update(&v.to_le_bytes());
            m.update(&from.to_le_bytes());
            m.update(&to.to_le_bytes());
            m.update(&size.to_le_bytes());
            m.update(&nonce_c);
            m.update(&nonce_a);
            m
        };
        mac(b"oxccl-bootstrap acceptor proof")
            .verify_slice(&ch[18..50])
            .expect("acceptor proof verifies");
        let mut proof = vec![v as u8, 2];
        proof.extend_from_slice(
            &mac(b"oxccl-bootstrap connector proof")
                .finalize()
                .into_bytes(),
        );
        s.write_all(&frame(&proof)).unwrap();
        s.read_exact(&mut len).unwrap();
        let mut welcome = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut welcome).unwrap();
        assert_eq!(welcome, [v as u8, 3], "expected Welcome");
        Impostor { s }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }
}
