//! Helpers shared by the integration tests: run N ranks as threads of this process.

#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_bootstrap::{Bootstrap, Config, Result, UniqueId};

/// Deadline of the tests' bootstraps: long enough for a loaded 2-core machine, short
/// enough that a hang fails the test instead of the suite.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

pub fn config() -> Config {
    Config::default().with_timeout(TEST_TIMEOUT)
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Runs `n` ranks as threads, rank `r` with `config(r)`, and returns what `f` returned on
/// each, by rank. Init failures are returned, not unwrapped.
pub fn run_ranks_with<T: Send>(
    n: usize,
    config: impl Fn(usize) -> Config + Sync,
    f: impl Fn(Bootstrap) -> T + Sync,
) -> Vec<Result<T>> {
    let (id, listener) = UniqueId::listen(loopback()).unwrap();
    let mut listener = Some(listener);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, config, f) = (&id, &config, &f);
                let listener = if r == 0 { listener.take() } else { None };
                std::thread::Builder::new()
                    .name(format!("rank-{r}"))
                    .stack_size(512 << 10)
                    .spawn_scoped(s, move || {
                        let bs = match listener {
                            Some(l) => Bootstrap::init_root(id, l, n, &config(r)),
                            None => Bootstrap::init_with_config(id, r, n, &config(r)),
                        }?;
                        Ok(f(bs))
                    })
                    .unwrap()
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// As [`run_ranks_with`], every rank with [`config`], unwrapping init.
pub fn run_ranks<T: Send>(n: usize, f: impl Fn(Bootstrap) -> T + Sync) -> Vec<T> {
    run_ranks_with(n, |_| config(), f)
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r} failed to init: {e}")))
        .collect()
}

/// The bytes rank `r` contributes in the tests: lengths differ between ranks, and rank 3
/// contributes nothing, so length handling is exercised.
pub fn contribution(r: usize) -> Vec<u8> {
    if r == 3 {
        return Vec::new();
    }
    format!("rank-{r};").repeat(r % 5 + 1).into_bytes()
}

/// Runs `f` with this thread's log events written, without colours, to a string; returns
/// what `f` returned and the log.
pub fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let log = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    (out, log)
}
