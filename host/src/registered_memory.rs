//! Registered memory: a buffer plus what a peer needs to reach it, serializable so it can
//! travel to the peer through the out-of-band exchange.
//!
//! On the wire a registered memory is the layout version ([`oxccl_device::LAYOUT_VERSION`])
//! followed by the description; a peer decodes the version first and refuses any other, so
//! ranks built from different layouts fail with a clear error instead of misreading each
//! other. What a peer sends is checked on arrival ([`RegisteredMemory::from_bytes`]): the
//! transports, the size and offset inside the shared object, their alignment, an Ethernet
//! id exactly when the Ethernet transport is named, a CUDA IPC handle exactly when the
//! cuda-ipc transport is, and that handle's own checks. The object itself is checked when
//! it is mapped (see [`crate::host_ipc`]); a CUDA allocation when it is opened.
//!
//! Memory of a CUDA device carries a CUDA IPC handle (`cuda::cuda_ipc`) for ranks in other
//! processes of its node; ranks in the same process reach it at its own address.

use crate::buffer_memory::BufferMemory;
use crate::cuda::cuda_ipc::CudaIpcHandle;
use crate::cuda::registered_shares;
use crate::error::{Error, Result};
use crate::host_ipc::{HostIpcHandle, node_name};
use crate::transport::Transport;
use oxccl_device::LAYOUT_VERSION;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Alignment every registered range must have inside its object: enough for any packet
/// (16 bytes) and any element type.
pub const REGISTRATION_ALIGN: u64 = 16;

/// Longest encoded registered memory a peer may send.
const MAX_ENCODED_BYTES: usize = 4096;

/// A buffer registered for one-sided access, as it travels between ranks.
///
/// A registration made here ([`Communicator::register`](crate::Communicator::register))
/// holds a share of the buffer's memory: the memory stays allocated as long as the
/// registration, or a channel built from it, exists, whatever happens to the buffer. One
/// that came from a peer holds nothing: it is reached through a mapping the communicator
/// makes and keeps.
#[derive(Clone, Serialize, Deserialize)]
pub struct RegisteredMemory {
    rank: u32,
    addr: u64,
    size: u64,
    transports: Vec<Transport>,
    /// Node and process that own the memory.
    node: String,
    process_id: u32,
    /// The shared object holding the memory, and the memory's offset in it, for ranks that
    /// map it.
    host_ipc: Option<(HostIpcHandle, u64)>,
    /// The CUDA IPC handle of the range (memory of a CUDA device), for ranks in other
    /// processes that open it.
    cuda_ipc: Option<CudaIpcHandle>,
    /// The registration's token in its process (memory of a CUDA device), for ranks of that
    /// process, which reach it at its own address (`cuda::registered_shares`).
    cuda_share: Option<[u8; registered_shares::TOKEN_BYTES]>,
    /// The id the owner gave the memory in its Ethernet table
    /// ([`EthernetRegistry`](crate::ethernet_registry::EthernetRegistry)), for peers that
    /// reach it over Ethernet: they name it by this id, never by its address.
    ethernet_id: Option<u32>,
    /// The remote key of the memory's registration with the owner's RDMA device, for peers
    /// that write it over InfiniBand / RoCE (at [`Self::addr`], within [`Self::size`]: the
    /// device itself refuses anything outside).
    ib_rkey: Option<u32>,
    /// A share of the memory, for a registration made in this process.
    #[serde(skip)]
    owner: Option<BufferMemory>,
}

impl RegisteredMemory {
    /// A registration of `size` bytes at `offset` of `memory`, owned by `rank`, reachable
    /// by `transports` (plus, for memory of a CUDA device, the cuda-ipc transport).
    ///
    /// # Errors
    /// The driver refused to export memory of a CUDA device.
    pub(crate) fn new_local(
        rank: u32,
        memory: BufferMemory,
        offset: u64,
        size: u64,
        mut transports: Vec<Transport>,
    ) -> Result<Self> {
        let addr = memory.addr() + offset;
        let (host_ipc, cuda_ipc, cuda_share) = match &memory {
            BufferMemory::Cpu(m) => (m.ipc_handle().map(|h| (h, offset)), None, None),
            BufferMemory::Cuda(m) => (
                None,
                Some(CudaIpcHandle::export(m, offset, size)?),
                Some(registered_shares::enter(m, addr, size)?),
            ),
        };
        if cuda_ipc.is_some() && !transports.contains(&Transport::CudaIpc) {
            transports.push(Transport::CudaIpc);
        }
        Ok(RegisteredMemory {
            rank,
            addr,
            size,
            transports,
            node: node_name().to_owned(),
            process_id: std::process::id(),
            host_ipc,
            cuda_ipc,
            cuda_share,
            ethernet_id: None,
            ib_rkey: None,
            owner: Some(memory),
        })
    }

