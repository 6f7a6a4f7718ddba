//! The position-independent memory layout of a ring: header, slot array, formatting and
//! validation.
//!
//! ```text
//! offset (x86_64)   contents                                        written by
//! 0                 RingMeta: magic, version, element size/align,   init_in only
//!                   capacity, mask, slot offset, side modes
//! 128               prod.head: the Multi head word (CachePadded)   producers
//! 256               prod.near: tail word, RTS head word            producers
//! 384               cons.head: the Multi head word                  consumers
//! 512               cons.near: tail word, RTS head word             consumers
//! 640               slot[0] .. slot[capacity - 1]                   producers / consumers
//! ```
//!
//! The region holds indices only, never pointers, so it may be mapped at different addresses in
//! different processes. What the words of a side hold depends on the side's mode (`index.rs`);
//! the low half of each tail word is always that side's published position.
//!
//! Every block is a 128-byte line pair (crossbeam's `CachePadded`, sized for the adjacent-line
//! prefetcher), and the two sides share none. Within a side, the words are placed by who reads
//! them:
//!
//! - The opposite side reads only the tail word. A Multi side's head word, which only its own
//!   side reads and CASes, has a line pair of its own: when the opposite side polls the tail, it
//!   does not take the line the next claim's CAS needs. With one thread on each side (an MP/MC
//!   ring between two pipeline stages) that CAS stays on a line the claimant already owns. A
//!   version-3 layout kept the Multi head beside the tail, as DPDK does, and the two-core MP/MC
//!   bulk-32 ring case was 8 % slower for it (median of 6 alternated runs), and the two-core
//!   cache-less pool, where both threads claim on both sides, was no faster.
//! - An RTS side moves its head and tail words with two CASes per operation, and RTS is made
//!   for many threads per side: the two words share the line pair, so a claimant that takes
//!   over the side pulls one line pair, not two.
//! - HTS keeps head and tail in the tail word, and a Single side writes only its tail word.

use core::alloc::Layout;
use core::mem::{MaybeUninit, align_of, size_of};
use core::ptr;

use crossbeam_utils::CachePadded;

use super::error::RingError;
use super::index::initial_words;
use super::mode::{Side, SyncType, mode_name};
use crate::sync::UnsafeCell;
use crate::sync::atomic::AtomicU64;

/// Element types that may live in a ring shared between processes.
///
/// # Safety
///
/// Implement this only for `#[repr(C)]` (or primitive) plain-old-data types such that:
/// - every bit pattern is a valid value (another process may be buggy; reading its bytes must
///   never be undefined behaviour), so no `bool`, `char`, enums or `NonZero*`;
/// - the type contains no pointers, references, or anything else that is meaningful only in one
///   address space (`Box`, `&T`, `Arc`, file descriptors, function pointers);
/// - the type has no interior mutability and no `Drop` (it is `Copy`);
/// - every process that maps the ring uses the same definition (same field order and types).
pub unsafe trait ShmSafe: Copy + Send + 'static {}

macro_rules! shm_safe {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: a primitive integer or float: no pointers, every bit pattern is valid.
            unsafe impl ShmSafe for $t {}
        )*
    };
}

shm_safe!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);

// SAFETY: an array of `ShmSafe` elements has no padding between elements, no pointers, and every
// bit pattern of it is a sequence of valid elements.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}

/// One slot of the ring. Outside loom this has exactly the layout of `T`.
pub(crate) type Slot<T> = UnsafeCell<MaybeUninit<T>>;

/// `b"dp-ring\0"` read as a little-endian `u64`.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"dp-ring\0");

/// Layout version; bump on any change to [`RingMeta`] or [`RingHeader`] or to what their
/// fields mean.
///
/// 4: a Multi side's head word has a line pair of its own (it was beside the tail word, where
/// the RTS head word stays); slot 0 moves from offset 384 to 640.
/// 3: a Multi side's head word caches the opposite position in its high half (version 2 kept
/// it 0: a version-2 process sharing a Multi side would corrupt that cache, so it is refused).
/// 2: the two words of each side share a line pair and are 64 bits wide (RTS and HTS modes);
/// version 1 had four `u32` counters on four line pairs.
pub(crate) const VERSION: u32 = 4;

