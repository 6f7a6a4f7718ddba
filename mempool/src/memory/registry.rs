//! Process-global registry of live shareable regions, keyed by address.
//!
//! A transport that must describe a buffer to a peer process (the shm
//! provider passing a memfd plus offset, much like an RDMA provider finds
//! the MR covering an address) calls [`find`] with the buffer's address and
//! length. Every shareable [`Region`](super::Region), created here or mapped
//! from a peer, is listed from construction until drop; anonymous regions
//! never are, because a peer cannot map them.
//!
//! `find` takes a lock and a `dup()`, so it belongs on the connection-setup
//! path, not per packet: cache the [`SharedRef`] per region.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, PoisonError};

/// One live shareable region.
#[derive(Debug)]
struct Entry {
    len: usize,
    page_size: usize,
    /// The region's memfd. Invariant: open for as long as the entry exists,
    /// because `Region::drop` removes the entry (under the lock) before the
    /// region closes the fd.
    fd: RawFd,
    id: u64,
}

/// Live shareable regions by base address. Mappings never overlap, so the
/// only candidate for an address is the entry with the greatest base `<=` it.
static LIVE: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, Entry>> {
    // Nothing panics while holding the lock, but a poisoned map is still
    // consistent (every update is a single insert or remove).
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where an address range lives: a private duplicate of the region's memfd
/// plus the geometry a peer needs to map it and find the bytes.
#[derive(Debug)]
pub struct SharedRef {
    /// A `dup()` of the region's memfd (close-on-exec), owned by the caller.
    pub fd: OwnedFd,
    /// Base address of the region in this process.
    pub region_base: usize,
    /// Region length in bytes.
    pub region_len: usize,
    /// Page size of the region.
    pub page_size: usize,
    /// `addr - region_base`: where the range starts inside the memfd.
    pub offset: usize,
    /// Process-unique id of the region ([`Region::id`](super::Region::id)).
    pub region_id: u64,
}

/// `true` if `[addr, addr + len)` lies in `[base, base + region_len)`; an
/// empty range counts when `addr` itself is inside. Never overflows.
pub(crate) fn range_within(base: usize, region_len: usize, addr: usize, len: usize) -> bool {
    match addr.checked_sub(base) {
        Some(off) => off < region_len && len <= region_len - off,
        None => false,
    }
}

/// Lists a shareable region. Called by `Region` at construction.
pub(crate) fn insert(base: usize, len: usize, page_size: usize, fd: BorrowedFd<'_>, id: u64) {
    let prev = live().insert(
        base,
        Entry {
            len,
            page_size,
            fd: fd.as_raw_fd(),
            id,
        },
    );
    debug_assert!(prev.is_none(), "two live regions at one base address");
}

/// Unlists a region. Called by `Region::drop` before its fd is closed.
pub(crate) fn remove(base: usize, id: u64) {
    let mut map = live();
    if map.get(&base).is_some_and(|e| e.id == id) {
        map.remove(&base);
    }
}

/// The shareable region containing `[addr, addr + len)`, with a fresh dup
/// of its memfd; `None` if no live shareable region contains the whole range
/// (or the dup failed: use [`try_find`] to see that error).
///
/// ```
/// use mempool::memory::{Region, RegionConfig, registry};
///
/// let r = Region::new(&RegionConfig::new("shm-pool", 1 << 20).shareable(true).no_huge())?;
/// let buf = r.as_ptr() as usize + 4096;
/// let at = registry::find(buf, 2048).expect("inside a shareable region");
/// assert_eq!((at.offset, at.region_id), (4096, r.id()));
/// assert!(registry::find(buf, r.len()).is_none()); // runs past the end
/// # Ok::<(), mempool::memory::MemError>(())
/// ```
pub fn find(addr: usize, len: usize) -> Option<SharedRef> {
    try_find(addr, len).ok().flatten()
}

/// Like [`find`], but reports a failed `dup()` (e.g. `EMFILE`) as an error.
///
/// # Errors
///
/// The `dup()` error; the range was inside a live region.
pub fn try_find(addr: usize, len: usize) -> io::Result<Option<SharedRef>> {
    let map = live();
    let Some((&base, e)) = map.range(..=addr).next_back() else {
        return Ok(None);
    };
    if !range_within(base, e.len, addr, len) {
        return Ok(None);
    }
    // SAFETY: the entry exists, so its region has not started dropping and
    // the fd is open (Entry::fd invariant); we hold the lock, so it cannot be
    // removed and closed while the borrow lives.
    let fd = unsafe { BorrowedFd::borrow_raw(e.fd) }.try_clone_to_owned()?;
    Ok(Some(SharedRef {
        fd,
        region_base: base,
        region_len: e.len,
        page_size: e.page_size,
        offset: addr - base,
        region_id: e.id,
    }))
}

/// Number of live shareable regions in this process.
pub fn live_regions() -> usize {
    live().len()
}

#[cfg(test)]
mod tests {
    use super::range_within;

    #[test]
    fn containment_edges() {
        assert!(range_within(0x1000, 0x1000, 0x1000, 0x1000));
        assert!(range_within(0x1000, 0x1000, 0x1fff, 1));
        assert!(range_within(0x1000, 0x1000, 0x1fff, 0));
        assert!(!range_within(0x1000, 0x1000, 0x2000, 0));
        assert!(!range_within(0x1000, 0x1000, 0x1fff, 2));
        assert!(!range_within(0x1000, 0x1000, 0xfff, 1));
        assert!(!range_within(0x1000, 0x1000, 0x1800, usize::MAX));
    }
}