    /// Whether this registration was made in this process (it holds its memory).
    pub fn is_local(&self) -> bool {
        self.owner.is_some()
    }

    /// The share of the memory a local registration holds.
    pub(crate) fn owner(&self) -> Option<&BufferMemory> {
        self.owner.as_ref()
    }

    /// The CUDA IPC handle of memory of a CUDA device.
    pub(crate) fn cuda_ipc(&self) -> Option<&CudaIpcHandle> {
        self.cuda_ipc.as_ref()
    }

    /// The registration's token in its process (memory of a CUDA device).
    pub(crate) fn cuda_share(&self) -> Option<&[u8; registered_shares::TOKEN_BYTES]> {
        self.cuda_share.as_ref()
    }

    /// The process that owns the memory.
    pub fn process_id(&self) -> u32 {
        self.process_id
    }

    /// The shared object holding the memory and the memory's offset in it, if it can be
    /// mapped by other ranks.
    pub fn host_ipc(&self) -> Option<&(HostIpcHandle, u64)> {
        self.host_ipc.as_ref()
    }

    /// The id the owner gave the memory for peers that reach it over Ethernet, if it is
    /// reachable so.
    pub fn ethernet_id(&self) -> Option<u32> {
        self.ethernet_id
    }

    /// Makes a local registration reachable over Ethernet under `id` (its entry in this
    /// rank's table).
    pub(crate) fn set_ethernet_id(&mut self, id: u32) {
        self.ethernet_id = Some(id);
        if !self.transports.contains(&Transport::Ethernet) {
            self.transports.push(Transport::Ethernet);
        }
    }

    /// The remote key peers write the memory with over InfiniBand / RoCE, if it is
    /// reachable so.
    pub fn ib_rkey(&self) -> Option<u32> {
        self.ib_rkey
    }

    /// Makes a local registration reachable over InfiniBand / RoCE through RDMA device
    /// `device` (its index), whose registration of the memory has remote key `rkey`.
    #[cfg_attr(not(feature = "ib"), allow(dead_code))]
    pub(crate) fn set_ib_rkey(&mut self, device: u8, rkey: u32) {
        self.ib_rkey = Some(rkey);
        if !self.transports.contains(&Transport::Ib(device)) {
            self.transports.push(Transport::Ib(device));
        }
    }

    /// The RDMA device of the owner that reaches the memory, if it is reachable over
    /// InfiniBand / RoCE.
    pub fn ib_device(&self) -> Option<u8> {
        self.transports.iter().find_map(|t| match t {
            Transport::Ib(device) => Some(*device),
            _ => None,
        })
    }

    /// Rank that owns the memory.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Address in the owner's address space.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Transports the memory can be reached by.
    pub fn transports(&self) -> &[Transport] {
        &self.transports
    }

