//! [`PoolConfig`] and its validation into an object layout.

use crate::memory::HugePolicy;
use crate::ring::{RingLayout, SyncType};

use super::error::PoolError;
use super::{CACHE_MAX_SIZE, flush_threshold, max_cache_size};

/// Default object alignment: one cache line.
pub(crate) const DEFAULT_ALIGN: usize = 64;

/// Largest object alignment: the base page, which every region start is aligned to.
pub(crate) const MAX_ALIGN: usize = 4096;

/// Largest pool with an RTS free ring, whose capacity is 4x the objects rounded up to a power
/// of two (see `port::ring_capacity`) and must stay within [`RingLayout::MAX_CAPACITY`].
const RTS_MAX_COUNT: u32 = (RingLayout::MAX_CAPACITY / 4) as u32;

/// Default per-cache capacity, before clamping to what the pool size allows.
const DEFAULT_CACHE_SIZE: u32 = 256;

/// What to create: the input of [`Pool::new`](super::Pool::new), DPDK's `rte_mempool_create`
/// arguments.
///
/// ```
/// use mempool::memory::HugePolicy;
/// use mempool::pool::PoolConfig;
///
/// let cfg = PoolConfig::new("tx", 2048, 8191).cache_size(512).huge(HugePolicy::Require);
/// assert_eq!((cfg.align, cfg.shareable), (64, false));
/// // The default cache is 256 objects, or less when the pool is too small for it.
/// assert_eq!(PoolConfig::new("tiny", 64, 30).cache_size, 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Pool name, used in errors, debug panics and the region's notice.
    pub name: String,
    /// Usable bytes per object (at least 1).
    pub obj_size: usize,
    /// Number of objects (at least 1, at most 2^31).
    pub count: u32,
    /// Capacity of each [`PoolCache`](super::PoolCache) made by
    /// [`Pool::cache`](super::Pool::cache): at most [`CACHE_MAX_SIZE`], and
    /// [`flush_threshold`]`(cache_size)` must not exceed `count`. 0 makes caches pass-through.
    /// Default: 256, clamped to [`max_cache_size`]`(count)`.
    pub cache_size: u32,
    /// Object alignment in bytes: a power of two, at most 4096. The object stride is `obj_size`
    /// rounded up to it. Default: 64.
    pub align: usize,
    /// Hugepage policy of the region. Default: [`HugePolicy::Auto`].
    pub huge: HugePolicy,
    /// Back the objects with a memfd a peer process can map. Default: `false`.
    pub shareable: bool,
    /// Synchronisation mode of both sides of the free ring: [`SyncType::Multi`] (DPDK's default
    /// `ring_mp_mc` mempool ops), [`SyncType::Rts`] (`ring_mt_rts`) or [`SyncType::Hts`]
    /// (`ring_mt_hts`); see [`SyncType`] for how they behave when a thread is preempted
    /// mid-operation. Not [`SyncType::Single`]: every thread may get and put. Default: Multi.
    ///
    /// With RTS an object put back becomes visible to gets only once every put in flight has
    /// finished, so a get may fail with [`Empty`](super::Empty) while other threads are
    /// putting (as with DPDK's RTS rings); and the ring has four slots per object (see
    /// `port::ring_capacity`), so an RTS pool holds at most 2^29 objects.
    pub ring_sync: SyncType,
}

impl PoolConfig {
    /// A private pool of `count` objects of `obj_size` bytes with the default cache size,
    /// 64-byte alignment and [`HugePolicy::Auto`].
    pub fn new(name: impl Into<String>, obj_size: usize, count: u32) -> Self {
        Self {
            name: name.into(),
            obj_size,
            count,
            cache_size: DEFAULT_CACHE_SIZE.min(max_cache_size(count)),
            align: DEFAULT_ALIGN,
            huge: HugePolicy::Auto,
            shareable: false,
            ring_sync: SyncType::Multi,
        }
    }

    /// Sets the per-cache capacity.
    #[must_use]
    pub fn cache_size(mut self, cache_size: u32) -> Self {
        self.cache_size = cache_size;
        self
    }

    /// Sets the object alignment.
    #[must_use]
    pub fn align(mut self, align: usize) -> Self {
        self.align = align;
        self
    }

    /// Sets the hugepage policy.
    #[must_use]
    pub fn huge(mut self, policy: HugePolicy) -> Self {
        self.huge = policy;
        self
    }

    /// Normal pages only: shorthand for `.huge(HugePolicy::Never)`.
    #[must_use]
    pub fn no_huge(self) -> Self {
        self.huge(HugePolicy::Never)
    }

    /// Sets the free ring's synchronisation mode (see [`PoolConfig::ring_sync`]).
    #[must_use]
    pub fn ring_sync(mut self, sync: SyncType) -> Self {
        self.ring_sync = sync;
        self
    }

    /// Sets whether a peer process can map the objects.
    #[must_use]
    pub fn shareable(mut self, shareable: bool) -> Self {
        self.shareable = shareable;
        self
    }

