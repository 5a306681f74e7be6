//! Probe kernels: one device primitive each, so that what the primitive costs on its own
//! can be measured and its machine code checked.
//!
//! `cargo xtask build-ptx --check` prints each probe's registers, spills and stack per
//! architecture beside the register count nvcc gives MSCCL++'s same primitive, and checks
//! each probe's PTX for the protocol steps its primitive must contain (the probe lines of
//! `EXPECTATIONS` in `xtask/src/ptx_rules.rs`). A primitive whose cost grows, or whose
//! publish, wait or packet store stops being what the protocol needs, shows here first.
//!
//! Each probe takes its handle by value and plain scalars, and every thread of the launch
//! calls the primitive, as kernels do. Each returns the primitive's outcome through `?`, so
//! the call and its failure path stay in the kernel: nothing is optimised away. A probe may
//! be launched like any kernel (it does what its primitive does), but exists to be built.

use oxccl_device::coop::Block;
use oxccl_device::error::DeviceError;
use oxccl_device::fifo::{FifoDeviceHandle, ProxyTrigger};
use oxccl_device::kernel;
use oxccl_device::memory_channel::MemoryChannelDeviceHandle;
use oxccl_device::packet::{Ll8Packet, Ll16Packet};
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::semaphore::Device2DeviceSemaphoreDeviceHandle;

/// [`FifoDeviceHandle::push`] of `trigger`.
#[kernel]
pub fn probe_fifo_push(
    fifo: FifoDeviceHandle<'_>,
    trigger: ProxyTrigger,
) -> Result<(), DeviceError> {
    fifo.push(trigger)?;
    Ok(())
}

/// [`FifoDeviceHandle::push`] of `trigger`, then [`FifoDeviceHandle::sync`] on its position.
#[kernel]
pub fn probe_fifo_push_sync(
    fifo: FifoDeviceHandle<'_>,
    trigger: ProxyTrigger,
) -> Result<(), DeviceError> {
    let position = fifo.push(trigger)?;
    fifo.sync(position)?;
    Ok(())
}

/// [`PortChannelDeviceHandle::put`].
#[kernel]
pub fn probe_port_put(
    chan: PortChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.put(dst_off, src_off, bytes)?;
    Ok(())
}

/// [`PortChannelDeviceHandle::signal`].
#[kernel]
pub fn probe_port_signal(chan: PortChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.signal()?;
    Ok(())
}

/// [`PortChannelDeviceHandle::put_with_signal`].
#[kernel]
pub fn probe_port_put_with_signal(
    chan: PortChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.put_with_signal(dst_off, src_off, bytes)?;
    Ok(())
}

/// [`PortChannelDeviceHandle::put_with_signal_and_flush`].
#[kernel]
pub fn probe_port_put_with_signal_and_flush(
    chan: PortChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.put_with_signal_and_flush(dst_off, src_off, bytes)?;
    Ok(())
}

/// [`PortChannelDeviceHandle::flush`].
#[kernel]
pub fn probe_port_flush(chan: PortChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.flush()?;
    Ok(())
}

/// [`PortChannelDeviceHandle::wait`].
#[kernel]
pub fn probe_port_wait(chan: PortChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.wait()?;
    Ok(())
}

/// [`Device2DeviceSemaphoreDeviceHandle::wait`].
#[kernel]
pub fn probe_semaphore_wait(
    semaphore: Device2DeviceSemaphoreDeviceHandle<'_>,
) -> Result<(), DeviceError> {
    semaphore.wait()?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::put`], split among the block.
#[kernel]
pub fn probe_memory_put(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.put(Block, dst_off, src_off, bytes)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::get`], split among the block.
#[kernel]
pub fn probe_memory_get(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
) -> Result<(), DeviceError> {
    chan.get(Block, dst_off, src_off, bytes)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::signal`].
#[kernel]
pub fn probe_memory_signal(chan: MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.signal()?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::relaxed_signal`].
#[kernel]
pub fn probe_memory_relaxed_signal(chan: MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.relaxed_signal()?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::wait`].
#[kernel]
pub fn probe_memory_wait(chan: MemoryChannelDeviceHandle<'_>) -> Result<(), DeviceError> {
    chan.wait()?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::put_packets`] of [`Ll8Packet`]s, split among the block.
