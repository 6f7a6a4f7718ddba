//! Counters: per cache (single writer, no read-modify-write) and per pool (cache-less path),
//! summed by [`Pool::stats`](super::Pool::stats).
//!
//! Each [`PoolCache`](super::PoolCache) owns an `Arc<CacheStats>` that it alone writes; the pool
//! keeps a clone of every live cache's counters in a [`Registry`] (under a mutex taken only when
//! a cache is created or dropped and when someone reads the totals) plus the totals of caches
//! already dropped. The cache-less path ([`Pool::get_bulk`](super::Pool::get_bulk) and friends)
//! has many writers and uses `fetch_add`.
//!
//! ## Why caches count in plain integers and publish
//!
//! A cache is used by one thread, so it counts in plain fields of its own and *publishes* the
//! running totals to its `Arc<CacheStats>` with `Relaxed` stores: every
//! [`PUBLISH_EVERY`](super::PUBLISH_EVERY) operations, on every explicit flush, on
//! [`PoolCache::publish_stats`](super::PoolCache::publish_stats) and on drop. Only the owner
//! stores, so no read-modify-write is needed; readers in other threads only want a recent value
//! and nothing else is published through a counter, so no ordering is needed either; the
//! counters are atomics only so that those concurrent reads are not data races.
//!
//! Counting straight into the atomics on every operation was measured first: on the 2-vCPU
//! AMD EPYC (KVM) development box, one core cycling 128 objects through a 512-object cache in
//! bulks of 1 ran at 611 M objects/s with no counters, 257 M with `load + add + store` of two
//! counters per operation, and 248 M with one plain `store` of a locally kept total: any atomic
//! access on the hit path stopped the compiler from keeping the cache's state in registers
//! across an inlined loop. With publication every 64 operations it ran at 300-414 M over
//! several runs on the shared box (DPDK 22.11, statistics compiled out as in its default
//! build: 418 M on the same box).
//! DPDK's own per-lcore `rte_mempool_debug_stats` are plain per-lcore integers for the same
//! reason, and are compiled out unless `RTE_LIBRTE_MEMPOOL_STATS` is set.

use core::ops::AddAssign;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Totals of a pool's activity, from [`Pool::stats`](super::Pool::stats).
///
/// Counts are objects unless noted. While threads are active the fields are read one by one,
/// so they need not be mutually consistent (a get may be counted in `gets` before its
/// `cache_hits`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PoolStats {
    /// Objects handed out by successful gets (caches, cache-less path and [`PoolBox`]es).
    ///
    /// [`PoolBox`]: super::PoolBox
    pub gets: u64,
    /// Objects returned by puts (including [`PoolBox`] drops).
    ///
    /// [`PoolBox`]: super::PoolBox
    pub puts: u64,
    /// Objects served from a cache that held them before the request (no ring access for them).
    pub cache_hits: u64,
    /// Get requests that failed with [`Empty`](super::Empty) (requests, not objects).
    pub empty: u64,
    /// Bulk refills of a cache from the ring (operations).
    pub refills: u64,
    /// Bulk flushes of a cache to the ring on reaching the flush threshold (operations; drops
    /// and explicit [`PoolCache::flush`](super::PoolCache::flush) calls are not counted).
    pub flushes: u64,
}

impl AddAssign for PoolStats {
    fn add_assign(&mut self, o: Self) {
        self.gets += o.gets;
        self.puts += o.puts;
        self.cache_hits += o.cache_hits;
        self.empty += o.empty;
        self.refills += o.refills;
        self.flushes += o.flushes;
    }
}

/// Counters of one cache, kept by the cache in plain integers (no atomics on its paths).
///
/// The number of objects in the cache is not a counter: it is derived from the flows in and out
/// of the cache array ([`CacheCounters::cached`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheCounters {
    /// Objects handed out that were in the cache before the request.
    pub(crate) hits: u64,
    /// Objects handed out that came from the ring (refill or direct dequeue).
    pub(crate) misses: u64,
    /// Objects put, into the cache or past it.
    pub(crate) puts: u64,
    /// Objects put straight to the ring (puts larger than the cache).
    pub(crate) bypassed: u64,
    /// Objects a refill left in the cache (`size` per refill).
    pub(crate) refilled: u64,
    /// Objects moved from the cache to the ring (threshold flushes and explicit flushes).
    pub(crate) flushed: u64,
    /// Failed gets.
    pub(crate) empty: u64,
    /// Refill operations.
    pub(crate) refills: u64,
    /// Threshold flush operations.
    pub(crate) flushes: u64,
}

