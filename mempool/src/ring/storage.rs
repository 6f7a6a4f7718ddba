//! Where a ring's memory lives and how slots are read and written.
//!
//! A [`RawRing`] is the per-handle view of one formatted region: a header pointer, a slot pointer,
//! the capacity and mask copied out of the header at attach time, and a keep-alive that owns
//! (or pins) the region. The region is either a heap allocation made by
//! [`Ring::with_capacity`](super::Ring::with_capacity) or caller-supplied memory (shared
//! mappings); both go through the same `format`/`validate` code in `layout.rs`.
//!
//! Capacity and mask are cached per handle, never re-read from shared memory, so a peer process
//! that scribbles over the header can corrupt data but cannot steer slot accesses outside the
//! region.

use core::alloc::Layout;
use core::fmt;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use std::sync::Arc;

#[cfg(not(loom))]
use super::copy::copy_run;
use super::index::Indices;
use super::layout::{RingHeader, RingLayout, Slot};

/// Cache-line size assumed by [`RawRing::prefetch_ahead`].
#[cfg(all(not(loom), target_arch = "x86_64"))]
const LINE: usize = 64;
/// Fewest lines [`RawRing::prefetch_ahead`] looks ahead of the next write.
#[cfg(all(not(loom), target_arch = "x86_64"))]
const PREFETCH_LINES: u32 = 8;
/// Most lines one [`RawRing::prefetch_ahead`] fetches.
#[cfg(all(not(loom), target_arch = "x86_64"))]
const PREFETCH_MAX_LINES: u32 = 64;

/// Whether the CPU executes `prefetchw` (CPUID leaf 0x8000_0001, ECX bit 8: PRFCHW, which
/// AMD calls 3DNowPrefetch; Intel since Broadwell). Asked once per process: CPUID is
/// serialising, and under a hypervisor it is a VM exit. The cache is a hint-only value, so
/// `Relaxed` is enough: a racing first call just asks twice and stores the same answer.
#[cfg(all(not(loom), target_arch = "x86_64"))]
fn cpu_has_prefetchw() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering as O};
    static CACHE: AtomicU8 = AtomicU8::new(0);
    match CACHE.load(O::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            use core::arch::x86_64::__cpuid;
            let has =
                __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0;
            CACHE.store(1 + u8::from(has), O::Relaxed);
            has
        }
    }
}

/// Other targets and loom have no write prefetch.
#[cfg(any(loom, not(target_arch = "x86_64")))]
fn cpu_has_prefetchw() -> bool {
    false
}

/// Keeps the memory behind a ring alive for as long as any handle exists.
///
/// For externally supplied regions pass whatever owns the mapping (for example an
/// `Arc<memmap2::MmapMut>` or a guard that calls `munmap` on drop); every handle clones it and the
/// last handle dropped releases it.
pub type KeepAlive = Arc<dyn Send + Sync>;

/// A ring region allocated from the global allocator.
#[derive(Debug)]
pub(crate) struct HeapRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region is plain memory owned by this value; all concurrent access to its contents
// goes through ring handles, which do their own synchronisation.
unsafe impl Send for HeapRegion {}
// SAFETY: as above; `HeapRegion` itself exposes no access to the memory.
unsafe impl Sync for HeapRegion {}

impl HeapRegion {
    /// Allocates an uninitialised region for `layout`.
    pub(crate) fn alloc(layout: &RingLayout) -> Option<Self> {
        let layout = layout.alloc_layout();
        // SAFETY: the layout's size is non-zero: it includes the header.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        Some(Self { ptr, layout })
    }