/// Immutable description of the ring, written once by `init_in`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingMeta {
    /// [`MAGIC`] once the ring is formatted.
    pub(crate) magic: u64,
    /// [`VERSION`].
    pub(crate) version: u32,
    /// `size_of::<T>()`.
    pub(crate) elem_size: u32,
    /// `align_of::<T>()`.
    pub(crate) elem_align: u32,
    /// Number of slots; a power of two, at most [`RingLayout::MAX_CAPACITY`].
    pub(crate) capacity: u32,
    /// `capacity - 1`.
    pub(crate) mask: u32,
    /// Byte offset of slot 0 from the start of the header.
    pub(crate) slots_offset: u32,
    /// [`SyncType`] of the producer side, as stored (`SyncType::id`).
    pub(crate) prod_mode: u32,
    /// [`SyncType`] of the consumer side, as stored.
    pub(crate) cons_mode: u32,
}

/// The shared words of one side (see `index.rs` for what they hold in each mode).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct HeadTail {
    /// The Multi head word, on a line pair of its own: the opposite side never reads it.
    pub(crate) head: CachePadded<AtomicU64>,
    /// The words on the line pair the opposite side reads.
    pub(crate) near: CachePadded<TailWords>,
}

/// The tail word and the RTS head word beside it.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct TailWords {
    /// The tail word: its low half is the side's published position.
    pub(crate) tail: AtomicU64,
    /// The RTS head word (op count and position), next to the tail it is moved with.
    pub(crate) rts_head: AtomicU64,
}

/// The shared ring header. See the [module docs](self) for the picture.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct RingHeader {
    /// Written by `init_in` before any handle exists; read-only afterwards.
    pub(crate) meta: CachePadded<RingMeta>,
    /// The producer side: below its tail position every counter holds a published element.
    pub(crate) prod: HeadTail,
    /// The consumer side: below its tail position every counter has been consumed, and its
    /// slot may be overwritten.
    pub(crate) cons: HeadTail,
}

// Layout checks. Under loom the atomics are model objects of another size, and the layout only
// has to be self-consistent within one heap allocation, so these hold for real builds only.
#[cfg(not(loom))]
const _: () = {
    use core::mem::offset_of;
    assert!(size_of::<RingMeta>() == 40);
    assert!(align_of::<RingMeta>() == 8);
    assert!(offset_of!(RingMeta, magic) == 0);
    assert!(offset_of!(RingMeta, capacity) == 20);
    assert!(offset_of!(RingMeta, cons_mode) == 36);
    assert!(size_of::<AtomicU64>() == 8 && align_of::<AtomicU64>() == 8);

    // Every field starts on its own cache-line (pair) boundary and the fields do not overlap.
    let line = align_of::<CachePadded<u8>>();
    let pad = size_of::<CachePadded<RingMeta>>();
    assert!(pad.is_multiple_of(line) && pad >= size_of::<RingMeta>());
    assert!(size_of::<TailWords>() == 16);
    assert!(offset_of!(TailWords, tail) == 0);
    assert!(offset_of!(TailWords, rts_head) == 8);
    assert!(size_of::<CachePadded<AtomicU64>>() == line);
    assert!(size_of::<CachePadded<TailWords>>() == line);
    assert!(size_of::<HeadTail>() == 2 * line);
    assert!(offset_of!(HeadTail, head) == 0);
    assert!(offset_of!(HeadTail, near) == line);
    assert!(offset_of!(RingHeader, meta) == 0);
    assert!(offset_of!(RingHeader, prod) == pad);
    assert!(offset_of!(RingHeader, cons) == pad + 2 * line);
    assert!(size_of::<RingHeader>() == pad + 4 * line);
    assert!(align_of::<RingHeader>() == line);
};

// The concrete numbers on the 128-byte-padded targets we run on.
#[cfg(all(not(loom), any(target_arch = "x86_64", target_arch = "aarch64")))]
const _: () = {
    use core::mem::offset_of;
    assert!(align_of::<RingHeader>() == 128);
    assert!(offset_of!(RingHeader, prod) == 128);
    assert!(offset_of!(RingHeader, cons) == 384);
    assert!(size_of::<RingHeader>() == 640);
};

/// Size and alignment of a ring's memory region, for a given element type and capacity.
///
/// ```
/// use mempool::ring::RingLayout;
///
/// let layout = RingLayout::new::<u64>(1024).unwrap();
/// assert_eq!(layout.capacity(), 1024);
/// assert_eq!(layout.bytes(), layout.slots_offset() + 1024 * 8);
/// assert_eq!(RingLayout::bytes_for::<u64>(1024), Ok(layout.bytes()));
/// assert!(RingLayout::new::<u64>(1000).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    capacity: u32,
    slots_offset: usize,
    bytes: usize,
    align: usize,
}

