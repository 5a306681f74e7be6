//! What a peer sends as registered memory is checked before anything is mapped. (Its own
//! test binary: it counts this process's mappings.)
#![allow(missing_docs)]

mod common;

use common::config;
use oxccl::host_ipc::{HostIpcHandle, mapped_objects};
use oxccl::in_process;
use oxccl::transport::Transport;
use oxccl::{Error, RegisteredMemory};
use serde::{Deserialize, Serialize};

/// What a registered memory is on the wire after its layout version: a hostile peer can
/// send any of it.
#[derive(Clone, Serialize, Deserialize)]
struct Wire {
    rank: u32,
    addr: u64,
    size: u64,
    transports: Vec<Transport>,
    node: String,
    process_id: u32,
    host_ipc: Option<(HostIpcHandle, u64)>,
    cuda_ipc: Option<CudaWire>,
    cuda_share: Option<[u8; 16]>,
    ethernet_id: Option<u32>,
    ib_rkey: Option<u32>,
}

/// A CUDA IPC handle on the wire: the driver's 64 bytes (in two halves), the allocation's
/// size, the range's offset and size in it, the GPU's UUID.
#[derive(Clone, Serialize, Deserialize)]
struct CudaWire {
    handle: ([u8; 32], [u8; 32]),
    allocation_size: u64,
    offset: u64,
    size: u64,
    device_uuid: [u8; 16],
}

/// A CUDA handle that passes every check a peer can make without the driver.
fn cuda_handle(size: u64) -> CudaWire {
    CudaWire {
        handle: ([7; 32], [9; 32]),
        allocation_size: 1 << 20,
        offset: 4096,
        size,
        device_uuid: [0xab; 16],
    }
}

fn decode(memory: &RegisteredMemory) -> (u32, Wire) {
    let bytes = memory.to_bytes().unwrap();
    let (version, rest) = postcard::take_from_bytes::<u32>(&bytes).unwrap();
    (version, postcard::from_bytes(rest).unwrap())
}

fn encode(version: u32, wire: &Wire) -> Vec<u8> {
    let mut out = postcard::to_stdvec(&version).unwrap();
    out.extend(postcard::to_stdvec(wire).unwrap());
    out
}

