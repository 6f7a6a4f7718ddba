//! Counters: per cache (single writer, no read-modify-write) and per pool (cache-less path),
//! summed by [`Pool::stats`](super::Pool::stats).
//!
//! Each [`PoolCache`](super::PoolCache) owns an `Arc<CacheStats>` that it alone writes; the pool
//! keeps a clone of every live cache's counters in a [`Registry`] (under a mutex taken only when
//! a cache is created or dropped and when someone reads the totals) plus the totals of caches
//! already dropped. The cache-less path ([`Pool::get_bulk`](super::Pool::get_bulk) and friends)
//! has many writers and uses `fetch_add`.
//!
//! ## Why single-writer counters are `Relaxed` load + store
//!
//! Only the owning thread stores a cache's counters, so `load + 1, store` never loses an update
//! and needs no `lock`-prefixed instruction (on x86 it is a plain `add` to memory). Readers in
//! other threads only want a recent value: nothing else is published through a counter, so no
//! ordering is needed (`Relaxed`). The counters are atomics only so that those concurrent reads
//! are not data races. DPDK's `rte_mempool_debug_stats` are per-lcore for the same reason.

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

/// Counters of one cache; written only by the thread that owns the cache.
#[derive(Debug, Default)]
pub(crate) struct CacheStats {
    gets: AtomicU64,
    puts: AtomicU64,
    hits: AtomicU64,
    empty: AtomicU64,
    refills: AtomicU64,
    flushes: AtomicU64,
    /// Objects currently in the cache, for [`Pool::available`](super::Pool::available).
    cached: AtomicU64,
}

/// Adds `n` to a single-writer counter.
#[inline(always)]
fn bump(counter: &AtomicU64, n: u64) {
    // Relaxed load + store: single writer (the owning cache's thread), see the module docs.
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl CacheStats {
    /// Records a successful get of `n` objects, `hits` of them already cached, leaving `cached`.
    #[inline(always)]
    pub(crate) fn on_get(&self, n: usize, hits: usize, cached: u32) {
        bump(&self.gets, n as u64);
        bump(&self.hits, hits as u64);
        self.set_cached(cached);
    }

    /// Records a put of `n` objects leaving `cached` in the cache.
    #[inline(always)]
    pub(crate) fn on_put(&self, n: usize, cached: u32) {
        bump(&self.puts, n as u64);
        self.set_cached(cached);
    }

    /// Records a failed get.
    pub(crate) fn on_empty(&self) {
        bump(&self.empty, 1);
    }

    /// Records a refill of the cache from the ring.
    pub(crate) fn on_refill(&self) {
        bump(&self.refills, 1);
    }

    /// Records a threshold flush of the cache to the ring.
    pub(crate) fn on_flush(&self) {
        bump(&self.flushes, 1);
    }

    /// Publishes the cache length.
    #[inline(always)]
    pub(crate) fn set_cached(&self, cached: u32) {
        // Relaxed: single writer; readers want an approximate count only (module docs).
        self.cached.store(u64::from(cached), Ordering::Relaxed);
    }

    /// Objects in the cache as last published.
    pub(crate) fn cached(&self) -> u64 {
        // Relaxed: an approximate count, nothing is read through it.
        self.cached.load(Ordering::Relaxed)
    }

    /// The counters as last written.
    pub(crate) fn snapshot(&self) -> PoolStats {
        // Relaxed: statistics only (module docs).
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolStats {
            gets: r(&self.gets),
            puts: r(&self.puts),
            cache_hits: r(&self.hits),
            empty: r(&self.empty),
            refills: r(&self.refills),
            flushes: r(&self.flushes),
        }
    }
}

/// Counters of the cache-less path; any thread writes them.
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    gets: AtomicU64,
    puts: AtomicU64,
    empty: AtomicU64,
}

impl SharedStats {
    /// Records a successful cache-less get of `n` objects.
    #[inline(always)]
    pub(crate) fn on_get(&self, n: usize) {
        // Relaxed RMW: many writers, so an atomic add; statistics only, nothing is published.
        self.gets.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a cache-less put of `n` objects.
    #[inline(always)]
    pub(crate) fn on_put(&self, n: usize) {
        // Relaxed RMW: as in `on_get`.
        self.puts.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a failed cache-less get.
    pub(crate) fn on_empty(&self) {
        // Relaxed RMW: as in `on_get`.
        self.empty.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters, as [`PoolStats`].
    fn snapshot(&self) -> PoolStats {
        // Relaxed: statistics only.
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoolStats {
            gets: r(&self.gets),
            puts: r(&self.puts),
            empty: r(&self.empty),
            ..PoolStats::default()
        }
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
