//! Protection domains, memory regions and the peers' view of them.
//!
//! A protection domain owns a key-table segment (see [`layout`](super::layout)). Registering
//! memory writes one entry; deregistering revokes it by generation. Memory registered with a
//! remote right must live in a shareable `mempool` region: the region is *exported* (its
//! memfd is sent to every connected peer, which maps it once) and the key entry names the
//! export slot. Regions without a remotely accessible registration are never sent anywhere.
//!
//! On the peer, a [`RemotePd`] holds the mapped key table and exports of one remote
//! protection domain, shared by every connection to it. Every remote access re-reads the
//! owner's key entry, so revocation takes effect immediately.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use mempool::memory::{Region, registry};

use super::Shm;
use super::cm::Conn;
use super::device::{DevInner, lock};
use super::layout::{KEY_SLOTS, KeySnap, KeyTable, make_key};
use super::msg::{MAX_REGIONS, Msg, RegionDesc};
use crate::fabric::error::{FabricError, Result};
use crate::fabric::traits::{MemoryRegion, ProtectionDomain};
use crate::fabric::types::Access;

/// Most regions one protection domain exports.
pub(crate) const MAX_EXPORTS: usize = MAX_REGIONS;

/// A region exported to peers.
pub(crate) struct Export {
    pub fd: OwnedFd,
    pub len: u64,
    pub page_size: u32,
    /// Keeps the memory mapped when registered through `reg_region`.
    _keep: Option<Arc<Region>>,
}

/// What registering remotely accessible memory needs to export its region.
struct ExportReq {
    fd: OwnedFd,
    len: u64,
    page_size: u64,
    region_id: u64,
    offset: u64,
    keep: Option<Arc<Region>>,
}

struct PdState {
    gens: Vec<u32>,
    free: Vec<u32>,
    exports: Vec<Export>,
    export_by_region: HashMap<u64, u32>,
    conns: Vec<Weak<Conn>>,
    mr_seq: u64,
}

pub(crate) struct PdInner {
    /// Keeps the device alive while the domain exists.
    _dev: Arc<DevInner>,
    pub id: u64,
    pub kt_seg: Arc<Region>,
    state: Mutex<PdState>,
}

// SAFETY: the raw key-table pointer is derived from kt_seg, which the struct keeps alive;
// the table is accessed only through atomics.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl PdInner {
    #[inline]
    pub(crate) fn kt(&self) -> &KeyTable {
        // SAFETY: kt_seg is at least size_of::<KeyTable>() long (created so) and lives as
        // long as self.
        unsafe { &*self.kt_seg.as_ptr().cast::<KeyTable>() }
    }

    /// Checks a local scatter/gather entry and returns its address, or `None` (local
    /// protection error) if the key, range or rights do not allow the access.
    #[inline]
    pub(crate) fn check_local(
        &self,
        lkey: u32,
        addr: u64,
        len: u32,
        write: bool,
    ) -> Option<*mut u8> {
        if len == 0 {
            return Some(addr as *mut u8);
        }
        let s = self.kt().lookup(lkey)?;
        if !s.covers(addr, u64::from(len)) {
            return None;
        }
        if write && s.access & Access::LOCAL_WRITE.bits() == 0 {
            return None;
        }
        Some(addr as *mut u8)
    }

    /// Snapshot of the exports and registration of `conn` for future announcements; used
    /// when describing ourselves to a new peer. Returns the region list and duplicated fds.
    pub(crate) fn exports_for_new_conn(
        &self,
        conn: &Arc<Conn>,
    ) -> Result<(Vec<RegionDesc>, Vec<OwnedFd>)> {
        let mut st = lock(&self.state);
        st.conns.retain(|w| w.strong_count() > 0);
        st.conns.push(Arc::downgrade(conn));
        let mut descs = Vec::with_capacity(st.exports.len());
        let mut fds = Vec::with_capacity(st.exports.len());
        for (slot, e) in st.exports.iter().enumerate() {
            descs.push(RegionDesc {
                slot: slot as u32,
                len: e.len,
                page_size: e.page_size,
            });
            fds.push(e.fd.try_clone().map_err(|e| FabricError::Io {
                op: "duplicating a region descriptor",
                source: e,
            })?);
        }
        Ok((descs, fds))
    }

    fn register(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: Access,
        export: Option<ExportReq>,
    ) -> Result<(u32, u32)> {
        let mut st = lock(&self.state);
        let (region_slot, region_off) = match export {
            None => (u32::MAX, 0),
            Some(x) => {
                let slot = match st.export_by_region.get(&x.region_id) {
                    Some(&s) => s,
                    None => {
                        self.export_locked(&mut st, x.fd, x.len, x.page_size, x.region_id, x.keep)?
                    }
                };
                (slot, x.offset)
            }
        };
        let idx = st.free.pop().ok_or(FabricError::Exhausted {
            what: "memory regions in this protection domain",
            limit: KEY_SLOTS as u64,
            hint: "register fewer, larger regions (e.g. one per mempool)",
        })?;
        let g = &mut st.gens[idx as usize];
        *g = (*g + 1) & 0xF_FFFF;
        if *g == 0 {
            *g = 1;
        }
        let key = make_key(idx as usize, *g);
        self.kt().publish(
            idx as usize,
            &KeySnap {
                key,
                access: access.bits(),
                region_slot,
                base: addr,
                len: len as u64,
                region_off,
            },
        );
        Ok((idx, key))
    }

    fn export_locked(
        &self,
        st: &mut PdState,
        fd: OwnedFd,
        len: u64,
        page_size: u64,
        region_id: u64,
        keep: Option<Arc<Region>>,
    ) -> Result<u32> {
        if st.exports.len() >= MAX_EXPORTS {
            return Err(FabricError::Exhausted {
                what: "exported regions in this protection domain",
                limit: MAX_EXPORTS as u64,
                hint: "carve remotely accessible buffers from fewer, larger regions",
            });
        }
        let slot = st.exports.len() as u32;
        let page_size = u32::try_from(page_size).unwrap_or(u32::MAX);
        st.exports.push(Export {
            fd,
            len,
            page_size,
            _keep: keep,
        });
        st.export_by_region.insert(region_id, slot);
        // Tell every connected peer, and wait until each has mapped the region, so a key
        // we hand out afterwards works at once on their side.
        st.mr_seq += 1;
        let seq = st.mr_seq;
        let msg = Msg::MrAdd {
            seq,
            region: RegionDesc {
                slot,
                len,
                page_size,
            },
        };
        let conns: Vec<Arc<Conn>> = st.conns.iter().filter_map(Weak::upgrade).collect();
        let fd = st.exports[slot as usize].fd.as_fd();
        let mut sent = Vec::new();
        for c in &conns {
            if c.announce(&msg, fd).is_ok() {
                sent.push(c);
            }
        }
        for c in sent {
            // A peer that does not answer is dead or wedged; its connection will fail on
            // its own, so do not fail the registration for it.
            let _ = c.wait_mr_ack(seq, Duration::from_secs(2));
        }
        Ok(slot)
    }

    fn deregister(&self, idx: u32) {
        self.kt().revoke(idx as usize);
        lock(&self.state).free.push(idx);
    }
}