/// Guards against a peer's registered memory being trusted: a handle forged to name
/// another file of the owner (any descriptor of any process would do), a size or offset
/// that does not fit the object, a misaligned offset, another layout version, a handle
/// without its transport, an Ethernet id without its transport or the other way round, a
/// CUDA IPC handle without its transport or the other way round, a zero or mis-sized one,
/// a well-formed one offered to a rank of the emulator, and an RDMA key without the ib
/// transport or the other way round. Each is refused with an error
/// saying why, and nothing is mapped.
#[test]
fn registered_memory_rejects_bad_handle() {
    in_process::run(2, config(), |comm| {
        let buf = comm.alloc::<u64>(1024)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        if comm.rank() == 0 {
            let file = tempfile::tempfile().unwrap();
            let (version, good) = decode(&all[1]);
            let (handle, offset) = good.host_ipc.clone().unwrap();
            let forge = |f: &dyn Fn(&mut Wire)| {
                let mut w = good.clone();
                f(&mut w);
                w
            };
            let before = mapped_objects();
            // (bytes, what the error must say)
            let cases: Vec<(Vec<u8>, &str)> = vec![
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.host_ipc = Some((
                                HostIpcHandle {
                                    fd: rustix::fd::AsRawFd::as_raw_fd(&file),
                                    ..handle.clone()
                                },
                                offset,
                            ))
                        }),
                    ),
                    "not an oxccl device-memory object",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.host_ipc = Some((
                                HostIpcHandle {
                                    len: handle.len * 2,
                                    ..handle.clone()
                                },
                                offset,
                            ))
                        }),
                    ),
                    "holds",
                ),
                (
                    encode(version, &forge(&|w| w.size = handle.len + 1)),
                    "do not fit",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| w.host_ipc = Some((handle.clone(), handle.len))),
                    ),
                    "do not fit",
                ),
                (
                    encode(version, &forge(&|w| w.host_ipc = Some((handle.clone(), 8)))),
                    "not a multiple of 16",
                ),
                (encode(version + 1, &good), "layout version"),
                (
                    encode(
                        version,
                        &forge(&|w| w.transports = vec![Transport::Ethernet]),
                    ),
                    "host-ipc",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| w.transports = vec![Transport::HostIpc, Transport::Ethernet]),
                    ),
                    "carries no Ethernet id",
                ),
                (
                    encode(version, &forge(&|w| w.ethernet_id = Some(3))),
                    "carries an Ethernet id but not",
                ),
                (
                    encode(version, &forge(&|w| w.cuda_ipc = Some(cuda_handle(8192)))),
                    "carries a CUDA IPC handle but not the cuda-ipc transport",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| w.transports = vec![Transport::HostIpc, Transport::CudaIpc]),
                    ),
                    "names the cuda-ipc transport but carries no handle",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.transports = vec![Transport::HostIpc, Transport::CudaIpc];
                            w.cuda_share = Some([5; 16]);
                            w.cuda_ipc = Some(CudaWire {
                                handle: ([0; 32], [0; 32]),
                                ..cuda_handle(8192)
                            });
                        }),
                    ),
                    "all zeros",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.transports = vec![Transport::HostIpc, Transport::CudaIpc];
                            w.cuda_share = Some([5; 16]);
                            w.cuda_ipc = Some(cuda_handle(8));
                        }),
                    ),
                    "its CUDA IPC handle names 8 bytes",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.transports = vec![Transport::HostIpc, Transport::CudaIpc];
                            w.cuda_share = Some([5; 16]);
                            w.cuda_ipc = Some(cuda_handle(8192));
                        }),
                    ),
                    "is on a CUDA device, and this rank runs on",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| {
                            w.transports = vec![Transport::HostIpc, Transport::CudaIpc];
                            w.cuda_ipc = Some(cuda_handle(8192));
                        }),
                    ),
                    "without a registration token",
                ),
                (
                    encode(version, &forge(&|w| w.ib_rkey = Some(0x5eed))),
                    "carries an RDMA key but not the ib transport",
                ),
                (
                    encode(
                        version,
                        &forge(&|w| w.transports = vec![Transport::HostIpc, Transport::Ib(0)]),
                    ),
                    "names the ib transport but carries no RDMA key",
                ),
                (b"\x01garbage".to_vec(), "malformed"),
            ];
            for (bytes, why) in cases {
                let refused =
                    RegisteredMemory::from_bytes(&bytes).and_then(|memory| comm.reach(&memory));
                match refused {
                    Err(Error::InvalidUsage(msg)) => assert!(msg.contains(why), "{why}: {msg}"),
                    other => panic!("{why}: expected a refusal, got {other:?}"),
                }
            }
            assert_eq!(mapped_objects(), before, "a refused handle left a mapping");
            // The genuine one maps.
            let region = comm.reach(&RegisteredMemory::from_bytes(&encode(version, &good))?)?;
            assert_eq!(region.size, 8192);
        }
        comm.barrier()
    })
    .unwrap();
}

/// Guards ranks of one process on a GPU, which reach each other's memory at its own
/// address: only through a registration this process made, for exactly its range. A peer's
/// registration with its address moved, or its token changed, is refused (a registration
/// forged by a peer of another process that claims this one cannot point this rank at
/// other memory here); the genuine one is reached.
#[test]
fn a_forged_in_process_cuda_registration_is_refused() {
    if let Err(why) = oxccl::Backend::cuda_device_count() {
        println!(
            "a_forged_in_process_cuda_registration_is_refused: the cuda part is skipped: {why}"
        );
        return;
    }
    let config = oxccl::in_process::InProcessConfig {
        backend: oxccl::Backend::Cuda,
        ..config()
    };
    in_process::run(2, config, |comm| {
        let buf = comm.alloc::<u64>(1024)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        if comm.rank() == 0 {
            let (version, good) = decode(&all[1]);
            assert!(good.cuda_share.is_some() && good.cuda_ipc.is_some());
            let moved = Wire {
                addr: good.addr + 256,
                ..good.clone()
            };
            let retoken = Wire {
                cuda_share: good.cuda_share.map(|t| t.map(|b| b ^ 0x5a)),
                ..good.clone()
            };
            for forged in [moved, retoken] {
                let refused = RegisteredMemory::from_bytes(&encode(version, &forged))
                    .and_then(|memory| comm.reach(&memory));
                match refused {
                    Err(Error::InvalidUsage(msg)) => {
                        assert!(msg.contains("not a live registration"), "{msg}")
                    }
                    other => panic!("expected a refusal, got {other:?}"),
                }
            }
            let region = comm.reach(&RegisteredMemory::from_bytes(&encode(version, &good))?)?;
            assert_eq!((region.addr, region.size), (good.addr, 8192));
        }
        comm.barrier()
    })
    .unwrap();
}