impl CacheCounters {
    /// Objects in the cache: `(puts - bypassed) + refilled - hits - flushed`.
    pub(crate) fn cached(&self) -> u64 {
        (self.puts.saturating_sub(self.bypassed) + self.refilled)
            .saturating_sub(self.hits + self.flushed)
    }

    /// The counters as [`PoolStats`].
    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            gets: self.hits + self.misses,
            puts: self.puts,
            cache_hits: self.hits,
            empty: self.empty,
            refills: self.refills,
            flushes: self.flushes,
        }
    }
}

/// The published copy of one cache's [`CacheCounters`], read by the pool.
///
/// Written only by the owning cache, with plain `Relaxed` stores of its running totals (no
/// read-modify-write: there is one writer), when it publishes: every
/// [`PUBLISH_EVERY`](super::PUBLISH_EVERY) operations, on every explicit flush, on
/// [`PoolCache::publish_stats`](super::PoolCache::publish_stats) and on drop. Readers get each
/// counter as of some publication; they are not mutually consistent while the owner runs.
#[derive(Debug, Default)]
pub(crate) struct CacheStats {
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    bypassed: AtomicU64,
    refilled: AtomicU64,
    flushed: AtomicU64,
    empty: AtomicU64,
    refills: AtomicU64,
    flushes: AtomicU64,
}

impl CacheStats {
    /// Publishes the owner's running totals.
    pub(crate) fn publish(&self, c: &CacheCounters) {
        // Relaxed: single writer; statistics only, nothing is read through them (module
        // docs). `bypassed` is stored before `puts` and `hits` after `refilled`, so a reader
        // that loads in the opposite order sees no more bypassed than put objects and no more
        // hits than flowed in (up to objects put between two publications).
        let w = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        w(&self.bypassed, c.bypassed);
        w(&self.puts, c.puts);
        w(&self.refilled, c.refilled);
        w(&self.hits, c.hits);
        w(&self.misses, c.misses);
        w(&self.flushed, c.flushed);
        w(&self.empty, c.empty);
        w(&self.refills, c.refills);
        w(&self.flushes, c.flushes);
    }

    /// The counters as last published.
    pub(crate) fn load(&self) -> CacheCounters {
        // Relaxed: statistics only (module docs).
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheCounters {
            hits: r(&self.hits),
            misses: r(&self.misses),
            puts: r(&self.puts),
            bypassed: r(&self.bypassed),
            refilled: r(&self.refilled),
            flushed: r(&self.flushed),
            empty: r(&self.empty),
            refills: r(&self.refills),
            flushes: r(&self.flushes),
        }
    }

    /// Objects in the cache as of the last publication (approximate while the owner runs).
    fn cached(&self) -> u64 {
        self.load().cached()
    }

    /// The counters as last published, as [`PoolStats`].
    fn snapshot(&self) -> PoolStats {
        self.load().stats()
    }
}

/// Counters of the cache-less path; any thread writes them.
///
/// Striped: each thread adds to one of [`SHARED_STRIPES`] line-padded copies, picked once per
/// thread, and [`SharedStats::snapshot`] sums them. One copy written by every thread made each
/// cache-less operation a second contended line besides the ring's own: on two cores the
/// `fetch_add` pulled the counters' line over from the other core on every get and put, which
/// DPDK (whose cache-less path counts nothing unless `RTE_LIBRTE_MEMPOOL_STATS` is set) does
/// not pay. With stripes two threads add to different lines and the add stays a local locked
/// instruction; threads beyond the stripe count share stripes, which is correct, only slower.
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    stripes: [CachePadded<SharedStripe>; SHARED_STRIPES],
}

