//! Where the device protocols' cells are among a kernel's parameters.
//!
//! A kernel receives its handles by value, so the addresses a protocol touches (a
//! semaphore's inbound counter, a FIFO's slots, head and tail, a memory channel's buffers)
//! are words at fixed byte offsets of its parameters. This module says which word of which
//! handle type is which, from the offsets `oxccl-device` itself defines (xtask links it on
//! the host, where its `#[repr(C)]` layouts are the ones the GPU sees): the layout facts are
//! defined once, in the device crate, and only composed here.
//!
//! The packet flag of the LL protocols is a plain scalar: a kernel parameter named `flag`,
//! or a field of an argument struct that the flag is computed from.

use oxccl_device::fifo::{FifoDeviceHandle, FifoRawParts};
use oxccl_device::memory_channel::{MemoryChannelBuffers, MemoryChannelDeviceHandle};
use oxccl_device::port_channel::PortChannelDeviceHandle;
use oxccl_device::semaphore::{
    Device2DeviceSemaphoreDeviceHandle, Host2DeviceSemaphoreDeviceHandle, SemaphoreRawParts,
};
use oxccl_kernels::all_reduce::RingAllReduceArgs;
use oxccl_kernels::packet_all_reduce::PacketAllReduceArgs;
use std::mem::offset_of;

/// What a parameter word holds, for the protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Address of a semaphore's inbound counter: what a `wait` acquires.
    SemaphoreInbound,
    /// Address of the peer's inbound counter (device-to-device semaphores): what a
    /// `signal` raises.
    SemaphoreRemoteInbound,
    /// Address of a FIFO's trigger slots: where a push publishes.
    FifoTriggers,
    /// Address of a FIFO's head counter: where a push claims its slot.
    FifoHead,
    /// Address of a FIFO's tail counter: what a `sync` acquires.
    FifoTail,
    /// Address of a memory channel's peer buffer: where `put` and packets write.
    RemoteBuffer,
    /// Address of a memory channel's own buffer: what `put` reads, `get` writes.
    LocalBuffer,
    /// Address of a memory channel's packet buffer: where packets are polled.
    PacketBuffer,
    /// The LL packet flag (or the value it is computed from).
    Flag,
}

/// One protocol word of a kernel parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Word {
    /// Byte offset within the parameter.
    pub offset: u64,
    /// What it holds.
    pub field: Field,
    /// Where it is, as source would name it: `chan.semaphore.inbound`.
    pub path: String,
}

