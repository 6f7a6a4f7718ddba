//! Errors: [`Empty`] on the data path, [`PoolError`] at creation.

use crate::memory::MemError;
use crate::ring::RingError;

/// A get could not be satisfied: the pool (as seen by this cache) holds fewer free objects than
/// requested. Nothing was taken.
///
/// Small and `Copy` for the data path; the counts are a snapshot at the time of the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "mempool empty: {requested} objects requested, {available} available to this caller; \
     make the pool larger or return objects sooner (other lcores' caches may hold free objects)"
)]
pub struct Empty {
    /// Objects asked for (saturated at `u32::MAX`).
    pub requested: u32,
    /// Objects the failing caller could see: the ring plus its own cache.
    pub available: u32,
}

impl Empty {
    /// Builds the error from a request length and a count of visible objects.
    #[cold]
    pub(crate) fn new(requested: usize, available: usize) -> Self {
        Self {
            requested: u32::try_from(requested).unwrap_or(u32::MAX),
            available: u32::try_from(available).unwrap_or(u32::MAX),
        }
    }
}

/// Why a pool or a cache could not be created.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A config field is out of range; the reason says which and what is allowed.
    #[error("pool '{name}': {reason}")]
    InvalidConfig {
        /// Pool name.
        name: String,
        /// What was wrong and what to do.
        reason: &'static str,
    },
    /// The cache size exceeds [`CACHE_MAX_SIZE`](super::CACHE_MAX_SIZE).
    #[error(
        "pool '{name}': cache_size {cache_size} exceeds the maximum of {max}; use at most {max}"
    )]
    CacheTooLarge {
        /// Pool name.
        name: String,
        /// The requested cache size.
        cache_size: u32,
        /// [`CACHE_MAX_SIZE`](super::CACHE_MAX_SIZE).
        max: u32,
    },
    /// The cache's flush threshold exceeds the pool size, so a cache could swallow the pool.
    #[error(
        "pool '{name}': cache_size {cache_size} flushes at {threshold} objects (1.5 x cache_size) \
         but the pool has only {count}; raise count to at least {threshold} or lower cache_size \
         to at most {max_cache}"
    )]
    CacheTooLargeForCount {
        /// Pool name.
        name: String,
        /// The requested cache size.
        cache_size: u32,
        /// [`flush_threshold`](super::flush_threshold)`(cache_size)`.
        threshold: u32,
        /// The pool's object count.
        count: u32,
        /// [`max_cache_size`](super::max_cache_size)`(count)`.
        max_cache: u32,
    },
    /// Allocating the object memory failed.
    #[error("pool '{name}': allocating the object memory failed: {source}")]
    Memory {
        /// Pool name.
        name: String,
        /// The region error (it says what to do: reserve hugepages, raise limits, ...).
        #[source]
        source: MemError,
    },
    /// Creating the free ring failed.
    #[error("pool '{name}': creating the free ring failed: {source}")]
    Ring {
        /// Pool name.
        name: String,
        /// The ring error.
        #[source]
        source: RingError,
    },
}