/// Stripes of [`SharedStats`]: enough that the threads of a small machine each get their own,
/// few enough that a pool's counters stay a kilobyte.
pub(crate) const SHARED_STRIPES: usize = 8;

/// One stripe of [`SharedStats`].
#[derive(Debug, Default)]
struct SharedStripe {
    gets: AtomicU64,
    puts: AtomicU64,
    empty: AtomicU64,
}

/// The stripe of the calling thread: assigned round-robin on the thread's first cache-less
/// operation (on any pool), then fixed.
#[cfg(not(loom))]
#[inline(always)]
fn stripe_index() -> usize {
    use core::cell::Cell;
    use core::sync::atomic::AtomicUsize;

    /// Next stripe to hand out.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::thread_local! {
        /// This thread's stripe, `usize::MAX` until assigned.
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            // Relaxed: only spreads threads over stripes; nothing is published through it.
            i = NEXT.fetch_add(1, Ordering::Relaxed) % SHARED_STRIPES;
            s.set(i);
        }
        i
    })
}

/// Under loom every thread uses stripe 0: the models check the counters' atomics, not the
/// spreading, and loom threads have no `std` thread-locals of their own.
#[cfg(loom)]
#[inline(always)]
fn stripe_index() -> usize {
    0
}

impl SharedStats {
    /// The calling thread's stripe.
    #[inline(always)]
    fn mine(&self) -> &SharedStripe {
        // `stripe_index() < SHARED_STRIPES`, so the index is in bounds.
        &self.stripes[stripe_index()]
    }

    /// Records a successful cache-less get of `n` objects.
    #[inline(always)]
    pub(crate) fn on_get(&self, n: usize) {
        // Relaxed RMW: a stripe may have several writers, so an atomic add; statistics only,
        // nothing is published.
        self.mine().gets.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a cache-less put of `n` objects.
    #[inline(always)]
    pub(crate) fn on_put(&self, n: usize) {
        // Relaxed RMW: as in `on_get`.
        self.mine().puts.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a failed cache-less get.
    pub(crate) fn on_empty(&self) {
        // Relaxed RMW: as in `on_get`.
        self.mine().empty.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters summed over the stripes, as [`PoolStats`].
    fn snapshot(&self) -> PoolStats {
        // Relaxed: statistics only.
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut s = PoolStats::default();
        for stripe in &self.stripes {
            s.gets += r(&stripe.gets);
            s.puts += r(&stripe.puts);
            s.empty += r(&stripe.empty);
        }
        s
    }
}

/// The counters of one live cache, shared between the cache and the pool's registry.
pub(crate) type CacheStatsRef = Arc<CachePadded<CacheStats>>;

/// The pool's view of its caches' counters.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Counters of every live cache.
    live: Vec<CacheStatsRef>,
    /// Sum of the counters of dropped caches.
    retired: PoolStats,
}

impl Registry {
    /// Registers a new cache's counters and returns them.
    pub(crate) fn register(&mut self) -> CacheStatsRef {
        let stats = Arc::new(CachePadded::new(CacheStats::default()));
        self.live.push(Arc::clone(&stats));
        stats
    }

    /// Folds a dropping cache's final counters into the retired totals.
    pub(crate) fn retire(&mut self, stats: &CacheStatsRef) {
        if let Some(i) = self.live.iter().position(|s| Arc::ptr_eq(s, stats)) {
            self.live.swap_remove(i);
            self.retired += stats.snapshot();
        }
    }

    /// Totals over live and retired caches plus the cache-less counters.
    pub(crate) fn totals(&self, shared: &SharedStats) -> PoolStats {
        let mut sum = self.retired;
        sum += shared.snapshot();
        for s in &self.live {
            sum += s.snapshot();
        }
        sum
    }

    /// Objects held by live caches, as last published by each.
    pub(crate) fn cached(&self) -> u64 {
        self.live.iter().map(|s| s.cached()).sum()
    }

    /// Number of live caches.
    pub(crate) fn live(&self) -> usize {
        self.live.len()
    }
}
