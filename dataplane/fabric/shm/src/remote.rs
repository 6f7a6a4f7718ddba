//! A peer's protection domain as one connection sees it: the peer's key table, mapped
//! read-only, and the registrations the peer exported to this connection, each mapped from
//! the memfd it sent (writable only if it granted a remote write right).
//!
//! Everything here was written by the peer and is checked before use: the key table's
//! entries (a key, its rights, its range and its export slot) are only numbers, and a
//! remote access is allowed only if they name an export mapped here, the access lies
//! inside that mapping, and a write goes to a writable mapping. Every remote access re-reads
//! the owner's key entry, so revocation takes effect immediately.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use mempool::memory::Region;

use crate::layout::{KeySnap, KeyTable};
use crate::msg::{MAX_REGIONS, RegionDesc};
use crate::seg::{map_segment, map_segment_read_only};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::types::Access;

/// A peer's key table, mapped read-only.
pub(crate) struct RemoteKt {
    /// The view's mapping, kept alive with it.
    _kt_seg: Arc<Region>,
    kt: KeyTable,
}

impl RemoteKt {
    /// Maps and validates a peer's key table.
    pub(crate) fn map(kt_fd: OwnedFd, kt_len: u64) -> Result<Self> {
        let kt_seg = map_segment_read_only(kt_fd, kt_len, 4096, "peer-keytable")?;
        // SAFETY: kt_seg is a live, page-aligned mapping of kt_seg.len() bytes, kept alive
        // beside the view; the table is only read (through atomics).
        let kt = unsafe { KeyTable::attach(kt_seg.as_ptr(), kt_seg.len()) }
            .map_err(FabricError::Protocol)?;
        Ok(Self {
            _kt_seg: kt_seg,
            kt,
        })
    }

    #[inline]
    fn kt(&self) -> &KeyTable {
        &self.kt
    }

    /// The peer's current entry for `rkey`, if any.
    #[inline]
    pub(crate) fn lookup(&self, rkey: u32) -> Option<KeySnap> {
        self.kt().lookup(rkey)
    }
}

/// One registration a peer exported to this connection, mapped here.
pub(crate) struct PeerExport {
    map: Arc<Region>,
    writable: bool,
}

impl PeerExport {
    /// Maps an export from its description and memfd.
    pub(crate) fn map(desc: &RegionDesc, fd: OwnedFd) -> Result<Self> {
        let page = u64::from(desc.page_size);
        let map = if desc.writable {
            map_segment(fd, desc.len, page, "peer-region")?
        } else {
            map_segment_read_only(fd, desc.len, page, "peer-region")?
        };
        Ok(Self {
            map,
            writable: desc.writable,
        })
    }
}

/// The exports of one connection's peer, by slot.
pub(crate) struct PeerExports {
    slots: Vec<Option<PeerExport>>,
}

impl PeerExports {
    pub(crate) const fn new() -> Self {
        Self { slots: Vec::new() }
    }

    /// Installs export `slot` (replacing one the peer withdrew without telling us).
    pub(crate) fn add(&mut self, slot: u32, e: PeerExport) -> Result<()> {
        let i = slot as usize;
        if i >= MAX_REGIONS {
            return Err(FabricError::Protocol("peer export slot out of range"));
        }
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(e);
        Ok(())
    }

    /// Takes export `slot` out (the caller unmaps it by dropping it).
    pub(crate) fn remove(&mut self, slot: u32) -> Option<PeerExport> {
        self.slots.get_mut(slot as usize).and_then(Option::take)
    }

    /// Translates a peer address range into a pointer in our mapping of its export, if
    /// the key is valid, covers the range, grants `need`, and names an export mapped here
    /// that holds the range (writable, for `need` with a write right).
    #[inline]
    pub(crate) fn translate(
        &self,
        kt: &RemoteKt,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<*mut u8> {
        let s = kt.lookup(rkey)?;
        if s.access & need.bits() != need.bits() || !s.covers(addr, len) {
            return None;
        }
        let e = self.slots.get(s.region_slot as usize)?.as_ref()?;
        if need.contains(Access::REMOTE_WRITE) && !e.writable {
            return None;
        }
        let off = s.region_off.checked_add(addr.checked_sub(s.base)?)?;
        if off.checked_add(len)? > e.map.len() as u64 {
            return None;
        }
        // SAFETY: off + len <= map.len(), so the pointer stays inside the mapping.
        Some(unsafe { e.map.as_ptr().add(off as usize) })
    }
}
