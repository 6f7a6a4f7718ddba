//! [`PoolCache`]: the per-lcore object cache (DPDK's `rte_mempool_cache`).

use core::fmt;
use core::ptr;
use core::slice;
use std::sync::Arc;

use crate::ring::{AnyConsumer, AnyProducer};

use super::config::check_cache_size;
use super::error::{Empty, PoolError};
use super::stats::{CacheCounters, CacheStatsRef, PoolStats};
use super::{CACHE_CAPACITY, CACHE_MAX_SIZE, ObjId, Pool, flush_threshold};

/// Operations of a cache between two publications of its counters to the pool (see
/// [`PoolCache::publish_stats`]).
pub const PUBLISH_EVERY: u32 = 64;

/// A per-thread cache of free objects in front of a pool's ring; see the
/// [module docs](super#per-lcore-caches) for the get, put and flush rules.
///
/// Made by [`Pool::cache`] or [`Pool::cache_with_size`]. It is `Send` (move it to the lcore that
/// uses it) but not `Sync`, and every operation takes `&mut self`: one owner, no atomics on the
/// hit path (its counters are plain fields, published to the pool every [`PUBLISH_EVERY`]
/// operations). It holds its own clones of the ring handles and an `Arc` of the pool.
/// Dropping it returns every cached object to the ring.
///
/// ```
/// use mempool::pool::{ObjId, Pool, PoolConfig};
///
/// let pool = Pool::new(PoolConfig::new("c", 64, 64).cache_size(8).no_huge())?;
/// let mut cache = pool.cache();
/// let id = cache.get()?; // refills 8 + 1 from the ring, hands out 1
/// assert_eq!((cache.len(), pool.in_ring()), (8, 55));
/// // SAFETY: `id` came from this pool and is put back once.
/// unsafe { cache.put(id) };
/// assert_eq!(cache.len(), 9);
/// drop(cache);
/// assert_eq!(pool.in_ring(), 64);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PoolCache {
    /// `objs[..len]` are free objects held by this cache; `objs[len - 1]` was cached last.
    objs: Box<[ObjId; CACHE_CAPACITY]>,
    /// Objects held. Invariant between operations: `len <= max(size, flush_at - 1) <= 767`.
    len: u32,
    /// Capacity the cache settles at after a refill or a flush; `<= CACHE_MAX_SIZE`.
    size: u32,
    /// Length at which a put flushes the excess above `size`:
    /// `max(flush_threshold(size), size + 1)` (the two differ only for `size <= 1`).
    flush_at: u32,
    /// Our clone of the ring's producer handle (flushes, bypassing puts).
    prod: AnyProducer<ObjId>,
    /// Our clone of the ring's consumer handle (refills, bypassing gets).
    cons: AnyConsumer<ObjId>,
    /// This cache's counters, published to `stats` by [`PoolCache::publish_stats`].
    counters: CacheCounters,
    /// Operations since the last publication; publishing happens at [`PUBLISH_EVERY`].
    unpublished: u32,
    /// Counters, written only by this cache, read by [`Pool::stats`].
    stats: CacheStatsRef,
    /// The pool, kept alive by the cache.
    pool: Arc<Pool>,
}

// A cache moves to its lcore; it must not be shared (it is `!Sync` through the ring handles).
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<PoolCache>();
};

impl PoolCache {
    /// A cache of `size` objects (already validated against the pool) for `pool`.
    pub(crate) fn new(pool: Arc<Pool>, size: u32) -> Self {
        debug_assert!(size <= CACHE_MAX_SIZE);
        let (prod, cons) = pool.ring().handles();
        let stats = pool.registry().register();
        let objs = vec![ObjId::default(); CACHE_CAPACITY]
            .into_boxed_slice()
            .try_into()
            .unwrap_or_else(|_| unreachable!("the vector has CACHE_CAPACITY elements"));
        Self {
            objs,
            len: 0,
            size,
            flush_at: flush_threshold(size).max(size + 1),
            prod,
            cons,
            counters: CacheCounters::default(),
            unpublished: 0,
            stats,
            pool,
        }
    }

    /// The pool this cache serves.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Objects currently held by the cache.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the cache holds no object.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cache's capacity (`size`): its length after a refill or a flush.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The length at which a put flushes: [`flush_threshold`]`(size)`.
    pub fn flush_threshold(&self) -> u32 {
        flush_threshold(self.size)
    }

