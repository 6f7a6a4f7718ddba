//! Fixed-size lock-free FIFO rings with DPDK `rte_ring` semantics, in process memory or in memory
//! shared between processes.
//!
//! # Model
//!
//! A ring is an array of `capacity` slots (a power of two) plus a head and a tail per side.
//! Positions are free-running `u32` counters: they only ever increase (wrapping at 2^32) and
//! become slot indices by masking with `capacity - 1`, so a full ring holds exactly `capacity`
//! elements and no slot is sacrificed to tell full from empty (DPDK's `RING_F_EXACT_SZ`
//! behaviour).
//!
//! ```text
//!  cons_tail        cons_head           prod_tail         prod_head        cons_tail + capacity
//!      | being dequeued |  ready to dequeue |  being enqueued |       free       |
//! ```
//!
//! Each side has a synchronisation mode, chosen per side as with DPDK's ring flags: at the type
//! level ([`Single`], [`Multi`], [`Rts`], [`Hts`]; see [`SyncType`] for the comparison) or at
//! run time ([`Ring::with_sync`], giving [`AnyProducer`]/[`AnyConsumer`]). DPDK's four classic
//! combinations are [`Spsc`], [`Mpsc`], [`Spmc`] and [`Mpmc`]. Every mode follows one
//! protocol:
//!
//! 1. **Claim** `n` counters by moving the side's head: compute the room left against the
//!    opposite side's tail (`capacity + cons_tail - prod_head` free slots for the producer,
//!    `prod_tail - cons_head` filled slots for the consumer).
//! 2. **Copy** the elements in or out: an inline loop over the claimed slots, split in two
//!    when the run wraps at the end of the slot array (no `memcpy` call, see `copy.rs`).
//! 3. **Publish** by moving the side's tail with Release, which hands the slots to the other
//!    side.
//!
//! The opposite side only ever reads a side's tail position, which sits at the same place in
//! every mode, so the two sides of a ring may have any two modes.
//!
//! Operations come in DPDK's flavours: single element ([`Producer::enqueue`],
//! [`Consumer::dequeue`]), *bulk* (all `n` or nothing: [`Producer::enqueue_bulk`],
//! [`Consumer::dequeue_bulk`]) and *burst* (as many as possible: [`Producer::enqueue_burst`],
//! [`Consumer::dequeue_burst`]).
//!
//! ## Single-producer / single-consumer path
//!
//! A [`Single`] side has one writer, so its head is a plain field of the handle and the shared
//! head is not touched at all. The handle also caches the opposite tail and reloads it (Acquire)
//! only when the cached value says the ring is possibly full (producer) or possibly empty
//! (consumer). While the consumer keeps up, a producer therefore reads the consumer's tail
//! roughly once per lap of the ring rather than once per operation, and the hot path is: compare,
//! copy, one Release store.
//!
//! ## Multi-producer / multi-consumer path
//!
//! A [`Multi`] side follows DPDK's default sync mode (`rte_ring_c11_pvt.h`): load the shared head,
//! compute the room, CAS the head forward by `n` (retrying on contention), copy, then **wait until
//! the tail equals the head we started from** before storing the new tail. Claims are serialised
//! by the CAS, copies run in parallel, and publication happens in claim order, so the opposite
//! side only ever sees a gap-free prefix.
//!
//! Unlike DPDK, the side caches the opposite tail: the high half of its head word holds the last
//! opposite position a claimant loaded, moved together with the head by the claim CAS, and a
//! claimant reloads the opposite tail only when that position says there is not enough room.
//! DPDK loads the opposite tail on every operation, pulling the other side's line over while
//! that side is busy. The cache is the side's, not a handle's, so it cannot go stale: the claim
//! CAS keeps `head` within `capacity` of it (see `mt.rs`).
//!
//! RTS and HTS handles cache the opposite tail per handle instead (their head words have no
//! room for it), and reload it only when it looks short or impossible. **Such a handle idle
//! while the other handles of its side move about 2^32 counters** (counters are u32) can find
//! its copy looking valid again and claim what is not there (a consumer: slots whose elements
//! were already taken). The pools reload before each ring operation (the cache-less port) and
//! each cache miss; a program that keeps its own clone of an RTS or HTS handle idle that long
//! should do the same (make one operation on a fresh clone of the ring's handles), or use
//! DPDK's rule of one load per operation.
//!
//! ## RTS and HTS
//!
//! DPDK's two other multi-thread modes, for threads that may be preempted:
//!
//! - [`Rts`] (relaxed tail sync): head and tail carry an operation count next to the position.
//!   A finishing thread counts itself on the tail with a CAS, and the one that finds no other
//!   claim unfinished moves the tail to the head. Nobody waits for a predecessor; a preempted
//!   thread holds back publication, and the others keep claiming until the head is `htd_max`
//!   (`capacity / 8` unless set with [`Producer::set_htd_max`]) ahead of the tail.
//! - [`Hts`] (head/tail sync): head and tail share one 64-bit word and a thread claims only when
//!   they are equal, so a side runs one operation at a time: two line-local atomic operations
//!   per operation and no ordering among claimants to maintain. DPDK builds its peek and
//!   zero-copy APIs on this mode; those are not provided here.
//!
//! ## Memory-ordering edges
//!
//! Labels follow DPDK's style and appear at every atomic access:
//!
//! | label | operation | pairs with | what it orders |
//! |-------|-----------|------------|----------------|
//! | R1 | producer publishes `prod.tail`, Release (store, or CAS in RTS) | A1 | slot writes before the consumer's reads |
//! | A1 | consumer loads `prod.tail`, Acquire | R1 | |
//! | R2 | consumer publishes `cons.tail`, Release | A2 | slot reads before the producer's next writes of those slots |
//! | A2 | producer loads `cons.tail`, Acquire | R2 | |
//! | R3 | Multi/RTS head CAS success, Release | A3 | a later head mover sees at least our view of the opposite tail (Multi: and the slot accesses below the opposite position cached in the word) |
//! | A3 | Multi/RTS head load / CAS failure, Acquire | R3 | (so its room computation never underflows) |
//! | A4 | Multi tail wait, Acquire | R1 / R2 of the same-side predecessor | predecessor's slot accesses before our tail store |
//! | A5 | HTS word load / CAS failure, Acquire | R1 / R2 of the same-side predecessor | predecessor's operation before our claim |
//! | A6 | RTS tail load / CAS failure, Acquire | R1 / R2 of earlier finishers | the head we read is at least as new as theirs |
//!
//! A4 is stronger than DPDK's relaxed tail wait: in the C11 model a plain store does not extend
//! a release sequence, so without it a consumer that acquires our tail would not be formally
//! ordered after the predecessor's slot writes (loom reports exactly that race when A4 is
//! weakened). On x86 Acquire loads are plain loads, so it is free where it matters most. The
//! three Relaxed accesses (the HTS claim CAS, the RTS finisher's head load and the RTS distance
//! check) are justified where they occur (`hts.rs`, `rts.rs`), and weakening any labelled edge
//! to `Relaxed` makes a loom model fail (see `tests/loom_ring.rs`).
//!
//! ## Waiting, and preemption
//!
//! A Multi thread between its head CAS and its tail store blocks every later claimant on the
//! same side: they cannot publish until it does (the tail wait). An HTS thread blocks every other
//! thread of its side from claiming at all. If it is preempted there, its peers wait for a
//! whole scheduler time slice; with real-time priorities (`SCHED_FIFO`) on a shared core the
//! waiter may never let the holder run again. DPDK documents the same limitation. RTS removes
//! the wait for a predecessor to *finish*; only the head/tail distance limit remains.
//!
//! Every such wait spins with [`core::hint::spin_loop`] for up to 50 us and then also calls
//! [`std::thread::yield_now`] on every retry: a predecessor that is merely slow is waited out on
//! the spot, and overcommitted non-RT threads (for example four test threads on a two-core box)
//! still make progress. (Yielding after a few microseconds instead cost most of the throughput
//! of two contending threads on a loaded host; see `SpinWait` in `src/sync.rs`.) For preemptible
//! or RT threads prefer RTS, or one [`Single`] ring per producer/consumer pair: Single sides
//! never wait for anyone.
//!
//! A process that shares a Multi, RTS or HTS side is trusted to make progress, as a lock holder
//! is: one that stops mid-operation stalls the side's other users (never the opposite side's
//! Single handle, and never memory safety).
//!
//! # Example
//!
//! ```
//! use mempool::ring::{Ring, Single};
//!
//! let (mut tx, mut rx) = Ring::<u64>::with_capacity::<Single, Single>(8)?;
//! assert_eq!(tx.enqueue_bulk(&[1, 2, 3]), 3);
//! assert_eq!(tx.enqueue_burst(&[4, 5, 6, 7, 8, 9, 10]), 5); // only 5 slots were left
//! assert_eq!(tx.enqueue(11), Err(11));
//! let mut out = [0u64; 4];
//! assert_eq!(rx.dequeue_bulk(&mut out), 4);
//! assert_eq!(out, [1, 2, 3, 4]);
//! assert_eq!(rx.dequeue(), Some(5));
//! assert_eq!(rx.len(), 3);
//! # Ok::<(), mempool::ring::RingError>(())
//! ```
//!
//! # Shared memory
//!
//! The ring region is a `#[repr(C)]` header followed by the slots (see [`RingLayout`]); it holds
//! only counters, never pointers, so it works at different addresses in different processes. The
//! heap constructor [`Ring::with_capacity`] formats an allocation through the same code as
//! [`Ring::init_in`], which formats caller-supplied memory; [`Ring::attach_producer`] and
//! [`Ring::attach_consumer`] validate a formatted region (magic, version, element size and
//! alignment, capacity, side modes) and return handles, failing with a [`RingError`] rather than
//! panicking. Elements of shared rings must implement [`ShmSafe`]. Handles over external memory
//! hold a [`KeepAlive`] supplied by the caller, so the mapping outlives every handle.
//!
//! A misbehaving peer process can corrupt the elements and counters but cannot make this process
//! access memory outside the region: capacity and mask are copied out of the header once, at
//! attach time, and every request is clamped to the capacity before it meets the shared
//! counters.
//!
//! ```
//! use std::sync::Arc;
//! use mempool::ring::{KeepAlive, Multi, Ring, RingLayout, Single};
//!
//! // Stand-in for a shared mapping (normally a memfd or hugepage region mapped by both
//! // processes): any memory aligned to `RingLayout::align_for::<T>()` works.
//! #[derive(Clone, Copy)]
//! #[repr(C, align(128))]
//! struct Line([u8; 128]);
//! let len = RingLayout::bytes_for::<u64>(64)?;
//! let mut region = vec![Line([0; 128]); len.div_ceil(128)].into_boxed_slice();
//! let mem = region.as_mut_ptr().cast::<u8>();
//! let keep: KeepAlive = Arc::new(region);
//!
//! // SAFETY: `mem` is valid for `len` bytes for as long as `keep` lives and nobody else uses it.
//! unsafe { Ring::<u64>::init_in::<Multi, Single>(mem, len, 64)? };
//! // In a real deployment each process attaches the side it uses, after learning (through a
//! // socket, a pipe or fork) that the ring was formatted.
//! // SAFETY: formatted above in this thread; there is exactly one consumer.
//! let mut rx = unsafe { Ring::<u64>::attach_consumer::<Single>(mem, len, keep.clone())? };
//! // SAFETY: as above; Multi producers may be attached any number of times.
//! let mut tx = unsafe { Ring::<u64>::attach_producer::<Multi>(mem, len, keep)? };
//! assert_eq!(tx.enqueue_burst(&[7, 8, 9]), 3);
//! assert_eq!(rx.dequeue(), Some(7));
//! // Attaching with the wrong mode or element type is an error, not undefined behaviour.
//! // SAFETY: the region stays valid; the call fails before creating a handle.
//! let wrong = unsafe { Ring::<u32>::attach_consumer::<Single>(mem, len, Arc::new(())) };
//! assert!(wrong.is_err());
//! # Ok::<(), mempool::ring::RingError>(())
//! ```
//!
//! # Verification
//!
//! Atomics and slot cells come from `crate::sync`, which switches to loom under `--cfg loom`.
//! The loom models live in `tests/loom_ring.rs`:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p mempool --test loom_ring --release
//! ```

