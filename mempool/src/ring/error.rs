//! Errors of ring creation and attachment.
//!
//! The data path (enqueue/dequeue) never produces a [`RingError`]: a full or empty ring is
//! reported through the return value (`Err(value)`, `None`, a short count). These errors come only
//! from constructors, where a caller passed a bad capacity or a region that does not hold a ring
//! of the expected shape.

use super::mode::Side;

/// Why a ring could not be created or attached.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A capacity of zero was requested.
    #[error("ring capacity must be at least 1 (a power of two); got 0")]
    ZeroCapacity,
    /// The capacity is not a power of two.
    #[error(
        "ring capacity {requested} is not a power of two; round it up with \
         usize::next_power_of_two()"
    )]
    CapacityNotPowerOfTwo {
        /// The capacity that was asked for.
        requested: usize,
    },
    /// The capacity exceeds what free-running 32-bit indices can address.
    #[error("ring capacity {requested} exceeds the maximum of {max} slots")]
    CapacityTooLarge {
        /// The capacity that was asked for.
        requested: usize,
        /// The largest supported capacity.
        max: usize,
    },
    /// Header plus slots do not fit in `usize` (or in an allocation of `isize::MAX` bytes).
    #[error("a ring of {capacity} slots of {elem_size} bytes does not fit in the address space")]
    SizeOverflow {
        /// Requested number of slots.
        capacity: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// The global allocator returned null for the ring memory.
    #[error("allocating {bytes} bytes for the ring failed")]
    AllocFailed {
        /// Bytes requested from the allocator.
        bytes: usize,
    },
    /// The region pointer is null.
    #[error("the ring region pointer is null")]
    NullRegion,
    /// The region is not aligned enough for the ring header or the element type.
    #[error(
        "the ring region at {addr:#x} is not aligned to {align} bytes; \
         map it page-aligned or use RingLayout::alloc_layout()"
    )]
    Misaligned {
        /// Address of the region.
        addr: usize,
        /// Alignment the ring needs (`RingLayout::align()`).
        align: usize,
    },
    /// The region is smaller than header plus slots.
    #[error(
        "the ring region holds {len} bytes but the ring needs {needed}; \
         size it with RingLayout::bytes_for()"
    )]
    RegionTooSmall {
        /// Bytes the ring needs.
        needed: usize,
        /// Bytes the caller supplied.
        len: usize,
    },
    /// The region does not start with the ring magic: it was never formatted with `init_in`, or
    /// it was overwritten.
    #[error(
        "no ring header in the region (magic {found:#018x}); format it with Ring::init_in first"
    )]
    BadMagic {
        /// The 8 bytes found where the magic should be.
        found: u64,
    },
    /// The region was formatted by an incompatible version of this crate.
    #[error(
        "the ring header has layout version {found}, this build understands {expected}; \
         rebuild both processes from the same source"
    )]
    VersionMismatch {
        /// Version stored in the header.
        found: u32,
        /// Version this build writes.
        expected: u32,
    },
    /// The header was written by a build whose header layout differs (e.g. another cache-line
    /// padding), so slot offsets would disagree.
    #[error(
        "the ring header says slots start at byte {found}, this build expects {expected}; \
         both processes must be built for the same target"
    )]
    LayoutMismatch {
        /// Slot offset stored in the header.
        found: u32,
        /// Slot offset this build computes.
        expected: u32,
    },
    /// The ring stores elements of another size or alignment than `T`.
    #[error(
        "the ring stores {found_size}-byte elements aligned to {found_align}, but the element \
         type has size {expected_size} and alignment {expected_align}; attach with the type \
         the ring was formatted for"
    )]
    ElementMismatch {
        /// Element size stored in the header.
        found_size: u32,
        /// Element alignment stored in the header.
        found_align: u32,
        /// `size_of::<T>()` of the attaching type.
        expected_size: u32,
        /// `align_of::<T>()` of the attaching type.
        expected_align: u32,
    },
    /// The capacity or mask in the header is inconsistent (not a power of two, mask is not
    /// `capacity - 1`, or larger than the supported maximum).
    #[error("corrupt ring header: capacity {capacity}, mask {mask:#x}")]
    CorruptHeader {
        /// Capacity stored in the header.
        capacity: u32,
        /// Mask stored in the header.
        mask: u32,
    },
    /// A side was formatted as single-threaded and attached as multi-threaded, or vice versa.
    #[error(
        "the ring's {side} side was formatted as {found} but attached as {expected}; use the \
         synchronisation mode the ring was created with"
    )]
    ModeMismatch {
        /// Which side disagrees.
        side: Side,
        /// Mode name stored in the header.
        found: &'static str,
        /// Mode name of the attaching handle.
        expected: &'static str,
    },
}
