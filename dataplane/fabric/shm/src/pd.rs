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
//!
//! **Memory windows** (type 2). A registration with [`Access::MW_BIND`] is exported like
//! one with a remote right (writable by peers if it has local write, so that a window can
//! grant remote write), but its own key keeps only its own rights: a peer reaches its
//! pages only through the key of a window bound to it. A window is a key-table entry of
//! its own, allocated unbound (key 0 in the table: its key names nothing). A bind, run by
//! one of the domain's queue pairs in order with its sends, writes the entry: the window's
//! key with the consumer key the poster chose, the window's remote rights, and the bound
//! range with the region's export slot and offset, so a peer's access is checked against
//! it exactly as against a region's entry. A rebind rewrites it (the old key stops
//! matching); a local invalidation, a peer's SEND with invalidate (checked by the queue
//! pair it arrives on: the key must be the current key of a window of this domain), the
//! window's drop and its region's deregistration revoke it. Window entries are written
//! under the domain's window lock, region entries under its state lock; each entry has one
//! writer at a time, as the seqlock needs. Key tags start at a value derived from the
//! domain, so two domains rarely issue the same key. Revoking a window's entry takes no
//! pages back (the region stays exported): an access a peer checked just before the
//! revocation may land after it, which an honest peer's in-order queue never does with a
//! key it invalidated or was told is gone (see the README's safety model).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mempool::memory::Region;

use crate::Shm;
use crate::core::DevCore;
use crate::layout::{
    KEY_TAG_MASK, KeySnap, KeyTable, MAX_KEY_SLOTS, key_parts, key_table_len, make_key,
};
use crate::link::Link;
use crate::msg::{MAX_REGIONS, Msg, RegionDesc};
use crate::share::{self, Share};
use crate::util::lock;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::traits::{MemoryRegion, MemoryWindow, ProtectionDomain};
use dp_fabric::types::{Access, SendOp};

/// Most registrations one protection domain exports at a time (all of them travel with
/// a new connection's endpoint description).
pub(crate) const MAX_EXPORTS: usize = MAX_REGIONS;

/// An exported registration.
struct Export {
    share: Arc<Share>,
    desc: RegionDesc,
}

/// What the owner knows of a key-table slot that holds a memory window.
#[derive(Clone, Copy, Debug)]
struct WinSlot {
    /// The window's key with consumer key 0 (its upper 24 bits); 0: the slot is no window.
    base: u32,
    /// The key it is bound under, 0 while unbound.
    bound: u32,
    /// Key-table slot of the region it is bound to (`u32::MAX` while unbound).
    mr_idx: u32,
}

impl WinSlot {
    const NONE: Self = Self {
        base: 0,
        bound: 0,
        mr_idx: u32::MAX,
    };
}

/// Remote rights a window may grant.
const WINDOW_RIGHTS: u32 = Access::REMOTE_READ.bits() | Access::REMOTE_WRITE.bits();

/// A memory-window bind, as the poster asked for it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bind {
    pub rkey: u32,
    pub lkey: u32,
    pub access: Access,
    pub addr: u64,
    pub len: u64,
}

impl Bind {
    /// The bind a `SendOp::BindMw` asks for; `None` for every other operation.
    pub(crate) const fn of(op: SendOp) -> Option<Self> {
        match op {
            SendOp::BindMw {
                rkey,
                lkey,
                access,
                addr,
                len,
            } => Some(Self {
                rkey,
                lkey,
                access,
                addr,
                len,
            }),
            _ => None,
        }
    }
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
    /// Memory windows by key-table slot; window entries of the key table are written under
    /// it. Taken on the data path (binds, invalidations); never held together with
    /// `state`'s lock.
    wins: SpinLock<Box<[WinSlot]>>,
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

    /// The entry a bind would write, if the bind is valid now: the window names a window of
    /// this domain (the key's upper 24 bits are its), the region a live registration of
    /// this domain with `MW_BIND` (not a window), the range lies inside it, and the rights
    /// are remote ones the region allows. Returns (window slot, region slot, entry).
    fn check_bind(&self, wins: &[WinSlot], b: &Bind) -> Option<(usize, u32, KeySnap)> {
        let (widx, _) = key_parts(b.rkey);
        let w = wins.get(widx)?;
        if w.base == 0 || b.rkey & !0xFF != w.base {
            return None;
        }
        let rights = b.access.bits();
        if rights & !WINDOW_RIGHTS != 0 {
            return None;
        }
        let (midx, _) = key_parts(b.lkey);
        if wins.get(midx).is_none_or(|m| m.base != 0) {
            return None;
        }
        let mr = self.kt().lookup(b.lkey)?;
        if mr.access & Access::MW_BIND.bits() == 0
            || mr.region_slot == u32::MAX
            || (rights & Access::REMOTE_WRITE.bits() != 0
                && mr.access & Access::LOCAL_WRITE.bits() == 0)
            || !mr.covers(b.addr, b.len)
        {
            return None;
        }
        let region_off = mr.region_off.checked_add(b.addr - mr.base)?;
        Some((
            widx,
            midx as u32,
            KeySnap {
                key: b.rkey,
                access: rights,
                region_slot: mr.region_slot,
                base: b.addr,
                len: b.len,
                region_off,
            },
        ))
    }

    /// True if `b` would bind now (the post-time check).
    pub(crate) fn bind_is_valid(&self, b: &Bind) -> bool {
        let wins = self.wins.lock();
        self.check_bind(&wins, b).is_some()
    }

