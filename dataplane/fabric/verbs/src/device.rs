//! Device discovery and the opened device.

use std::net::IpAddr;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rdma_sys as ffi;

use crate::cm::VerbsCm;
use crate::cq::VerbsCq;
use crate::pd::VerbsPd;
use crate::sys::{self, GidEntry, errno, os_err};
use crate::ud::{VerbsUdDest, VerbsUdQp};
use crate::{MAX_SGE, Verbs, VerbsConfig, conv, pdata};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{Device, QpInit};
use dp_fabric::types::DeviceAttr;

/// The array `rdma_get_devices` returned; freed (not the contexts in it, which librdmacm
/// owns for the life of the process) when the last device handle goes.
struct DevList(*mut *mut ffi::ibv_context);

impl Drop for DevList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from rdma_get_devices and is freed exactly once.
        unsafe { ffi::rdma_free_devices(self.0) };
    }
}

pub(crate) struct DevInner {
    _list: DevList,
    /// librdmacm's context for this device: the one its ids point at.
    pub ctx: *mut ffi::ibv_context,
    /// The port the attributes describe (the first active one).
    pub port: u8,
    /// `IBV_LINK_LAYER_*` of that port.
    pub link_layer: u8,
    pub attr: DeviceAttr,
    pub cfg: VerbsConfig,
    /// Entries in each port's GID table.
    pub gid_tbl_len: usize,
    /// Physical ports.
    pub ports: u8,
    next_id: AtomicU64,
}

// SAFETY: libibverbs contexts may be used from any thread (all verbs are thread safe); the
// list pointer is only freed in Drop.
unsafe impl Send for DevInner {}
// SAFETY: as above; shared access only reads the pointers and calls thread-safe verbs.
unsafe impl Sync for DevInner {}

impl DevInner {
    /// A fresh id for connections and listeners.
    pub(crate) fn next_id(&self) -> u64 {
        // Relaxed: only uniqueness matters.
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The device name.
    pub(crate) fn name(&self) -> &str {
        &self.attr.name
    }

    /// Every valid GID table entry of the device.
    pub(crate) fn gids(&self) -> Result<Vec<GidEntry>> {
        // SAFETY: ctx is live for as long as self.
        unsafe { sys::gid_table(self.ctx, self.gid_tbl_len * usize::from(self.ports.max(1))) }
            .map_err(|e| FabricError::Io {
                op: "ibv_query_gid_table",
                source: e,
            })
    }

    /// The index of `gid` in `port`'s GID table, preferring a RoCE v2 entry (the RDMA CM's
    /// default mode) when the same GID appears with several types.
    pub(crate) fn gid_index(&self, port: u8, gid: &[u8; 16]) -> Result<u8> {
        let table = self.gids()?;
        let matching = || {
            table
                .iter()
                .filter(|e| e.port == u32::from(port) && &e.gid == gid)
        };
        let best = matching()
            .find(|e| e.gid_type == sys::GID_TYPE_ROCE_V2)
            .or_else(|| matching().next())
            .ok_or_else(|| FabricError::InvalidArgument {
                what: "source GID",
                why: format!(
                    "the route's source GID is not in {} port {port}'s GID table",
                    self.name()
                ),
            })?;
        u8::try_from(best.index).map_err(|_| FabricError::InvalidArgument {
            what: "source GID",
            why: format!("GID index {} does not fit an address handle", best.index),
        })
    }
}

/// An opened RDMA device.
///
/// Opening claims nothing: it looks the device up among librdmacm's contexts, queries its
/// limits, and probes the largest inline payload a queue pair may ask for (libibverbs
/// reports that only per queue pair). Handles are cheap to clone.
#[derive(Clone)]
pub struct VerbsDevice {
    pub(crate) inner: Arc<DevInner>,
}

impl core::fmt::Debug for VerbsDevice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerbsDevice")
            .field("name", &self.inner.attr.name)
            .field("port", &self.inner.port)
            .finish()
    }
}

/// Names of the RDMA devices libibverbs sees (`ibv_get_device_list`).
///
/// # Errors
/// [`FabricError::NoDevice`] if there is none.
pub fn devices() -> Result<Vec<String>> {
    let names = ibv_device_names();
    if names.is_empty() {
        return Err(FabricError::NoDevice { name: None });
    }
    Ok(names)
}

