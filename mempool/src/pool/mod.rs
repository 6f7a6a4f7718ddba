//! Fixed-size object pools with DPDK `rte_mempool` semantics.
//!
//! A [`Pool`] carves `count` objects of `obj_size` bytes out of one [`Region`] (hugepages when
//! available) and keeps the free ones as [`ObjId`]s (object indices) in a lock-free
//! [`ring`](crate::ring) shared by every thread: Multi on both sides by default (DPDK's
//! default `ring_mp_mc` mempool ops), or RTS or HTS ([`PoolConfig::ring_sync`], DPDK's
//! `ring_mt_rts` and `ring_mt_hts`) for threads that may be preempted while they get or put. Objects never move: object
//! `i` lives at `base + i * stride` for the life of the pool, so [`Pool::addr`] and
//! [`Pool::id_of`] convert between ids and addresses with arithmetic, and a fabric provider can
//! register the pool's memory once ([`Pool::chunks`], [`Pool::region`]) and find the key of any
//! object by address.
//!
//! # Three ways to get and put
//!
//! | API | for | cost per call |
//! |-----|-----|---------------|
//! | [`PoolCache::get_bulk`] / [`PoolCache::put_bulk`] | the hot path: one cache per lcore | a `memcpy` into or out of a private array; the ring is touched once per `cache_size` objects |
//! | [`Pool::get_bulk`] / [`Pool::put_bulk`] | cache-less pools and control paths | one ring operation (a CAS on a shared line) |
//! | [`Pool::get_owned`] -> [`PoolBox`] | convenience: an owned handle that returns its object on drop | one ring operation each way |
//!
//! Raw gets are safe; raw puts are `unsafe`, because the pool cannot cheaply tell a free object
//! from an allocated one, and putting an object twice would hand it to two owners (two
//! [`PoolBox`]es with overlapping `&mut [u8]`). The `debug` feature checks that contract with
//! cookies (below), the way DPDK's `RTE_LIBRTE_MEMPOOL_DEBUG` does.
//!
//! # Per-lcore caches
//!
//! A [`PoolCache`] is owned by one thread (it is `Send`, not `Sync`), like a DPDK user-owned
//! `rte_mempool_cache` passed to `rte_mempool_generic_get/put`. It holds up to `size` objects
//! (at most [`CACHE_MAX_SIZE`] = 512, as `RTE_MEMPOOL_CACHE_MAX_SIZE`) in a fixed array of
//! `3 x CACHE_MAX_SIZE` slots (the overflow room of DPDK's cache before 22.11, which went to 2x
//! with the newer flush rule), so no operation ever checks for space.
//!
//! - **Get** pops the most recently cached objects (LIFO: the objects whose bytes are most
//!   likely still in this core's cache come back first). When the cache holds fewer than asked,
//!   it hands out what it has and refills from the ring with `size + remaining` objects in one
//!   bulk, serving the remaining ones from the top of the refill and keeping `size`. If the ring
//!   cannot supply that many, it dequeues just the remainder; if that fails too, the request
//!   fails with [`Empty`] and nothing is taken (all or nothing, as `rte_mempool_get_bulk`).
//!   Requests whose remainder exceeds `size` skip the refill and take the remainder from the
//!   ring directly (DPDK 22.11 refills for remainders up to 512 whatever the cache size).
//!   The objects handed out from the cache are its top `n` in stack order (one `memcpy`),
//!   where DPDK copies them one by one in reverse; the set is the same.
//! - **Put** appends to the cache; when the length reaches the flush threshold
//!   ([`flush_threshold`]`(size)` = `size + size / 2`, i.e. [`FLUSH_THRESHOLD_MULTIPLIER`] = 1.5
//!   truncated, as DPDK's `CALC_CACHE_FLUSHTHRESH`), everything above `size` goes back to the ring
//!   in one bulk. This is DPDK's flush rule before 22.11; 22.11 and later flush the whole cache
//!   when an append would cross the threshold and keep only the new objects. The older rule was
//!   chosen because a flush leaves `size` objects in the cache instead of as few as one batch,
//!   so a thread that alternates bursts of puts and gets keeps hitting; in steady state (a
//!   cache cycling below its threshold, as in `mempool_perf_autotest`) the two never differ.
//!   Puts of more than `size` objects bypass the cache.
//! - **Drop** of a cache returns everything it holds to the ring; [`PoolCache::flush`] does so
//!   on demand.
//!
//! A cache of size 0 is a cache-less port: every request goes to the ring, but the counters are
//! per thread (no shared atomics besides the ring's own).
//!
//! ## Stranded objects and sizing
//!
//! Objects in one lcore's cache are invisible to the others: a get can fail with [`Empty`] while
//! other caches together hold up to `caches x (1.5 x size - 1)` free objects, exactly as DPDK
//! warns. [`Pool::available`] and [`Pool::in_use`] count cached objects as available and are
//! approximate while caches are active (DPDK documents `rte_mempool_avail_count` the same way;
//! here each live cache is counted as of its last statistics publication).
//! Size pools as DPDK advises:
//!
//! - `count >= lcores x 1.5 x cache_size + in-flight objects`, and at least
//!   [`flush_threshold`]`(cache_size)`, which [`Pool::new`] enforces (DPDK keeps that constant
//!   private; it is exported here so nobody hard-codes "2 x cache");
//! - `count = 2^q - 1` wastes nothing in DPDK, whose ring needs one spare slot; this ring has no
//!   spare slot, so `count = 2^q` is the exact fit here;
//! - `count` a multiple of `cache_size`, otherwise the last partial batch tends to sit in the
//!   ring while caches cycle full batches.
//!
//! # Object layout and the `debug` feature
//!
//! Without the `debug` feature an object is `obj_size` bytes rounded up to `align` (default 64,
//! a cache line): no header, no trailer, no per-object cost. With `debug`, each object is
//! framed as `[.. header cookie | object | trailer cookie ..]` (DPDK's `rte_mempool_objhdr`
//! cookie and `rte_mempool_objtlr`, with DPDK's cookie values), and every get and put checks
//! them like `rte_mempool_check_cookies`:
//!
//! - put of an object that is already free (double free), put of an object of another pool,
//!   and put of an id out of range panic with a message naming the pool and the object;
//! - a trailer that no longer holds its cookie (a write past the end of the object) or a header
//!   that holds neither cookie (a write before its start) panics on the next get or put;
//! - `Pool::audit` (present with the feature) walks every object.
//!
//! These are programming-error checks for debug and test builds, not input validation: they
//! verify the safety contract of the `unsafe` puts. In `debug` builds an [`ObjId`] also carries
//! its pool's tag, so "object of another pool" is detected even when the index is in range.
//!
//! # Statistics
//!
//! [`Pool::stats`] sums gets, puts, cache hits, failed gets ([`Empty`]), refills and flushes
//! over the cache-less path (shared atomic counters), the live caches and the caches already
//! dropped. A cache counts in plain fields and publishes its totals to the pool every
//! [`PUBLISH_EVERY`] operations, on [`PoolCache::flush`], on [`PoolCache::publish_stats`] and
//! on drop, so a live cache is seen as of its last publication: an atomic counter update on the
//! hit path cost more than half the throughput of small bulks (measurements in `stats.rs`).
//! [`PoolCache::stats`] is the cache's own exact view.
//!
//! # Objects are bytes
//!
//! An object is `obj_size` bytes of the region, zeroed when the pool is created and never
//! reset: a put does not touch the contents (like DPDK), so the next owner sees what the last
//! one wrote. Code that writes objects through raw pointers ([`Pool::addr`]) must store only
//! initialised bytes there (write typed values with `write_unaligned` of types without padding,
//! or zero the padding), because [`PoolBox`] lets the next owner read them as `&[u8]`.
//!
//! # Shareable pools
//!
//! With [`PoolConfig::shareable`] the objects live in a memfd region that a peer process can map
//! (see [`memory`](crate::memory)); the free ring stays private to this process. Bytes of a
//! shareable pool may be written by a peer at any time the application protocol allows (a
//! remote RDMA write, a peer's store). The safe byte views of [`PoolBox`] assume the protocol
//! rules that out while the view lives; where it cannot, use the raw pointers
//! ([`PoolBox::as_ptr`], [`Pool::addr`]) and volatile or atomic accesses.
//!
//! # Verification
//!
//! The pool's own atomics are its statistics counters; all ownership transfer of objects goes
//! through the ring. `tests/loom_pool.rs` model-checks two caches and the cache-less path on a
//! tiny pool:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p mempool --test loom_pool --release
//! ```
//!
//! # Example
//!
//! ```
//! use mempool::pool::{ObjId, Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig::new("rx", 2048, 4096).cache_size(256).no_huge())?;
//! let mut cache = pool.cache();
//! let mut burst = [ObjId::default(); 32];
//! cache.get_bulk(&mut burst)?;
//! for &id in &burst {
//!     // SAFETY: the object is ours until we put it back; 2048 bytes are in bounds.
//!     unsafe { pool.addr(id).as_ptr().write_bytes(0xab, 2048) };
//! }
//! // SAFETY: every id came from this pool and is put back exactly once.
//! unsafe { cache.put_bulk(&burst) };
//! assert_eq!(cache.stats().gets, 32);
//! cache.publish_stats(); // caches publish every 64 operations; make the totals exact now
//! assert_eq!(pool.stats().gets, 32);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Region`]: crate::memory::Region