    /// Binds a window (`IBV_WR_BIND_MW`): from now on `b.rkey` grants `b.access` on the
    /// range, and the window's previous key nothing. False if the bind is not valid (any
    /// more): the window's entry is then left as it was.
    pub(crate) fn bind(&self, b: &Bind) -> bool {
        let mut wins = self.wins.lock();
        let Some((widx, midx, snap)) = self.check_bind(&wins, b) else {
            return false;
        };
        self.kt().publish(widx, &snap);
        wins[widx].bound = b.rkey;
        wins[widx].mr_idx = midx;
        true
    }

    /// Invalidates `key` (`IBV_WR_LOCAL_INV`, or a peer's SEND with invalidate): true if it
    /// is the current key of a bound window of this domain, which is then revoked (every
    /// later lookup of it fails); false, touching nothing, for any other key.
    pub(crate) fn invalidate(&self, key: u32) -> bool {
        let mut wins = self.wins.lock();
        let (idx, _) = key_parts(key);
        let Some(w) = wins.get_mut(idx) else {
            return false;
        };
        if w.base == 0 || w.bound == 0 || w.bound != key {
            return false;
        }
        self.kt().revoke(idx);
        w.bound = 0;
        w.mr_idx = u32::MAX;
        true
    }

    /// Allocates an unbound window's slot; returns (slot, key with consumer key 0).
    fn alloc_mw(&self) -> Result<(u32, u32)> {
        let mut st = lock(&self.state);
        let idx = st.free.pop().ok_or(FabricError::Exhausted {
            what: "key slots (memory regions and windows) in this protection domain",
            limit: self.kt.slots() as u64,
            hint: "make the protection domain with ShmDevice::alloc_pd_with_slots",
        })?;
        // A new generation, consumer key 0: no earlier key of the slot matches any of the
        // window's keys.
        let g = &mut st.gens[idx as usize];
        let mut generation = ((*g >> 8) + 1) & (KEY_TAG_MASK >> 8);
        if generation == 0 {
            generation = 1;
        }
        *g = generation << 8;
        let key = make_key(idx as usize, *g);
        drop(st);
        // The entry is revoked (key 0) since the slot was freed: the key names nothing
        // until a bind.
        self.wins.lock()[idx as usize] = WinSlot {
            base: key,
            bound: 0,
            mr_idx: u32::MAX,
        };
        Ok((idx, key))
    }

    /// Frees a window's slot, revoking its key.
    fn dealloc_mw(&self, idx: u32) {
        {
            let mut wins = self.wins.lock();
            if let Some(w) = wins.get_mut(idx as usize) {
                self.kt().revoke(idx as usize);
                *w = WinSlot::NONE;
            }
        }
        let mut st = lock(&self.state);
        // The next tag of the slot starts a new generation: no key of the window's comes
        // back for the slot's next registration.
        if let Some(g) = st.gens.get_mut(idx as usize) {
            *g |= 0xFF;
        }
        st.free.push(idx);
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
    /// With `windows` (the region had `MW_BIND`), the windows bound to it are revoked too,
    /// before its export slot can be reused.
    fn deregister(&self, idx: u32, export: Option<u32>, windows: bool) {
        self.kt().revoke(idx as usize);
        if windows {
            // A bind that found the region's key valid finished under this lock before we
            // get it, and is revoked here; a later one finds the key revoked.
            let mut wins = self.wins.lock();
            for (i, w) in wins.iter_mut().enumerate() {
                if w.base != 0 && w.mr_idx == idx {
                    self.kt().revoke(i);
                    w.bound = 0;
                    w.mr_idx = u32::MAX;
                }
            }
        }
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
        // Key tags start at a value of this domain's (its device context and id), so keys
        // of different domains differ, which makes a key sent to the wrong domain fail
        // rather than name an object there by coincidence.
        let seed = ((u64::from(dev.ctx_id) << 32 | id).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44)
            as u32
            & KEY_TAG_MASK
            & !0xFF;
        Ok(Self {
            inner: Arc::new(PdInner {
                _dev: dev.clone(),
                id,
                kt_seg,
                kt,
                state: Mutex::new(PdState {
                    gens: vec![seed; slots],
                    free,
                    exports: Vec::new(),
                    links: Vec::new(),
                    mr_seq: 0,
                }),
                wins: SpinLock::new(vec![WinSlot::NONE; slots].into_boxed_slice()),
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

/// Whether peers must be able to write the pages of a registration with `access`: with a
/// remote write right, or with local write and `MW_BIND` (a window may grant remote write).
fn peer_writes(access: Access) -> bool {
    access.contains(Access::REMOTE_WRITE) || access.contains(Access::MW_BIND | Access::LOCAL_WRITE)
}

/// Whether a registration's pages are exported to the domain's peers: with a remote right,
/// or with `MW_BIND` (windows bound to it are reached through its export).
fn exported(access: Access) -> bool {
    access.is_remote() || access.contains(Access::MW_BIND)
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
        let share = if exported(access) {
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
        let share = if exported(access) {
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
        let (idx, key) = self.inner.alloc_mw()?;
        Ok(ShmMw {
            pd: self.inner.clone(),
            idx,
            key,
        })
    }
}

/// A type-2 memory window of the shm provider: a key-table slot of its protection domain.
/// Dropping it revokes its key and frees the slot.
pub struct ShmMw {
    pd: Arc<PdInner>,
    idx: u32,
    key: u32,
}

impl core::fmt::Debug for ShmMw {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ShmMw")
            .field("key", &format_args!("{:#x}", self.key))
            .finish()
    }
}

impl Drop for ShmMw {
    fn drop(&mut self) {
        self.pd.dealloc_mw(self.idx);
    }
}

impl MemoryWindow for ShmMw {
    fn rkey(&self) -> u32 {
        self.key
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
        self.pd
            .deregister(self.idx, self.export, self.access.contains(Access::MW_BIND));
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