    /// Node the memory lives on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Encodes for the out-of-band exchange: the layout version, then the description
    /// (postcard).
    ///
    /// # Errors
    /// Never in practice; an encoder failure is reported as [`Error::Internal`].
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let encode =
            |e: postcard::Error| Error::Internal(format!("encoding registered memory: {e}"));
        let mut out = postcard::to_stdvec(&LAYOUT_VERSION).map_err(encode)?;
        out.extend(postcard::to_stdvec(self).map_err(encode)?);
        Ok(out)
    }

    /// Decodes and checks what a peer's [`Self::to_bytes`] produced.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for bytes that are not a registered memory of this layout
    /// version (with nothing after it), or one whose description cannot be right: no
    /// transport, a host IPC handle without the host IPC transport, a range outside its
    /// object or misaligned in it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let malformed =
            |what: String| Error::InvalidUsage(format!("malformed registered memory: {what}"));
        if bytes.len() > MAX_ENCODED_BYTES {
            return Err(malformed(format!(
                "{} bytes, more than the {MAX_ENCODED_BYTES} any registration takes",
                bytes.len()
            )));
        }
        let (version, rest) =
            postcard::take_from_bytes::<u32>(bytes).map_err(|e| malformed(e.to_string()))?;
        if version != LAYOUT_VERSION {
            return Err(Error::InvalidUsage(format!(
                "registered memory of layout version {version} from a peer; this build uses \
                 layout version {LAYOUT_VERSION}: every rank of a job must run the same oxccl"
            )));
        }
        let (memory, rest) = postcard::take_from_bytes::<RegisteredMemory>(rest)
            .map_err(|e| malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(malformed(format!("{} bytes after it", rest.len())));
        }
        memory.validate()?;
        Ok(memory)
    }

    /// Checks what can be checked without mapping.
    fn validate(&self) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::InvalidUsage(format!(
                "registered memory of rank {} refused: {why}",
                self.rank
            )))
        };
        if self.transports.is_empty() {
            return refuse("it names no transport".into());
        }
        if let Some((handle, offset)) = &self.host_ipc {
            if !self.transports.contains(&Transport::HostIpc) {
                return refuse(
                    "it carries a host IPC handle but not the host-ipc transport".into(),
                );
            }
            if !offset.is_multiple_of(REGISTRATION_ALIGN) {
                return refuse(format!(
                    "offset {offset} in its object is not a multiple of {REGISTRATION_ALIGN}"
                ));
            }
            let fits = offset
                .checked_add(self.size)
                .is_some_and(|end| end <= handle.len);
            if !fits {
                return refuse(format!(
                    "{} bytes at offset {offset} do not fit its {}-byte object",
                    self.size, handle.len
                ));
            }
        }
        match (
            &self.cuda_ipc,
            self.transports.contains(&Transport::CudaIpc),
        ) {
            (Some(handle), true) => {
                handle.check().map_err(|e| {
                    Error::InvalidUsage(format!(
                        "registered memory of rank {} refused: {e}",
                        self.rank
                    ))
                })?;
                if handle.size != self.size {
                    return refuse(format!(
                        "its CUDA IPC handle names {} bytes, the registration {}",
                        handle.size, self.size
                    ));
                }
            }
            (Some(_), false) => {
                return refuse(
                    "it carries a CUDA IPC handle but not the cuda-ipc transport".into(),
                );
            }
            (None, true) => {
                return refuse("it names the cuda-ipc transport but carries no handle".into());
            }
            (None, false) => {}
        }
        if self.cuda_ipc.is_some() != self.cuda_share.is_some() {
            return refuse(
                "it carries a CUDA IPC handle without a registration token, or the other way \
                 round"
                    .into(),
            );
        }
        match (
            self.transports.contains(&Transport::Ethernet),
            self.ethernet_id,
        ) {
            (true, None) => {
                return refuse("it names the Ethernet transport but carries no Ethernet id".into());
            }
            (false, Some(_)) => {
                return refuse("it carries an Ethernet id but not the Ethernet transport".into());
            }
            _ => {}
        }
        let ib_devices = self
            .transports
            .iter()
            .filter(|t| matches!(t, Transport::Ib(_)))
            .count();
        match (ib_devices, self.ib_rkey) {
            (0, None) => {}
            (1, Some(_)) if self.addr.checked_add(self.size).is_some() => {}
            (1, Some(_)) => {
                return refuse(format!(
                    "{} bytes at {:#x} run past the end of the address space",
                    self.size, self.addr
                ));
            }
            (0, Some(_)) => {
                return refuse("it carries an RDMA key but not the ib transport".into());
            }
            (1, None) => {
                return refuse("it names the ib transport but carries no RDMA key".into());
            }
            (n, _) => {
                return refuse(format!("it names the ib transport {n} times"));
            }
        }
        Ok(())
    }
}

impl PartialEq for RegisteredMemory {
    /// Equal when they describe the same memory, whether or not they hold it.
    fn eq(&self, other: &Self) -> bool {
        (
            self.rank,
            self.addr,
            self.size,
            &self.transports,
            &self.node,
            self.process_id,
            &self.host_ipc,
            &self.cuda_ipc,
            &self.cuda_share,
            self.ethernet_id,
            self.ib_rkey,
        ) == (
            other.rank,
            other.addr,
            other.size,
            &other.transports,
            &other.node,
            other.process_id,
            &other.host_ipc,
            &other.cuda_ipc,
            &other.cuda_share,
            other.ethernet_id,
            other.ib_rkey,
        )
    }
}