mod cache;
mod config;
#[cfg(feature = "debug")]
mod debug;
mod error;
mod objects;
mod owned;
mod port;
mod stats;

use core::fmt;

pub use cache::{PUBLISH_EVERY, PoolCache};
pub use config::PoolConfig;
#[cfg(feature = "debug")]
pub use debug::{AuditError, AuditReport, COOKIE_ALLOCATED, COOKIE_FREE, COOKIE_TRAILER};
pub use error::{Empty, PoolError};
pub use objects::Pool;
pub use owned::PoolBox;
pub use stats::PoolStats;

/// Largest per-cache capacity, DPDK's `RTE_MEMPOOL_CACHE_MAX_SIZE`.
pub const CACHE_MAX_SIZE: u32 = 512;

/// A cache flushes back to the ring when it holds this many times its size (DPDK's private
/// `CACHE_FLUSHTHRESH_MULTIPLIER`); [`flush_threshold`] is the exact integer rule.
pub const FLUSH_THRESHOLD_MULTIPLIER: f64 = 1.5;

/// Slots in a cache's object array: DPDK's `3 x RTE_MEMPOOL_CACHE_MAX_SIZE` overflow room.
///
/// Bound used by every unchecked cache access: between operations a cache holds at most
/// `max(size, flush_threshold(size) - 1) <= 767` objects, a put appends at most `size <= 512`,
/// and a refill writes at most `size + size <= 1024` slots from 0.
pub(crate) const CACHE_CAPACITY: usize = 3 * CACHE_MAX_SIZE as usize;