mod any;
mod consumer;
pub(crate) mod copy;
mod error;
mod headtail;
mod hts;
mod index;
mod layout;
mod mode;
mod mt;
mod producer;
mod rts;
mod storage;
#[cfg(all(test, not(loom)))]
mod tests;

use core::convert::Infallible;
use core::marker::PhantomData;
use std::sync::Arc;

pub use any::{AnyConsumer, AnyProducer};
pub use consumer::Consumer;
pub use error::RingError;
pub use layout::{RingLayout, ShmSafe};
pub use mode::{Hts, Multi, ParseSyncTypeError, Rts, SharedMode, Side, Single, SyncMode, SyncType};
pub use producer::Producer;
pub use storage::KeepAlive;

use storage::{HeapRegion, RawRing};

/// The two handles of a ring with producer mode `P` and consumer mode `C`.
pub type Handles<T, P, C> = (Producer<T, P>, Consumer<T, C>);
/// Single producer, single consumer handles (DPDK SP/SC).
pub type Spsc<T> = Handles<T, Single, Single>;
/// Multi producer, single consumer handles (DPDK MP/SC).
pub type Mpsc<T> = Handles<T, Multi, Single>;
/// Single producer, multi consumer handles (DPDK SP/MC).
pub type Spmc<T> = Handles<T, Single, Multi>;
/// Multi producer, multi consumer handles (DPDK MP/MC).
pub type Mpmc<T> = Handles<T, Multi, Multi>;

