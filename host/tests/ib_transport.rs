//! Choosing the InfiniBand / RoCE transport where it cannot run: built without the `ib`
//! feature, or (with it) on a machine without an RDMA device. Either is a clear error from
//! `Communicator::new`, never a panic or a silent fallback. What the transport sends a peer
//! is tested in `ib_wire.rs` and `registered_memory.rs`.
#![allow(missing_docs)]

use oxccl::TransportChoice;
use oxccl::{Communicator, CommunicatorConfig, Device, Error, ErrorKind, InProcessExchange};
use std::sync::Arc;
use std::time::Duration;

fn communicator_with(transport: TransportChoice) -> oxccl::Result<Communicator> {
    let exchange = InProcessExchange::group(1, Duration::from_secs(5)).remove(0);
    let config = CommunicatorConfig {
        transport,
        ..CommunicatorConfig::default()
    };
    Communicator::new(Arc::new(exchange), Device::cpu(0), config)
}

/// Guards against `OXCCL_TRANSPORT=ib` on a build without the transport being accepted (and
/// falling back to another) or failing with an error that does not say how to get it.
#[cfg(not(feature = "ib"))]
#[test]
fn ib_without_the_feature_errors() {
    let err = communicator_with(TransportChoice::Ib).unwrap_err();
    assert!(
        matches!(&err, Error::BackendUnavailable(m) if m.contains("`ib` feature")),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::System);
}

/// Guards against the ib transport on a machine without an RDMA device panicking (every
/// verbs wrapper call panics or misbehaves on a missing library if not checked first) or
/// coming up half made. Where a device with an active port exists this test has nothing to
/// check and says so.
#[cfg(feature = "ib")]
#[test]
fn ib_without_device_errors() {
    if let Ok(device) = oxccl::ib_device::IbDevice::open(0) {
        eprintln!(
            "skipped: this machine has RDMA device {} with an active port",
            device.name()
        );
        return;
    }
    let err = communicator_with(TransportChoice::Ib).unwrap_err();
    assert!(
        matches!(&err, Error::BackendUnavailable(m) if m.contains("no RDMA device")),
        "{err}"
    );
    assert_eq!(err.kind(), ErrorKind::System);
    eprintln!("refused as expected: {err}");
    // The host-ipc transport still works in the same build and process.
    let comm = communicator_with(TransportChoice::HostIpc).unwrap();
    assert_eq!(comm.config().transport, TransportChoice::HostIpc);
}
