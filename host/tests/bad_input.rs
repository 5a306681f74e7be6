//! Bad input from kernels: triggers outside registered memory, unknown ids, waits that
//! never end. Each must be refused or bounded, write nothing, and reach the host as an
//! error naming rank, channel and peer.
//!
//! The jobs run on the backend `OXCCL_BACKEND` names (the emulator by default): the GPU
//! bundle runs them on a GPU, where a kernel's returned error does not come back with the
//! stream, only its records do.
#![allow(missing_docs)]

use oxccl::in_process::{self, InProcessConfig};
use oxccl::{
    Backend, ChannelFailure, ChannelKind, Communicator, CommunicatorConfig, Error, ErrorKind,
    PortChannel, RegisteredMemory, Result,
};
use oxccl_device::DeviceError;
use oxccl_device::launch::LaunchConfig;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::port_channel::{PortChannelDeviceHandle, PortChannelIds};
use oxccl_kernels::device_check::{
    flush_once, put_then_flush, signal_memory_channel_once, wait_memory_channel_once,
    wait_port_channel_once,
};
use oxccl_proxy::{ProxyError, Refusal, Side};
use std::time::{Duration, Instant};

const BYTES: usize = 4096;

fn config(wait_timeout: Duration) -> InProcessConfig {
    InProcessConfig {
        communicator: CommunicatorConfig {
            wait_timeout,
            proxy_assist: false,
            ..Default::default()
        },
        exchange_timeout: Duration::from_secs(20),
        backend: backend(),
    }
}

/// The backend the jobs run on: `OXCCL_BACKEND`, the emulator by default.
fn backend() -> Backend {
    Backend::from_env().expect("OXCCL_BACKEND names a backend")
}

/// `handle` with other ids in its triggers (ids are checked by the proxy, so safe to set).
fn with_ids(
    handle: PortChannelDeviceHandle<'_>,
    ids: impl FnOnce(PortChannelIds) -> PortChannelIds,
) -> PortChannelDeviceHandle<'_> {
    PortChannelDeviceHandle::new(handle.fifo(), handle.semaphore(), ids(handle.ids()))
}

/// Two ranks, each with a buffer of `BYTES` filled with its rank + 1, and a port channel to
/// the other.
fn setup(
    comm: &mut Communicator,
) -> Result<(oxccl::DeviceBuffer<u8>, PortChannel, Vec<RegisteredMemory>)> {
    let buf = comm
        .device()
        .alloc_from(&vec![comm.rank() as u8 + 1; BYTES])?;
    let all = comm.all_gather_memory(&comm.register(&buf)?)?;
    let peer = 1 - comm.rank();
    let chan = comm.port_channel(peer, &all[peer as usize], &all[comm.rank() as usize])?;
    Ok((buf, chan, all))
}

