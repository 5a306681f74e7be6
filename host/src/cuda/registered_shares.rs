//! CUDA memory registered in this process, by a random token that travels with each
//! registration. A rank reaches another rank's CUDA memory at its own address only when
//! both are in this process (the driver refuses to open an IPC handle in the process that
//! exported it), and only through a token this process handed out, for exactly the range
//! registered under it: a registration forged by a peer of another process that claims to
//! come from this one cannot point this rank's proxy or kernels at other memory here.
//!
//! An entry holds its memory weakly: the registration (and the channels built on it) keep
//! the memory alive, and a rank that reaches it holds a share of its own. Entries of freed
//! memory are dropped at the next registration.

use super::cuda_memory::CudaMemory;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Bytes of a token.
pub(crate) const TOKEN_BYTES: usize = 16;

/// A registered range: its address, its size and its memory.
struct Share {
    addr: u64,
    size: u64,
    memory: Weak<CudaMemory>,
}

static SHARES: Mutex<Option<HashMap<[u8; TOKEN_BYTES], Share>>> = Mutex::new(None);

/// Enters the `size` bytes at `addr` of `memory` (a registration) and returns its token.
///
/// # Errors
/// The operating system's random source failed.
pub(crate) fn enter(memory: &Arc<CudaMemory>, addr: u64, size: u64) -> Result<[u8; TOKEN_BYTES]> {
    let mut token = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut token).map_err(|e| Error::System {
        context: "drawing the token of a CUDA registration".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut shares = SHARES.lock();
    let shares = shares.get_or_insert_with(HashMap::new);
    shares.retain(|_, share| share.memory.strong_count() > 0);
    let share = Share {
        addr,
        size,
        memory: Arc::downgrade(memory),
    };
    shares.insert(token, share);
    Ok(token)
}

/// A share of the memory registered under `token`, if that is exactly the `size` bytes at
/// `addr` and the memory is still allocated.
pub(crate) fn find(token: &[u8; TOKEN_BYTES], addr: u64, size: u64) -> Option<Arc<CudaMemory>> {
    let shares = SHARES.lock();
    let share = shares.as_ref()?.get(token)?;
    (share.addr == addr && share.size == size)
        .then(|| share.memory.upgrade())
        .flatten()
}
