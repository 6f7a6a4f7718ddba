//! A peer's protection domain as this process sees it: its key table and the regions it
//! exported, mapped here, shared by every connection to it. Every remote access re-reads
//! the owner's key entry, so revocation takes effect immediately.

use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};

use mempool::memory::Region;

use crate::layout::{KeyTable, SegKind};
use crate::msg::{MAX_REGIONS, RegionDesc};
use crate::seg::map_segment;
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::Access;

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
    /// Maps a peer protection domain's key table (validated), with no region mapped yet.
    pub(crate) fn map(kt_fd: OwnedFd, kt_len: u64) -> Result<Arc<Self>> {
        let kt_seg = map_segment(kt_fd, kt_len, 4096, "peer-keytable")?;
        if kt_seg.len() < size_of::<KeyTable>() {
            return Err(FabricError::Protocol("peer key table too small"));
        }
        // SAFETY: mapped, page aligned, at least one KeyTable long (checked above).
        let kt = unsafe { &*kt_seg.as_ptr().cast::<KeyTable>() };
        kt.hdr
            .check(SegKind::KeyTable, kt_seg.len())
            .map_err(FabricError::Protocol)?;
        let regions = (0..MAX_REGIONS).map(|_| OnceLock::new()).collect();
        Ok(Arc::new(Self { kt_seg, regions }))
    }

    /// Maps export `desc` unless it is mapped already.
    pub(crate) fn add_region(&self, desc: &RegionDesc, fd: OwnedFd) -> Result<()> {
        let cell = self
            .regions
            .get(desc.slot as usize)
            .ok_or(FabricError::Protocol("peer region slot out of range"))?;
        if cell.get().is_some() {
            return Ok(());
        }
        let r = map_segment(fd, desc.len, u64::from(desc.page_size), "peer-region")?;
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
