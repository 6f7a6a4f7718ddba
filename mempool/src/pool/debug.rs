//! Object cookies of the `debug` feature (DPDK's `RTE_LIBRTE_MEMPOOL_DEBUG`).
//!
//! Every object is framed by a header cookie (the 8 bytes before it) and a trailer cookie (the
//! 8 bytes at the next 8-byte boundary after it); see `ObjLayout` in `config.rs`. The header
//! says whether the object is free ([`COOKIE_FREE`]: in the ring or a cache) or allocated
//! ([`COOKIE_ALLOCATED`]); the trailer always holds [`COOKIE_TRAILER`]. The values are DPDK's.
//!
//! Gets flip free to allocated and puts flip allocated to free with an atomic swap, so of two
//! threads racing to free the same object exactly one sees "allocated" and the other panics:
//! the check itself never races. The cookies are diagnostics, not part of the synchronisation:
//! ownership of an object moves through the ring and the caches, which order everything else.
//! So every cookie access is `Relaxed`.
//!
//! The cookie words are `core` atomics over region memory (`AtomicU64::from_ptr`), not the loom
//! shim's: loom cannot see mmapped memory, and the models do not enable this feature.

use core::sync::atomic::{AtomicU64, Ordering};

use super::{ObjId, Pool};

/// Header cookie of a free object (DPDK's `RTE_MEMPOOL_HEADER_COOKIE1`).
pub const COOKIE_FREE: u64 = 0xbadb_adba_dadd_2e55;
/// Header cookie of an allocated object (DPDK's `RTE_MEMPOOL_HEADER_COOKIE2`).
pub const COOKIE_ALLOCATED: u64 = 0xf2ee_f2ee_dadd_2e55;
/// Trailer cookie of every object (DPDK's `RTE_MEMPOOL_TRAILER_COOKIE`).
pub const COOKIE_TRAILER: u64 = 0xadd2_e55b_adba_dbad;

/// What [`Pool::audit`] found in a consistent pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Objects whose header says free (in the ring or a cache).
    pub free: usize,
    /// Objects whose header says allocated.
    pub allocated: usize,
}

/// A corrupted object found by [`Pool::audit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// The header holds neither cookie: something wrote before the start of the object (or
    /// past the end of the previous one).
    #[error(
        "{id}: header cookie {found:#018x} is neither free nor allocated (write before the object's start)"
    )]
    Header {
        /// The object.
        id: ObjId,
        /// The value found.
        found: u64,
    },
    /// The trailer lost its cookie: something wrote past the end of the object.
    #[error("{id}: trailer cookie {found:#018x} was overwritten (write past the object's end)")]
    Trailer {
        /// The object.
        id: ObjId,
        /// The value found.
        found: u64,
    },
    /// The free objects by cookie disagree with the ring and caches (only meaningful when the
    /// pool is quiescent).
    #[error(
        "{free} objects have free cookies but the ring and caches hold {available}; an object \
         was lost or handed out twice"
    )]
    Count {
        /// Objects with a free header cookie.
        free: usize,
        /// [`Pool::available`] at the time of the audit.
        available: usize,
    },
}

impl Pool {
    /// The header cookie word of object `index`.
    fn header(&self, index: u32) -> &AtomicU64 {
        // SAFETY: the header is the 8 bytes before the object, inside its slot (`first >= 8`),
        // 8-aligned (`first` and `stride` are multiples of 8, the region is page aligned), and
        // only ever accessed atomically after `init_cookies` (which happens before the pool is
        // shared). The region outlives `&self`.
        unsafe { AtomicU64::from_ptr(self.slot_addr(index).sub(8).cast()) }
    }

    /// The trailer cookie word of object `index`.
    fn trailer(&self, index: u32) -> &AtomicU64 {
        // SAFETY: at `trailer` past the object start, an 8-aligned word inside the slot
        // (`first + trailer + 8 <= stride`); atomic-only access as for `header`.
        unsafe { AtomicU64::from_ptr(self.slot_addr(index).add(self.layout().trailer).cast()) }
    }

    /// Writes the free and trailer cookies of every object, before the pool is shared.
    pub(crate) fn init_cookies(&self) {
        for i in 0..self.count() {
            // Relaxed: the pool is not shared yet; the `Arc` publication orders these stores.
            self.header(i).store(COOKIE_FREE, Ordering::Relaxed);
            self.trailer(i).store(COOKIE_TRAILER, Ordering::Relaxed);
        }
    }

