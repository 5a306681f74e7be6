//! A rank's RDMA device, for the InfiniBand / RoCE transport (feature `ib`): the opened
//! device, its protection domain, the port and GID the rank talks from, and the memory
//! registered with it.
//!
//! The device is the first one (in libibverbs' order) with an active port, or the one
//! named by [`IB_DEVICE_ENV`]; the GID is the port's at index [`IB_GID_INDEX_ENV`] (default
//! 0; RoCE v2 usually needs the index of the port's RoCE v2 GID, as NCCL's
//! `NCCL_IB_GID_INDEX`). libibverbs is loaded at run time: where it is missing, or lists no
//! device, opening fails with [`Error::BackendUnavailable`] saying so, never a panic.
//!
//! Every registration ([`IbDevice::register`]) is kept, with a share of the memory it pins,
//! until the device is dropped with its communicator: the memory a peer may still write is
//! never freed under the device.

use crate::error::{Error, Result};
use crate::ib_wire::IbEndpoint;
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::memory_region::{
    MemoryRegion as VerbsRegion, RegisterMemoryRegionError as RegisterError,
};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use std::any::Any;
use std::sync::Arc;

/// Environment variable naming the RDMA device to use (`mlx5_0`); default: the first with
/// an active port.
pub const IB_DEVICE_ENV: &str = "OXCCL_IB_DEVICE";

/// Environment variable giving the GID index of the port (default 0).
pub const IB_GID_INDEX_ENV: &str = "OXCCL_IB_GID_INDEX";

/// One registration with the device, and what keeps its memory alive.
struct Registration {
    addr: u64,
    len: u64,
    region: Arc<VerbsRegion>,
    _keep_alive: Arc<dyn Any + Send + Sync>,
}

/// The keys of one registration with the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistrationKeys {
    /// What this rank's requests from the memory carry.
    pub local: u32,
    /// What peers name the memory by.
    pub remote: u32,
}

/// A rank's opened RDMA device.
pub struct IbDevice {
    rank: u32,
    index: u8,
    name: String,
    context: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    port: u8,
    gid_index: u8,
    lid: u16,
    gid: [u8; 16],
    global: bool,
    mtu: u16,
    registrations: Mutex<Vec<Registration>>,
}

impl std::fmt::Debug for IbDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbDevice")
            .field("rank", &self.rank)
            .field("name", &self.name)
            .field("port", &self.port)
            .field("lid", &self.lid)
            .field("global", &self.global)
            .field("mtu", &self.mtu)
            .finish()
    }
}

/// A verbs failure of rank `rank`, doing `what`, in `call`.
pub(crate) fn verbs_error(
    rank: u32,
    what: &str,
    call: &'static str,
    error: &dyn std::error::Error,
) -> Error {
    Error::Verbs {
        context: format!("rank {rank}: {what}"),
        call,
        detail: with_causes(error),
    }
}

/// `error` and its causes, "outer: inner: ..." (the verbs wrapper's own messages leave out
/// the errno that says why).
pub(crate) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Bytes of an InfiniBand MTU.
fn mtu_bytes(mtu: Mtu) -> u16 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

