//! Protection domains and memory regions.
//!
//! A protection domain owns a key-table segment (see [`layout`](crate::layout)), which peers
//! map read-only (it is sealed against writable mappings once formatted). Registering memory
//! writes one entry; deregistering revokes it by generation, so every copy of the old key
//! stops working at once.
//!
//! A registration with a remote right is *exported*: its pages get a memfd of their own
//! ([`share`](crate::share)), which is sent to the peers of every connection whose queue
//! pair belongs to this protection domain, and only to them (the protection domain is the
//! isolation unit, as on RDMA hardware: a peer can only name keys of the domain of the
//! queue pair it is connected to). A peer maps the memfd once, writable only if a remote
//! write right was granted. The key entry names the export slot. Registrations without a
//! remote right are never sent anywhere. When an exported registration ends, its key is
//! revoked, its peers are told to unmap it (`MrDel`), and its pages get their original
//! memory back, so a peer that kept the mapping writes into pages nobody reads.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mempool::memory::Region;

use crate::Shm;
use crate::core::DevCore;
use crate::layout::{KEY_TAG_MASK, KeySnap, KeyTable, MAX_KEY_SLOTS, key_table_len, make_key};
use crate::link::Link;
use crate::msg::{MAX_REGIONS, Msg, RegionDesc};
use crate::share::{self, Share};
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::traits::{MemoryRegion, MemoryWindow, ProtectionDomain};
use dp_fabric::types::Access;

/// Most registrations one protection domain exports at a time (all of them travel with
/// a new connection's endpoint description).
pub(crate) const MAX_EXPORTS: usize = MAX_REGIONS;

/// An exported registration.
struct Export {
    share: Arc<Share>,
    desc: RegionDesc,
}

struct PdState {
    gens: Vec<u32>,
    free: Vec<u32>,
    exports: Vec<Option<Export>>,
    /// Links of the connections whose queue pairs belong to this domain.
    links: Vec<Weak<Link>>,
    mr_seq: u64,
}

pub(crate) struct PdInner {
    /// Keeps the device alive while the domain exists.
    _dev: Arc<DevCore>,
    pub id: u64,
    pub kt_seg: Arc<Region>,
    kt: KeyTable,
    state: Mutex<PdState>,
}

