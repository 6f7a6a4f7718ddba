//! The per-device state every object shares ([`DevInner`]): librdmacm's context for the
//! device, the limits queried from it when it was opened, and the options it was opened with.
//! Protection domains, completion queues, queue pairs and CM channels each keep an `Arc` of
//! it; [`VerbsDevice`](crate::VerbsDevice) is the public handle over it. Also the
//! poison-ignoring [`lock`] the objects' tables use.
//!
//! This is the bottom of the provider's objects: it depends only on the FFI helpers
//! (`sys`, `conv`, `pdata`) and the crate root's options.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdma_sys as ffi;

use crate::sys::{self, GidEntry, errno, os_err};
use crate::{MAX_SGE, VerbsConfig, conv, pdata};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::DeviceAttr;

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The array `rdma_get_devices` returned; freed (not the contexts in it, which librdmacm
/// owns for the life of the process) when the last device handle goes.
struct DevList(*mut *mut ffi::ibv_context);

impl Drop for DevList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from rdma_get_devices and is freed exactly once.
        unsafe { ffi::rdma_free_devices(self.0) };
    }
}

/// The state of an opened device that all its objects share (see the module docs).
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
    /// Memory windows the device supports (`max_mw`; 0: none).
    pub max_mw: u32,
    next_id: AtomicU64,
}

// SAFETY: libibverbs contexts may be used from any thread (all verbs are thread safe); the
// list pointer is only freed in Drop.
unsafe impl Send for DevInner {}
// SAFETY: as above; shared access only reads the pointers and calls thread-safe verbs.
unsafe impl Sync for DevInner {}

impl DevInner {
    /// Looks up the device named `name` (or the first one) among librdmacm's contexts and
    /// queries it.
    ///
    /// # Errors
    /// As [`VerbsDevice::open`](crate::VerbsDevice::open).
    pub(crate) fn open(name: Option<&str>, cfg: VerbsConfig) -> Result<Self> {
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
        unsafe { query(list, ctx, cfg) }
    }

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

/// Names of the RDMA devices libibverbs sees (`ibv_get_device_list`); empty if none.
pub(crate) fn ibv_device_names() -> Vec<String> {
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
        // A type-2 window is tied to the queue pair that bound it: only that queue pair's
        // peer reaches it (Soft-RoCE's are type 2B; see the crate doc).
        mw_domain_wide: false,
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
        max_mw: u32::try_from(da.max_mw).unwrap_or(0),
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