    /// Checks that `id` is one of ours before touching its cookies.
    fn check_owner(&self, id: ObjId, op: &str) {
        if id.tag() != self.tag() || id.index() >= self.count() {
            panic!(
                "mempool '{}': {op} of {id}, which does not belong to this pool (pool tag {}, \
                 id tag {}, count {}): objects must return to the pool they came from",
                self.name(),
                self.tag(),
                id.tag(),
                self.count()
            );
        }
    }

    /// Checks the trailer of `id`.
    fn check_trailer(&self, id: ObjId, op: &str) {
        // Relaxed: diagnostic read (module docs).
        let found = self.trailer(id.index()).load(Ordering::Relaxed);
        if found != COOKIE_TRAILER {
            panic!(
                "mempool '{}': {op} of {id} at {:p}: trailer cookie {found:#018x} was \
                 overwritten; something wrote past the end of the object (obj_size {})",
                self.name(),
                self.slot_addr(id.index()),
                self.obj_size()
            );
        }
    }

    /// Marks freshly taken objects allocated; panics if one was not free or is corrupted.
    pub(crate) fn check_get(&self, ids: &[ObjId]) {
        for &id in ids {
            self.check_owner(id, "get");
            // Relaxed: diagnostic swap (module docs).
            let old = self
                .header(id.index())
                .swap(COOKIE_ALLOCATED, Ordering::Relaxed);
            if old != COOKIE_FREE {
                let what = if old == COOKIE_ALLOCATED {
                    "is already allocated: it was in the free ring or a cache while in use \
                     (a double free whose first put was not caught, or a use after free)"
                } else {
                    "has a corrupted header cookie: something wrote before the object's start"
                };
                panic!(
                    "mempool '{}': get of {id} at {:p}, which {what} (header {old:#018x})",
                    self.name(),
                    self.slot_addr(id.index())
                );
            }
            self.check_trailer(id, "get");
        }
    }

    /// Marks returned objects free; panics on a double free, a foreign id or corruption.
    pub(crate) fn check_put(&self, ids: &[ObjId]) {
        for &id in ids {
            self.check_owner(id, "put");
            // Relaxed: diagnostic swap (module docs).
            let old = self.header(id.index()).swap(COOKIE_FREE, Ordering::Relaxed);
            if old != COOKIE_ALLOCATED {
                let what = if old == COOKIE_FREE {
                    "is already free: double free"
                } else {
                    "has a corrupted header cookie: something wrote before the object's start"
                };
                panic!(
                    "mempool '{}': put of {id} at {:p}, which {what} (header {old:#018x})",
                    self.name(),
                    self.slot_addr(id.index())
                );
            }
            self.check_trailer(id, "put");
        }
    }

    /// Walks every object and checks its cookies (`rte_mempool_audit`), then compares the
    /// number of free cookies with the objects in the ring and the caches.
    ///
    /// The cookie check holds at any time; the count check is exact only while no thread gets
    /// or puts (cookies flip before objects reach the ring or a cache) and every live cache has
    /// published its counters ([`PoolCache::publish_stats`](super::PoolCache::publish_stats)),
    /// so run it on a quiescent pool. Available with the `debug` feature only.
    ///
    /// # Errors
    ///
    /// The first corrupted object found, or a count mismatch.
    pub fn audit(&self) -> Result<AuditReport, AuditError> {
        let mut report = AuditReport {
            free: 0,
            allocated: 0,
        };
        for i in 0..self.count() {
            let id = ObjId::new(i, self.tag());
            // Relaxed: diagnostic reads (module docs).
            match self.header(i).load(Ordering::Relaxed) {
                COOKIE_FREE => report.free += 1,
                COOKIE_ALLOCATED => report.allocated += 1,
                found => return Err(AuditError::Header { id, found }),
            }
            let found = self.trailer(i).load(Ordering::Relaxed);
            if found != COOKIE_TRAILER {
                return Err(AuditError::Trailer { id, found });
            }
        }
        let available = self.available();
        if report.free != available {
            return Err(AuditError::Count {
                free: report.free,
                available,
            });
        }
        Ok(report)
    }
}