fn ibv_device_names() -> Vec<String> {
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count and returns a NULL-terminated array (or
    // NULL when libibverbs cannot run, e.g. without kernel support).
    let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: i < n entries of the live list; each is a valid device.
        let name = unsafe { sys::c_string(ffi::ibv_get_device_name(*list.add(i))) };
        out.push(name);
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    out
}

impl VerbsDevice {
    /// Opens the device named `name` (as `ibv_devices` lists it), or the first one.
    ///
    /// # Errors
    /// [`FabricError::NoDevice`] if there is no RDMA device or none with that name;
    /// [`FabricError::Io`] if the device exists but librdmacm cannot use it (the
    /// `rdma_ucm` module is not loaded) or cannot be queried.
    pub fn open(name: Option<&str>) -> Result<Self> {
        Self::open_with(name, VerbsConfig::default())
    }

    /// Opens a device with explicit options.
    ///
    /// # Errors
    /// As [`VerbsDevice::open`], and [`FabricError::InvalidArgument`] for a zero
    /// `resolve_attempts` or `resolve_timeout`.
    pub fn open_with(name: Option<&str>, cfg: VerbsConfig) -> Result<Self> {
        if cfg.resolve_attempts == 0 || cfg.resolve_timeout.is_zero() {
            return Err(FabricError::InvalidArgument {
                what: "VerbsConfig",
                why: "resolve_attempts and resolve_timeout must be non-zero".into(),
            });
        }
        let names = ibv_device_names();
        let no_device = || FabricError::NoDevice {
            name: name.map(str::to_owned),
        };
        if names.is_empty() || name.is_some_and(|n| !names.iter().any(|x| x == n)) {
            return Err(no_device());
        }
        let mut n = 0;
        // SAFETY: rdma_get_devices writes the count and returns librdmacm's contexts (NULL
        // on failure, with errno set).
        let list = unsafe { ffi::rdma_get_devices(&raw mut n) };
        if list.is_null() {
            return Err(FabricError::Io {
                op: "rdma_get_devices (librdmacm sees no device: is the rdma_ucm module loaded?)",
                source: os_err(errno()),
            });
        }
        let list = DevList(list);
        let mut ctx = ptr::null_mut();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: i < n entries of the live list, each a live context with a device.
            let c = unsafe { *list.0.add(i) };
            // SAFETY: as above.
            let dev_name = unsafe { sys::c_string(ffi::ibv_get_device_name((*c).device)) };
            if name.is_none_or(|want| want == dev_name) {
                ctx = c;
                break;
            }
        }
        if ctx.is_null() {
            return Err(FabricError::Io {
                op: "rdma_get_devices (libibverbs lists the device but librdmacm does not: \
                     is the rdma_ucm module loaded?)",
                source: os_err(libc::ENODEV),
            });
        }
        // SAFETY: ctx is one of librdmacm's live contexts, kept by `list`.
        let inner = unsafe { query(list, ctx, cfg) }?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The port the attributes describe (the first active port).
    pub fn port(&self) -> u8 {
        self.inner.port
    }

    /// The options the device was opened with.
    pub fn config(&self) -> &VerbsConfig {
        &self.inner.cfg
    }

    /// The IP addresses of the device's GID table, IPv4 first (on RoCE, the addresses of
    /// the network device it is bound to). Link-local IPv6 addresses are left out.
    ///
    /// # Errors
    /// If the GID table cannot be read.
    pub fn ip_addrs(&self) -> Result<Vec<IpAddr>> {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for e in self.inner.gids()? {
            match sys::gid_ip(&e.gid) {
                Some(ip @ IpAddr::V4(_)) if !v4.contains(&ip) => v4.push(ip),
                Some(IpAddr::V6(ip))
                    if !ip.is_unicast_link_local() && !v6.contains(&IpAddr::V6(ip)) =>
                {
                    v6.push(IpAddr::V6(ip));
                }
                _ => {}
            }
        }
        v4.extend(v6);
        Ok(v4)
    }
}

/// Queries a device's limits into a `DevInner`.
///
/// # Safety
/// `ctx` must be a live context that `list` keeps alive.
unsafe fn query(list: DevList, ctx: *mut ffi::ibv_context, cfg: VerbsConfig) -> Result<DevInner> {
    // SAFETY: ctx is live; ibv_device_attr is plain data that ibv_query_device fills.
    let mut da: ffi::ibv_device_attr = unsafe { core::mem::zeroed() };
    // SAFETY: ctx is live and da is a writable attribute struct.
    let rc = unsafe { ffi::ibv_query_device(ctx, &raw mut da) };
    if rc != 0 {
        return Err(FabricError::Io {
            op: "ibv_query_device",
            source: os_err(rc),
        });
    }
    // SAFETY: ctx is live.
    let name = unsafe { sys::c_string(ffi::ibv_get_device_name((*ctx).device)) };
    let mut chosen = None;
    for p in 1..=da.phys_port_cnt.max(1) {
        // SAFETY: plain data filled by the query below.
        let mut pa: ffi::ibv_port_attr = unsafe { core::mem::zeroed() };
        // SAFETY: ctx is live, p is a port number of the device, pa is writable.
        if unsafe { ffi::___ibv_query_port(ctx, p, &raw mut pa) } != 0 {
            continue;
        }
        let active = pa.state == ffi::ibv_port_state::IBV_PORT_ACTIVE;
        if chosen.is_none() || active {
            chosen = Some((p, pa));
        }
        if active {
            break;
        }
    }
    let Some((port, pa)) = chosen else {
        return Err(FabricError::Io {
            op: "ibv_query_port",
            source: os_err(errno()),
        });
    };
    let max_sge = u32::try_from(da.max_sge).unwrap_or(1).clamp(1, MAX_SGE);
    // SAFETY: ctx is live.
    let max_inline = unsafe { probe_max_inline(ctx) };
    let (req, rep, rej) = pdata::limits(cfg.private_data);
    let max_msg = u64::from(pa.max_msg_sz);
    let attr = DeviceAttr {
        name,
        provider: "verbs",
        max_qp_wr: u32::try_from(da.max_qp_wr).unwrap_or(0),
        max_sge,
        max_cqe: u32::try_from(da.max_cqe).unwrap_or(0),
        max_inline_data: max_inline,
        max_msg_size: max_msg,
        max_send_size: max_msg,
        mtu: conv::mtu_bytes(pa.active_mtu),
        max_req_private_data: req,
        max_rep_private_data: rep,
        max_rej_private_data: rej,
    };
    Ok(DevInner {
        _list: list,
        ctx,
        port,
        link_layer: if pa.link_layer == 0 {
            sys::LINK_LAYER_INFINIBAND
        } else {
            pa.link_layer
        },
        attr,
        cfg,
        gid_tbl_len: usize::try_from(pa.gid_tbl_len).unwrap_or(0),
        ports: da.phys_port_cnt,
        next_id: AtomicU64::new(1),
    })
}

/// The largest `max_inline_data` an RC queue pair of this device can be created with.
/// libibverbs has no device attribute for it, so try a few sizes on a scratch queue pair and
/// take what the provider grants.
///
/// # Safety
/// `ctx` must be a live context.
unsafe fn probe_max_inline(ctx: *mut ffi::ibv_context) -> u32 {
    // SAFETY: ctx is live.
    let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return 0;
    }
    // SAFETY: ctx is live; no channel, no completion vector.
    let cq = unsafe { ffi::ibv_create_cq(ctx, 2, ptr::null_mut(), ptr::null_mut(), 0) };
    let mut granted = 0;
    if !cq.is_null() {
        for want in [1024u32, 512, 256, 128, 64, 32, 16] {
            // SAFETY: plain data; every field the call reads is set below.
            let mut ia: ffi::ibv_qp_init_attr = unsafe { core::mem::zeroed() };
            ia.send_cq = cq;
            ia.recv_cq = cq;
            ia.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
            ia.cap = ffi::ibv_qp_cap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: want,
            };
            // SAFETY: pd and cq are live objects of ctx; ia is a valid init attribute.
            let qp = unsafe { ffi::ibv_create_qp(pd, &raw mut ia) };
            if !qp.is_null() {
                granted = ia.cap.max_inline_data.max(want);
                // SAFETY: qp was created above and is destroyed once.
                unsafe { ffi::ibv_destroy_qp(qp) };
                break;
            }
        }
        // SAFETY: cq was created above; its only queue pair is gone.
        unsafe { ffi::ibv_destroy_cq(cq) };
    }
    // SAFETY: pd was allocated above; nothing uses it any more.
    unsafe { ffi::ibv_dealloc_pd(pd) };
    granted
}

impl Device for VerbsDevice {
    type P = Verbs;

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        VerbsPd::new(&self.inner)
    }

    fn create_cq(&self, depth: u32) -> Result<VerbsCq> {
        VerbsCq::new(&self.inner, depth)
    }

    fn create_cm_channel(&self) -> Result<VerbsCm> {
        VerbsCm::new(&self.inner)
    }

    fn create_ud_qp(
        &self,
        init: &QpInit<'_, Verbs>,
        local: IpAddr,
        qkey: u32,
    ) -> Result<VerbsUdQp> {
        VerbsUdQp::new(&self.inner, init, local, qkey)
    }

    fn resolve_ud_dest(
        &self,
        pd: &VerbsPd,
        local: IpAddr,
        remote: IpAddr,
        remote_qpn: u32,
        qkey: u32,
    ) -> Result<VerbsUdDest> {
        VerbsUdDest::resolve(&self.inner, pd, local, remote, remote_qpn, qkey)
    }
}