impl Eq for RegisteredMemory {}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("rank", &self.rank)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("transports", &self.transports)
            .field("node", &self.node)
            .field("process_id", &self.process_id)
            .field("host_ipc", &self.host_ipc)
            .field("cuda_ipc", &self.cuda_ipc)
            .field("ethernet_id", &self.ethernet_id)
            .field("ib_rkey", &self.ib_rkey)
            .field("local", &self.is_local())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    pub(super) fn sample() -> RegisteredMemory {
        let buf = Device::cpu(0).alloc_zeroed::<u8>(8192).unwrap();
        RegisteredMemory::new_local(
            3,
            buf.memory().clone(),
            4096,
            4096,
            vec![Transport::HostIpc],
        )
        .unwrap()
    }

    /// Guards against a registered memory that does not survive the trip to a peer, or that
    /// claims to hold memory on the other side.
    #[test]
    fn round_trips_through_bytes() {
        let m = sample();
        let back = RegisteredMemory::from_bytes(&m.to_bytes().unwrap()).unwrap();
        assert_eq!(back, m);
        assert!(m.is_local() && !back.is_local());
    }

    /// Guards against a peer's registration with an RDMA key whose transports name two
    /// devices, or whose range wraps around the address space (a key alone, or the ib
    /// transport alone, is in `tests/registered_memory.rs`).
    #[test]
    fn rdma_keys_name_one_device_and_a_range_that_fits() {
        let mut m = sample();
        m.set_ib_rkey(1, 0x5eed);
        let back = RegisteredMemory::from_bytes(&m.to_bytes().unwrap()).unwrap();
        assert_eq!((back.ib_rkey(), back.ib_device()), (Some(0x5eed), Some(1)));
        let refused = |m: &RegisteredMemory, why: &str| {
            let err = RegisteredMemory::from_bytes(&m.to_bytes().unwrap()).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidUsage(m) if m.contains(why)),
                "{err}"
            );
        };
        let mut two_devices = m.clone();
        two_devices.transports.push(Transport::Ib(2));
        refused(&two_devices, "names the ib transport 2 times");
        let mut wrapping = m;
        wrapping.addr = u64::MAX - 16;
        refused(&wrapping, "past the end of the address space");
    }

    /// Guards against bytes after a peer's registration being ignored: the message is
    /// exactly one registration, as every other wire format of oxccl refuses trailing bytes.
    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = sample().to_bytes().unwrap();
        bytes.push(0);
        let err = RegisteredMemory::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidUsage(m) if m.contains("1 bytes after it")),
            "{err}"
        );
    }

    /// Guards against garbage from a peer being accepted as memory to write into.
    #[test]
    fn garbage_is_refused() {
        assert!(matches!(
            RegisteredMemory::from_bytes(&[0xff; 3]),
            Err(Error::InvalidUsage(_))
        ));
        assert!(RegisteredMemory::from_bytes(&vec![1; MAX_ENCODED_BYTES + 1]).is_err());
    }
}

#[cfg(test)]
mod properties {
    use super::tests::sample;
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use std::sync::LazyLock;

    /// A registration of this process, as a peer would receive it.
    static SAMPLE_BYTES: LazyLock<Vec<u8>> = LazyLock::new(|| sample().to_bytes().unwrap());

    /// Whether `memory` is what the receiving side may use: held by nobody here, and
    /// the same after another trip.
    fn usable(memory: &RegisteredMemory) -> bool {
        !memory.is_local()
            && RegisteredMemory::from_bytes(&memory.to_bytes().unwrap())
                .is_ok_and(|again| again == *memory)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Guards against a panic on any bytes a peer sends after the layout version, or a
        /// registration decoded from them that does not survive another trip. Every prefix
        /// is tried: a registration must use all the bytes.
        #[test]
        fn arbitrary_bytes_are_an_error_or_a_usable_registration(
            body in vec(any::<u8>(), 0..160),
        ) {
            let mut bytes = postcard::to_stdvec(&LAYOUT_VERSION).unwrap();
            bytes.extend_from_slice(&body);
            for len in 0..=bytes.len() {
                if let Ok(memory) = RegisteredMemory::from_bytes(&bytes[..len]) {
                    prop_assert!(usable(&memory), "{:?}", memory);
                }
            }
        }

        /// Guards against a corrupted registration (bit flips in its lengths, options,
        /// transports and ranges, a cut, a byte after it) causing a panic or being accepted
        /// unchecked.
        #[test]
        fn corrupted_registrations_are_an_error_or_usable(
            flips in vec((any::<usize>(), 1u8..), 1..4),
            cut in any::<usize>(),
            extra in any::<u8>(),
        ) {
            let mut padded = SAMPLE_BYTES.clone();
            padded.push(extra);
            prop_assert!(RegisteredMemory::from_bytes(&padded).is_err());
            let mut bytes = SAMPLE_BYTES.clone();
            for (at, mask) in flips {
                let i = at % bytes.len();
                bytes[i] ^= mask;
            }
            let cut = cut % (bytes.len() + 1);
            for candidate in [&bytes[..], &bytes[..cut]] {
                if let Ok(memory) = RegisteredMemory::from_bytes(candidate) {
                    prop_assert!(usable(&memory), "{:?}", memory);
                }
            }
        }
    }
}