    /// Takes one object: the most recently cached one, refilling from the ring if the cache is
    /// empty.
    ///
    /// # Errors
    ///
    /// [`Empty`] when neither the cache nor the ring holds an object.
    #[inline]
    pub fn get(&mut self) -> Result<ObjId, Empty> {
        let mut one = [ObjId::default()];
        self.get_bulk(&mut one)?;
        Ok(one[0])
    }

    /// Fills `out` with free objects, all or nothing (`rte_mempool_generic_get`).
    ///
    /// Served from the top of the cache when it holds enough; otherwise the cache's objects
    /// plus a refill from the ring (module docs). An empty `out` succeeds.
    ///
    /// # Errors
    ///
    /// [`Empty`] when this cache and the ring together hold fewer than `out.len()` objects (or
    /// the refill fails and the ring cannot supply the remainder). Nothing is taken from the
    /// pool, but `out` may have been partly overwritten.
    #[inline]
    pub fn get_bulk(&mut self, out: &mut [ObjId]) -> Result<(), Empty> {
        let n = out.len();
        let len = self.len as usize;
        if n > len {
            return self.get_miss(out);
        }
        let top = len - n;
        debug_assert!(len <= CACHE_CAPACITY);
        // SAFETY: `top + n == len <= CACHE_CAPACITY` (field invariant), so the source run is
        // inside the array; `out` holds `n` elements and is a distinct exclusive borrow.
        unsafe { copy_ids(self.objs.as_ptr().add(top), out.as_mut_ptr(), n) };
        self.len = top as u32;
        self.counters.hits += n as u64;
        self.count_op();
        #[cfg(feature = "debug")]
        self.pool.check_get(out);
        Ok(())
    }

    /// The cache holds fewer than `out.len()` objects: hand out what it has plus the remainder
    /// from a refill, or from the ring directly.
    #[inline(never)]
    fn get_miss(&mut self, out: &mut [ObjId]) -> Result<(), Empty> {
        let n = out.len();
        let len = self.len as usize;
        let size = self.size as usize;
        let remaining = n - len;
        let (cached, rest) = out.split_at_mut(len);
        cached.copy_from_slice(&self.objs[..len]);
        // The consumer handle's copy of the producer tail may be as old as this cache's last
        // miss, and other consumers may have moved the head by 2^32 counters since (an idle
        // lcore's cache): a copy that old can pass the ring's staleness check and grant ids
        // already handed out. Reload it: one Acquire load per miss, which DPDK's rings make
        // on every operation; none for Multi rings, whose cache is in the shared head word and
        // cannot go stale. (Puts need no reload: the ring has a slot for every object.)
        self.cons.refresh_opp_tail();
        if remaining <= size {
            // Refill: `size + remaining <= 2 * CACHE_MAX_SIZE <= CACHE_CAPACITY`. The ring
            // leaves the array untouched if it cannot supply them all, so the cached objects
            // copied above are still in `objs[..len]` on failure.
            let fill = size + remaining;
            if self.cons.dequeue_bulk(&mut self.objs[..fill]) == fill {
                rest.copy_from_slice(&self.objs[size..fill]);
                self.len = self.size;
                self.counters.refills += 1;
                self.counters.refilled += size as u64;
                self.got(out, len);
                return Ok(());
            }
        }
        // Too large for a refill, or the ring is short of `size + remaining`: take just the
        // remainder (`remaining >= 1`, so a 0 from the ring means failure).
        if self.cons.dequeue_bulk(rest) == remaining {
            self.len = 0;
            self.got(out, len);
            return Ok(());
        }
        self.counters.empty += 1;
        self.count_op();
        Err(Empty::new(n, len + self.cons.len()))
    }

    /// Bookkeeping of a successful slow-path get of `out`, `hits` of which were cached before.
    fn got(&mut self, out: &[ObjId], hits: usize) {
        self.counters.hits += hits as u64;
        self.counters.misses += (out.len() - hits) as u64;
        self.count_op();
        #[cfg(feature = "debug")]
        self.pool.check_get(out);
        #[cfg(not(feature = "debug"))]
        let _ = out;
    }

    /// Returns one object to the cache (flushing the excess to the ring at the threshold).
    /// Never fails.
    ///
    /// # Safety
    ///
    /// As for [`Pool::put`]: `id` was handed out by a get on this cache's pool and has not been
    /// put back since.
    #[inline]
    pub unsafe fn put(&mut self, id: ObjId) {
        // SAFETY: forwarded caller contract.
        unsafe { self.put_bulk(slice::from_ref(&id)) }
    }