/// A protection domain of the shm provider.
#[derive(Clone)]
pub struct ShmPd {
    pub(crate) inner: Arc<PdInner>,
}

impl core::fmt::Debug for ShmPd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmPd").field("id", &self.inner.id).finish()
    }
}

impl ShmPd {
    pub(crate) fn new(dev: &Arc<DevInner>) -> Result<Self> {
        let id = dev.next_id();
        let kt_seg = dev.new_segment(&format!("pd{id}"), size_of::<KeyTable>())?;
        // SAFETY: the fresh segment is zeroed, page aligned and big enough; nobody else has
        // it yet.
        unsafe { (*kt_seg.as_ptr().cast::<KeyTable>()).init(dev.ctx_id) };
        let free = (0..KEY_SLOTS as u32).rev().collect();
        Ok(Self {
            inner: Arc::new(PdInner {
                _dev: dev.clone(),
                id,
                kt_seg,
                state: Mutex::new(PdState {
                    gens: vec![0; KEY_SLOTS],
                    free,
                    exports: Vec::new(),
                    export_by_region: HashMap::new(),
                    conns: Vec::new(),
                    mr_seq: 0,
                }),
            }),
        })
    }
}

fn check_access(addr: u64, len: usize, access: Access) -> Result<()> {
    if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
        return Err(FabricError::Registration {
            addr,
            len: len as u64,
            access: format!("{access:?}"),
            why: "REMOTE_WRITE requires LOCAL_WRITE (as in verbs)".into(),
        });
    }
    if len > 1 << 40 {
        return Err(FabricError::Registration {
            addr,
            len: len as u64,
            access: format!("{access:?}"),
            why: "length too large".into(),
        });
    }
    Ok(())
}

fn not_shareable(addr: u64, len: usize, access: Access) -> FabricError {
    FabricError::Registration {
        addr,
        len: len as u64,
        access: format!("{access:?}"),
        why: "the shm provider exposes memory to peers only from shareable mempool regions; \
              allocate it with RegionConfig::shareable(true) (or from a shareable pool)"
            .into(),
    }
}

impl ProtectionDomain for ShmPd {
    type P = Shm;

