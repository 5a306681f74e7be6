//! Host objects of semaphores: they own the counters in device memory and build the
//! device handles (the protocol is documented in [`oxccl_device::semaphore`]).
//!
//! Counters live in one small device buffer per semaphore, zeroed at creation:
//! cell 0 is `inbound` (written by the peer), cell 1 `expected`, cell 2 `outbound`.
//! Creating a semaphore is a pairwise step: each side tells the other where its
//! `inbound` counter is (see [`Communicator`](crate::Communicator)).

use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::error::Result;
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle,
};
use oxccl_device::wait::WaitPolicy;

const INBOUND: u64 = 0;
const EXPECTED: u64 = 1;
const OUTBOUND: u64 = 2;
const CELLS: usize = 4;

/// The counters of one semaphore, in device memory.
#[derive(Debug)]
pub struct SemaphoreCells {
    cells: DeviceBuffer<u64>,
}

impl SemaphoreCells {
    /// Zeroed counters on `device`.
    ///
    /// # Errors
    /// The allocation failed.
    pub fn new(device: &Device) -> Result<Self> {
        Ok(SemaphoreCells {
            cells: device.alloc::<u64>(CELLS)?,
        })
    }

    fn cell(&self, index: u64) -> u64 {
        self.cells.addr() + index * 8
    }

    /// The inbound counter as registered memory, to hand to the peer (8 bytes).
    pub fn inbound_memory(&self, rank: u32, transports: Vec<Transport>) -> RegisteredMemory {
        let host_ipc = self.cells.ipc_handle().map(|h| (h, INBOUND * 8));
        RegisteredMemory::new(rank, self.cell(INBOUND), 8, transports, host_ipc)
    }
}

/// A semaphore the peer's proxy raises and a kernel here waits on (port channels).
#[derive(Debug)]
pub struct Host2DeviceSemaphore {
    cells: SemaphoreCells,
    peer: u32,
}

impl Host2DeviceSemaphore {
    /// A semaphore over `cells`, raised by `peer`.
    pub fn new(cells: SemaphoreCells, peer: u32) -> Self {
        Host2DeviceSemaphore { cells, peer }
    }

    /// The rank whose proxy raises it.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The kernel-side handle, with waits under `wait`.
    pub fn device_handle(&self, wait: WaitPolicy) -> Host2DeviceSemaphoreDeviceHandle {
        Host2DeviceSemaphoreDeviceHandle {
            inbound: self.cells.cell(INBOUND),
            expected: self.cells.cell(EXPECTED),
            wait,
        }
    }
}

/// A semaphore pair kernels raise directly in each other's memory (memory channels).
#[derive(Debug)]
pub struct Device2DeviceSemaphore {
    cells: SemaphoreCells,
    peer: u32,
    /// The peer's inbound counter, mapped in this process.
    remote_inbound: u64,
}

impl Device2DeviceSemaphore {
    /// A semaphore over `cells`, whose signals go to `peer`'s inbound counter at
    /// `remote_inbound` (an address in this process).
    pub fn new(cells: SemaphoreCells, peer: u32, remote_inbound: u64) -> Self {
        Device2DeviceSemaphore {
            cells,
            peer,
            remote_inbound,
        }
    }

    /// The rank at the other end.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// The kernel-side handle, with waits under `wait`.
    pub fn device_handle(&self, wait: WaitPolicy) -> Device2DeviceSemaphoreDeviceHandle {
        Device2DeviceSemaphoreDeviceHandle {
            inbound: self.cells.cell(INBOUND),
            expected: self.cells.cell(EXPECTED),
            remote_inbound: self.remote_inbound,
            outbound: self.cells.cell(OUTBOUND),
            wait,
        }
    }
}