/// Constructors of rings of `T`. The ring itself is only ever reached through its
/// [`Producer`] and [`Consumer`] handles; this type is never instantiated.
#[derive(Debug)]
pub struct Ring<T> {
    _never: Infallible,
    _elems: PhantomData<fn() -> T>,
}

impl<T: Copy + Send> Ring<T> {
    /// Allocates a ring of `capacity` slots on the heap and returns its two handles.
    ///
    /// The memory is freed when the last handle is dropped.
    ///
    /// # Errors
    ///
    /// [`RingError::ZeroCapacity`], [`RingError::CapacityNotPowerOfTwo`],
    /// [`RingError::CapacityTooLarge`], [`RingError::SizeOverflow`], or
    /// [`RingError::AllocFailed`].
    pub fn with_capacity<P: SyncMode, C: SyncMode>(
        capacity: usize,
    ) -> Result<Handles<T, P, C>, RingError> {
        Self::with_capacity_and_start::<P, C>(capacity, 0)
    }

    /// Like [`Ring::with_capacity`], but with all four counters starting at `start` instead of
    /// 0, as if `start` elements had already passed through. Lets tests reach the `u32`
    /// wrap-around of the counters without 2^32 operations.
    #[doc(hidden)]
    pub fn with_capacity_and_start<P: SyncMode, C: SyncMode>(
        capacity: usize,
        start: u32,
    ) -> Result<Handles<T, P, C>, RingError> {
        let ring = heap_ring::<T>(capacity, start, P::TYPE, C::TYPE)?;
        Ok((Producer::new(ring.clone()), Consumer::new(ring)))
    }