    fn reg_region(
        &self,
        region: &Arc<Region>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<ShmMr> {
        let addr = region.as_ptr() as u64 + offset as u64;
        check_access(addr, len, access)?;
        if offset.checked_add(len).is_none_or(|e| e > region.len()) {
            return Err(FabricError::Registration {
                addr,
                len: len as u64,
                access: format!("{access:?}"),
                why: format!(
                    "range {offset}+{len} is outside the {}-byte region",
                    region.len()
                ),
            });
        }
        let export = if access.is_remote() {
            let h = region
                .share_handle()
                .ok_or_else(|| not_shareable(addr, len, access))?;
            let fd = h.fd.try_clone_to_owned().map_err(|e| FabricError::Io {
                op: "duplicating a region descriptor",
                source: e,
            })?;
            Some(ExportReq {
                fd,
                len: h.len as u64,
                page_size: h.page_size as u64,
                region_id: region.id(),
                offset: offset as u64,
                keep: Some(region.clone()),
            })
        } else {
            None
        };
        let (idx, key) = self.inner.register(addr, len, access, export)?;
        Ok(ShmMr {
            pd: self.inner.clone(),
            idx,
            key,
            addr,
            len,
            access,
            _keep: Some(region.clone()),
        })
    }

    unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<ShmMr> {
        let a = addr as u64;
        check_access(a, len, access)?;
        let export = if access.is_remote() {
            let r = registry::find(addr as usize, len.max(1))
                .ok_or_else(|| not_shareable(a, len, access))?;
            Some(ExportReq {
                fd: r.fd,
                len: r.region_len as u64,
                page_size: r.page_size as u64,
                region_id: r.region_id,
                offset: r.offset as u64,
                keep: None,
            })
        } else {
            None
        };
        let (idx, key) = self.inner.register(a, len, access, export)?;
        Ok(ShmMr {
            pd: self.inner.clone(),
            idx,
            key,
            addr: a,
            len,
            access,
            _keep: None,
        })
    }
}

/// A memory region registered with the shm provider.
pub struct ShmMr {
    pd: Arc<PdInner>,
    idx: u32,
    key: u32,
    addr: u64,
    len: usize,
    access: Access,
    _keep: Option<Arc<Region>>,
}

impl core::fmt::Debug for ShmMr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmMr")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("key", &format_args!("{:#x}", self.key))
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for ShmMr {
    fn drop(&mut self) {
        self.pd.deregister(self.idx);
    }
}

impl MemoryRegion for ShmMr {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn access(&self) -> Access {
        self.access
    }
}

/// A peer protection domain as this process sees it: its key table and the regions it
/// exported, mapped here.
pub(crate) struct RemotePd {
    pub kt_seg: Arc<Region>,
    regions: Box<[OnceLock<Arc<Region>>]>,
}

// SAFETY: the key table is reached through atomics only; regions are Arc'd mappings.
unsafe impl Send for RemotePd {}
// SAFETY: as above.
unsafe impl Sync for RemotePd {}

impl RemotePd {
    /// Maps (or finds) the peer protection domain `(ctx, pd_id)`.
    pub(crate) fn get_or_map(
        dev: &DevInner,
        ctx: u32,
        pd_id: u64,
        kt_fd: OwnedFd,
        kt_len: u64,
    ) -> Result<Arc<Self>> {
        let mut m = lock(&dev.remote_pds);
        if let Some(r) = m.get(&(ctx, pd_id)).and_then(Weak::upgrade) {
            return Ok(r);
        }
        let kt_seg = dev.map_segment(kt_fd, kt_len, 4096, "peer-keytable")?;
        if kt_seg.len() < size_of::<KeyTable>() {
            return Err(FabricError::Protocol("peer key table too small"));
        }
        // SAFETY: mapped, page aligned, at least one KeyTable long (checked above).
        let kt = unsafe { &*kt_seg.as_ptr().cast::<KeyTable>() };
        kt.hdr
            .check(super::layout::SegKind::KeyTable, kt_seg.len())
            .map_err(FabricError::Protocol)?;
        let regions = (0..MAX_EXPORTS).map(|_| OnceLock::new()).collect();
        let r = Arc::new(Self { kt_seg, regions });
        m.retain(|_, w| w.strong_count() > 0);
        m.insert((ctx, pd_id), Arc::downgrade(&r));
        Ok(r)
    }

    /// Maps export `desc` unless it is mapped already.
    pub(crate) fn add_region(&self, dev: &DevInner, desc: &RegionDesc, fd: OwnedFd) -> Result<()> {
        let cell = self
            .regions
            .get(desc.slot as usize)
            .ok_or(FabricError::Protocol("peer region slot out of range"))?;
        if cell.get().is_some() {
            return Ok(());
        }
        let r = dev.map_segment(fd, desc.len, u64::from(desc.page_size), "peer-region")?;
        let _ = cell.set(r);
        Ok(())
    }

    #[inline]
    fn kt(&self) -> &KeyTable {
        // SAFETY: validated in get_or_map; kt_seg lives as long as self.
        unsafe { &*self.kt_seg.as_ptr().cast::<KeyTable>() }
    }

    /// Translates a peer address range into a pointer in our mapping of its region, if the
    /// key is valid, covers the range and grants `need`.
    #[inline]
    pub(crate) fn translate(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<*mut u8> {
        let s = self.kt().lookup(rkey)?;
        if s.access & need.bits() != need.bits() || !s.covers(addr, len) {
            return None;
        }
        let region = self.regions.get(s.region_slot as usize)?.get()?;
        let off = s.region_off.checked_add(addr - s.base)?;
        if off.checked_add(len)? > region.len() as u64 {
            return None;
        }
        // SAFETY: off + len <= region.len(), so the pointer stays inside the mapping.
        Some(unsafe { region.as_ptr().add(off as usize) })
    }
}
