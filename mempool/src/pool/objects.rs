//! [`Pool`]: creation, addressing, the cache-less path, accounting.

use core::fmt;
use core::ptr::NonNull;
use std::sync::{Arc, PoisonError};

use crate::memory::{Region, RegionConfig};
use crate::ring::SyncType;

use super::config::{ObjLayout, PoolConfig};
use super::error::{Empty, PoolError};
use super::port::RingPort;
use super::stats::{Mutex, MutexGuard, PoolStats, Registry, SharedStats};
use super::{MemChunk, ObjId};

/// A pool of fixed-size objects carved from one region; see the [module docs](super).
///
/// Created behind an `Arc`: caches and [`PoolBox`](super::PoolBox)es keep the pool (and so its
/// memory) alive.
pub struct Pool {
    /// Name from the config.
    name: String,
    /// Address of object 0; object `i` is at `objs + i * layout.stride`. Points into `region`.
    objs: NonNull<u8>,
    /// Object geometry.
    layout: ObjLayout,
    /// Number of objects; every id handed out is `< count`.
    count: u32,
    /// Capacity of caches made by [`Pool::cache`].
    cache_size: u32,
    /// Tag carried by this pool's ids (`debug` builds).
    #[cfg(feature = "debug")]
    tag: u32,
    /// The free ring; holds every object that is neither in a cache nor allocated.
    ring: RingPort,
    /// Counters of the cache-less path, striped over lines (many writers).
    shared: SharedStats,
    /// Counters of the caches; locked only at cache creation/drop and by readers.
    registry: Mutex<Registry>,
    /// The memory the objects live in; dropped (unmapped) after everything else.
    region: Arc<Region>,
}

// SAFETY: `objs` points into `region`, which the pool owns and which is `Send + Sync`; the pool
// never dereferences it except for debug cookies, which are accessed atomically. `RingPort` is
// `Send + Sync`, the statistics are atomics or behind a mutex, the rest is immutable.
unsafe impl Send for Pool {}
// SAFETY: as for `Send`: every field is either immutable after construction or synchronised
// (ring protocol, atomics, mutex).
unsafe impl Sync for Pool {}

