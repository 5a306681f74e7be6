//! CUDA IPC: how a rank reaches the registered device memory of a rank in another process of
//! the same host, the CUDA backend's counterpart of [`crate::host_ipc`].
//!
//! What travels, a [`CudaIpcHandle`] (serde; postcard on the wire, inside the registration
//! it belongs to): the 64-byte interprocess handle of the `cuMemAlloc` allocation that holds
//! the registered range (`cuIpcGetMemHandle` of the allocation's base), the allocation's
//! size, the range's offset from the base and its size, and the UUID of the GPU the
//! allocation lives on. It names an allocation, never an address: a peer's mapping of it
//! lies at an address of the peer's own.
//!
//! A handle comes from a peer and is not trusted. On arrival [`CudaIpcHandle::check`] refuses,
//! without the driver, a handle of all zeros, an empty allocation, an empty range, an offset
//! that is not a multiple of [`REGISTRATION_ALIGN`], and a range that does not fit its
//! allocation (its end computed without overflow). Before the driver sees it,
//! [`CudaIpcMapping::open`] also refuses a handle of a GPU that is not one of this host (a
//! handle from another host cannot be opened): one this process sees, or one the NVIDIA
//! kernel driver lists in [`PROC_GPUS`] (a GPU hidden by `CUDA_VISIBLE_DEVICES`, which the
//! driver still maps). Once opened, where the driver reports the mapping's size, a mapping
//! smaller than the allocation the handle claims is refused too. Each refusal is an
//! [`Error::InvalidUsage`] saying which check failed.
//!
//! Opening (`cuIpcOpenMemHandle` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) maps the whole
//! allocation; when it lives on another GPU, the driver enables peer access to that GPU as
//! the mapping needs it, not up front. A peer allocation is opened once: the caller caches
//! mappings keyed by (peer rank, allocation handle), and reaches every registration in the
//! allocation at [`CudaIpcMapping::addr_of`]. (Opening an open handle again is not an error:
//! the driver returns the same address and counts the opens.) A mapping is closed when it is
//! dropped (`cuIpcCloseMemHandle`). The exporter must keep its allocation until every peer has
//! closed its mapping: the driver leaves freeing exported memory before then undefined.
//!
//! Two ranks on the same GPU (two processes, one device) work through the same path: the
//! driver maps the allocation without needing peer access. Two ranks that are threads of one
//! process do not: the driver refuses to open a handle in the process that exported it, and
//! such ranks use the address itself.

use super::cuda_device::CudaDevice;
use super::cuda_memory::CudaMemory;
use super::driver;
use crate::registered_memory::REGISTRATION_ALIGN;
use crate::{Error, Result};
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Where the NVIDIA kernel driver lists the GPUs of this host: one folder per GPU, each with
/// an `information` file that holds a `GPU UUID:` line.
pub(crate) const PROC_GPUS: &str = "/proc/driver/nvidia/gpus";

/// A registered range of CUDA device memory, as it travels to ranks in other processes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct CudaIpcHandle {
    /// The interprocess handle of the allocation (`cuIpcGetMemHandle` of its base): opaque
    /// bytes only the driver reads.
    #[serde(with = "handle_bytes")]
    pub(crate) handle: [u8; 64],
    /// Bytes of the allocation, as the exporter's driver reports them.
    pub(crate) allocation_size: u64,
    /// Where the range starts, in bytes from the allocation's base.
    pub(crate) offset: u64,
    /// Bytes of the range.
    pub(crate) size: u64,
    /// The GPU the allocation lives on (`cuDeviceGetUuid`).
    pub(crate) device_uuid: [u8; 16],
}

impl CudaIpcHandle {
    /// The handle of the `size` bytes at `offset` of `memory`, for ranks in other processes
    /// of this host.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for an empty range, one past the end of `memory`, or one whose
    /// start is not a multiple of [`REGISTRATION_ALIGN`] from its allocation's base (what a
    /// peer would refuse, refused here first); [`Error::Cuda`] if the driver refuses to
    /// export the memory.
    pub(crate) fn export(memory: &CudaMemory, offset: u64, size: u64) -> Result<Self> {
        let bytes = memory.bytes() as u64;
        let fits = offset.checked_add(size).is_some_and(|end| end <= bytes);
        if size == 0 || !fits {
            return Err(Error::InvalidUsage(format!(
                "cannot export {size} bytes at offset {offset} of {bytes} bytes of CUDA device \
                 memory: the range is empty or does not fit"
            )));
        }
        let device = memory.device();
        let addr = memory.addr() + offset;
        // The allocation is found from the address, not assumed to start at `memory`: the
        // handle names the whole allocation and the offset is taken from its base.
        let (base, allocation_size) = device.context.address_range(addr)?;
        let handle = device.context.ipc_handle(base)?;
        let offset = addr.checked_sub(base).ok_or_else(|| {
            Error::Internal(format!(
                "the driver says the allocation holding {addr:#x} starts after it, at {base:#x}"
            ))
        })?;
        let exported = CudaIpcHandle {
            handle,
            allocation_size: allocation_size as u64,
            offset,
            size,
            device_uuid: device.facts.uuid,
        };
        exported.check()?;
        Ok(exported)
    }