impl PdInner {
    #[inline]
    pub(crate) fn kt(&self) -> &KeyTable {
        &self.kt
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

    /// Checks a peer's WRITE into our memory, as the peer named it (`key`, `addr` in our
    /// address space, `len` bytes, at least 1): the address, or `None` if the key is not
    /// ours, lacks the remote write right or does not cover the range. Used to place an
    /// inline payload at poll time (module `qpseg`), where the peer's word is all we have.
    pub(crate) fn check_remote_write(&self, key: u32, addr: u64, len: u32) -> Option<*mut u8> {
        let s = self.kt().lookup(key)?;
        if s.access & Access::REMOTE_WRITE.bits() == 0 || !s.covers(addr, u64::from(len)) {
            return None;
        }
        Some(addr as *mut u8)
    }

    /// Adds the link of a new connection of this domain, and returns the exports to
    /// describe to its peer (with duplicated descriptors). Later exports are announced
    /// over the link.
    pub(crate) fn exports_for_new_conn(
        &self,
        link: &Arc<Link>,
    ) -> Result<(Vec<RegionDesc>, Vec<OwnedFd>)> {
        let mut st = lock(&self.state);
        st.links.retain(|w| w.strong_count() > 0);
        st.links.push(Arc::downgrade(link));
        let mut descs = Vec::new();
        let mut fds = Vec::new();
        for e in st.exports.iter().flatten() {
            descs.push(e.desc);
            fds.push(e.share.fd.try_clone().map_err(|e| FabricError::Io {
                op: "duplicating a region descriptor",
                source: e,
            })?);
        }
        Ok((descs, fds))
    }

    /// Writes a key entry; with `export`, also exports the registration's pages to the
    /// peers of this domain (waiting until each has mapped them, so a key handed out
    /// afterwards works at once on their side). Returns (key index, key, export slot).
    fn register(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        export: Option<(Arc<Share>, usize)>,
    ) -> Result<(u32, u32, Option<u32>)> {
        let mut st = lock(&self.state);
        let idx = st.free.pop().ok_or(FabricError::Exhausted {
            what: "memory regions in this protection domain",
            limit: self.kt.slots() as u64,
            hint: "register fewer, larger regions (e.g. one per mempool), or make the \
                   protection domain with ShmDevice::alloc_pd_with_slots",
        })?;
        let (region_slot, region_off) = match export {
            None => (u32::MAX, 0),
            Some((share, off)) => match self.export_locked(&mut st, share) {
                Ok(slot) => (slot, off as u64),
                Err(e) => {
                    st.free.push(idx);
                    return Err(e);
                }
            },
        };
        // A fresh 20-bit tag (generation and consumer bits) per registration of the slot.
        let g = &mut st.gens[idx as usize];
        *g = (*g + 1) & KEY_TAG_MASK;
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
        let slot = (region_slot != u32::MAX).then_some(region_slot);
        Ok((idx, key, slot))
    }

    fn export_locked(&self, st: &mut PdState, share: Arc<Share>) -> Result<u32> {
        let slot = match st.exports.iter().position(Option::is_none) {
            Some(i) => i,
            None if st.exports.len() < MAX_EXPORTS => {
                st.exports.push(None);
                st.exports.len() - 1
            }
            None => {
                return Err(FabricError::Exhausted {
                    what: "remotely accessible registrations in this protection domain",
                    limit: MAX_EXPORTS as u64,
                    hint: "register fewer, larger remotely accessible buffers, or use more \
                           protection domains",
                });
            }
        } as u32;
        let desc = RegionDesc {
            slot,
            len: share.len as u64,
            page_size: u32::try_from(share.page).unwrap_or(u32::MAX),
            writable: share.writable,
        };
        st.mr_seq += 1;
        let seq = st.mr_seq;
        let msg = Msg::MrAdd { seq, region: desc };
        let links: Vec<Arc<Link>> = st.links.iter().filter_map(Weak::upgrade).collect();
        let mut sent = Vec::new();
        for l in &links {
            if l.announce(&msg, share.fd.as_fd()).is_ok() {
                sent.push(l);
            }
        }
        st.exports[slot as usize] = Some(Export { share, desc });
        for l in sent {
            // A peer that does not answer is dead or wedged; its connection will fail on
            // its own, so do not fail the registration for it.
            let _ = l.wait_mr_ack(seq, Duration::from_secs(2));
        }
        Ok(slot)
    }

    /// Revokes key `idx` and withdraws its export. Peers are told to unmap it; none is
    /// waited for: the pages stop being the exported memfd when the caller drops its share.
    fn deregister(&self, idx: u32, export: Option<u32>) {
        self.kt().revoke(idx as usize);
        let mut st = lock(&self.state);
        st.free.push(idx);
        if let Some(slot) = export
            && let Some(e) = st.exports.get_mut(slot as usize).and_then(Option::take)
        {
            let msg = Msg::MrDel { slot };
            st.links.retain(|w| w.strong_count() > 0);
            for l in st.links.iter().filter_map(Weak::upgrade) {
                let _ = l.send(&msg, &[]);
            }
            drop(e);
        }
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
    pub(crate) fn new(dev: &Arc<DevCore>, slots: usize) -> Result<Self> {
        if slots == 0 || slots > MAX_KEY_SLOTS {
            return Err(FabricError::InvalidArgument {
                what: "key slots of a protection domain",
                why: format!("{slots} is outside 1..={MAX_KEY_SLOTS}"),
            });
        }
        let id = dev.next_id();
        let kt_seg = dev.new_segment(&format!("pd{id}"), key_table_len(slots))?;
        // SAFETY: the fresh segment is zeroed, page aligned and key_table_len(slots) long;
        // nobody else has it yet; kt_seg is kept alive beside the view.
        let kt = unsafe { KeyTable::init(kt_seg.as_ptr(), slots, dev.ctx_id) };
        // Peers only read the key table: from now on they can map it read-only only.
        kt_seg.seal_future_write().map_err(|e| FabricError::Io {
            op: "sealing the key table against peers' writes",
            source: std::io::Error::other(e),
        })?;
        let free = (0..slots as u32).rev().collect();
        Ok(Self {
            inner: Arc::new(PdInner {
                _dev: dev.clone(),
                id,
                kt_seg,
                kt,
                state: Mutex::new(PdState {
                    gens: vec![0; slots],
                    free,
                    exports: Vec::new(),
                    links: Vec::new(),
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

fn share_failed(addr: u64, len: usize, access: Access, why: String) -> FabricError {
    FabricError::Registration {
        addr,
        len: len as u64,
        access: format!("{access:?}"),
        why: format!(
            "the shm provider gives remotely accessible memory a shared memory file of its \
             own and could not do so here: {why}; register memory of a mempool region or \
             private anonymous memory (malloc, mmap MAP_PRIVATE|MAP_ANONYMOUS), in pages no \
             other remote registration touches"
        ),
    }
}

/// Whether peers must be able to write the pages of a registration with `access`.
fn peer_writes(access: Access) -> bool {
    access.contains(Access::REMOTE_WRITE)
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
        let share = if access.is_remote() {
            Some(
                share::share_region(region, offset, len, peer_writes(access))
                    .map_err(|why| share_failed(addr, len, access, why))?,
            )
        } else {
            None
        };
        self.finish(addr, len, access, share, Some(region.clone()))
    }

    unsafe fn reg_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<ShmMr> {
        let a = addr as u64;
        check_access(a, len, access)?;
        let share = if access.is_remote() {
            // The caller's contract (mapped, readable, writable while registered) is what
            // sharing the pages in place needs.
            Some(
                share::share_raw(addr as usize, len, peer_writes(access))
                    .map_err(|why| share_failed(a, len, access, why))?,
            )
        } else {
            None
        };
        self.finish(a, len, access, share, None)
    }

    fn alloc_mw(&self) -> Result<ShmMw> {
        Err(FabricError::InvalidArgument {
            what: "memory windows",
            why: "not implemented yet".into(),
        })
    }
}

/// A memory window of the shm provider.
#[derive(Debug)]
pub enum ShmMw {}

impl MemoryWindow for ShmMw {
    fn rkey(&self) -> u32 {
        match *self {}
    }
}

impl ShmPd {
    fn finish(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        share: Option<(Arc<Share>, usize)>,
        keep: Option<Arc<Region>>,
    ) -> Result<ShmMr> {
        let mine = share.as_ref().map(|(s, _)| s.clone());
        let (idx, key, export) = self.inner.register(addr, len, access, share)?;
        Ok(ShmMr {
            pd: self.inner.clone(),
            idx,
            key,
            export,
            addr,
            len,
            access,
            share: mine,
            keep,
        })
    }
}

/// A memory region registered with the shm provider.
pub struct ShmMr {
    pd: Arc<PdInner>,
    idx: u32,
    key: u32,
    /// Export slot, for registrations with a remote right.
    export: Option<u32>,
    addr: u64,
    len: usize,
    access: Access,
    /// The pages' own memfd while the registration lives (remote rights only).
    share: Option<Arc<Share>>,
    /// The region registered through `reg_region`, kept mapped while registered.
    keep: Option<Arc<Region>>,
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
        if let (Some(s), Some(r)) = (&self.share, &self.keep)
            && Arc::strong_count(r) == 1
        {
            // This registration holds the last reference to the region: its memory is
            // unmapped with it, there is nothing to give back.
            s.skip_restore();
        }
        self.pd.deregister(self.idx, self.export);
        // Dropping the last reference to the share gives the pages their memory back.
        self.share = None;
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
    use crate::share::tests::Anon;
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