/// The protocol words of a kernel parameter `name` of type `ty` (the last segment of the
/// type's path, without generics: `PortChannelDeviceHandle`). Empty for a type that holds
/// none.
pub fn param_words(name: &str, ty: &str) -> Vec<Word> {
    let mut out = Vec::new();
    let mut add = |offset: usize, field, path: String| {
        out.push(Word {
            offset: offset as u64,
            field,
            path,
        })
    };
    match ty {
        "FifoDeviceHandle" => fifo(0, name, &mut add),
        "Host2DeviceSemaphoreDeviceHandle" => h2d_semaphore(0, name, &mut add),
        "Device2DeviceSemaphoreDeviceHandle" => d2d_semaphore(0, name, &mut add),
        "PortChannelDeviceHandle" => port_channel(0, name, &mut add),
        "MemoryChannelDeviceHandle" => memory_channel(0, name, &mut add),
        "RingAllReduceArgs" => {
            let next = offset_of!(RingAllReduceArgs<'static>, next);
            let prev = offset_of!(RingAllReduceArgs<'static>, prev);
            memory_channel(next, &format!("{name}.next"), &mut add);
            memory_channel(prev, &format!("{name}.prev"), &mut add);
        }
        "PacketAllReduceArgs" => {
            let next = offset_of!(PacketAllReduceArgs<'static>, next);
            let prev = offset_of!(PacketAllReduceArgs<'static>, prev);
            memory_channel(next, &format!("{name}.next"), &mut add);
            memory_channel(prev, &format!("{name}.prev"), &mut add);
            // The call's packet flag is `packet_flag(sequence)`.
            let sequence = offset_of!(PacketAllReduceArgs<'static>, sequence);
            add(sequence, Field::Flag, format!("{name}.sequence"));
        }
        "u32" | "u64" if name == "flag" => add(0, Field::Flag, name.to_string()),
        _ => {}
    }
    out
}

type Add<'a> = dyn FnMut(usize, Field, String) + 'a;

fn fifo(at: usize, name: &str, add: &mut Add<'_>) {
    let raw = at + FifoDeviceHandle::RAW_OFFSET;
    let cells = [
        (
            offset_of!(FifoRawParts, triggers),
            Field::FifoTriggers,
            "triggers",
        ),
        (offset_of!(FifoRawParts, head), Field::FifoHead, "head"),
        (offset_of!(FifoRawParts, tail), Field::FifoTail, "tail"),
    ];
    for (off, field, cell) in cells {
        add(raw + off, field, format!("{name}.{cell}"));
    }
}

fn h2d_semaphore(at: usize, name: &str, add: &mut Add<'_>) {
    let raw = at + Host2DeviceSemaphoreDeviceHandle::RAW_OFFSET;
    let inbound = offset_of!(SemaphoreRawParts, inbound);
    add(
        raw + inbound,
        Field::SemaphoreInbound,
        format!("{name}.inbound"),
    );
}

fn d2d_semaphore(at: usize, name: &str, add: &mut Add<'_>) {
    let raw = at + Device2DeviceSemaphoreDeviceHandle::RAW_OFFSET;
    let inbound = offset_of!(SemaphoreRawParts, inbound);
    let remote = offset_of!(SemaphoreRawParts, remote_inbound);
    add(
        raw + inbound,
        Field::SemaphoreInbound,
        format!("{name}.inbound"),
    );
    add(
        raw + remote,
        Field::SemaphoreRemoteInbound,
        format!("{name}.remote_inbound"),
    );
}

fn port_channel(at: usize, name: &str, add: &mut Add<'_>) {
    fifo(
        at + PortChannelDeviceHandle::FIFO_OFFSET,
        &format!("{name}.fifo"),
        add,
    );
    h2d_semaphore(
        at + PortChannelDeviceHandle::SEMAPHORE_OFFSET,
        &format!("{name}.semaphore"),
        add,
    );
}

fn memory_channel(at: usize, name: &str, add: &mut Add<'_>) {
    d2d_semaphore(
        at + MemoryChannelDeviceHandle::SEMAPHORE_OFFSET,
        &format!("{name}.semaphore"),
        add,
    );
    let buffers = at + MemoryChannelDeviceHandle::BUFFERS_OFFSET;
    let cells = [
        (
            offset_of!(MemoryChannelBuffers, remote),
            Field::RemoteBuffer,
            "remote",
        ),
        (
            offset_of!(MemoryChannelBuffers, local),
            Field::LocalBuffer,
            "local",
        ),
        (
            offset_of!(MemoryChannelBuffers, packets),
            Field::PacketBuffer,
            "packets",
        ),
    ];
    for (off, field, cell) in cells {
        add(buffers + off, field, format!("{name}.{cell}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(words: &[Word], path: &str) -> u64 {
        words
            .iter()
            .find(|w| w.path == path)
            .unwrap_or_else(|| panic!("{path} not in {words:?}"))
            .offset
    }

    /// Guards against the rules looking for a protocol's cell at the wrong offset: these
    /// are the offsets the PTX of the shipped kernels loads (`ld.param.b64 %rd, [k_param_0+80]`
    /// for a port channel's inbound counter).
    #[test]
    fn offsets_match_the_device_layouts() {
        let port = param_words("chan", "PortChannelDeviceHandle");
        assert_eq!(find(&port, "chan.fifo.triggers"), 0);
        assert_eq!(find(&port, "chan.fifo.head"), 8);
        assert_eq!(find(&port, "chan.fifo.tail"), 16);
        assert_eq!(find(&port, "chan.semaphore.inbound"), 80);
        let mem = param_words("next", "MemoryChannelDeviceHandle");
        assert_eq!(find(&mem, "next.semaphore.inbound"), 0);
        assert_eq!(find(&mem, "next.semaphore.remote_inbound"), 16);
        assert_eq!(find(&mem, "next.remote"), 56);
        assert_eq!(find(&mem, "next.local"), 72);
        assert_eq!(find(&mem, "next.packets"), 88);
        let args = param_words("args", "RingAllReduceArgs");
        assert_eq!(find(&args, "args.prev.semaphore.inbound"), 104);
        let args = param_words("args", "PacketAllReduceArgs");
        assert!(args.iter().any(|w| w.field == Field::Flag));
    }

    /// Guards against a scalar taken for a protocol word: only a parameter named `flag` is
    /// the packet flag.
    #[test]
    fn scalars_hold_no_protocol_word_but_the_flag() {
        assert!(param_words("bytes", "u64").is_empty());
        assert_eq!(param_words("flag", "u32")[0].field, Field::Flag);
        assert!(param_words("x", "DeviceSlice").is_empty());
    }
}