    /// Checks what can be checked without the driver (see the module docs), as a handle
    /// from a peer is on arrival.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] naming what is wrong.
    pub(crate) fn check(&self) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::InvalidUsage(format!(
                "CUDA IPC handle of {} refused: {why}",
                uuid_text(&self.device_uuid)
            )))
        };
        if self.handle.iter().all(|&b| b == 0) {
            return refuse("its interprocess handle is all zeros (nothing was exported)".into());
        }
        if self.allocation_size == 0 {
            return refuse("its allocation holds 0 bytes".into());
        }
        if self.size == 0 {
            return refuse("its range is empty (0 bytes)".into());
        }
        if !self.offset.is_multiple_of(REGISTRATION_ALIGN) {
            return refuse(format!(
                "offset {} in its allocation is not a multiple of {REGISTRATION_ALIGN}",
                self.offset
            ));
        }
        let fits = self
            .offset
            .checked_add(self.size)
            .is_some_and(|end| end <= self.allocation_size);
        if !fits {
            return refuse(format!(
                "{} bytes at offset {} do not fit its {}-byte allocation",
                self.size, self.offset, self.allocation_size
            ));
        }
        Ok(())
    }

    /// Checks that the handle's GPU is one of this host: one this process sees, or one the
    /// NVIDIA kernel driver lists.
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`] without a driver; [`Error::InvalidUsage`] for a GPU of
    /// no device of this host.
    fn check_on_this_host(&self) -> Result<()> {
        let visible = driver::visible_device_uuids()?;
        if visible.contains(&self.device_uuid) || proc_gpu_uuids().contains(&self.device_uuid) {
            return Ok(());
        }
        Err(Error::InvalidUsage(format!(
            "CUDA IPC handle refused: it names {}, which is not a GPU of this host ({}): \
             CUDA IPC works between processes of one host only",
            uuid_text(&self.device_uuid),
            crate::host_ipc::node_name()
        )))
    }
}

/// A peer's allocation mapped into this process through CUDA IPC; closed on drop.
///
/// Invariant: `base` is the first byte of a mapping of this device's context made by
/// `cuIpcOpenMemHandle` from `handle`, at least `allocation_size` bytes long, closed only by
/// `drop`.
#[derive(Debug)]
pub(crate) struct CudaIpcMapping {
    device: Arc<CudaDevice>,
    base: sys::CUdeviceptr,
    handle: [u8; 64],
    allocation_size: u64,
}

impl CudaIpcMapping {
    /// Maps the allocation `handle` names into `device`'s context, after the checks of the
    /// module docs.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for a handle [`CudaIpcHandle::check`] refuses, one of a GPU
    /// of no device of this host, or one whose mapping is smaller than it says;
    /// [`Error::BackendUnavailable`] without a driver; [`Error::Cuda`] if the driver refuses
    /// (a handle exported by this same process, a GPU without peer access to `device`'s, an
    /// allocation already freed).
    pub(crate) fn open(device: &Arc<CudaDevice>, handle: &CudaIpcHandle) -> Result<Self> {
        handle.check()?;
        handle.check_on_this_host()?;
        // SAFETY: the handle is well formed and names a GPU of this host, so as far as can be
        // checked it came from `cuIpcGetMemHandle` in a peer process (the driver refuses one
        // that did not). The mapping made here closes it once, on drop; the exporter keeps
        // the allocation until its peers have closed their mappings.
        let base = unsafe { device.context.ipc_open(&handle.handle) }.map_err(|e| match e {
            Error::Cuda {
                context,
                call,
                code,
            } => Error::Cuda {
                context: format!(
                    "{context}: memory of {} on {device:?} (a handle exported by this same \
                     process, or of a GPU without peer access to this one, cannot be opened)",
                    uuid_text(&handle.device_uuid)
                ),
                call,
                code,
            },
            other => other,
        })?;
        let mapping = CudaIpcMapping {
            device: device.clone(),
            base,
            handle: handle.handle,
            allocation_size: handle.allocation_size,
        };
        // The peer's memory is device memory a CPU launch must not be given either; entered
        // before anything can fail, as `drop` removes it.
        super::gpu_address_ranges::enter(base, handle.allocation_size);
        // From here on, an error drops `mapping`, which closes it.
        mapping.check_size()?;
        Ok(mapping)
    }

    /// The address in this process of the range `handle` names: the mapping's first byte
    /// plus the range's offset.
    ///
    /// `handle` is one of a registration in the allocation this mapping was opened from,
    /// checked on arrival.
    pub(crate) fn addr_of(&self, handle: &CudaIpcHandle) -> u64 {
        debug_assert!(
            handle.handle == self.handle,
            "a handle of another allocation than the mapping's"
        );
        debug_assert!(handle.offset + handle.size <= self.allocation_size);
        self.base + handle.offset
    }

    /// Refuses a mapping smaller than the allocation its handle claims, where the driver
    /// reports the mapping's size: the handle's size bounds every access through it.
    fn check_size(&self) -> Result<()> {
        match self.device.context.address_range(self.base) {
            Ok((_, mapped)) if (mapped as u64) < self.allocation_size => {
                Err(Error::InvalidUsage(format!(
                    "CUDA IPC handle refused: it says its allocation holds {} bytes, the driver \
                     mapped {mapped}",
                    self.allocation_size
                )))
            }
            Ok(_) => Ok(()),
            // The driver documents the call for its own allocations; an IPC mapping it does
            // not answer for keeps the size the handle passed `check` with.
            Err(e) => {
                tracing::debug!(error = %e, "the size of a CUDA IPC mapping could not be read");
                Ok(())
            }
        }
    }
}

impl Drop for CudaIpcMapping {
    fn drop(&mut self) {
        // A second mapping of the same allocation (opened again instead of taken from the
        // caller's cache) shares the driver's mapping and this entry.
        super::gpu_address_ranges::remove(self.base);
        // SAFETY: by the invariant, opened in this device's context and closed only here;
        // whoever holds the mapping keeps it while channels or queued copies use it.
        if let Err(e) = unsafe { self.device.context.ipc_close(self.base) } {
            tracing::warn!(
                error = %e,
                bytes = self.allocation_size,
                "closing a peer's CUDA IPC mapping failed"
            );
        }
    }
}

/// The UUIDs of the GPUs the NVIDIA kernel driver lists in [`PROC_GPUS`], hidden from this
/// process or not; none where it lists none (no NVIDIA driver, or a container without the
/// list).
fn proc_gpu_uuids() -> Vec<[u8; 16]> {
    let Ok(dir) = std::fs::read_dir(PROC_GPUS) else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok())
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("information")).ok())
        .filter_map(|text| text.lines().find_map(parse_uuid_line))
        .collect()
}

/// The UUID of a `GPU UUID:  GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b` line of a GPU's
/// `information` file; `None` for any other line.
fn parse_uuid_line(line: &str) -> Option<[u8; 16]> {
    let text = line
        .strip_prefix("GPU UUID:")?
        .trim()
        .strip_prefix("GPU-")?;
    let groups: Vec<&str> = text.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let digits: Vec<u8> = groups
        .concat()
        .chars()
        .map(|c| c.to_digit(16).map(|d| d as u8))
        .collect::<Option<_>>()?;
    let mut uuid = [0u8; 16];
    for (byte, pair) in uuid.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = pair[0] << 4 | pair[1];
    }
    Some(uuid)
}

/// A GPU's UUID as `nvidia-smi` writes it: `GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b`.
fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(&uuid[..4]),
        hex(&uuid[4..6]),
        hex(&uuid[6..8]),
        hex(&uuid[8..10]),
        hex(&uuid[10..])
    )
}

/// Serde for the 64-byte interprocess handle, as two 32-byte halves (serde derives arrays
/// up to 32 elements): fixed size on the wire, no length to check.
mod handle_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(handle: &[u8; 64], s: S) -> Result<S::Ok, S::Error> {
        let (mut low, mut high) = ([0u8; 32], [0u8; 32]);
        low.copy_from_slice(&handle[..32]);
        high.copy_from_slice(&handle[32..]);
        (low, high).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 64], D::Error> {
        let (low, high) = <([u8; 32], [u8; 32])>::deserialize(d)?;
        let mut handle = [0u8; 64];
        handle[..32].copy_from_slice(&low);
        handle[32..].copy_from_slice(&high);
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle that passes `check`, of a GPU no host has.
    fn good() -> CudaIpcHandle {
        CudaIpcHandle {
            handle: std::array::from_fn(|i| i as u8 + 1),
            allocation_size: 1 << 20,
            offset: 4096,
            size: 1024,
            device_uuid: [0xa5; 16],
        }
    }

    /// Guards against the wire form losing or reordering bytes of the handle (its halves
    /// swapped, say), or a handle growing past what a registration may take on the wire.
    #[test]
    fn a_handle_travels_through_postcard_unchanged() {
        let handle = good();
        let bytes = postcard::to_stdvec(&handle).unwrap();
        assert!(bytes.len() < 128, "{} bytes on the wire", bytes.len());
        let back: CudaIpcHandle = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, handle);
        assert!(back.check().is_ok());
        // Truncated on the way: an error, not a panic.
        for cut in [0, 10, 63, bytes.len() - 1] {
            assert!(postcard::from_bytes::<CudaIpcHandle>(&bytes[..cut]).is_err());
        }
    }

    /// Guards against a malformed handle from a peer reaching the driver: each check of
    /// `check` refuses its case with an error that says what is wrong, and a range ending
    /// exactly at the allocation's end is accepted.
    #[test]
    fn check_refuses_each_malformed_handle() {
        type Spoil = fn(&mut CudaIpcHandle);
        let cases: [(&str, Spoil, &str); 6] = [
            ("zero handle", |h| h.handle = [0; 64], "all zeros"),
            ("empty allocation", |h| h.allocation_size = 0, "0 bytes"),
            ("empty range", |h| h.size = 0, "range is empty"),
            (
                "range past the allocation",
                |h| h.size = h.allocation_size - h.offset + 16,
                "do not fit",
            ),
            (
                "offset + size overflows",
                |h| {
                    h.offset = u64::MAX - 15;
                    h.size = 32;
                },
                "do not fit",
            ),
            (
                "misaligned offset",
                |h| h.offset += 8,
                "not a multiple of 16",
            ),
        ];
        for (name, spoil, expected) in cases {
            let mut handle = good();
            spoil(&mut handle);
            let err = handle.check().expect_err(name);
            assert!(matches!(err, Error::InvalidUsage(_)), "{name}: {err}");
            let text = err.to_string();
            assert!(text.contains(expected), "{name}: {text}");
            assert!(text.contains("GPU-a5a5a5a5-a5a5"), "{name}: {text}");
        }
        let mut at_end = good();
        at_end.size = at_end.allocation_size - at_end.offset;
        assert!(at_end.check().is_ok());
    }

    /// Guards against a handle of a GPU of no device of this host (one from another host)
    /// reaching the driver, and against opening on a machine without a driver panicking in
    /// cudarc instead of failing. Without a driver there is no device to open on and the
    /// host check itself fails; on a GPU machine the forged UUID is refused by name.
    #[test]
    fn a_handle_of_no_gpu_here_is_refused_and_no_driver_is_an_error() {
        let handle = good();
        let err = handle.check_on_this_host().unwrap_err();
        match driver::device_count() {
            Err(_) => assert!(matches!(err, Error::BackendUnavailable(_)), "{err}"),
            Ok(_) => {
                assert!(matches!(err, Error::InvalidUsage(_)), "{err}");
                assert!(err.to_string().contains("not a GPU of this host"), "{err}");
            }
        }
        match CudaDevice::shared(0) {
            Err(e) => assert!(matches!(e, Error::BackendUnavailable(_)), "{e}"),
            Ok(device) => {
                let err = CudaIpcMapping::open(&device, &handle).unwrap_err();
                assert!(err.to_string().contains("not a GPU of this host"), "{err}");
                // `check` runs first: a malformed handle is refused as such.
                let mut zero = handle.clone();
                zero.handle = [0; 64];
                let err = CudaIpcMapping::open(&device, &zero).unwrap_err();
                assert!(err.to_string().contains("all zeros"), "{err}");
            }
        }
    }

    /// Guards against misreading the NVIDIA driver's list of the host's GPUs (a UUID with
    /// its bytes shifted, another line taken for the UUID), which would refuse handles of
    /// GPUs hidden from this process or accept garbage.
    #[test]
    fn gpu_uuid_lines_parse_to_the_uuid_nvidia_smi_shows() {
        let text = "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b";
        let uuid = parse_uuid_line(&format!("GPU UUID: \t {text}")).unwrap();
        assert_eq!(uuid[0], 0x92);
        assert_eq!(uuid[15], 0x3b);
        assert_eq!(uuid_text(&uuid), text);
        for other in [
            "Model:           NVIDIA H100 80GB HBM3",
            "GPU UUID:        9221d5d1-b60b-a624-bf14-0a1819cfda3b",
            "GPU UUID:        GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3",
            "GPU UUID:        GPU-9221d5d1b60b-a624-bf14-0a1819cfda3b0",
            "GPU UUID:        GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3g",
            "GPU UUID:        GPU-+221d5d1-b60b-a624-bf14-0a1819cfda3b",
        ] {
            assert_eq!(parse_uuid_line(other), None, "{other}");
        }
    }
}
