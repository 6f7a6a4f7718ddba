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
//!
//! # Plain process memory with remote rights
//!
//! `reg_raw` with a remote right on memory that is not in a shareable region (a `malloc`
//! buffer, as librdmacm's `riomap` callers pass) makes the pages shareable *in place*: the
//! page-aligned range is copied into a fresh memfd, which is then mapped `MAP_SHARED |
//! MAP_FIXED` over the same addresses, so the program sees the same bytes at the same
//! address and the memfd is exported like a region. The conversion is remembered per range,
//! and later registrations inside it reuse the memfd; a registration that extends past it
//! (while nothing is registered on the old range) converts the union afresh. See
//! [`inplace`](crate::inplace) for what this costs the program: the pages become shared memory for good.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mempool::memory::{Region, registry};

use crate::Shm;
use crate::core::DevCore;
use crate::inplace;
use crate::layout::{KEY_SLOTS, KeySnap, KeyTable, make_key};
use crate::link::Link;
use crate::msg::{MAX_REGIONS, Msg, RegionDesc};
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{MemoryRegion, ProtectionDomain};
use dp_fabric::types::Access;

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
    conns: Vec<Weak<Link>>,
    mr_seq: u64,
}

pub(crate) struct PdInner {
    /// Keeps the device alive while the domain exists.
    _dev: Arc<DevCore>,
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
        conn: &Arc<Link>,
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
        let conns: Vec<Arc<Link>> = st.conns.iter().filter_map(Weak::upgrade).collect();
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
    pub(crate) fn new(dev: &Arc<DevCore>) -> Result<Self> {
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

fn in_place_failed(addr: u64, len: usize, access: Access, why: String) -> FabricError {
    FabricError::Registration {
        addr,
        len: len as u64,
        access: format!("{access:?}"),
        why: format!(
            "the memory is not in a shareable region and could not be shared in place: {why}; \
             allocate it from a shareable mempool region (RegionConfig::shareable(true)), or \
             from private anonymous memory (malloc, mmap MAP_PRIVATE|MAP_ANONYMOUS)"
        ),
    }
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
            _share: None,
        })
    }

    unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<ShmMr> {
        let a = addr as u64;
        check_access(a, len, access)?;
        let mut share = None;
        let export = if access.is_remote() {
            match registry::find(addr as usize, len.max(1)) {
                Some(r) => Some(ExportReq {
                    fd: r.fd,
                    len: r.region_len as u64,
                    page_size: r.page_size as u64,
                    region_id: r.region_id,
                    offset: r.offset as u64,
                    keep: None,
                }),
                None => {
                    // Not in a shareable region: share the pages in place. The caller's
                    // contract (mapped, readable, writable while registered) is what
                    // `inplace::share` needs.
                    let (s, offset) = inplace::share(addr as usize, len)
                        .map_err(|why| in_place_failed(a, len, access, why))?;
                    let fd = s.fd.try_clone().map_err(|e| FabricError::Io {
                        op: "duplicating an in-place shared memory descriptor",
                        source: e,
                    })?;
                    let export = ExportReq {
                        fd,
                        len: s.len as u64,
                        page_size: inplace::page_size() as u64,
                        region_id: s.id,
                        offset: offset as u64,
                        keep: None,
                    };
                    share = Some(s);
                    Some(export)
                }
            }
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
            _share: share,
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
    /// Pages shared in place for this registration: while any registration holds them,
    /// their range is never converted again (which would detach it from this export).
    _share: Option<Arc<inplace::Share>>,
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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use crate::Shm;
    use crate::inplace::tests::Anon;
    use crate::{ShmConfig, ShmDevice};
    use dp_fabric::conformance::{self, Env};
    use dp_fabric::{
        Access, MemoryRegion, ProtectionDomain, QpCaps, RcQueuePair, RemoteAddr, SendOp, SendWr,
    };

    #[test]
    fn raw_registration_takes_remote_writes_into_plain_memory() {
        let dir = std::env::temp_dir().join(format!("dp-pd-inplace-{}", std::process::id()));
        let cfg = ShmConfig {
            dir: Some(dir.clone()),
            ..ShmConfig::default()
        };
        let env = Env {
            a: ShmDevice::open(cfg.clone()).expect("device a"),
            b: ShmDevice::open(cfg).expect("device b"),
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            port: 21_000,
        };
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let mut p = conformance::connect::<Shm>(&env, env.port, caps, &[], &[]).expect("connect");
        let m = Anon::new(3);
        for i in 0..m.len {
            m.set(i, 0xEE);
        }
        // Registered after the connection is up, so the export reaches the peer through the
        // announcement path. SAFETY: `m` stays mapped until after `mr` is dropped, and no
        // Rust reference into it exists (the test reads it with volatile loads).
        let mr = unsafe {
            p.b.pd.reg_raw(
                m.ptr.add(50),
                6000,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        }
        .expect("reg_raw of plain memory with remote write");
        assert_eq!(mr.addr(), m.ptr as u64 + 50);
        p.a.fill(0, 4096, |i| (i * 3) as u8);
        let sge = [p.a.mr.sge(0, 4096)];
        let to = RemoteAddr {
            addr: mr.addr() + 10,
            rkey: mr.rkey(),
        };
        p.a.qp
            .post_send(&[SendWr::signaled(1, SendOp::Write(to), &sge)])
            .expect("post write");
        let (ca, _) = conformance::poll_n(&mut p, 1, 0).expect("write completion");
        assert!(ca[0].is_ok(), "{:?}", ca[0]);
        for i in 0..m.len {
            let want = if (60..60 + 4096).contains(&i) {
                ((i - 60) * 3) as u8
            } else {
                0xEE
            };
            assert_eq!(m.get(i), want, "byte {i}");
        }
        // Past the registration is out of bounds for the peer, as for any region.
        let past = RemoteAddr {
            addr: mr.addr() + 6000 - 8,
            rkey: mr.rkey(),
        };
        p.a.qp
            .post_send(&[SendWr::signaled(2, SendOp::Write(past), &sge[..1])])
            .expect("post write");
        let (ca, _) = conformance::poll_n(&mut p, 1, 0).expect("failed write completion");
        assert!(!ca[0].is_ok(), "a write past the registration succeeded");
        drop(mr);
        drop(p);
        let _ = std::fs::remove_dir_all(dir);
    }
}
