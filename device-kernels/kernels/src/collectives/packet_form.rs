//! How the packet collectives (`*_packets`) move a message into a peer's slot: as LL16
//! packets, or as plain data and one signal.
//!
//! **Packets** ([`PacketForm::LL16`]): data and flag in one store, so the receiver needs no
//! signal and the sender no fence; each byte of data takes two bytes of packets, and the
//! receiver polls every packet. On a GPU, where a system-scope fence before a signal costs
//! microseconds, this is the form for small messages.
//!
//! **Data** ([`PacketForm::DATA`]): the sender stores the bytes as they are into the same
//! slot, then raises the peer's semaphore with a release signal; the receiver waits for the
//! signal (acquire) and reads the slot in place. Half the bytes, and the receiver spins on
//! one line instead of polling each packet while the sender is still writing its line: on
//! the CPU emulator, where a release costs nothing, 2 ranks all-reduced 1 KiB in 0.62-0.78
//! µs a call against 0.89-1.18 as packets (8-64 B even; alternated runs).
//!
//! The host picks one per call from the message size
//! ([`CollectiveArgs::packet_form`](super::CollectiveArgs::packet_form)); every rank picks
//! the same (same size, same settings). Sets, call numbers and the eager protocol are the
//! same in both forms; data land in slots of their own, beside the packets' (see
//! [`ScratchLayout`](super::ScratchLayout)): user bytes left in a packet slot could read as
//! a later call's flag.

/// The form of a packet collective's messages (see the module docs).
pub struct PacketForm;

impl PacketForm {
    /// LL16 packets: data and flag in one store.
    pub const LL16: u32 = 0;
    /// Plain data, then one release signal per peer.
    pub const DATA: u32 = 1;

    /// The form of a call whose largest message to one peer is `bytes`, where messages from
    /// `data_from` bytes on go as data.
    pub const fn for_bytes(bytes: u64, data_from: u64) -> u32 {
        if bytes >= data_from {
            Self::DATA
        } else {
            Self::LL16
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_go_as_data_from_the_threshold_on() {
        assert_eq!(PacketForm::for_bytes(511, 512), PacketForm::LL16);
        assert_eq!(PacketForm::for_bytes(512, 512), PacketForm::DATA);
        assert_eq!(PacketForm::for_bytes(1 << 20, u64::MAX), PacketForm::LL16);
        assert_eq!(PacketForm::for_bytes(0, 0), PacketForm::DATA);
    }
}
