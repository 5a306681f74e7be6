//! Port channels over Ethernet (TCP on the loopback), between ranks that are threads of one
//! process, and a receiver facing a client that speaks the wire format with bad frames.
#![allow(missing_docs)]

mod common;

use common::{assert_all_gathered, config_with_assist, ring_buffer};
use oxccl::ethernet::new_token;
use oxccl::ethernet_connection::EthernetConnection;
use oxccl::ethernet_wire::{
    MAX_CHUNK_BYTES, MAX_FRAME_HEADER_BYTES, Message, ReadOutcome, TOKEN_BYTES, encode, read_header,
};
use oxccl::host_ipc::HostIpcHandle;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, Error, RegisteredMemory, Transport, TransportChoice};
use oxccl_device::launch::LaunchConfig;
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::{DeviceError, kernel};
use oxccl_kernels::device_check::put_then_flush;
use oxccl_kernels::ring_exchange::port_ring_exchange;
use oxccl_proxy::{Connection, ProxyError};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn ethernet(assist: bool) -> InProcessConfig {
    let mut config = config_with_assist(assist);
    config.communicator.transport = TransportChoice::Ethernet;
    config
}

/// `small_count` puts of `small_bytes` back to back, then a put of `big_bytes` with a
/// signal, all from and to `offset` onwards; then a flush, and a wait for the peer's signal.
#[kernel]
fn puts_then_signal(
    chan: PortChannelDeviceHandle<'_>,
    offset: u64,
    small_bytes: u64,
    small_count: u64,
    big_bytes: u64,
) -> Result<(), DeviceError> {
    for i in 0..small_count {
        let at = offset + i * small_bytes;
        chan.put(at, at, small_bytes)?;
    }
    let at = offset + small_count * small_bytes;
    chan.put_with_signal(at, at, big_bytes)?;
    chan.flush()?;
    chan.wait()
}

const SMALL: u64 = 4096;
const SMALLS: u64 = 5;
/// Larger than a chunk, and not a multiple of it.
const BIG: u64 = 3 * MAX_CHUNK_BYTES as u64 + 1000;
const HALF: u64 = SMALL * SMALLS + BIG;

fn byte(rank: u32, i: u64) -> u8 {
    (i.wrapping_mul(131) ^ (rank as u64 * 77)) as u8
}

/// Guards against an Ethernet port channel losing, reordering or misplacing bytes: several
/// puts back to back, a put larger than a chunk, a signal that must arrive after them, a
/// flush that must wait for them; both ways triggers get executed (proxy thread, assist),
/// and with memory staged through host buffers as a GPU's is (copied out before sending,
/// in after receiving, the signal behind the copies).
#[test]
fn ethernet_port_channel_puts_signal_flush() {
    for (assist, staging) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut config = ethernet(assist);
        config.communicator.ethernet_staging = staging;
        in_process::run(2, config, |comm| {
            let (rank, peer) = (comm.rank(), 1 - comm.rank());
            let mut host = vec![0xee_u8; 2 * HALF as usize];
            let mine = rank as u64 * HALF;
            for i in 0..HALF {
                host[(mine + i) as usize] = byte(rank, i);
            }
            let buf = comm.device().alloc_from(&host)?;
            let all = comm.all_gather_memory(&comm.register(&buf)?)?;
            assert!(all[peer as usize].ethernet_id().is_some());
            let chan = comm.port_channel(peer, &all[peer as usize], &all[rank as usize])?;
            let stream = comm.device().stream()?;
            puts_then_signal::launch(
                &stream,
                LaunchConfig::grid(1),
                chan.device_handle(),
                mine,
                SMALL,
                SMALLS,
                BIG,
            )?;
            comm.synchronize(&stream)?;
            let got = buf.to_vec()?;
            for r in 0..2 {
                for i in 0..HALF {
                    let at = (r as u64 * HALF + i) as usize;
                    assert_eq!(got[at], byte(r, i), "rank {rank}: byte {i} of rank {r}");
                }
            }
            comm.barrier()
        })
        .unwrap();
    }
}

