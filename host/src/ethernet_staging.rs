//! Staging for the Ethernet transport: how its sender and receivers reach memory the host
//! cannot read or write at its address (a GPU's), through a host buffer of one chunk.
//!
//! A rank whose memory needs it has a [`Staging`]; each user (a connection's sender, a
//! receiver thread) takes a [`Stager`] of its own from it: a buffer of
//! [`MAX_CHUNK_BYTES`] and its own queue of copies.
//! The sender copies each chunk of a put out of the device into the buffer before it sends
//! it; a receiver reads each chunk into the buffer (whole, as before, so a frame cut short
//! writes nothing), copies it into the device, and writes a signal's counter behind the
//! copies before it, so a kernel that sees the counter sees the data.
//!
//! On a GPU ([`crate::cuda::cuda_staging`]) the buffer is pinned host memory and the copies
//! are the device's DMA, on a stream of the stager's. On the emulator the host reaches
//! memory at its address and needs none of this, but [`HostStaging`] (plain copies through
//! a heap buffer) runs the same path when
//! [`CommunicatorConfig::ethernet_staging`](crate::CommunicatorConfig::ethernet_staging)
//! asks, so it is tested without a GPU.

use crate::error::Result;
use crate::ethernet_wire::MAX_CHUNK_BYTES;
use std::sync::atomic::{AtomicU64, Ordering};

/// A rank's staging: hands out [`Stager`]s.
pub(crate) trait Staging: Send + Sync + std::fmt::Debug {
    /// A stager of its own for one user (a sender or a receiver thread).
    ///
    /// # Errors
    /// Its buffer or copy queue could not be made.
    fn stager(&self) -> Result<Box<dyn Stager>>;

    /// What stages, for messages (`"cuda"`, `"host"`).
    fn name(&self) -> &'static str;
}

/// One user's staging: a host buffer of one chunk and the copies in and out of it.
pub(crate) trait Stager: Send {
    /// The buffer, [`MAX_CHUNK_BYTES`] long.
    fn buffer(&mut self) -> &mut [u8];

    /// Copies `len` bytes at `src` (memory of this rank) into the buffer's first `len`
    /// bytes, and returns once they are there.
    ///
    /// # Safety
    /// `src..src + len` lies inside memory of this rank that stays allocated for the
    /// call; `len` is at most [`MAX_CHUNK_BYTES`].
    ///
    /// # Errors
    /// The copy failed (a driver error, in words).
    unsafe fn copy_out(&mut self, src: u64, len: usize) -> std::result::Result<(), String>;

    /// Copies the buffer's first `len` bytes to `dst` (memory of this rank), and returns
    /// once the buffer may be reused.
    ///
    /// # Safety
    /// As [`Self::copy_out`], for `dst`.
    ///
    /// # Errors
    /// The copy failed.
    unsafe fn copy_in(&mut self, dst: u64, len: usize) -> std::result::Result<(), String>;

    /// Stores `value` into the counter at `dst` (an aligned u64 of this rank's memory)
    /// after every earlier [`Self::copy_in`] of this stager has landed, with release
    /// semantics for a kernel that acquires it.
    ///
    /// # Safety
    /// `dst` is an 8-byte aligned counter inside memory of this rank that stays allocated,
    /// and is only accessed atomically.
    ///
    /// # Errors
    /// The store could not be made.
    unsafe fn store_counter(&mut self, dst: u64, value: u64) -> std::result::Result<(), String>;
}

impl std::fmt::Debug for dyn Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stager")
    }
}

/// Staging of the emulator's memory through a heap buffer: what a GPU's Ethernet traffic
/// does, with plain copies (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct HostStaging;

impl Staging for HostStaging {
    fn stager(&self) -> Result<Box<dyn Stager>> {
        Ok(Box::new(HostStager {
            buffer: vec![0; MAX_CHUNK_BYTES as usize],
        }))
    }

    fn name(&self) -> &'static str {
        "host"
    }
}

/// A [`HostStaging`] user's buffer.
struct HostStager {
    buffer: Vec<u8>,
}

impl Stager for HostStager {
    fn buffer(&mut self) -> &mut [u8] {
        &mut self.buffer
    }

    unsafe fn copy_out(&mut self, src: u64, len: usize) -> std::result::Result<(), String> {
        let dst = self.buffer.get_mut(..len).ok_or("longer than a chunk")?;
        // SAFETY: `src..src + len` is memory of this rank the host reaches at its address
        // (the caller's contract); the buffer is ours and cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, dst.as_mut_ptr(), len) };
        Ok(())
    }

    unsafe fn copy_in(&mut self, dst: u64, len: usize) -> std::result::Result<(), String> {
        let src = self.buffer.get(..len).ok_or("longer than a chunk")?;
        // SAFETY: as in `copy_out`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as usize as *mut u8, len) };
        Ok(())
    }

    unsafe fn store_counter(&mut self, dst: u64, value: u64) -> std::result::Result<(), String> {
        // SAFETY: an aligned counter of this rank's memory, only accessed atomically (the
        // caller's contract).
        let cell = unsafe { AtomicU64::from_ptr(dst as usize as *mut u64) };
        // Release: the copies before it (plain stores of this thread) are visible to a
        // kernel that acquires the value.
        cell.store(value, Ordering::Release);
        Ok(())
    }
}