/// Runs `put_then_flush` with `handle` on rank 0 only; returns rank 0's refusal and
/// whether rank 1's buffer is untouched. Also checks that the refused put's flush did not
/// report success, and that a later flush on the stopped channel does not either.
fn run_bad_put(
    tweak: impl Fn(&PortChannel) -> (PortChannelDeviceHandle<'_>, u64, u64, u64) + Sync,
) -> Vec<(Option<ProxyError>, bool)> {
    in_process::run(2, config(Duration::from_secs(10)), |comm| {
        let (buf, chan, _all) = setup(comm)?;
        let mut refused = None;
        if comm.rank() == 0 {
            let stream = comm.device().stream()?;
            let (handle, dst_off, src_off, bytes) = tweak(&chan);
            put_then_flush::launch(
                &stream,
                LaunchConfig::grid(1),
                handle,
                dst_off,
                src_off,
                bytes,
            )?;
            match stream.synchronize() {
                Err(Error::KernelError { error, .. }) => assert_eq!(error, DeviceError::Aborted),
                Ok(()) => {} // a put the device itself refused never reaches the flush
                other => panic!("expected the kernel to report the failure, got {other:?}"),
            }
            match comm.check() {
                Err(Error::Proxy(e)) => refused = Some(e),
                other => panic!("expected a refused trigger, got {other:?}"),
            }
            // The error is reported once, and the records are lowered after the report...
            assert!(comm.check().is_ok(), "the error is reported once");
            // ... but the channel stays stopped: a later flush must not claim success. (A
            // trigger naming an unknown channel stops no channel.)
            let stopped = !matches!(
                refused,
                Some(ProxyError::TriggerRefused {
                    refusal: Refusal::UnknownChannel { .. },
                    ..
                })
            );
            flush_once::launch(&stream, LaunchConfig::grid(1), chan.device_handle())?;
            match comm.synchronize(&stream) {
                Err(Error::Channel(e)) if stopped => {
                    assert!(matches!(e.cause, ChannelFailure::Stopped { .. }), "{e}");
                    // Only the emulator returns the kernel's error, which names it.
                    if comm.device().backend() == Backend::Cpu {
                        assert!(e.to_string().contains("flush_once"), "{e}");
                    }
                }
                Ok(()) if !stopped => {}
                other => panic!("a flush after a refusal returned {other:?}"),
            }
        }
        comm.barrier()?;
        let untouched = buf.to_vec()?.iter().all(|&b| b == comm.rank() as u8 + 1);
        Ok((refused, untouched))
    })
    .unwrap()
}

/// Guards against the proxy writing past the end of a peer's registered buffer (MSCCL++
/// does not check) or silently dropping the request.
#[test]
fn trigger_out_of_bounds_is_refused() {
    // Destination range crosses the end of the peer's buffer.
    let results = run_bad_put(|c| (c.device_handle(), (BYTES - 8) as u64, 0, 64));
    let (refused, _) = &results[0];
    match refused {
        Some(ProxyError::TriggerRefused {
            rank: 0,
            channel,
            peer: Some(1),
            refusal:
                Refusal::OutOfBounds {
                    side: Side::Dst,
                    offset,
                    end,
                    size,
                    ..
                },
        }) => {
            assert_eq!(*channel, 0);
            assert_eq!(
                (*offset, *end, *size),
                ((BYTES - 8) as u64, (BYTES + 56) as u64, BYTES as u64)
            );
        }
        other => panic!("unexpected: {other:?}"),
    }
    let message = refused.as_ref().unwrap().to_string();
    assert!(
        message.contains("rank 0") && message.contains("channel 0"),
        "{message}"
    );
    assert!(
        results.iter().all(|(_, untouched)| *untouched),
        "a refused trigger wrote data"
    );

    // Source range past the end of our own buffer.
    let results = run_bad_put(|c| (c.device_handle(), 0, BYTES as u64, 1));
    assert!(matches!(
        &results[0].0,
        Some(ProxyError::TriggerRefused {
            refusal: Refusal::OutOfBounds {
                side: Side::Src,
                ..
            },
            ..
        })
    ));
    assert!(results.iter().all(|(_, untouched)| *untouched));
}

/// Guards against a trigger naming an unregistered memory or channel being executed with
/// whatever happens to sit at that index.
#[test]
fn trigger_unknown_id_is_refused() {
    let results = run_bad_put(|c| {
        let h = with_ids(c.device_handle(), |ids| PortChannelIds {
            dst_memory_id: 300,
            ..ids
        });
        (h, 0, 0, 16)
    });
    assert!(matches!(
        &results[0].0,
        Some(ProxyError::TriggerRefused {
            refusal: Refusal::UnknownMemory {
                side: Side::Dst,
                id: 300
            },
            ..
        })
    ));
    assert!(results.iter().all(|(_, untouched)| *untouched));

    let results = run_bad_put(|c| {
        let h = with_ids(c.device_handle(), |ids| PortChannelIds {
            semaphore_id: 1000,
            ..ids
        });
        (h, 0, 0, 16)
    });
    assert!(matches!(
        &results[0].0,
        Some(ProxyError::TriggerRefused {
            channel: 1000,
            peer: None,
            refusal: Refusal::UnknownChannel { id: 1000 },
            ..
        })
    ));
    assert!(results.iter().all(|(_, untouched)| *untouched));

    // A source memory that is the peer's, not ours: known id, wrong owner.
    let results = run_bad_put(|c| {
        let h = with_ids(c.device_handle(), |ids| PortChannelIds {
            src_memory_id: ids.dst_memory_id,
            ..ids
        });
        (h, 0, 0, 16)
    });
    assert!(matches!(
        &results[0].0,
        Some(ProxyError::TriggerRefused {
            refusal: Refusal::WrongRank {
                side: Side::Src,
                owner: 1,
                expected: 0,
                ..
            },
            ..
        })
    ));
}

/// Guards against a device wait for a signal that never comes hanging the kernel (and the
/// job) forever, and against a timeout that does not say which channel, which peer, what
/// was waited for and what arrived.
#[test]
fn wait_times_out() {
    let limit = Duration::from_millis(200);
    in_process::run(2, config(limit), |comm| {
        let buf = comm.alloc::<u8>(64)?;
        let all = comm.all_gather_memory(&comm.register(&buf)?)?;
        let peer = 1 - comm.rank();
        let mine = all[comm.rank() as usize].clone();
        let memory = comm.memory_channel(peer, &all[peer as usize], &mine, None)?;
        let port = comm.port_channel(peer, &all[peer as usize], &mine)?;
        let stream = comm.device().stream()?;
        // Nobody signals: both waits must end by themselves.
        for kind in [ChannelKind::Memory, ChannelKind::Port] {
            let started = Instant::now();
            if kind == ChannelKind::Memory {
                wait_memory_channel_once::launch(
                    &stream,
                    LaunchConfig::grid(1),
                    memory.device_handle(),
                )?;
            } else {
                wait_port_channel_once::launch(
                    &stream,
                    LaunchConfig::grid(1),
                    port.device_handle(),
                )?;
            }
            let result = comm.synchronize(&stream);
            let waited = started.elapsed();
            assert!(
                waited >= limit,
                "{kind}: returned after {waited:?}, before the limit"
            );
            assert!(waited < Duration::from_secs(10), "{kind}: took {waited:?}");
            match result {
                Err(Error::Channel(e)) => {
                    assert_eq!(
                        (e.rank, e.channel.kind, e.channel.peer),
                        (comm.rank(), kind, peer)
                    );
                    assert_eq!(e.channel.index, 0);
                    assert_eq!(e.kind(), ErrorKind::Timeout);
                    assert_eq!(
                        e.cause,
                        ChannelFailure::WaitTimedOut {
                            expected: 1,
                            arrived: 0,
                            after: limit
                        }
                    );
                    let text = e.to_string();
                    assert!(
                        text.contains(&format!("{kind} #0 to peer {peer}"))
                            && text.contains("waited for signal 1, 0 had arrived"),
                        "{text}"
                    );
                }
                other => panic!("{kind}: expected a timeout, got {other:?}"),
            }
        }
        comm.barrier()
    })
    .unwrap();
}

/// Guards against a handle that was never set up (a zeroed one) reaching memory at
/// address 0: the call refuses it, and the launch's error names the call and says why.
#[test]
fn zeroed_handle_is_an_error_naming_it() {
    let device = oxccl::Device::cpu(0);
    let stream = device.stream().unwrap();
    signal_memory_channel_once::launch(
        &stream,
        LaunchConfig::grid(1),
        MemoryChannelDeviceHandle::default(),
    )
    .unwrap();
    match stream.synchronize() {
        Err(Error::KernelError {
            kernel,
            error,
            message,
        }) => {
            assert_eq!(kernel, "signal_memory_channel_once");
            assert_eq!(error, DeviceError::NullHandle);
            assert!(message.contains("signal"), "{message}");
            let text = error.to_string();
            assert!(text.contains("never set up"), "{text}");
        }
        other => panic!("expected the zeroed handle to be refused, got {other:?}"),
    }
    wait_port_channel_once::launch(
        &stream,
        LaunchConfig::grid(1),
        PortChannelDeviceHandle::default(),
    )
    .unwrap();
    assert!(matches!(
        stream.synchronize(),
        Err(Error::KernelError {
            error: DeviceError::NullHandle,
            ..
        })
    ));
}

/// Guards against "no limit" sneaking in as a zero limit: a communicator whose device
/// waits would wait forever is refused.
#[test]
fn zero_wait_timeout_is_refused() {
    let err = in_process::run(1, config(Duration::ZERO), |_| Ok(())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidUsage);
    assert!(err.to_string().contains("wait_timeout is zero"), "{err}");
}