    /// Returns objects to the cache (`rte_mempool_generic_put`). Never fails.
    ///
    /// Appends to the cache; if that brings it to its flush threshold, everything above `size`
    /// goes back to the ring in one bulk. More than `size` objects go to the ring directly.
    ///
    /// # Safety
    ///
    /// As for [`Pool::put`], for every id; `ids` must not contain duplicates.
    #[inline]
    pub unsafe fn put_bulk(&mut self, ids: &[ObjId]) {
        #[cfg(feature = "debug")]
        self.pool.check_put(ids);
        self.pool.debug_check_range(ids);
        let n = ids.len();
        if n > self.size as usize {
            return self.put_bypass(ids);
        }
        let len = self.len as usize;
        debug_assert!(len + n <= CACHE_CAPACITY);
        // SAFETY: `len <= 767` (field invariant) and `n <= size <= 512`, so `len + n <= 1279 <
        // CACHE_CAPACITY`; `ids` is a shared borrow that cannot alias our array.
        unsafe { copy_ids(ids.as_ptr(), self.objs.as_mut_ptr().add(len), n) };
        let len = (len + n) as u32;
        self.counters.puts += n as u64;
        self.count_op();
        if len >= self.flush_at {
            self.flush_excess(len);
        } else {
            self.len = len;
        }
    }

    /// Puts larger than the cache go straight to the ring.
    #[inline(never)]
    fn put_bypass(&mut self, ids: &[ObjId]) {
        if self.prod.enqueue_bulk(ids) != ids.len() {
            self.pool.ring_overflow(ids.len());
        }
        self.counters.puts += ids.len() as u64;
        self.counters.bypassed += ids.len() as u64;
        self.count_op();
    }

    /// The cache reached `flush_at` with `len` objects: return `objs[size..len]` to the ring.
    #[inline(never)]
    fn flush_excess(&mut self, len: u32) {
        let (size, len) = (self.size as usize, len as usize);
        if self.prod.enqueue_bulk(&self.objs[size..len]) != len - size {
            self.pool.ring_overflow(len - size);
        }
        self.len = self.size;
        self.counters.flushes += 1;
        self.counters.flushed += (len - size) as u64;
    }

    /// Returns every cached object to the ring (`rte_mempool_cache_flush`), for example before
    /// an lcore goes idle so other lcores can use them.
    pub fn flush(&mut self) {
        let len = self.len as usize;
        if len != 0 && self.prod.enqueue_bulk(&self.objs[..len]) != len {
            self.pool.ring_overflow(len);
        }
        self.len = 0;
        self.counters.flushed += len as u64;
        self.publish_stats();
    }

    /// Publishes this cache's hit and put counts to the pool, making [`Pool::stats`] and
    /// [`Pool::available`] exact for this cache until its next operation.
    ///
    /// A cache counts in plain fields and publishes only every [`PUBLISH_EVERY`] operations,
    /// on [`PoolCache::flush`] and on drop: an atomic store per operation cost more than half
    /// the throughput of small bulks (see `stats.rs`). Call this before reading exact totals
    /// while the cache is alive.
    pub fn publish_stats(&mut self) {
        self.unpublished = 0;
        self.stats.publish(&self.counters);
    }

    /// This cache's own counters, exact (the pool's totals see them as of the last
    /// publication).
    pub fn stats(&self) -> PoolStats {
        self.counters.stats()
    }

    /// Counts one operation; publishes every [`PUBLISH_EVERY`].
    #[inline(always)]
    fn count_op(&mut self) {
        self.unpublished += 1;
        if self.unpublished >= PUBLISH_EVERY {
            self.publish_cold();
        }
    }

    /// Out-of-line publication for [`PoolCache::count_op`].
    #[cold]
    #[inline(never)]
    fn publish_cold(&mut self) {
        self.publish_stats();
    }
}

// Making caches: the pool's side of `PoolCache`, here so that `objects.rs` need not know the type.
impl Pool {
    /// A cache of [`Pool::cache_size`] objects for the calling thread (see [`PoolCache`]).
    pub fn cache(self: &Arc<Self>) -> PoolCache {
        PoolCache::new(Arc::clone(self), self.cache_size())
    }

    /// A cache of `size` objects; 0 makes a cache-less port with per-thread counters.
    ///
    /// # Errors
    ///
    /// [`PoolError::CacheTooLarge`] or [`PoolError::CacheTooLargeForCount`], as for
    /// [`Pool::new`].
    pub fn cache_with_size(self: &Arc<Self>, size: u32) -> Result<PoolCache, PoolError> {
        check_cache_size(self.name(), size, self.count())?;
        Ok(PoolCache::new(Arc::clone(self), size))
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        self.flush();
        self.pool.registry().retire(&self.stats);
    }
}