impl RingLayout {
    /// Largest supported capacity. Free-running `u32` counters stay unambiguous as long as the
    /// distance between a head and the opposite tail (at most the capacity) is below 2^32.
    pub const MAX_CAPACITY: usize = 1 << 31;

    /// Computes the layout of a ring of `capacity` elements of type `T`.
    ///
    /// # Errors
    ///
    /// [`RingError::ZeroCapacity`], [`RingError::CapacityNotPowerOfTwo`],
    /// [`RingError::CapacityTooLarge`], or [`RingError::SizeOverflow`] if the region would not
    /// fit in the address space.
    pub fn new<T>(capacity: usize) -> Result<Self, RingError> {
        const {
            // Slots are `T` plus loom bookkeeping under loom, exactly `T` otherwise.
            assert!(cfg!(loom) || size_of::<Slot<T>>() == size_of::<T>());
        }
        if capacity == 0 {
            return Err(RingError::ZeroCapacity);
        }
        if capacity > Self::MAX_CAPACITY {
            return Err(RingError::CapacityTooLarge {
                requested: capacity,
                max: Self::MAX_CAPACITY,
            });
        }
        if !capacity.is_power_of_two() {
            return Err(RingError::CapacityNotPowerOfTwo {
                requested: capacity,
            });
        }
        let overflow = RingError::SizeOverflow {
            capacity,
            elem_size: size_of::<T>(),
        };
        let slots_offset = Self::slots_offset_for::<T>();
        let bytes = capacity
            .checked_mul(size_of::<Slot<T>>())
            .and_then(|s| s.checked_add(slots_offset))
            .ok_or(overflow)?;
        let align = Self::align_for::<T>();
        // `Layout` also rejects sizes that would exceed `isize::MAX` once rounded up.
        Layout::from_size_align(bytes, align).map_err(|_| overflow)?;
        Ok(Self {
            // Fits: capacity <= MAX_CAPACITY = 2^31.
            capacity: capacity as u32,
            slots_offset,
            bytes,
            align,
        })
    }

    /// Bytes a ring of `capacity` elements of type `T` occupies: header plus slots.
    ///
    /// # Errors
    ///
    /// As for [`RingLayout::new`].
    pub fn bytes_for<T>(capacity: usize) -> Result<usize, RingError> {
        Self::new::<T>(capacity).map(|l| l.bytes)
    }

    /// Alignment the region of a ring of `T` must have: the header's cache-line alignment or
    /// `T`'s, whichever is larger. Page-aligned mappings always satisfy it.
    pub fn align_for<T>() -> usize {
        align_of::<RingHeader>().max(align_of::<Slot<T>>())
    }