impl Pool {
    /// Creates a pool as `cfg` asks: validates it like `rte_mempool_create`, maps one region
    /// for the objects, and fills the free ring with every object.
    ///
    /// # Errors
    ///
    /// [`PoolError::CacheTooLarge`] when `cache_size > CACHE_MAX_SIZE`,
    /// [`PoolError::CacheTooLargeForCount`] when `flush_threshold(cache_size) > count`,
    /// [`PoolError::InvalidConfig`] for an empty name, zero size or count, a bad alignment or
    /// a pool too large to address, [`PoolError::Memory`] when the region cannot be mapped
    /// (for example [`HugePolicy::Require`](crate::memory::HugePolicy::Require) without
    /// reserved hugepages) and [`PoolError::Ring`] when the ring cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use mempool::pool::{Pool, PoolConfig, PoolError};
    ///
    /// let pool = Pool::new(PoolConfig::new("ctl", 128, 1023).no_huge())?;
    /// assert_eq!((pool.count(), pool.available(), pool.in_use()), (1023, 1023, 0));
    ///
    /// let err = Pool::new(PoolConfig::new("small", 64, 100).cache_size(128)).unwrap_err();
    /// assert!(matches!(err, PoolError::CacheTooLargeForCount { threshold: 192, .. }));
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn new(cfg: PoolConfig) -> Result<Arc<Self>, PoolError> {
        let layout = cfg.validate()?;
        let region_cfg = RegionConfig::new(cfg.name.as_str(), layout.bytes)
            .shareable(cfg.shareable)
            .huge(cfg.huge);
        let region = Region::new(&region_cfg).map_err(|source| PoolError::Memory {
            name: cfg.name.clone(),
            source,
        })?;
        debug_assert!(region.len() >= layout.bytes);
        let tag = next_tag();
        let ring =
            RingPort::new(cfg.count, tag, cfg.ring_sync).map_err(|source| PoolError::Ring {
                name: cfg.name.clone(),
                source,
            })?;
        // SAFETY: `first < stride <= bytes <= region.len()`, so the offset is inside the region
        // (with `first == 0` outside `debug` builds).
        let objs = unsafe { region.as_ptr().add(layout.first) };
        let pool = Self {
            name: cfg.name,
            // SAFETY: derived from the region's non-null base by an in-bounds offset.
            objs: unsafe { NonNull::new_unchecked(objs) },
            layout,
            count: cfg.count,
            cache_size: cfg.cache_size,
            #[cfg(feature = "debug")]
            tag,
            ring,
            shared: SharedStats::default(),
            registry: Mutex::new(Registry::default()),
            region: Arc::new(region),
        };
        #[cfg(not(feature = "debug"))]
        let _ = tag;
        #[cfg(feature = "debug")]
        pool.init_cookies();
        Ok(Arc::new(pool))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of objects.
    #[inline]
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Usable bytes per object.
    #[inline]
    pub fn obj_size(&self) -> usize {
        self.layout.obj_size
    }

    /// Distance in bytes between consecutive objects (object size plus padding, and cookies
    /// in `debug` builds).
    #[inline]
    pub fn stride(&self) -> usize {
        self.layout.stride
    }

    /// Capacity of the caches [`Pool::cache`] makes.
    pub fn cache_size(&self) -> u32 {
        self.cache_size
    }

    /// The synchronisation mode of the free ring's two sides ([`PoolConfig::ring_sync`]).
    pub fn ring_sync(&self) -> SyncType {
        self.ring.sync_type()
    }

    /// The region holding the objects, for fabric registration (`reg_region`) or sharing with
    /// a peer ([`Region::share_handle`]).
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The memory chunks holding the objects (`rte_mempool_mem_iter`): today always one, the
    /// whole region, page aligned. Register each as a memory region; every object lies in one.
    ///
    /// ```
    /// # use mempool::pool::{Pool, PoolConfig};
    /// let pool = Pool::new(PoolConfig::new("reg", 100, 64).no_huge())?;
    /// let chunks: Vec<_> = pool.chunks().collect();
    /// let id = pool.get()?;
    /// assert!(chunks.iter().any(|c| c.contains(pool.addr(id).as_ptr() as usize, 100)));
    /// # unsafe { pool.put(id) };
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn chunks(&self) -> impl Iterator<Item = MemChunk> + '_ {
        core::iter::once(MemChunk {
            addr: self.region.as_ptr() as usize,
            len: self.region.len(),
        })
    }

    /// Address of object `id`: `base + index * stride`, aligned to the configured alignment,
    /// valid for `obj_size` bytes while the pool lives.
    ///
    /// The pointer is raw: reading or writing the object is the caller's business and is sound
    /// only while the caller owns the object (between its get and its put).
    ///
    /// # Panics
    ///
    /// If `id.index() >= count`: the id did not come from this pool.
    #[inline]
    pub fn addr(&self, id: ObjId) -> NonNull<u8> {
        assert!(
            id.index() < self.count,
            "mempool '{}': {id} is out of range (count {})",
            self.name,
            self.count
        );
        // SAFETY: `index < count`, so the offset is inside the region (`count * stride <=
        // region.len()`) and the result is non-null.
        unsafe { self.objs.add(id.index() as usize * self.layout.stride) }
    }

    /// The id of the object starting at `ptr`, or `None` if `ptr` is not the start of one of
    /// this pool's objects (a foreign pointer, or one into the middle or padding of an object).
    pub fn id_of(&self, ptr: *const u8) -> Option<ObjId> {
        let off = self.offset_of(ptr)?;
        (off % self.layout.stride == 0).then(|| self.id_at(off))
    }