const _: () = assert!(
    flush_threshold(CACHE_MAX_SIZE) as usize - 1 + CACHE_MAX_SIZE as usize <= CACHE_CAPACITY
);
const _: () = assert!(2 * CACHE_MAX_SIZE as usize <= CACHE_CAPACITY);

/// The flush threshold of a cache of `cache_size` objects: `floor(1.5 x cache_size)`.
///
/// A put that brings the cache to this length (or more) returns everything above `cache_size`
/// to the ring. [`Pool::new`] requires `count >= flush_threshold(cache_size)`, like
/// `rte_mempool_create`.
///
/// ```
/// use mempool::pool::{CACHE_MAX_SIZE, flush_threshold};
/// assert_eq!(flush_threshold(CACHE_MAX_SIZE), 768);
/// assert_eq!(flush_threshold(3), 4);
/// ```
#[inline]
pub const fn flush_threshold(cache_size: u32) -> u32 {
    cache_size + cache_size / 2
}

/// The largest cache size a pool of `count` objects accepts: the largest `c <= CACHE_MAX_SIZE`
/// with `flush_threshold(c) <= count`.
///
/// ```
/// use mempool::pool::max_cache_size;
/// assert_eq!(max_cache_size(10), 7); // 7 + 3 = 10
/// assert_eq!(max_cache_size(1 << 20), 512);
/// ```
pub const fn max_cache_size(count: u32) -> u32 {
    // flush_threshold(c) = c + c / 2 <= count  <=>  c <= (2 * count + 1) / 3 (checked in tests).
    let c = (2 * count as u64 + 1) / 3;
    if c > CACHE_MAX_SIZE as u64 {
        CACHE_MAX_SIZE
    } else {
        c as u32
    }
}

/// Identifies one object of a pool: its index, `0..count`.
///
/// Ids are what the free ring and the caches store (4 bytes each; DPDK stores 8-byte pointers).
/// [`Pool::addr`] turns an id into the object's address and [`Pool::id_of`] goes back. An id is
/// only meaningful for the pool that handed it out. `ObjId::default()` (index 0, and no pool in
/// `debug` builds) is a placeholder for filling output arrays.
///
/// In `debug` builds the id also carries a tag of the pool it came from (8 bytes), so a put into
/// the wrong pool is caught even when the index is in range.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C)]
pub struct ObjId {
    /// Object index, `< count` for ids handed out by the pool.
    index: u32,
    /// Tag of the pool that handed the id out (0: none).
    #[cfg(feature = "debug")]
    pool: u32,
}

#[cfg(not(feature = "debug"))]
const _: () = assert!(size_of::<ObjId>() == 4 && align_of::<ObjId>() == 4);
#[cfg(feature = "debug")]
const _: () = assert!(size_of::<ObjId>() == 8 && align_of::<ObjId>() == 4);

impl ObjId {
    /// An id for object `index` of the pool tagged `tag`.
    #[inline(always)]
    #[cfg_attr(not(feature = "debug"), allow(unused_variables))]
    pub(crate) const fn new(index: u32, tag: u32) -> Self {
        Self {
            index,
            #[cfg(feature = "debug")]
            pool: tag,
        }
    }

    /// The object's index in its pool, `0..count`.
    #[inline(always)]
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The tag of the pool that handed out this id (`debug` builds only).
    #[cfg(feature = "debug")]
    #[inline(always)]
    pub(crate) const fn tag(self) -> u32 {
        self.pool
    }
}

impl fmt::Debug for ObjId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjId({})", self.index)
    }
}

impl fmt::Display for ObjId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "object {}", self.index)
    }
}

/// One virtually contiguous piece of a pool's memory, for fabric registration
/// (`rte_mempool_memhdr`: what `rte_mempool_mem_iter` visits).
///
/// Register each chunk as one memory region; every object of the pool lies inside exactly one
/// chunk, so the key of an object is found by address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemChunk {
    /// Start address (page aligned).
    pub addr: usize,
    /// Length in bytes (a multiple of the region's page size).
    pub len: usize,
}

impl MemChunk {
    /// Whether `[addr, addr + len)` lies inside the chunk.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}