    fn slots_offset_for<T>() -> usize {
        size_of::<RingHeader>().next_multiple_of(align_of::<Slot<T>>())
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Total size of the region in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Required alignment of the region.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Offset of the first slot from the start of the region.
    pub fn slots_offset(&self) -> usize {
        self.slots_offset
    }

    /// The region as an allocator [`Layout`].
    pub fn alloc_layout(&self) -> Layout {
        // Validated in `new`.
        Layout::from_size_align(self.bytes, self.align).unwrap_or_else(|_| unreachable!())
    }
}

/// Checks pointer, alignment and length of a region for a ring of `T`.
fn check_region<T>(mem: *mut u8, len: usize, needed: usize) -> Result<(), RingError> {
    if mem.is_null() {
        return Err(RingError::NullRegion);
    }
    let align = RingLayout::align_for::<T>();
    if !(mem as usize).is_multiple_of(align) {
        return Err(RingError::Misaligned {
            addr: mem as usize,
            align,
        });
    }
    if len < needed {
        return Err(RingError::RegionTooSmall { needed, len });
    }
    Ok(())
}

/// Writes a fresh header (every counter at `start`, in the words of each side's mode) and
/// prepares the slots.
///
/// # Safety
///
/// `mem` must be valid for writes of `len` bytes, and nothing else may access the region during
/// the call (other threads or processes may attach only after this returns and the caller has
/// published that fact to them).
pub(crate) unsafe fn format<T>(
    mem: *mut u8,
    len: usize,
    capacity: usize,
    start: u32,
    prod: SyncType,
    cons: SyncType,
) -> Result<RingLayout, RingError> {
    let layout = RingLayout::new::<T>(capacity)?;
    check_region::<T>(mem, len, layout.bytes)?;
    let meta = RingMeta {
        magic: MAGIC,
        version: VERSION,
        elem_size: size_of::<T>() as u32,
        elem_align: align_of::<T>() as u32,
        capacity: layout.capacity,
        mask: layout.capacity - 1,
        slots_offset: layout.slots_offset as u32,
        prod_mode: prod.id(),
        cons_mode: cons.id(),
    };
    // The head value goes to both head words; the mode uses one of them.
    let side = |(head, tail): (u64, u64)| HeadTail {
        head: CachePadded::new(AtomicU64::new(head)),
        near: CachePadded::new(TailWords {
            tail: AtomicU64::new(tail),
            rts_head: AtomicU64::new(head),
        }),
    };
    let header = RingHeader {
        meta: CachePadded::new(meta),
        prod: side(initial_words(prod, start)),
        cons: side(initial_words(cons, start)),
    };
    // SAFETY: the region is valid for `layout.bytes` writes (checked length, caller contract),
    // aligned for the header (checked), and exclusively ours during formatting.
    unsafe { ptr::write(mem.cast::<RingHeader>(), header) };
    if cfg!(loom) {
        // loom cells carry model state and must be constructed; real slots are plain
        // `MaybeUninit<T>` and need no initialisation.
        // SAFETY: `slots_offset` is within the region and aligned for `Slot<T>` (layout).
        let slots = unsafe { mem.add(layout.slots_offset) }.cast::<Slot<T>>();
        for i in 0..layout.capacity() {
            // SAFETY: `i < capacity`, so slot `i` lies inside the region.
            unsafe { ptr::write(slots.add(i), Slot::<T>::new(MaybeUninit::uninit())) };
        }
    }
    Ok(layout)
}

/// Validates the header at `mem` for element type `T` and the given side modes.
///
/// `side_modes` lists the sides the caller will create handles for, with their modes.
///
/// # Safety
///
/// `mem` must be valid for reads of `len` bytes, and if the region holds a ring header, its
/// `init_in` must happen-before this call.
pub(crate) unsafe fn validate<T>(
    mem: *mut u8,
    len: usize,
    side_modes: &[(Side, u32, &'static str)],
) -> Result<RingLayout, RingError> {
    check_region::<T>(mem, len, size_of::<RingHeader>())?;
    // SAFETY: the region is aligned for the header and at least header-sized (checked), valid
    // for reads (caller), and the meta part is never written after `init_in`, which
    // happened-before this call (caller).
    let meta: RingMeta = unsafe { ptr::read(mem.cast::<RingMeta>()) };
    if meta.magic != MAGIC {
        return Err(RingError::BadMagic { found: meta.magic });
    }
    if meta.version != VERSION {
        return Err(RingError::VersionMismatch {
            found: meta.version,
            expected: VERSION,
        });
    }
    let expected_offset = RingLayout::slots_offset_for::<T>() as u32;
    if meta.slots_offset != expected_offset {
        return Err(RingError::LayoutMismatch {
            found: meta.slots_offset,
            expected: expected_offset,
        });
    }
    if meta.elem_size as usize != size_of::<T>() || meta.elem_align as usize != align_of::<T>() {
        return Err(RingError::ElementMismatch {
            found_size: meta.elem_size,
            found_align: meta.elem_align,
            expected_size: size_of::<T>() as u32,
            expected_align: align_of::<T>() as u32,
        });
    }
    let corrupt = RingError::CorruptHeader {
        capacity: meta.capacity,
        mask: meta.mask,
    };
    if meta.mask != meta.capacity.wrapping_sub(1) {
        return Err(corrupt);
    }
    let layout = RingLayout::new::<T>(meta.capacity as usize).map_err(|_| corrupt)?;
    if len < layout.bytes {
        return Err(RingError::RegionTooSmall {
            needed: layout.bytes,
            len,
        });
    }
    for &(side, id, name) in side_modes {
        let found = match side {
            Side::Producer => meta.prod_mode,
            Side::Consumer => meta.cons_mode,
        };
        if found != id {
            return Err(RingError::ModeMismatch {
                side,
                found: mode_name(found),
                expected: name,
            });
        }
    }
    Ok(layout)
}