    /// Start of the region.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size of the region.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // Neither the header (atomics, integers) nor the slots (`MaybeUninit<T>` of `Copy`
        // types, loom cells) have drop glue, so freeing the memory is all there is to do.
        // SAFETY: allocated in `alloc` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A handle's view of a formatted ring region.
pub(crate) struct RawRing<T> {
    /// Start of the region (the header). Valid while `keep_alive` lives.
    hdr: NonNull<RingHeader>,
    /// Slot 0. `capacity` slots follow.
    slots: NonNull<Slot<T>>,
    /// `capacity - 1`, copied from the validated header.
    mask: u32,
    /// Number of slots, a power of two, copied from the validated header.
    capacity: u32,
    /// Owns or pins the region.
    keep_alive: KeepAlive,
    /// The CPU has `prefetchw` ([`cpu_has_prefetchw`]), for [`RawRing::prefetch_ahead`].
    prefetchw: bool,
    _elems: PhantomData<T>,
}

impl<T> Clone for RawRing<T> {
    fn clone(&self) -> Self {
        Self {
            hdr: self.hdr,
            slots: self.slots,
            mask: self.mask,
            capacity: self.capacity,
            keep_alive: Arc::clone(&self.keep_alive),
            prefetchw: self.prefetchw,
            _elems: PhantomData,
        }
    }
}

impl<T> fmt::Debug for RawRing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRing")
            .field("region", &self.hdr)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl<T> RawRing<T> {
    /// Builds a view of a validated region.
    ///
    /// # Safety
    ///
    /// `mem` must point to a region formatted for `T` with this `layout` (validated), which
    /// stays mapped and valid for reads and writes for as long as `keep_alive` lives.
    pub(crate) unsafe fn new(mem: *mut u8, layout: &RingLayout, keep_alive: KeepAlive) -> Self {
        debug_assert!(!mem.is_null() && layout.capacity().is_power_of_two());
        // SAFETY: `slots_offset` is inside the region (validated layout).
        let slots = unsafe { mem.add(layout.slots_offset()) }.cast::<Slot<T>>();
        Self {
            // SAFETY: `mem` is non-null (validated by the caller).
            hdr: unsafe { NonNull::new_unchecked(mem.cast()) },
            // SAFETY: derived from a non-null pointer by an in-bounds offset.
            slots: unsafe { NonNull::new_unchecked(slots) },
            mask: layout.capacity() as u32 - 1,
            capacity: layout.capacity() as u32,
            keep_alive,
            prefetchw: cpu_has_prefetchw(),
            _elems: PhantomData,
        }
    }

    /// Number of slots.
    #[inline(always)]
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The shared header.
    #[inline(always)]
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: the header was written by `format` and stays valid while `keep_alive` lives;
        // after formatting it is only accessed through atomics or read-only meta fields.
        unsafe { self.hdr.as_ref() }
    }