    /// Checks the config like `rte_mempool_create` and computes the object layout.
    pub(crate) fn validate(&self) -> Result<ObjLayout, PoolError> {
        let invalid = |reason| PoolError::InvalidConfig {
            name: self.name.clone(),
            reason,
        };
        if self.name.is_empty() {
            return Err(invalid(
                "name is empty; name the pool, it appears in errors",
            ));
        }
        if self.name.contains('\0') {
            return Err(invalid("name contains a NUL byte; use a plain name"));
        }
        if self.obj_size == 0 {
            return Err(invalid(
                "obj_size is 0; objects must hold at least one byte",
            ));
        }
        if self.count == 0 {
            return Err(invalid("count is 0; a pool needs at least one object"));
        }
        if self.count as usize > RingLayout::MAX_CAPACITY {
            return Err(invalid(
                "count exceeds 2^31, the free ring's limit; use fewer objects",
            ));
        }
        if !self.align.is_power_of_two() || self.align > MAX_ALIGN {
            return Err(invalid("align must be a power of two between 1 and 4096"));
        }
        if !self.ring_sync.is_shared() {
            return Err(invalid(
                "ring_sync is single, but every thread may get and put; use multi, rts or hts",
            ));
        }
        if self.ring_sync == SyncType::Rts && self.count > RTS_MAX_COUNT {
            return Err(invalid(
                "count exceeds 2^29, the limit of an RTS free ring (it has 4 slots per object); \
                 use fewer objects or ring_sync multi",
            ));
        }
        check_cache_size(&self.name, self.cache_size, self.count)?;
        ObjLayout::new(self.obj_size, self.align, self.count).ok_or_else(|| {
            invalid("count x object size does not fit in the address space; use fewer or smaller objects")
        })
    }
}

/// Checks a cache capacity against DPDK's two limits.
pub(crate) fn check_cache_size(name: &str, cache_size: u32, count: u32) -> Result<(), PoolError> {
    if cache_size > CACHE_MAX_SIZE {
        return Err(PoolError::CacheTooLarge {
            name: name.to_owned(),
            cache_size,
            max: CACHE_MAX_SIZE,
        });
    }
    let threshold = flush_threshold(cache_size);
    if threshold > count {
        return Err(PoolError::CacheTooLargeForCount {
            name: name.to_owned(),
            cache_size,
            threshold,
            count,
            max_cache: max_cache_size(count),
        });
    }
    Ok(())
}

/// Where objects sit in the pool's memory.
///
/// Object `i` starts at `base + first + i * stride`. Without the `debug` feature `first` is 0
/// and `stride` is `obj_size` rounded up to `align`. With it, each slot is
/// `[pad | header cookie (8) | object | pad | trailer cookie (8) | pad]`: the object starts at
/// `first = max(align, 8)` into the slot, the header cookie is the 8 bytes before it, and the
/// trailer cookie sits at the next 8-byte boundary after the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjLayout {
    /// Usable bytes per object.
    pub(crate) obj_size: usize,
    /// Distance between consecutive objects; a multiple of the effective alignment.
    pub(crate) stride: usize,
    /// Offset of object 0 from the region base.
    pub(crate) first: usize,
    /// Offset of the trailer cookie from the object start (`debug` only; 0 otherwise).
    pub(crate) trailer: usize,
    /// Bytes of memory the objects need: `count * stride` (slot `i` is `[i * stride, (i + 1) *
    /// stride)` and holds object `i` at offset `first`).
    pub(crate) bytes: usize,
}

impl ObjLayout {
    /// The layout for `count` objects, or `None` on arithmetic overflow.
    fn new(obj_size: usize, align: usize, count: u32) -> Option<Self> {
        let (first, trailer, slot) = if cfg!(feature = "debug") {
            let align = align.max(8);
            let trailer = obj_size.checked_next_multiple_of(8)?;
            (align, trailer, align.checked_add(trailer)?.checked_add(8)?)
        } else {
            (0, 0, obj_size)
        };
        let align = if cfg!(feature = "debug") {
            align.max(8)
        } else {
            align
        };
        let stride = slot.checked_next_multiple_of(align)?;
        let bytes = stride.checked_mul(count as usize)?;
        // Regions are limited to half the address space; leave the same headroom here.
        (bytes <= isize::MAX as usize / 2).then_some(Self {
            obj_size,
            stride,
            first,
            trailer,
            bytes,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn layout_rounds_to_alignment() {
        let l = ObjLayout::new(100, 64, 10).unwrap();
        if cfg!(feature = "debug") {
            // 64 (header block) + 104 (object to 8) + 8 (trailer) = 176 -> 192.
            assert_eq!((l.first, l.trailer, l.stride), (64, 104, 192));
        } else {
            assert_eq!((l.first, l.stride, l.bytes), (0, 128, 1280));
        }
        assert!(ObjLayout::new(usize::MAX / 2, 64, 4).is_none());
    }

    #[test]
    fn max_cache_size_is_the_largest_valid() {
        for count in 1..3000u32 {
            let c = max_cache_size(count);
            assert!(flush_threshold(c) <= count, "count {count}: {c} too large");
            assert!(
                c == CACHE_MAX_SIZE || flush_threshold(c + 1) > count,
                "count {count}: {c} not maximal"
            );
        }
    }
}