#[kernel]
pub fn probe_ll8_put_packets(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.put_packets::<Ll8Packet>(Block, dst_off, src_off, bytes, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::unpack_packets`] of [`Ll8Packet`]s, split among the block.
#[kernel]
pub fn probe_ll8_unpack_packets(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.unpack_packets::<Ll8Packet>(Block, dst_off, src_off, bytes, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::write_packet`] of one [`Ll8Packet`].
#[kernel]
pub fn probe_ll8_write(
    chan: MemoryChannelDeviceHandle<'_>,
    index: u64,
    payload: u32,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.write_packet::<Ll8Packet>(index, payload, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::read_packet`] of one [`Ll8Packet`] (its payload is dropped).
#[kernel]
pub fn probe_ll8_read(
    chan: MemoryChannelDeviceHandle<'_>,
    index: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.read_packet::<Ll8Packet>(index, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::put_packets`] of [`Ll16Packet`]s, split among the block.
#[kernel]
pub fn probe_ll16_put_packets(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.put_packets::<Ll16Packet>(Block, dst_off, src_off, bytes, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::unpack_packets`] of [`Ll16Packet`]s, split among the block.
#[kernel]
pub fn probe_ll16_unpack_packets(
    chan: MemoryChannelDeviceHandle<'_>,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.unpack_packets::<Ll16Packet>(Block, dst_off, src_off, bytes, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::write_packet`] of one [`Ll16Packet`].
#[kernel]
pub fn probe_ll16_write(
    chan: MemoryChannelDeviceHandle<'_>,
    index: u64,
    payload: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.write_packet::<Ll16Packet>(index, payload, flag)?;
    Ok(())
}

/// [`MemoryChannelDeviceHandle::read_packet`] of one [`Ll16Packet`] (its payload is dropped).
#[kernel]
pub fn probe_ll16_read(
    chan: MemoryChannelDeviceHandle<'_>,
    index: u64,
    flag: u32,
) -> Result<(), DeviceError> {
    chan.read_packet::<Ll16Packet>(index, flag)?;
    Ok(())
}

#[cfg(all(test, not(oxccl_loom)))]
mod tests {
    use super::*;

    /// Guards against a probe whose primitive does not run, or does not report: on the
    /// emulator a zeroed handle must reach the primitive and be refused by it.
    #[test]
    fn probes_reach_their_primitive() {
        let port = PortChannelDeviceHandle::default();
        let mem = MemoryChannelDeviceHandle::default();
        let null = Err(DeviceError::NullHandle);
        assert_eq!(
            probe_fifo_push(Default::default(), ProxyTrigger::default()),
            null
        );
        assert_eq!(
            probe_fifo_push_sync(Default::default(), ProxyTrigger::default()),
            null
        );
        assert_eq!(probe_port_put(port, 0, 0, 8), null);
        assert_eq!(probe_port_signal(port), null);
        assert_eq!(probe_port_put_with_signal(port, 0, 0, 8), null);
        assert_eq!(probe_port_put_with_signal_and_flush(port, 0, 0, 8), null);
        assert_eq!(probe_port_flush(port), null);
        assert_eq!(probe_port_wait(port), null);
        assert_eq!(probe_semaphore_wait(Default::default()), null);
        assert_eq!(probe_memory_put(mem, 0, 0, 8), null);
        assert_eq!(probe_memory_get(mem, 0, 0, 8), null);
        assert_eq!(probe_memory_signal(mem), null);
        assert_eq!(probe_memory_relaxed_signal(mem), null);
        assert_eq!(probe_memory_wait(mem), null);
        assert_eq!(probe_ll8_put_packets(mem, 0, 0, 8, 1), null);
        assert_eq!(probe_ll8_unpack_packets(mem, 0, 0, 8, 1), null);
        assert_eq!(probe_ll8_read(mem, 0, 1), null);
        assert_eq!(probe_ll16_put_packets(mem, 0, 0, 8, 1), null);
        assert_eq!(probe_ll16_unpack_packets(mem, 0, 0, 8, 1), null);
        assert_eq!(probe_ll16_write(mem, 0, 7, 1), null);
        assert_eq!(probe_ll16_read(mem, 0, 1), null);
    }
}