impl fmt::Debug for PoolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCache")
            .field("pool", &self.pool.name())
            .field("len", &self.len)
            .field("size", &self.size)
            .field("flush_threshold", &self.flush_threshold())
            .finish_non_exhaustive()
    }
}

/// Copies `n` ids from `src` to `dst` without calling `memcpy` for the small counts of the hot
/// path (bulk sizes are usually run-time values, so the compiler cannot inline the copy).
///
/// Runs of up to 128 bytes are moved as two possibly overlapping fixed-size blocks (the first
/// and the last `B` bytes, for the smallest `B` in 4, 8, 16, 32, 64 with `2B >= len`), like
/// DPDK's `rte_memcpy`; longer runs call `copy_nonoverlapping`.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `n` ids, and the two runs must not
/// overlap.
#[inline(always)]
unsafe fn copy_ids(src: *const ObjId, dst: *mut ObjId, n: usize) {
    /// Moves the first and last `B` bytes of a `len`-byte run, `B <= len <= 2B`.
    ///
    /// # Safety
    ///
    /// As for `copy_ids`, with `len` bytes.
    #[inline(always)]
    unsafe fn two<const B: usize>(src: *const u8, dst: *mut u8, len: usize) {
        debug_assert!(B <= len && len <= 2 * B);
        // SAFETY: both blocks lie within the `len`-byte runs (`B <= len`); reads complete
        // before the writes and the runs do not overlap (caller).
        unsafe {
            let head = src.cast::<[u8; B]>().read_unaligned();
            let tail = src.add(len - B).cast::<[u8; B]>().read_unaligned();
            dst.cast::<[u8; B]>().write_unaligned(head);
            dst.add(len - B).cast::<[u8; B]>().write_unaligned(tail);
        }
    }
    let len = n * size_of::<ObjId>();
    let (s, d) = (src.cast::<u8>(), dst.cast::<u8>());
    // SAFETY: in every arm the run is `len` bytes on both sides (caller) and each arm's block
    // size `B` satisfies `B <= len <= 2B` (ids are at least 4 bytes, so `len` is 0 or >= 4).
    unsafe {
        match len {
            0 => {}
            1..=8 => two::<4>(s, d, len),
            9..=16 => two::<8>(s, d, len),
            17..=32 => two::<16>(s, d, len),
            33..=64 => two::<32>(s, d, len),
            65..=128 => two::<64>(s, d, len),
            _ => ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::{Pool, PoolConfig};
    use crate::ring::SyncType;

    /// A cache idle while the other consumers moved the head around the u32 counters: its
    /// copy of the producer tail aliases to "16 available" on an empty ring. A miss must not
    /// trust it (it handed out ids the pool had already given).
    #[test]
    fn test_cache_miss_reloads_an_aliased_producer_tail() {
        for sync in [SyncType::Multi, SyncType::Rts, SyncType::Hts] {
            let mut cfg = PoolConfig::new("alias", 64, 64).cache_size(8).no_huge();
            cfg.ring_sync = sync;
            let pool = Pool::new(cfg).unwrap();
            let mut cache = pool.cache();
            let mut all = vec![ObjId::default(); 64];
            pool.get_bulk(&mut all).unwrap();
            // The ring is empty: its producer tail is where the head is.
            cache.cons.alias_cached_opp_tail(16);
            let mut out = [ObjId::default(); 4];
            assert!(
                cache.get_bulk(&mut out).is_err(),
                "{sync:?}: got {out:?} from an empty pool"
            );
            // SAFETY: `all` are the 64 distinct ids this test took from `pool` above and has
            // not returned.
            unsafe { pool.put_bulk(&all) };
        }
    }

    #[test]
    fn copy_ids_copies_exactly_n() {
        let src: Vec<ObjId> = (0..400).map(|i| ObjId::new(i + 1, 7)).collect();
        for n in 0..=300 {
            for off in [0usize, 1, 3] {
                let mut dst = vec![ObjId::default(); 310];
                // SAFETY: `off + n <= 303 <= src.len()` and `<= dst.len()`; distinct vectors.
                unsafe { copy_ids(src.as_ptr().add(off), dst.as_mut_ptr().add(off), n) };
                assert_eq!(
                    &dst[off..off + n],
                    &src[off..off + n],
                    "n {n}, offset {off}"
                );
                assert!(dst[..off].iter().all(|&id| id == ObjId::default()));
                assert!(
                    dst[off + n..].iter().all(|&id| id == ObjId::default()),
                    "n {n}"
                );
            }
        }
    }
}
