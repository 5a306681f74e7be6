//! The proxy service with real threads: how it reports what would otherwise stall it.
#![cfg(not(oxccl_loom))]
#![allow(missing_docs)]

use oxccl_device::DeviceError;
use oxccl_device::abort::AbortRecord;
use oxccl_device::fifo::{ProxyTrigger, TriggerFields, trigger_type};
use oxccl_device::wait::WaitPolicy;
use oxccl_proxy::{Connection, FIFO_SITE, MemoryRegion, ProxyConfig, ProxyError, ProxyService};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A connection that only counts the signals it is asked to deliver.
#[derive(Default)]
struct CountingConnection {
    signals: AtomicU64,
}

impl Connection for CountingConnection {
    fn write(
        &self,
        _dst: &MemoryRegion,
        _dst_off: u64,
        _src: &MemoryRegion,
        _src_off: u64,
        _bytes: u64,
    ) -> Result<(), ProxyError> {
        Ok(())
    }

    fn update_and_sync(
        &self,
        _dst: &MemoryRegion,
        _dst_off: u64,
        _value: u64,
    ) -> Result<(), ProxyError> {
        self.signals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<(), ProxyError> {
        Ok(())
    }

    fn peer(&self) -> u32 {
        1
    }

    fn transport(&self) -> &'static str {
        "counting"
    }
}

fn signal_trigger() -> ProxyTrigger {
    ProxyTrigger::encode(&TriggerFields {
        kind: trigger_type::FLAG,
        semaphore_id: 0,
        ..Default::default()
    })
}

/// Guards against a silent stall: a push that times out leaves a claimed FIFO position that
/// is never published, and the proxy, which executes in order, would stop at it forever for
/// every channel. The proxy must report it, naming the position, and raise the rank's stop
/// word so kernels stop waiting; and stopping the proxy afterwards must not hang.
#[test]
fn timed_out_push_is_reported() {
    let limit = Duration::from_millis(200);
    let mut proxy = ProxyService::new(ProxyConfig {
        rank: 0,
        fifo_size: 2,
        wait_timeout: limit,
        assist: false,
    })
    .unwrap();
    let connection = Arc::new(CountingConnection::default());
    let record = Arc::new(AbortRecord::new());
    let semaphore = Arc::new(AtomicU64::new(0));
    let remote_inbound = MemoryRegion::new(1, semaphore.as_ptr() as u64, 8);
    proxy
        .add_channel(connection.clone(), remote_inbound, record.clone())
        .unwrap();
    let cells = proxy.fifo_cells();
    let stop = proxy.stop_word();
    // SAFETY: the record and the stop word are kept alive by the Arcs above.
    let wait = unsafe { WaitPolicy::from_raw_parts(&*record, &*stop, limit.as_nanos() as u64, 0) };
    let fifo = cells.device_handle(wait);

    // The proxy is not running yet: two pushes fill the ring, the third gives up.
    assert_eq!(fifo.push(signal_trigger()), Ok(0));
    assert_eq!(fifo.push(signal_trigger()), Ok(1));
    assert_eq!(fifo.push(signal_trigger()), Err(DeviceError::Timeout));
    record.clear();
    proxy.clear_stop();

    // Now it runs: it executes the two published triggers, then finds position 2 claimed
    // and never published.
    proxy.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let stalled = loop {
        match proxy.check() {
            Err(e @ ProxyError::FifoStalled { .. }) => break e,
            Err(other) => panic!("unexpected proxy error: {other}"),
            Ok(()) => {
                assert!(
                    Instant::now() < deadline,
                    "the proxy never reported the unpublished position"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    match &stalled {
        ProxyError::FifoStalled {
            rank: 0,
            position: 2,
            waited,
        } => assert!(*waited >= limit, "{waited:?}"),
        other => panic!("{other:?}"),
    }
    let message = stalled.to_string();
    assert!(message.contains("position 2"), "{message}");
    assert_eq!(connection.signals.load(Ordering::Relaxed), 2);
    let reason = proxy
        .stop_reason()
        .expect("kernels of the rank must be stopped");
    assert_eq!(reason.site, FIFO_SITE);
    // A wait of the rank now stops at once instead of running out its own limit.
    let started = Instant::now();
    assert_eq!(fifo.sync(2), Err(DeviceError::Aborted));
    assert!(started.elapsed() < limit, "{:?}", started.elapsed());

    let started = Instant::now();
    proxy.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Guards against "no limit" sneaking in as a zero limit.
#[test]
fn zero_wait_timeout_is_refused_by_the_proxy() {
    let err = ProxyService::new(ProxyConfig {
        wait_timeout: Duration::ZERO,
        ..Default::default()
    })
    .err()
    .expect("a zero limit must be refused");
    assert!(err.to_string().contains("zero"), "{err}");
}