    /// The id of the object whose `obj_size` bytes contain `ptr` (an interior pointer, such as
    /// the data address in a completion), or `None` for foreign pointers and padding.
    pub fn id_containing(&self, ptr: *const u8) -> Option<ObjId> {
        let off = self.offset_of(ptr)?;
        (off % self.layout.stride < self.layout.obj_size).then(|| self.id_at(off))
    }

    /// Offset of `ptr` from object 0, if inside the object area.
    fn offset_of(&self, ptr: *const u8) -> Option<usize> {
        let off = ptr.addr().checked_sub(self.objs.as_ptr().addr())?;
        (off < self.count as usize * self.layout.stride).then_some(off)
    }

    /// The id of the slot containing offset `off` (which is inside the object area).
    fn id_at(&self, off: usize) -> ObjId {
        // Fits: `off / stride < count <= u32::MAX`.
        ObjId::new((off / self.layout.stride) as u32, self.tag())
    }

    /// Takes one object straight from the ring (no cache).
    ///
    /// # Errors
    ///
    /// [`Empty`] when the ring holds no object.
    #[inline]
    pub fn get(&self) -> Result<ObjId, Empty> {
        let mut one = [ObjId::default()];
        self.get_bulk(&mut one)?;
        Ok(one[0])
    }

    /// Fills `out` with free objects straight from the ring, all or nothing
    /// (`rte_mempool_get_bulk` on a cache-less pool). An empty `out` succeeds.
    ///
    /// Each call is one multi-consumer ring operation and one shared counter update; per-lcore
    /// code should use a [`PoolCache`](super::PoolCache) (a cache of size 0 avoids the shared
    /// counter).
    ///
    /// # Errors
    ///
    /// [`Empty`] when the ring holds fewer than `out.len()` objects; nothing is taken and
    /// `out` is unchanged.
    #[inline]
    pub fn get_bulk(&self, out: &mut [ObjId]) -> Result<(), Empty> {
        if out.is_empty() {
            return Ok(());
        }
        if self.ring.dequeue_bulk(out) != out.len() {
            self.shared.on_empty();
            return Err(Empty::new(out.len(), self.ring.len()));
        }
        #[cfg(feature = "debug")]
        self.check_get(out);
        self.shared.on_get(out.len());
        Ok(())
    }

    /// Returns one object straight to the ring. Never fails.
    ///
    /// # Safety
    ///
    /// `id` must have been handed out by a get on this pool (or
    /// [`PoolBox::into_raw`](super::PoolBox::into_raw)) and not been put back since: the caller
    /// gives up the object. The `debug` feature checks this and panics on a double free or a
    /// foreign id.
    #[inline]
    pub unsafe fn put(&self, id: ObjId) {
        // SAFETY: forwarded caller contract.
        unsafe { self.put_bulk(&[id]) }
    }

    /// Returns objects straight to the ring (`rte_mempool_put_bulk` on a cache-less pool).
    /// Never fails: the ring has a slot for every object of the pool.
    ///
    /// # Safety
    ///
    /// As for [`Pool::put`], for every id; `ids` must not contain duplicates.
    #[inline]
    pub unsafe fn put_bulk(&self, ids: &[ObjId]) {
        if ids.is_empty() {
            return;
        }
        #[cfg(feature = "debug")]
        self.check_put(ids);
        self.debug_check_range(ids);
        if self.ring.enqueue_bulk(ids) != ids.len() {
            self.ring_overflow(ids.len());
        }
        self.shared.on_put(ids.len());
    }

    /// Objects in the ring, not counting any cache (exact when nothing runs concurrently).
    pub fn in_ring(&self) -> usize {
        self.ring.len()
    }