    /// Allocates a ring of `capacity` slots on the heap with the side modes given as values
    /// (DPDK's creation flags), and returns handles that dispatch on the mode at run time.
    ///
    /// Use this when the modes come from a configuration; when they are known at compile time
    /// [`Ring::with_capacity`] gives typed handles with no dispatch.
    ///
    /// ```
    /// use mempool::ring::{AnyConsumer, Ring, SyncType};
    ///
    /// let (mut tx, mut rx) = Ring::<u32>::with_sync(64, SyncType::Rts, SyncType::Hts)?;
    /// let mut tx2 = tx.try_clone().expect("an RTS side can be shared");
    /// assert_eq!(tx.enqueue_bulk(&[1, 2]), 2);
    /// assert_eq!(tx2.enqueue(3), Ok(()));
    /// assert_eq!(rx.sync_type(), SyncType::Hts);
    /// assert!(matches!(rx, AnyConsumer::Hts(_)));
    /// let mut out = [0; 3];
    /// assert_eq!(rx.dequeue_bulk(&mut out), 3);
    /// assert_eq!(out, [1, 2, 3]);
    /// # Ok::<(), mempool::ring::RingError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`Ring::with_capacity`].
    pub fn with_sync(
        capacity: usize,
        prod: SyncType,
        cons: SyncType,
    ) -> Result<(AnyProducer<T>, AnyConsumer<T>), RingError> {
        let ring = heap_ring::<T>(capacity, 0, prod, cons)?;
        Ok((
            AnyProducer::new(ring.clone(), prod),
            AnyConsumer::new(ring, cons),
        ))
    }