/// The InfiniBand MTU of `bytes` (one of [`crate::ib_wire::MTUS`], as checked on arrival).
pub(crate) fn mtu_of(bytes: u16) -> Mtu {
    match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

impl IbDevice {
    /// Opens rank `rank`'s RDMA device (see the module docs for which).
    ///
    /// # Errors
    /// [`Error::BackendUnavailable`]: libibverbs cannot be loaded, lists no device, no
    /// device (or not the one named) has an active port, or the environment names a GID
    /// index that is not a number. [`Error::Verbs`]: the device could not be opened or
    /// queried, or refused a protection domain.
    pub fn open(rank: u32) -> Result<Self> {
        let unavailable = |why: String| Error::BackendUnavailable(format!("rank {rank}: {why}"));
        let wanted = std::env::var(IB_DEVICE_ENV).ok().filter(|n| !n.is_empty());
        let gid_index = match std::env::var(IB_GID_INDEX_ENV) {
            Ok(text) => text.trim().parse::<u8>().map_err(|_| {
                unavailable(format!(
                    "{IB_GID_INDEX_ENV}={text:?} is not a GID index (0-255)"
                ))
            })?,
            Err(_) => 0,
        };
        let list = DeviceList::new().map_err(|e| {
            unavailable(format!(
                "no RDMA device: libibverbs could not list devices ({}; is rdma-core \
                 installed, with a driver for the device?)",
                with_causes(&e)
            ))
        })?;
        if list.is_empty() {
            return Err(unavailable(
                "no RDMA device: libibverbs lists none (OXCCL_TRANSPORT=ethernet reaches \
                 other nodes without one)"
                    .into(),
            ));
        }
        let mut seen = Vec::new();
        for (index, device) in list.iter().enumerate() {
            let name = device.name();
            if wanted.as_ref().is_some_and(|w| *w != name) {
                seen.push(name);
                continue;
            }
            let index = u8::try_from(index)
                .map_err(|_| unavailable(format!("device {name} is past the 256th")))?;
            let what = format!("opening RDMA device {name}");
            let context = device
                .open()
                .map_err(|e| verbs_error(rank, &what, "ibv_open_device", &e))?;
            let ports = context
                .query_device()
                .map_err(|e| verbs_error(rank, &what, "ibv_query_device", &e))?
                .phys_port_cnt();
            for port in 1..=ports {
                let attr = context
                    .query_port(port)
                    .map_err(|e| verbs_error(rank, &what, "ibv_query_port", &e))?;
                if attr.port_state() != PortState::Active {
                    continue;
                }
                let gid = context
                    .query_gid(port, gid_index.into())
                    .map_err(|e| verbs_error(rank, &what, "ibv_query_gid", &e))?;
                let pd = context
                    .alloc_pd()
                    .map_err(|e| verbs_error(rank, &what, "ibv_alloc_pd", &e))?;
                let global = attr.link_layer() == LinkLayer::Ethernet || attr.lid() == 0;
                let device = IbDevice {
                    rank,
                    index,
                    name: name.clone(),
                    context,
                    pd,
                    port,
                    gid_index,
                    lid: attr.lid(),
                    gid: gid.raw,
                    global,
                    mtu: mtu_bytes(attr.active_mtu()),
                    registrations: Mutex::new(Vec::new()),
                };
                tracing::info!(
                    rank,
                    device = %name,
                    port,
                    lid = device.lid,
                    global,
                    mtu = device.mtu,
                    "RDMA device opened"
                );
                return Ok(device);
            }
            seen.push(format!("{name} (no active port)"));
        }
        Err(unavailable(match wanted {
            Some(w) => format!("no RDMA device {w} with an active port among {seen:?}"),
            None => format!("no RDMA device with an active port among {seen:?}"),
        }))
    }

    /// The device's index in libibverbs' list (what [`Transport::Ib`](crate::Transport::Ib)
    /// names).
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The device's name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rank that opened it.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The port, GID index and route of this end, for a queue pair of this device:
    /// everything of an [`IbEndpoint`] but the queue pair's own number and first sequence
    /// number.
    pub(crate) fn endpoint(&self, qp_number: u32, psn: u32) -> IbEndpoint {
        IbEndpoint {
            qp_number,
            psn,
            lid: self.lid,
            gid: self.gid,
            global: self.global,
            mtu: self.mtu,
        }
    }

    /// The port queue pairs of this device use.
    pub(crate) fn port(&self) -> u8 {
        self.port
    }

    /// The GID index of this end.
    pub(crate) fn gid_index(&self) -> u8 {
        self.gid_index
    }

    /// The opened device.
    pub(crate) fn context(&self) -> &Arc<DeviceContext> {
        &self.context
    }

    /// The protection domain every queue pair and registration of this device shares.
    pub(crate) fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Registers `len` bytes at `addr` (memory of this process, kept alive by
    /// `keep_alive`) for local access and for peers' RDMA writes, and, if `atomics`, their
    /// atomics (semaphores); returns its keys.
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] for an empty range; [`Error::Verbs`] if the device refused
    /// (memory it cannot pin, or GPU memory without GPUDirect RDMA).
    pub fn register(
        &self,
        addr: u64,
        len: u64,
        atomics: bool,
        keep_alive: Arc<dyn Any + Send + Sync>,
    ) -> Result<RegistrationKeys> {
        let what = format!("registering {len} bytes at {addr:#x} with {}", self.name);
        self.keep_registered(
            &what,
            "ibv_reg_mr",
            addr,
            len,
            atomics,
            keep_alive,
            |bytes, access| {
                // SAFETY: `addr..addr + len` is memory of this process (a registration made
                // here), and `keep_alive` holds its owner for as long as the registration
                // exists: the registration is dropped only with the device, after every queue
                // pair using it.
                unsafe { self.pd.reg_mr(addr as usize, bytes, access) }
            },
        )
    }

    /// Registers `len` bytes of GPU memory at device address `addr` through the dma-buf
    /// `fd` exported for them (`offset` is where `addr` lies in the dma-buf), as
    /// [`Self::register`] does host memory: no kernel module of NVIDIA's needed, where the
    /// RDMA device and its driver take dma-bufs.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub fn register_dma_buf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        addr: u64,
        len: u64,
        atomics: bool,
        keep_alive: Arc<dyn Any + Send + Sync>,
    ) -> Result<RegistrationKeys> {
        let what = format!(
            "registering {len} bytes of GPU memory at {addr:#x} with {} (dma-buf)",
            self.name
        );
        let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let call = "ibv_reg_dmabuf_mr";
        self.keep_registered(
            &what,
            call,
            addr,
            len,
            atomics,
            keep_alive,
            |bytes, access| {
                // SAFETY: `fd` is a live dma-buf the driver exported for memory holding
                // `offset..offset + len`, which `keep_alive` keeps allocated as long as the
                // registration (dropped only with the device); the registration takes its own
                // reference to the dma-buf, so `fd` may be closed afterwards.
                unsafe { self.pd.reg_dmabuf_mr(offset, bytes, addr, fd, access) }
            },
        )
    }

    /// Registers `len` bytes at `addr` with `reg` (given the byte count and the access
    /// peers get: writes, and atomics if `atomics`), keeps the registration with
    /// `keep_alive` until the device is dropped, and returns its keys; `what` and
    /// `call` name the attempt in errors.
    #[allow(clippy::too_many_arguments)]
    fn keep_registered(
        &self,
        what: &str,
        call: &'static str,
        addr: u64,
        len: u64,
        atomics: bool,
        keep_alive: Arc<dyn Any + Send + Sync>,
        reg: impl FnOnce(usize, AccessFlags) -> std::result::Result<Arc<VerbsRegion>, RegisterError>,
    ) -> Result<RegistrationKeys> {
        let bytes = usize::try_from(len)
            .ok()
            .filter(|&b| b > 0 && addr != 0)
            .ok_or_else(|| {
                Error::InvalidUsage(format!("rank {}: {what}: an empty range", self.rank))
            })?;
        let mut access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite;
        if atomics {
            access |= AccessFlags::RemoteAtomic;
        }
        let region = reg(bytes, access).map_err(|e| verbs_error(self.rank, what, call, &e))?;
        let keys = RegistrationKeys {
            local: region.lkey(),
            remote: region.rkey(),
        };
        self.registrations.lock().push(Registration {
            addr,
            len,
            region,
            _keep_alive: keep_alive,
        });
        Ok(keys)
    }

    /// The local key of the registration holding `len` bytes at `addr`, if one does.
    pub fn local_key(&self, addr: u64, len: u64) -> Option<u32> {
        self.registrations
            .lock()
            .iter()
            .find(|r| {
                addr >= r.addr
                    && addr
                        .checked_add(len)
                        .is_some_and(|end| end <= r.addr + r.len)
            })
            .map(|r| r.region.lkey())
    }
}