    /// Free objects: those in the ring plus those in live caches (`rte_mempool_avail_count`).
    ///
    /// Approximate while other threads get and put: the ring and each cache are read at
    /// different moments, and a live cache is counted as of its last statistics publication
    /// (exact once it is flushed, dropped or has called
    /// [`PoolCache::publish_stats`](super::PoolCache::publish_stats)). A get can fail even when
    /// this is large, because objects in other lcores' caches are not reachable (see the module
    /// docs on stranded objects).
    pub fn available(&self) -> usize {
        let cached = self.registry().cached();
        (self.ring.len() as u64 + cached).min(u64::from(self.count)) as usize
    }

    /// Objects handed out and not yet returned: `count - available()`, as approximate as
    /// [`Pool::available`] (`rte_mempool_in_use_count`).
    pub fn in_use(&self) -> usize {
        self.count as usize - self.available()
    }

    /// Number of live caches.
    pub fn caches(&self) -> usize {
        self.registry().live()
    }

    /// Counters summed over every cache (live and dropped) and the cache-less path. Live caches
    /// count as of their last publication (every [`PUBLISH_EVERY`](super::PUBLISH_EVERY)
    /// operations, flush, drop or [`PoolCache::publish_stats`](super::PoolCache::publish_stats)).
    pub fn stats(&self) -> PoolStats {
        self.registry().totals(&self.shared)
    }

    /// The cache counter registry. A panic while it is held cannot leave it inconsistent
    /// (every update is a single push, removal or addition), so poisoning is ignored.
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The raw ring, for caches.
    #[inline(always)]
    pub(crate) fn ring(&self) -> &RingPort {
        &self.ring
    }

    /// The tag this pool's ids carry (0 outside `debug` builds).
    #[inline(always)]
    pub(crate) fn tag(&self) -> u32 {
        #[cfg(feature = "debug")]
        return self.tag;
        #[cfg(not(feature = "debug"))]
        0
    }

    /// In builds with debug assertions, checks that every id is in range (the `debug`
    /// feature checks more, with a better message).
    #[inline(always)]
    pub(crate) fn debug_check_range(&self, ids: &[ObjId]) {
        debug_assert!(
            ids.iter().all(|id| id.index() < self.count),
            "mempool '{}': put of an id out of range (count {})",
            self.name,
            self.count
        );
    }

    /// Called when the ring refuses a put. The ring has a slot for every object, so this means
    /// an object was put twice (or a foreign id was put): the pool's accounting is broken.
    #[cold]
    #[inline(never)]
    pub(crate) fn ring_overflow(&self, n: usize) -> ! {
        panic!(
            "mempool '{}': the free ring has no room for {n} returned objects although it has a \
             slot for each of the {} objects; an object was put twice or a foreign object was \
             put (enable the `debug` feature to find it)",
            self.name, self.count
        );
    }

    /// Layout of the objects.
    #[cfg(feature = "debug")]
    pub(crate) fn layout(&self) -> &ObjLayout {
        &self.layout
    }

    /// Address of object `index` (`< count`), unchecked.
    #[cfg(feature = "debug")]
    pub(crate) fn slot_addr(&self, index: u32) -> *mut u8 {
        debug_assert!(index < self.count);
        // SAFETY: `index < count` (caller), so inside the region.
        unsafe { self.objs.as_ptr().add(index as usize * self.layout.stride) }
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("count", &self.count)
            .field("obj_size", &self.layout.obj_size)
            .field("stride", &self.layout.stride)
            .field("cache_size", &self.cache_size)
            .field("in_ring", &self.ring.len())
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// A process-unique tag for a new pool's ids (`debug` builds); 0 is never handed out.
fn next_tag() -> u32 {
    #[cfg(feature = "debug")]
    {
        use std::sync::atomic::{AtomicU32, Ordering};
        /// Source of pool tags.
        static NEXT: AtomicU32 = AtomicU32::new(1);
        // Relaxed: tags only need to be distinct; the RMW is atomic on its own and nothing is
        // published through it. (Wraps after 2^32 pools; debug builds never get near that.)
        NEXT.fetch_add(1, Ordering::Relaxed).max(1)
    }
    #[cfg(not(feature = "debug"))]
    0
}