    /// [`Ring::with_capacity`] for a single-producer, single-consumer ring.
    ///
    /// # Errors
    ///
    /// As for [`Ring::with_capacity`].
    pub fn spsc(capacity: usize) -> Result<Spsc<T>, RingError> {
        Self::with_capacity(capacity)
    }

    /// [`Ring::with_capacity`] for a multi-producer, single-consumer ring.
    ///
    /// # Errors
    ///
    /// As for [`Ring::with_capacity`].
    pub fn mpsc(capacity: usize) -> Result<Mpsc<T>, RingError> {
        Self::with_capacity(capacity)
    }

    /// [`Ring::with_capacity`] for a single-producer, multi-consumer ring.
    ///
    /// # Errors
    ///
    /// As for [`Ring::with_capacity`].
    pub fn spmc(capacity: usize) -> Result<Spmc<T>, RingError> {
        Self::with_capacity(capacity)
    }

    /// [`Ring::with_capacity`] for a multi-producer, multi-consumer ring.
    ///
    /// # Errors
    ///
    /// As for [`Ring::with_capacity`].
    pub fn mpmc(capacity: usize) -> Result<Mpmc<T>, RingError> {
        Self::with_capacity(capacity)
    }
}

impl<T: ShmSafe> Ring<T> {
    /// Formats `mem` as an empty ring of `capacity` elements with producer mode `P` and consumer
    /// mode `C`. Size the region with [`RingLayout::bytes_for`]. Handles are then obtained with
    /// [`Ring::attach_producer`] / [`Ring::attach_consumer`], in this or another process.
    ///
    /// # Errors
    ///
    /// Capacity errors as for [`Ring::with_capacity`], [`RingError::NullRegion`],
    /// [`RingError::Misaligned`] or [`RingError::RegionTooSmall`]. The region is not modified on
    /// error.
    ///
    /// # Safety
    ///
    /// - `mem` must be valid for reads and writes of `len` bytes.
    /// - Nothing may access the region while this runs, and no handles to a previous ring in
    ///   the region may be in use.
    /// - Other processes may attach only after learning, through some synchronising channel
    ///   (`fork`, a pipe or socket message, a futex, ...), that this call has returned.
    pub unsafe fn init_in<P: SyncMode, C: SyncMode>(
        mem: *mut u8,
        len: usize,
        capacity: usize,
    ) -> Result<RingLayout, RingError> {
        // SAFETY: forwarded caller contract.
        unsafe { layout::format::<T>(mem, len, capacity, 0, P::TYPE, C::TYPE) }
    }

    /// Validates the ring in `mem` and returns a producer handle for it.
    ///
    /// # Errors
    ///
    /// [`RingError::NullRegion`], [`RingError::Misaligned`], [`RingError::RegionTooSmall`],
    /// [`RingError::BadMagic`], [`RingError::VersionMismatch`], [`RingError::LayoutMismatch`],
    /// [`RingError::ElementMismatch`], [`RingError::CorruptHeader`] or
    /// [`RingError::ModeMismatch`] when the region does not hold a ring of `T` with producer
    /// mode `P`.
    ///
    /// # Safety
    ///
    /// - `mem` must be valid for reads and writes of `len` bytes for as long as `keep_alive`
    ///   lives (every handle keeps a clone of it).
    /// - The region must have been formatted by [`Ring::init_in`] for this same element type
    ///   (only its size and alignment can be checked), and that call must happen-before this
    ///   one (see `init_in`).
    /// - If `P` is [`Single`], at most one producer handle may be in use, across all processes,
    ///   at any time; a new one may be attached only after the previous one is no longer used and
    ///   that fact has been communicated through a synchronising channel.
    pub unsafe fn attach_producer<P: SyncMode>(
        mem: *mut u8,
        len: usize,
        keep_alive: KeepAlive,
    ) -> Result<Producer<T, P>, RingError> {
        // SAFETY: forwarded caller contract.
        let layout = unsafe { layout::validate::<T>(mem, len, &[side::<P>(Side::Producer)]) }?;
        // SAFETY: validated above; the region lives as long as `keep_alive` (caller).
        Ok(Producer::new(unsafe {
            RawRing::new(mem, &layout, keep_alive)
        }))
    }

