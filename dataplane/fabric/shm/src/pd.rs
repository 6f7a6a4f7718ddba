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
//! [`in_place`] for what this costs the program: the pages become shared memory for good.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use mempool::memory::{Region, registry};

use crate::Shm;
use crate::cm::Conn;
use crate::device::{DevInner, lock};
use crate::layout::{KEY_SLOTS, KeySnap, KeyTable, make_key};
use crate::msg::{MAX_REGIONS, Msg, RegionDesc};
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
                    // `in_place::share` needs.
                    let (s, offset) = in_place::share(addr as usize, len)
                        .map_err(|why| in_place_failed(a, len, access, why))?;
                    let fd = s.fd.try_clone().map_err(|e| FabricError::Io {
                        op: "duplicating an in-place shared memory descriptor",
                        source: e,
                    })?;
                    let export = ExportReq {
                        fd,
                        len: s.len as u64,
                        page_size: in_place::page_size() as u64,
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
    _share: Option<Arc<in_place::Share>>,
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

/// Plain process memory made shareable in place, for registrations with remote rights.
///
/// # What it does
///
/// [`share`] page-aligns the range, creates a memfd of that size, copies the range's
/// current bytes into it (`pwrite` from the range: the kernel reads them), and maps the
/// memfd `MAP_SHARED | MAP_FIXED` over the range. The program keeps its pointers and its
/// bytes; peers map the same memfd, so their RDMA WRITEs land in the program's memory.
///
/// Shared ranges are remembered process-wide (a mapping belongs to the process, not to a
/// protection domain). A later registration inside one reuses its memfd. One that overlaps
/// ranges but extends past them converts the union (the overlapped ranges and the new pages)
/// into a new memfd, provided no registration still holds an overlapped range (its export
/// would silently stop backing the memory). Before every lookup the table is checked against
/// `/proc/self/maps`: ranges the program unmapped, moved (`mremap`, `realloc`) or mapped
/// over since are forgotten, never reused.
///
/// # Consequences for the program
///
/// These are the price of RDMA-style registration of ordinary memory; librdmacm's users meet
/// their own versions of them (`ibv_fork_init`, `RDMAV_FORK_SAFE`):
///
/// * The pages stay shared memory after deregistration, until the program unmaps them.
/// * `fork` after the conversion is unsupported: the child shares the pages with its parent
///   instead of getting copy-on-write copies.
/// * `madvise(MADV_DONTNEED)` and `MADV_FREE` no longer zero the pages: the bytes live in
///   the memfd.
/// * The conversion is not atomic against *other threads* storing into the same pages: a
///   store made between the copy and the remap is lost. Nor against other threads
///   unmapping and remapping the pages in that window (which the registration contract
///   already forbids for the registered range itself). Register buffers whose pages no
///   other thread writes meanwhile; page-aligned allocations are safest (glibc serves large
///   `malloc`s from mappings of their own).
/// * Only private, anonymous, readable and writable, non-executable memory (the heap,
///   anonymous mappings) is converted. File mappings, shared anonymous memory, stacks and
///   executable or read-only pages are refused: converting them would detach them from what
///   backs them.
/// * Growing a converted mapping with `mremap` (glibc's `realloc` of a block it `mmap`ed,
///   128 KiB and up by default) maps pages past the end of the memfd, and touching them
///   raises `SIGBUS`: allocate a new buffer instead of growing a registered one. (The memfd
///   cannot carry sparse room to grow into: peers check its size against the export.)
/// * Memfds replaced by a union stay exported (peers mapped them) until the protection
///   domain is dropped, so growing one buffer step by step costs at most the sum of its
///   sizes.
pub(crate) mod in_place {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use super::lock;

    /// Export ids of in-place shares carry this bit, which mempool region ids (a counter
    /// from 1) never reach, so the two never collide in a protection domain's export map.
    const ID_BIT: u64 = 1 << 63;
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    static SHARES: Mutex<Vec<Arc<Share>>> = Mutex::new(Vec::new());

    /// One range of process memory shared in place.
    #[derive(Debug)]
    pub(crate) struct Share {
        /// First byte (page aligned).
        pub base: usize,
        /// Bytes (a page multiple).
        pub len: usize,
        /// The memfd now backing the range.
        pub fd: OwnedFd,
        /// Export id (never a mempool region id).
        pub id: u64,
        /// The memfd's inode: how its mappings are recognised in `/proc/self/maps`.
        ino: u64,
    }

    /// The system page size.
    pub(crate) fn page_size() -> usize {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(p)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    }

    /// One line of `/proc/self/maps`.
    #[derive(Debug)]
    struct Vma {
        start: usize,
        end: usize,
        perms: [u8; 4],
        offset: u64,
        ino: u64,
        path: String,
    }

    fn parse_line(line: &str) -> Option<Vma> {
        // The first five fields are separated by single spaces; the path follows padding.
        let mut f = line.splitn(6, ' ');
        let (range, perms, offset, _dev, ino) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.next().unwrap_or("").trim_start().to_owned();
        let (s, e) = range.split_once('-')?;
        Some(Vma {
            start: usize::from_str_radix(s, 16).ok()?,
            end: usize::from_str_radix(e, 16).ok()?,
            perms: perms.as_bytes().try_into().ok()?,
            offset: u64::from_str_radix(offset, 16).ok()?,
            ino: ino.parse().ok()?,
            path,
        })
    }

    fn read_maps() -> Result<Vec<Vma>, String> {
        let text = std::fs::read_to_string("/proc/self/maps")
            .map_err(|e| format!("reading /proc/self/maps: {e}"))?;
        Ok(text.lines().filter_map(parse_line).collect())
    }

    /// The mappings covering `[start, end)` in address order, if they leave no gap.
    fn covering(vmas: &[Vma], start: usize, end: usize) -> Option<Vec<&Vma>> {
        let mut at = start;
        let mut out = Vec::new();
        for v in vmas {
            if v.end <= at {
                continue;
            }
            if v.start > at {
                return None;
            }
            out.push(v);
            at = v.end;
            if at >= end {
                return Some(out);
            }
        }
        None
    }

    /// True while `s`'s memfd still backs all of its range, at the offsets it was mapped at.
    fn still_mapped(s: &Share, vmas: &[Vma]) -> bool {
        covering(vmas, s.base, s.base + s.len).is_some_and(|vs| {
            vs.iter().all(|v| {
                v.ino == s.ino
                    && v.perms[3] == b's'
                    && v.start >= s.base
                    && v.offset == (v.start - s.base) as u64
            })
        })
    }

    /// True for memory that may be converted: private, anonymous, read-write, not
    /// executable.
    fn convertible(v: &Vma) -> bool {
        let anonymous =
            v.ino == 0 && (v.path.is_empty() || v.path == "[heap]" || v.path.starts_with("[anon:"));
        anonymous && &v.perms == b"rw-p"
    }

    fn os_err(what: &str) -> String {
        format!("{what}: {}", std::io::Error::last_os_error())
    }

    /// Makes `[addr, addr + len)` (an empty range counts as one byte) shareable, or finds it
    /// shared already. Returns the share and the offset of `addr` in its memfd.
    ///
    /// # Errors
    /// A description of why the range cannot be shared: not all mapped, not private
    /// anonymous read-write memory, overlapping a share that is still registered, or a
    /// failed system call.
    pub(crate) fn share(addr: usize, len: usize) -> Result<(Arc<Share>, usize), String> {
        let page = page_size();
        let start = addr & !(page - 1);
        let end = addr
            .checked_add(len.max(1))
            .and_then(|e| e.checked_next_multiple_of(page))
            .ok_or("the range runs past the end of the address space")?;
        let mut table = lock(&SHARES);
        let vmas = read_maps()?;
        table.retain(|s| still_mapped(s, &vmas));
        if let Some(s) = table
            .iter()
            .find(|s| s.base <= start && end <= s.base + s.len)
        {
            return Ok((s.clone(), addr - s.base));
        }
        let overlapped: Vec<Arc<Share>> = table
            .iter()
            .filter(|s| s.base < end && start < s.base + s.len)
            .cloned()
            .collect();
        // The table holds one reference and `overlapped` another; more are registrations.
        if let Some(s) = overlapped.iter().find(|s| Arc::strong_count(s) > 2) {
            return Err(format!(
                "it overlaps pages {:#x}..{:#x}, shared in place and still registered; \
                 deregister them first, or register a range inside them",
                s.base,
                s.base + s.len
            ));
        }
        let ustart = overlapped.iter().map(|s| s.base).fold(start, usize::min);
        let uend = overlapped
            .iter()
            .map(|s| s.base + s.len)
            .fold(end, usize::max);
        let vs = covering(&vmas, ustart, uend)
            .ok_or_else(|| format!("{ustart:#x}..{uend:#x} is not all mapped"))?;
        for v in vs {
            let ours = overlapped.iter().any(|s| s.ino == v.ino);
            if !ours && !convertible(v) {
                return Err(format!(
                    "{:#x}..{:#x} is a {} mapping of '{}', not private anonymous read-write \
                     memory",
                    v.start,
                    v.end,
                    String::from_utf8_lossy(&v.perms),
                    v.path
                ));
            }
        }
        let ulen = uend - ustart;
        // Relaxed: the counter only has to hand out distinct values; nothing is published
        // through it.
        let id = ID_BIT | NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let fd = memfd(id, ulen)?;
        let mut done = 0usize;
        while done < ulen {
            // SAFETY: the kernel reads [ustart + done, uend), which /proc/self/maps showed
            // mapped and readable; if another thread unmapped it since, pwrite fails with
            // EFAULT (the kernel checks user pointers), nothing is read out of bounds.
            let n = unsafe {
                libc::pwrite(
                    fd.as_raw_fd(),
                    (ustart + done) as *const libc::c_void,
                    ulen - done,
                    done as libc::off_t,
                )
            };
            if n <= 0 {
                return Err(os_err("copying the pages into the memfd"));
            }
            done += n as usize;
        }
        // SAFETY: replaces [ustart, uend), which holds only private anonymous memory or our
        // own earlier shares of it (checked above), with the memfd holding the same bytes: the
        // program keeps its addresses and contents. The range is page aligned and mapped.
        let p = unsafe {
            libc::mmap(
                ustart as *mut libc::c_void,
                ulen,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED || p as usize != ustart {
            return Err(os_err("mapping the memfd over the pages"));
        }
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes one stat into the buffer we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
            return Err(os_err("fstat of the memfd"));
        }
        // SAFETY: fstat succeeded, so it initialised the buffer.
        let ino = unsafe { st.assume_init() }.st_ino;
        table.retain(|s| !overlapped.iter().any(|o| Arc::ptr_eq(o, s)));
        let s = Arc::new(Share {
            base: ustart,
            len: ulen,
            fd,
            id,
            ino,
        });
        table.push(s.clone());
        Ok((s, addr - ustart))
    }

    fn memfd(id: u64, len: usize) -> Result<OwnedFd, String> {
        let name = format!("dp-inplace-{}\0", id & !ID_BIT);
        // SAFETY: name is NUL-terminated and outlives the call.
        let raw = unsafe { libc::memfd_create(name.as_ptr().cast(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_err("memfd_create"));
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(len).map_err(|_| "range too large".to_owned())?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(os_err("sizing the memfd"));
        }
        Ok(fd)
    }

    #[cfg(test)]
    pub(super) mod tests {
        use super::*;

        /// A private anonymous mapping of `pages` pages that no other test thread touches
        /// (heap pages could be written by other tests during a conversion).
        pub(crate) struct Anon {
            pub ptr: *mut u8,
            pub len: usize,
        }

        impl Anon {
            pub(crate) fn new(pages: usize) -> Self {
                let len = pages * page_size();
                // SAFETY: a fresh anonymous mapping; no address hint.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                assert_ne!(p, libc::MAP_FAILED, "mmap");
                Self { ptr: p.cast(), len }
            }

            pub(crate) fn get(&self, i: usize) -> u8 {
                assert!(i < self.len);
                // SAFETY: in bounds of our live mapping; volatile because peers and the
                // memfd write it behind the compiler's back.
                unsafe { self.ptr.add(i).read_volatile() }
            }

            pub(crate) fn set(&self, i: usize, v: u8) {
                assert!(i < self.len);
                // SAFETY: as in get.
                unsafe { self.ptr.add(i).write_volatile(v) }
            }
        }

        impl Drop for Anon {
            fn drop(&mut self) {
                // SAFETY: unmapping the mapping we made; nothing refers to it any more.
                unsafe { libc::munmap(self.ptr.cast(), self.len) };
            }
        }

        fn backing_ino(addr: usize) -> Option<(u64, String)> {
            let vmas = read_maps().unwrap();
            let v = vmas.iter().find(|v| v.start <= addr && addr < v.end)?;
            Some((v.ino, v.path.clone()))
        }

        fn pread(fd: &OwnedFd, off: usize) -> u8 {
            let mut b = 0u8;
            // SAFETY: reading one byte into a live local.
            let n =
                unsafe { libc::pread(fd.as_raw_fd(), (&raw mut b).cast(), 1, off as libc::off_t) };
            assert_eq!(n, 1);
            b
        }

        #[test]
        fn keeps_address_and_bytes_and_reuses_ranges() {
            let page = page_size();
            let m = Anon::new(4);
            let base = m.ptr as usize;
            for i in 0..m.len {
                m.set(i, (i % 251) as u8);
            }
            let (s, off) = share(base + 100, 5000).unwrap();
            assert_eq!(
                (s.base, s.len, off),
                (base, 5000usize.div_ceil(page) * page, 100)
            );
            for i in 0..m.len {
                assert_eq!(m.get(i), (i % 251) as u8, "byte {i} changed");
            }
            let (ino, path) = backing_ino(base).unwrap();
            assert!(path.starts_with("/memfd:dp-inplace-"), "backed by {path}");
            assert_ne!(ino, 0);
            // The memory and the memfd are one: stores show through both ways.
            m.set(7, 0xAB);
            assert_eq!(pread(&s.fd, 7), 0xAB);
            let v = 0x5Au8;
            // SAFETY: writing one byte from a live local.
            let n = unsafe { libc::pwrite(s.fd.as_raw_fd(), (&raw const v).cast(), 1, 9) };
            assert_eq!(n, 1);
            assert_eq!(m.get(9), 0x5A);
            // A range inside is the same share.
            let (s2, off2) = share(base + 200, 10).unwrap();
            assert!(Arc::ptr_eq(&s, &s2));
            assert_eq!(off2, 200);
            drop(s2);

            // Growing past it while it is held (a live registration) is refused ...
            let held = s.clone();
            let e = share(base, 3 * page).unwrap_err();
            assert!(e.contains("still registered"), "{e}");
            drop(held);
            drop(s);
            // ... and converts the union once nothing holds it, keeping every byte.
            let (u, off) = share(base + page, 2 * page).unwrap();
            assert_eq!((u.base, u.len, off), (base, 3 * page, page));
            for i in 0..m.len {
                let want = match i {
                    7 => 0xAB,
                    9 => 0x5A,
                    _ => (i % 251) as u8,
                };
                assert_eq!(m.get(i), want, "byte {i} after the union");
            }
            assert_eq!(pread(&u.fd, 9), 0x5A);
        }

        #[test]
        fn forgets_ranges_that_were_mapped_over() {
            let m = Anon::new(2);
            let (s, _) = share(m.ptr as usize, 10).unwrap();
            let first = s.id;
            drop(s);
            // The program maps fresh anonymous memory over the range (as free + malloc may).
            // SAFETY: replaces our own test mapping, which nothing else refers to.
            let p = unsafe {
                libc::mmap(
                    m.ptr.cast(),
                    m.len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_eq!(p.cast(), m.ptr);
            m.set(3, 42);
            let (s, _) = share(m.ptr as usize, 10).unwrap();
            assert_ne!(s.id, first, "a stale share was reused");
            assert_eq!(m.get(3), 42);
        }

        #[test]
        fn refuses_what_it_must_not_convert() {
            // A read-only mapping.
            let m = Anon::new(1);
            // SAFETY: changing the protection of our own mapping, which nothing writes.
            let rc = unsafe { libc::mprotect(m.ptr.cast(), m.len, libc::PROT_READ) };
            assert_eq!(rc, 0, "mprotect");
            let e = share(m.ptr as usize, 16).unwrap_err();
            assert!(e.contains("not private anonymous"), "{e}");
            // Shared anonymous memory.
            // SAFETY: a fresh shared anonymous mapping.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page_size(),
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let e = share(p as usize, 16).unwrap_err();
            assert!(e.contains("not private anonymous"), "{e}");
            // SAFETY: unmapping the mapping made above.
            unsafe { libc::munmap(p, page_size()) };
        }

        #[test]
        fn parses_maps_and_finds_gaps() {
            let v = parse_line(
                "7f95f35bb000-7f95f35bd000 rw-s 00001000 00:01 93386                      \
                 /memfd:dp-inplace-7 (deleted)",
            )
            .unwrap();
            assert_eq!(
                (v.start, v.end, v.offset, v.ino),
                (0x7f95f35bb000, 0x7f95f35bd000, 0x1000, 93386)
            );
            assert_eq!(
                (&v.perms, v.path.as_str()),
                (b"rw-s", "/memfd:dp-inplace-7 (deleted)")
            );
            let anon = parse_line("1000-3000 rw-p 00000000 00:00 0 ").unwrap();
            assert!(convertible(&anon) && anon.path.is_empty());
            let vmas = [
                anon,
                parse_line("3000-4000 rw-p 00000000 00:00 0      [heap]").unwrap(),
                parse_line("5000-6000 rw-p 00000000 00:00 0").unwrap(),
            ];
            assert_eq!(covering(&vmas, 0x1000, 0x4000).map(|v| v.len()), Some(2));
            assert!(covering(&vmas, 0x2000, 0x5800).is_none(), "gap at 0x4000");
            assert!(
                covering(&vmas, 0x5000, 0x7000).is_none(),
                "runs past the end"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::in_place::tests::Anon;
    use crate::Shm;
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