/// Guards against channels sharing one connection per peer (two channels to the same peer
/// when there are two ranks; to different peers with four) mixing up each other's ids or
/// semaphores, and against a put larger than a chunk being cut.
#[test]
fn ethernet_port_ring_exchange() {
    for ranks in [2, 4] {
        in_process::run(ranks, ethernet(false), |comm| {
            let chunk = (MAX_CHUNK_BYTES as usize / 4) + 1001;
            let (buf, all) = ring_buffer(comm, chunk)?;
            let mine = all[comm.rank() as usize].clone();
            let (next, prev) = comm.ring_port_channels(&all, &mine)?;
            let stream = comm.device().stream()?;
            for _ in 0..2 {
                port_ring_exchange::launch(
                    &stream,
                    LaunchConfig::grid(1),
                    next.device_handle(),
                    prev.device_handle(),
                    comm.rank(),
                    comm.size(),
                    (chunk * 4) as u64,
                )?;
            }
            comm.synchronize(&stream)?;
            assert_all_gathered(comm, &buf, chunk, 0);
            comm.barrier()
        })
        .unwrap();
    }
}

/// Guards against a memory channel (which needs load/store access) being handed out over a
/// transport that cannot give it.
#[test]
fn ethernet_memory_channel_is_refused() {
    in_process::run(2, ethernet(false), |comm| {
        let buf = comm.alloc_zeroed::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let peer = 1 - comm.rank();
        let mine = all[comm.rank() as usize].clone();
        match comm.memory_channel(peer, &all[peer as usize], &mine, None) {
            Err(Error::InvalidUsage(why)) => assert!(why.contains("load/store"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        Ok(())
    })
    .unwrap();
}

/// Guards against ranks that chose different transports building a channel that cannot
/// work, instead of an error naming both choices.
#[test]
fn ethernet_transport_mismatch_is_an_error() {
    let exchanges = oxccl::InProcessExchange::group(2, Duration::from_secs(10));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = exchanges
            .into_iter()
            .map(|exchange| {
                s.spawn(move || -> oxccl::Result<()> {
                    let rank = exchange.rank_id();
                    let mut config = ethernet(false).communicator;
                    if rank == 1 {
                        config.transport = TransportChoice::HostIpc;
                    }
                    let device = oxccl::Device::cpu(rank as usize);
                    let mut comm =
                        Communicator::new(std::sync::Arc::new(exchange), device, config)?;
                    let buf = comm.alloc_zeroed::<u8>(64)?;
                    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
                    let peer = 1 - rank;
                    comm.port_channel(peer, &all[peer as usize], &all[rank as usize])
                        .map(drop)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for result in results {
        match result {
            Err(Error::InvalidUsage(why)) => {
                assert!(why.contains("same transport"), "{why}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

/// What a registered memory is on the wire after its layout version: a lying peer can send
/// any of it.
#[derive(Serialize, Deserialize)]
struct Wire {
    rank: u32,
    addr: u64,
    size: u64,
    transports: Vec<Transport>,
    node: String,
    process_id: u32,
    host_ipc: Option<(HostIpcHandle, u64)>,
    /// A CUDA IPC handle: always absent here (emulator memory), so its type does not matter.
    cuda_ipc: Option<()>,
    cuda_share: Option<()>,
    ethernet_id: Option<u32>,
    ib_rkey: Option<u32>,
}

/// Guards against a receiver that trusts the sender's view of its memory: rank 1 claims
/// its 4096-byte buffer has 8192 bytes, so rank 0's proxy lets a put at offset 4096 through;
/// rank 1's receiver refuses it against its own table and writes nothing, rank 1's host
/// learns why, and rank 0's flush fails with rank 1's reason instead of succeeding.
#[test]
fn ethernet_receiver_refuses_what_a_lying_registration_allowed() {
    in_process::run(2, ethernet(false), |comm| {
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let bytes = [8192, 4096][rank as usize];
        let buf = comm.device().alloc_from(&vec![rank as u8 + 1; bytes])?;
        let mine = comm.register(&buf)?;
        let mut sent = mine.to_bytes()?;
        if rank == 1 {
            let (version, rest) = postcard::take_from_bytes::<u32>(&sent).unwrap();
            let mut wire: Wire = postcard::from_bytes(rest).unwrap();
            wire.size = 8192;
            wire.host_ipc = None;
            wire.transports = vec![Transport::Ethernet];
            sent = postcard::to_stdvec(&version).unwrap();
            sent.extend(postcard::to_stdvec(&wire).unwrap());
        }
        let theirs =
            RegisteredMemory::from_bytes(&comm.out_of_band().all_gather(sent)?[peer as usize])?;
        let chan = comm.port_channel(peer, &theirs, &mine)?;
        if rank == 0 {
            let stream = comm.device().stream()?;
            put_then_flush::launch(
                &stream,
                LaunchConfig::grid(1),
                chan.device_handle(),
                4096,
                0,
                64,
            )?;
            assert!(
                stream.synchronize().is_err(),
                "the failed flush must fail the kernel"
            );
            match comm.check() {
                Err(Error::Proxy(ProxyError::Connection {
                    peer: 1, message, ..
                })) => assert!(
                    message.contains("the peer refused")
                        && message.contains("outside its 4096 bytes"),
                    "{message}"
                ),
                other => panic!("expected the connection failure, got {other:?}"),
            }
        }
        comm.barrier()?;
        if rank == 1 {
            match comm.check() {
                Err(Error::Proxy(ProxyError::Inbound {
                    peer: 0, message, ..
                })) => {
                    assert!(message.contains("outside its 4096 bytes"), "{message}")
                }
                other => panic!("expected the refusal reported, got {other:?}"),
            }
            assert!(
                buf.to_vec()?.iter().all(|&b| b == 2),
                "rank 1's memory was written"
            );
        }
        comm.barrier()
    })
    .unwrap();
}

/// Larger than a receiver's read buffer, so that a payload cut short may lie partly in
/// the socket's queue.
const RECEIVER_BYTES: usize = 64 << 10;
const FILL: u8 = 0x5a;

/// One frame of the wire format, as a test client sends it.
fn frame(message: &Message) -> Vec<u8> {
    let mut out = [0u8; MAX_FRAME_HEADER_BYTES];
    let n = encode(message, &mut out).unwrap();
    out[..n].to_vec()
}

fn write_frame(id: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = frame(&Message::Write {
        id,
        offset,
        len: payload.len() as u32,
    });
    bytes.extend_from_slice(payload);
    bytes
}

/// What a raw client sends after its Hello, and what the receiver's refusal must say.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    /// Close the sending half after the bytes (a frame cut short).
    cut: bool,
    why: &'static str,
}

fn cases(id: u32) -> Vec<Case> {
    let mut other_version = frame(&Message::Flush { seq: 1 });
    other_version[2] = 9; // the version varint right after the length prefix
    let mut cut = frame(&Message::Write {
        id,
        offset: 0,
        len: 64,
    });
    cut.extend_from_slice(&[1; 32]);
    // Most of a long payload: the part past the receiver's read buffer waits in the socket.
    let mut long_cut = frame(&Message::Write {
        id,
        offset: 0,
        len: 48 << 10,
    });
    long_cut.extend_from_slice(&[1; 40 << 10]);
    vec![
        Case {
            name: "write past the registration",
            bytes: write_frame(id, RECEIVER_BYTES as u64 - 8, &[1; 16]),
            cut: false,
            why: "outside its 65536 bytes",
        },
        Case {
            name: "write at an offset that overflows",
            bytes: write_frame(id, u64::MAX - 2, &[1; 8]),
            cut: false,
            why: "outside its 65536 bytes",
        },
        Case {
            name: "unknown registration id",
            bytes: write_frame(id + 1000, 0, &[1; 8]),
            cut: false,
            why: "unknown registration id",
        },
        Case {
            name: "truncated payload",
            bytes: cut,
            cut: true,
            why: "truncated frame",
        },
        Case {
            name: "truncated long payload",
            bytes: long_cut,
            cut: true,
            why: "truncated frame",
        },
        Case {
            name: "truncated header",
            bytes: frame(&Message::Flush { seq: 9 })[..3].to_vec(),
            cut: true,
            why: "truncated frame",
        },
        Case {
            name: "oversized write length",
            bytes: frame(&Message::Write {
                id,
                offset: 0,
                len: MAX_CHUNK_BYTES + 1,
            }),
            cut: false,
            why: "at most",
        },
        Case {
            name: "oversized header length",
            bytes: u16::MAX.to_le_bytes().to_vec(),
            cut: false,
            why: "header of 65535 bytes",
        },
        Case {
            name: "another wire version",
            bytes: other_version,
            cut: false,
            why: "wire version 9",
        },
        Case {
            name: "signal past the registration",
            bytes: frame(&Message::Signal {
                id,
                offset: RECEIVER_BYTES as u64,
                value: 1,
            }),
            cut: false,
            why: "outside its 65536 bytes",
        },
        Case {
            name: "misaligned signal",
            bytes: frame(&Message::Signal {
                id,
                offset: 4,
                value: 1,
            }),
            cut: false,
            why: "not 8-byte aligned",
        },
    ]
}

/// Where the receiver listens, the token it expects, and its registration's id.
type Setup = (SocketAddr, [u8; TOKEN_BYTES], u32);

/// The next frame from the receiver, within a deadline.
fn next_frame(stream: &mut TcpStream) -> Result<ReadOutcome, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    read_header(stream, || Instant::now() < deadline, || deadline).map_err(|e| e.to_string())
}

/// Connects and says Hello with `token`; returns the stream and the receiver's answer.
fn hello(addr: SocketAddr, token: [u8; TOKEN_BYTES]) -> (TcpStream, ReadOutcome) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    stream
        .write_all(&frame(&Message::Hello {
            from: 1,
            to: 0,
            token,
        }))
        .unwrap();
    let answer = next_frame(&mut stream).unwrap();
    (stream, answer)
}

/// Rank 1's side: a client that speaks the wire format. For each case: connect, get
/// admitted, send the case's bytes, expect an error frame saying why, then the end of the
/// connection; then tell rank 0.
fn raw_client(comm: &Communicator, cases: &[Case]) -> oxccl::Result<()> {
    let oob = comm.out_of_band();
    for (tag, case) in (1..).zip(cases) {
        let (addr, token, _): Setup = postcard::from_bytes(&oob.recv(0, tag)?).unwrap();
        let (mut stream, welcome) = hello(addr, token);
        assert!(
            matches!(welcome, ReadOutcome::Frame(Message::Welcome)),
            "{welcome:?}"
        );
        stream.write_all(&case.bytes).unwrap();
        if case.cut {
            stream.shutdown(Shutdown::Write).unwrap();
        }
        match next_frame(&mut stream) {
            Ok(ReadOutcome::Frame(Message::Error { reason })) => {
                assert!(reason.contains(case.why), "{}: {reason}", case.name)
            }
            other => panic!("{}: expected an error frame, got {other:?}", case.name),
        }
        match next_frame(&mut stream) {
            Ok(ReadOutcome::Closed) => {}
            Err(e) if e.contains("reset") => {}
            other => panic!(
                "{}: expected the connection closed, got {other:?}",
                case.name
            ),
        }
        oob.send(0, tag, Vec::new())?;
    }
    // A stranger's token is refused; the right one is then admitted, and a good write and
    // flush go through.
    let tag = cases.len() as u64 + 1;
    let (addr, token, id): Setup = postcard::from_bytes(&oob.recv(0, tag)?).unwrap();
    let (_, refused) = hello(addr, [0; TOKEN_BYTES]);
    match refused {
        ReadOutcome::Frame(Message::Error { reason }) => {
            assert!(reason.contains("did not hand out"), "{reason}")
        }
        other => panic!("a wrong token got {other:?}"),
    }
    let (mut stream, welcome) = hello(addr, token);
    assert!(matches!(welcome, ReadOutcome::Frame(Message::Welcome)));
    stream.write_all(&write_frame(id, 8, &[0x11; 8])).unwrap();
    stream
        .write_all(&frame(&Message::Flush { seq: 1 }))
        .unwrap();
    match next_frame(&mut stream) {
        Ok(ReadOutcome::Frame(Message::FlushAck { seq: 1 })) => {}
        other => panic!("a good write and flush got {other:?}"),
    }
    // Closing on purpose, as a sender does: without the goodbye, the receiver reports the
    // closed connection as a lost peer, racing the host's last `check`.
    stream.write_all(&frame(&Message::Goodbye)).unwrap();
    oob.send(0, tag, Vec::new())
}

/// Guards against a receiver that trusts what a peer sends (MSCCL++'s Ethernet receiver
/// writes wherever the sender's pointer says): a write past its registration, at an offset
/// that overflows, into an unknown id; a frame cut short; an oversized length; another
/// version; a signal out of range or misaligned; a stranger's token. Each is refused with an
/// error saying why, to the client and to the host (`check`), nothing is written, and the
/// connection is closed; a good write afterwards still lands. The same with the receiver
/// staging memory as a GPU's (the payload still arrives whole before it is copied).
#[test]
fn ethernet_rejects_out_of_bounds_write() {
    for staging in [false, true] {
        let mut config = ethernet(false);
        config.communicator.ethernet_staging = staging;
        rejects_out_of_bounds_write(config);
    }
}

fn rejects_out_of_bounds_write(config: InProcessConfig) {
    in_process::run(2, config, |comm| {
        if comm.rank() == 1 {
            let cases = cases(0);
            return raw_client(comm, &cases);
        }
        let buf = comm.device().alloc_from(&vec![FILL; RECEIVER_BYTES])?;
        let registered = comm.register(&buf)?;
        let id = registered.ethernet_id().expect("an Ethernet registration");
        let cases = cases(id);
        let untouched =
            |buf: &oxccl::DeviceBuffer<u8>| buf.to_vec().unwrap().iter().all(|&b| b == FILL);
        let offer = |comm: &mut Communicator, tag: u64| -> oxccl::Result<()> {
            let token = new_token()?;
            let addr = comm.ethernet_endpoint()?.local_addr();
            let setup: Setup = (addr, token, id);
            comm.out_of_band()
                .send(1, tag, postcard::to_stdvec(&setup).unwrap())?;
            comm.ethernet_endpoint()?.accept(1, &token)?;
            comm.out_of_band().recv(1, tag).map(drop)
        };
        for (tag, case) in (1..).zip(&cases) {
            offer(comm, tag)?;
            match comm.check() {
                Err(Error::Proxy(ProxyError::Inbound {
                    rank: 0,
                    peer: 1,
                    message,
                    ..
                })) => assert!(message.contains(case.why), "{}: {message}", case.name),
                other => panic!(
                    "{}: expected the refusal reported, got {other:?}",
                    case.name
                ),
            }
            assert!(untouched(&buf), "{}: memory was written", case.name);
        }
        offer(comm, cases.len() as u64 + 1)?;
        comm.check()?;
        let got = buf.to_vec()?;
        assert_eq!(&got[8..16], &[0x11; 8]);
        assert!(got[..8].iter().chain(&got[16..]).all(|&b| b == FILL));
        Ok(())
    })
    .unwrap();
}

/// Guards against a receiver waiting forever inside a frame: a client that sends half a
/// write's payload and then nothing is refused once the wait limit passes, and nothing of
/// the half is written.
#[test]
fn ethernet_stalled_frame_is_refused_at_the_limit() {
    let mut config = ethernet(false);
    config.communicator.wait_timeout = Duration::from_millis(500);
    in_process::run(2, config, |comm| {
        if comm.rank() == 1 {
            let oob = comm.out_of_band();
            let (addr, token, id): Setup = postcard::from_bytes(&oob.recv(0, 1)?).unwrap();
            let (mut stream, welcome) = hello(addr, token);
            assert!(matches!(welcome, ReadOutcome::Frame(Message::Welcome)));
            let mut half = frame(&Message::Write {
                id,
                offset: 0,
                len: 64,
            });
            half.extend_from_slice(&[1; 32]);
            stream.write_all(&half).unwrap();
            let started = Instant::now();
            match next_frame(&mut stream) {
                Ok(ReadOutcome::Frame(Message::Error { reason })) => {
                    assert!(reason.contains("in time"), "{reason}")
                }
                other => panic!("a stalled frame got {other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(5));
            return oob.send(0, 1, Vec::new());
        }
        let buf = comm.device().alloc_from(&vec![FILL; RECEIVER_BYTES])?;
        let id = comm.register(&buf)?.ethernet_id().unwrap();
        let token = new_token()?;
        let addr = comm.ethernet_endpoint()?.local_addr();
        let setup: Setup = (addr, token, id);
        comm.out_of_band()
            .send(1, 1, postcard::to_stdvec(&setup).unwrap())?;
        comm.ethernet_endpoint()?.accept(1, &token)?;
        comm.out_of_band().recv(1, 1)?;
        assert!(matches!(
            comm.check(),
            Err(Error::Proxy(ProxyError::Inbound { .. }))
        ));
        assert!(buf.to_vec()?.iter().all(|&b| b == FILL));
        Ok(())
    })
    .unwrap();
}

/// A fake acceptor: admits one connection, answers nothing after the Welcome, and ends the
/// connection when `gone_after` frames have arrived (0: at once), without a goodbye or a
/// reason, as a killed process does.
fn vanishing_peer(gone_after: usize) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let hello = next_frame(&mut stream);
        assert!(
            matches!(hello, Ok(ReadOutcome::Frame(Message::Hello { .. }))),
            "{hello:?}"
        );
        stream.write_all(&frame(&Message::Welcome)).unwrap();
        for _ in 0..gone_after {
            let next = next_frame(&mut stream);
            assert!(matches!(next, Ok(ReadOutcome::Frame(_))), "{next:?}");
        }
    });
    (addr, peer)
}

/// Guards against a survivor reporting a killed peer in two ways depending on which of its
/// threads noticed first: the receiver says "lost peer", and a flush that saw the connection
/// end (or be reset) must say the same, then and on every later call, not report a transport
/// failure.
#[test]
fn ethernet_peer_gone_mid_flush_is_a_lost_peer() {
    for gone_after in [1, 0] {
        let (addr, peer) = vanishing_peer(gone_after);
        let mut peer = Some(peer);
        let limit = Duration::from_secs(10);
        let connection =
            EthernetConnection::connect(0, 1, addr, new_token().unwrap(), limit).unwrap();
        connection.wait_welcome().unwrap();
        if gone_after == 0 {
            peer.take().unwrap().join().unwrap();
        }
        let started = Instant::now();
        for call in 0..3 {
            let error = connection.flush().unwrap_err();
            assert!(
                matches!(
                    error,
                    ProxyError::PeerLost {
                        rank: 0,
                        peer: 1,
                        ..
                    }
                ),
                "peer gone after {gone_after} frames, flush {call}: {error}"
            );
        }
        assert!(
            started.elapsed() < limit / 2,
            "the flush waited out its limit"
        );
        if let Some(peer) = peer {
            peer.join().unwrap();
        }
    }
}