    /// The producer side's indices.
    #[inline(always)]
    pub(crate) fn producer_indices(&self) -> Indices<'_> {
        let h = self.header();
        Indices {
            head: &h.prod.head,
            rts_head: &h.prod.near.rts_head,
            tail: &h.prod.near.tail,
            opp_tail: &h.cons.near.tail,
            base: self.capacity,
            capacity: self.capacity,
        }
    }

    /// The consumer side's indices.
    #[inline(always)]
    pub(crate) fn consumer_indices(&self) -> Indices<'_> {
        let h = self.header();
        Indices {
            head: &h.cons.head,
            rts_head: &h.cons.near.rts_head,
            tail: &h.cons.near.tail,
            opp_tail: &h.prod.near.tail,
            base: 0,
            capacity: self.capacity,
        }
    }

    /// Pointer to the slot of counter `pos`.
    #[inline(always)]
    fn slot(&self, pos: u32) -> *mut Slot<T> {
        let idx = (pos & self.mask) as usize;
        debug_assert!(idx < self.capacity as usize);
        // SAFETY: `idx <= mask < capacity`, so the slot lies inside the region.
        unsafe { self.slots.as_ptr().add(idx) }
    }

    /// Writes `value` into the slot of counter `pos`.
    ///
    /// # Safety
    ///
    /// The caller must have claimed `pos` on the producer side and not yet published it.
    #[inline(always)]
    pub(crate) unsafe fn write_one(&self, pos: u32, value: T) {
        // SAFETY: the slot is in bounds; the claim gives us exclusive access (caller).
        unsafe { (*self.slot(pos)).with_mut(|p| p.write(MaybeUninit::new(value))) };
    }

    /// Reads the slot of counter `pos`.
    ///
    /// # Safety
    ///
    /// The caller must have claimed `pos` on the consumer side (so it holds a published element)
    /// and not yet released it.
    #[inline(always)]
    pub(crate) unsafe fn read_one(&self, pos: u32) -> T
    where
        T: Copy,
    {
        // SAFETY: in bounds; the element was written and published before our claim (caller).
        unsafe { (*self.slot(pos)).with(|p| (*p).assume_init()) }
    }

    /// Borrows the element in the slot of counter `pos`.
    ///
    /// # Safety
    ///
    /// As for [`RawRing::read_one`], and the slot must stay unreleased while the borrow lives.
    #[inline(always)]
    pub(crate) unsafe fn slot_ref(&self, pos: u32) -> &T {
        // SAFETY: in bounds and initialised (caller); nobody writes it until we release it.
        unsafe { (*self.slot(pos)).with(|p| (*p).assume_init_ref()) }
    }

    /// A Single producer's look-ahead: hints the CPU to fetch the slots of the counters one
    /// batch beyond the next write, at least [`PREFETCH_LINES`] lines ahead, when they are
    /// known free (`room`, from the producer's cached consumer tail, counts free counters from
    /// `next`; a stale cache only makes it smaller).
    ///
    /// On two cores the consumer read those slots one lap ago, so each of the producer's
    /// stores to them waits for a line transfer. Fetching the lines early overlaps those
    /// transfers with the current batch's copy, and the stores that follow find them in the
    /// cache owned, so they retire without waiting. The hint is `prefetchw`, which takes each
    /// line exclusive (invalidating the consumer's copy) where the CPU has it, and
    /// `prefetcht0` elsewhere. A read prefetch only brings a shared copy, and each store
    /// then waits for the invalidation round trip anyway: with the host's 100-150 ns line
    /// hand-off, `dp-perf ring` two-core SP/SC bulk 32 took 6.4-10.4 ns/elem with
    /// `prefetcht0` and 2.4-2.7 with `prefetchw`. Lines still being read by the consumer are
    /// never fetched (only free slots), and a prefetch changes no memory, so this is a hint
    /// only. It covers at most [`PREFETCH_MAX_LINES`] lines. `prefetchw` is inline assembly
    /// because the x86_64 baseline lacks the `prfchw` target feature that LLVM's
    /// `_MM_HINT_ET0` needs (it lowers that to `prefetcht0` without it).
    #[inline(always)]
    pub(crate) fn prefetch_ahead(&self, next: u32, k: u32, room: u32) {
        #[cfg(all(not(loom), target_arch = "x86_64"))]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let per_line = (LINE / size_of::<T>().max(1)).max(1) as u32;
            let dist = k.max(PREFETCH_LINES * per_line);
            let n = k.min(PREFETCH_MAX_LINES * per_line);
            if room < dist.saturating_add(n) {
                return;
            }
            let first = next.wrapping_add(dist);
            let mut i = 0;
            while i < n {
                let p = self.slot(first.wrapping_add(i)).cast::<i8>().cast_const();
                if self.prefetchw {
                    // SAFETY: `prefetchw` exists on this CPU (`cpu_has_prefetchw`); a
                    // prefetch never faults, writes nothing and touches no register or flag
                    // but its address operand (`slot` masks the counter, so the address is
                    // inside the slot array anyway).
                    unsafe {
                        core::arch::asm!(
                            "prefetchw byte ptr [{0}]",
                            in(reg) p,
                            options(nostack, preserves_flags, readonly)
                        )
                    };
                } else {
                    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; a
                    // prefetch never faults and accesses no memory in the abstract machine.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
                }
                i += per_line;
            }
        }
        #[cfg(any(loom, not(target_arch = "x86_64")))]
        let _ = (next, k, room);
    }

    /// Copies `src` into the slots of counters `start .. start + src.len()`, wrapping at the end
    /// of the slot array.
    ///
    /// The copy is inline ([`copy_run`], no `memcpy` call); a run that wraps is split in two by
    /// an out-of-line function, since that happens about once per lap of the ring.
    ///
    /// # Safety
    ///
    /// The caller must have claimed those counters on the producer side and not yet published
    /// them; `src.len() <= capacity`.
    #[inline(always)]
    pub(crate) unsafe fn write_run(&self, start: u32, src: &[T])
    where
        T: Copy,
    {
        let idx = (start & self.mask) as usize;
        debug_assert!(src.len() <= self.capacity as usize);
        #[cfg(not(loom))]
        {
            if src.len() <= self.capacity as usize - idx {
                // SAFETY: slots `idx .. idx + len` are inside the array (checked just above)
                // and claimed by us, so no other reference (not even a `peek`ed element passed
                // back in as `src`) points into them: no overlap with `src`. Slot<T> is
                // repr(transparent) over MaybeUninit<T>, itself transparent over T.
                unsafe { copy_run(src.as_ptr(), self.slot(start).cast::<T>(), src.len()) };
            } else {
                // SAFETY: forwarded caller contract; the run wraps (`len > capacity - idx`).
                unsafe { self.write_wrapped(idx, src) };
            }
        }
        #[cfg(loom)]
        {
            let first = src.len().min(self.capacity as usize - idx);
            for (i, v) in src.iter().enumerate() {
                // Same two-part split as the inline path, element by element so loom sees each
                // slot access.
                let slot = if i < first { idx + i } else { i - first };
                // SAFETY: `slot < capacity` by the split arithmetic; claimed by us (caller).
                unsafe {
                    (*self.slots.as_ptr().add(slot)).with_mut(|p| p.write(MaybeUninit::new(*v)))
                };
            }
        }
    }

    /// The wrapping case of [`RawRing::write_run`]: `src[..cap - idx]` to the slots from `idx`
    /// to the end, the rest to the slots from 0.
    ///
    /// # Safety
    ///
    /// As for `write_run`, with `idx < capacity < idx + src.len()`.
    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    unsafe fn write_wrapped(&self, idx: usize, src: &[T])
    where
        T: Copy,
    {
        let first = self.capacity as usize - idx;
        debug_assert!(first < src.len() && src.len() <= self.capacity as usize);
        let base = self.slots.as_ptr().cast::<T>();
        // SAFETY: slots `idx .. capacity` are in the array and claimed by us; `src` holds more
        // than `first` elements and cannot overlap claimed slots (see `write_run`).
        unsafe { copy_run(src.as_ptr(), base.add(idx), first) };
        // SAFETY: the wrapped part is slots `0 .. len - first`, and `len - first <= idx`
        // because `len <= capacity`; claimed by us.
        unsafe { copy_run(src.as_ptr().add(first), base, src.len() - first) };
    }

    /// Copies the slots of counters `start .. start + dst.len()` into `dst`, inline, like
    /// [`RawRing::write_run`].
    ///
    /// # Safety
    ///
    /// The caller must have claimed those counters on the consumer side and not yet released
    /// them; `dst.len() <= capacity`.
    #[inline(always)]
    pub(crate) unsafe fn read_run(&self, start: u32, dst: &mut [T])
    where
        T: Copy,
    {
        let idx = (start & self.mask) as usize;
        debug_assert!(dst.len() <= self.capacity as usize);
        #[cfg(not(loom))]
        {
            if dst.len() <= self.capacity as usize - idx {
                let src = self.slot(start).cast::<T>().cast_const();
                // SAFETY: slots `idx .. idx + len` are in the array (checked just above),
                // claimed by us and published (initialised) before our claim; `dst` is a
                // distinct exclusive borrow.
                unsafe { copy_run(src, dst.as_mut_ptr(), dst.len()) };
            } else {
                // SAFETY: forwarded caller contract; the run wraps (`len > capacity - idx`).
                unsafe { self.read_wrapped(idx, dst) };
            }
        }
        #[cfg(loom)]
        {
            let first = dst.len().min(self.capacity as usize - idx);
            for (i, v) in dst.iter_mut().enumerate() {
                let slot = if i < first { idx + i } else { i - first };
                // SAFETY: `slot < capacity` by the split arithmetic; claimed and published
                // (caller).
                *v = unsafe { (*self.slots.as_ptr().add(slot)).with(|p| (*p).assume_init()) };
            }
        }
    }

    /// The wrapping case of [`RawRing::read_run`].
    ///
    /// # Safety
    ///
    /// As for `read_run`, with `idx < capacity < idx + dst.len()`.
    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    unsafe fn read_wrapped(&self, idx: usize, dst: &mut [T])
    where
        T: Copy,
    {
        let first = self.capacity as usize - idx;
        debug_assert!(first < dst.len() && dst.len() <= self.capacity as usize);
        let base = self.slots.as_ptr().cast::<T>().cast_const();
        // SAFETY: slots `idx .. capacity` are in the array, claimed and published; `dst` holds
        // more than `first` elements and is a distinct exclusive borrow.
        unsafe { copy_run(base.add(idx), dst.as_mut_ptr(), first) };
        // SAFETY: wrapped part `0 .. len - first` with `len - first <= idx`; as above.
        unsafe { copy_run(base, dst.as_mut_ptr().add(first), dst.len() - first) };
    }
}

#[cfg(all(test, not(loom), target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// The CPUID answer (asked twice: once to fill the cache, once from it) agrees with the
    /// kernel's own reading of the same bit, the `3dnowprefetch` flag in /proc/cpuinfo.
    #[test]
    fn prefetchw_detection_matches_the_kernel() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("Linux has /proc/cpuinfo");
        let flags = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("/proc/cpuinfo has a flags line on x86_64");
        let kernel = flags.split_whitespace().any(|f| f == "3dnowprefetch");
        assert_eq!(super::cpu_has_prefetchw(), kernel);
        assert_eq!(super::cpu_has_prefetchw(), kernel);
    }
}