    /// Validates the ring in `mem` and returns a consumer handle for it.
    ///
    /// # Errors
    ///
    /// As for [`Ring::attach_producer`], with consumer mode `C`.
    ///
    /// # Safety
    ///
    /// As for [`Ring::attach_producer`], with "consumer" for "producer".
    pub unsafe fn attach_consumer<C: SyncMode>(
        mem: *mut u8,
        len: usize,
        keep_alive: KeepAlive,
    ) -> Result<Consumer<T, C>, RingError> {
        // SAFETY: forwarded caller contract.
        let layout = unsafe { layout::validate::<T>(mem, len, &[side::<C>(Side::Consumer)]) }?;
        // SAFETY: validated above; the region lives as long as `keep_alive` (caller).
        Ok(Consumer::new(unsafe {
            RawRing::new(mem, &layout, keep_alive)
        }))
    }

    /// [`Ring::attach_producer`] and [`Ring::attach_consumer`] in one call.
    ///
    /// # Errors
    ///
    /// As for [`Ring::attach_producer`].
    ///
    /// # Safety
    ///
    /// As for [`Ring::attach_producer`], for both sides.
    pub unsafe fn attach<P: SyncMode, C: SyncMode>(
        mem: *mut u8,
        len: usize,
        keep_alive: KeepAlive,
    ) -> Result<Handles<T, P, C>, RingError> {
        // SAFETY: forwarded caller contract.
        unsafe { attach_raw::<T, P, C>(mem, len, keep_alive) }
    }
}

/// The `(side, mode id, mode name)` triple `validate` checks for a handle of mode `M`.
fn side<M: SyncMode>(side: Side) -> (Side, u32, &'static str) {
    (side, M::ID, M::NAME)
}

/// Allocates and formats a heap ring with all counters at `start`; returns a view of it that
/// owns the allocation.
fn heap_ring<T: Copy + Send>(
    capacity: usize,
    start: u32,
    prod: SyncType,
    cons: SyncType,
) -> Result<RawRing<T>, RingError> {
    let layout = RingLayout::new::<T>(capacity)?;
    let region = HeapRegion::alloc(&layout).ok_or(RingError::AllocFailed {
        bytes: layout.bytes(),
    })?;
    let mem = region.as_ptr();
    // SAFETY: the allocation is `region.len()` bytes, aligned for the layout, and not yet
    // shared.
    let layout = unsafe { layout::format::<T>(mem, region.len(), capacity, start, prod, cons)? };
    // SAFETY: just formatted in this thread; the view keeps the allocation alive.
    Ok(unsafe { RawRing::new(mem, &layout, Arc::new(region)) })
}

/// Validates a formatted region and creates both handles; shared by the heap and the
/// shared-memory constructors.
///
/// # Safety
///
/// As for [`Ring::attach`], for any `T: Copy + Send` (heap rings need not be `ShmSafe`).
unsafe fn attach_raw<T: Copy + Send, P: SyncMode, C: SyncMode>(
    mem: *mut u8,
    len: usize,
    keep_alive: KeepAlive,
) -> Result<Handles<T, P, C>, RingError> {
    let sides = [side::<P>(Side::Producer), side::<C>(Side::Consumer)];
    // SAFETY: forwarded caller contract.
    let layout = unsafe { layout::validate::<T>(mem, len, &sides) }?;
    // SAFETY: validated above; the region lives as long as `keep_alive` (caller).
    let ring = unsafe { RawRing::new(mem, &layout, keep_alive) };
    Ok((Producer::new(ring.clone()), Consumer::new(ring)))
}
