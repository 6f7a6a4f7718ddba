//! [`RingPort`]: the pool's free ring, usable through `&self` from any thread.

use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr;

use crate::ring::{Consumer, Multi, Producer, Ring, RingError};

use super::ObjId;

/// The two Multi handles of the pool's free ring, shared by every thread through `&Pool`.
///
/// Ring handles take `&mut self` because a handle is meant to be used by one thread, and Multi
/// sides are shared by giving each thread a clone. Cloning per operation would add two atomic
/// read-modify-writes on the ring's keep-alive counter, a line every thread would then fight
/// over. Instead each cache-less operation works on a *borrowed clone*: a bitwise copy of the
/// stored handle, wrapped in `ManuallyDrop`, that lives only for the call.
///
/// A `Multi` handle is `Clone`, and its clone is exactly a bitwise copy plus one increment of
/// the keep-alive `Arc` (the per-handle cursor of a Multi side is not used: Multi operations
/// claim slots with a CAS on the shared head). The copy made here skips the increment and is
/// never dropped, so it never decrements; it is valid because the stored handle, which owns the
/// reference it borrows, outlives it (the copy does not escape the `&self` call). Any write the
/// ring makes to the copy's own fields stays in the copy.
pub(crate) struct RingPort {
    prod: Producer<ObjId, Multi>,
    cons: Consumer<ObjId, Multi>,
}

// SAFETY: `RingPort` is `!Sync` only because ring handles hold raw pointers to the ring region.
// Through `&RingPort` they are only (a) copied into borrowed clones, each then used by one
// thread exactly as a `Multi` clone may be, and (b) read by `&self` methods (`len`, `clone`)
// that touch immutable fields and atomics. No `&mut` to the stored handles is ever created
// after construction.
unsafe impl Sync for RingPort {}

impl fmt::Debug for RingPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingPort")
            .field("capacity", &self.cons.capacity())
            .field("len", &self.cons.len())
            .finish()
    }
}

impl RingPort {
    /// A ring with room for `count` ids, filled with `0..count` tagged `tag`.
    pub(crate) fn new(count: u32, tag: u32) -> Result<Self, RingError> {
        let capacity = (count as usize).next_power_of_two();
        let (mut prod, cons) = Ring::<ObjId>::mpmc(capacity)?;
        // In batches, so a pool of 2^31 objects needs no 8 GiB staging vector.
        const BATCH: u32 = 1024;
        let mut batch = Vec::with_capacity(BATCH as usize);
        for start in (0..count).step_by(BATCH as usize) {
            let end = count.min(start.saturating_add(BATCH));
            batch.clear();
            batch.extend((start..end).map(|i| ObjId::new(i, tag)));
            let sent = prod.enqueue_bulk(&batch);
            debug_assert_eq!(
                sent,
                batch.len(),
                "a fresh ring of {capacity} slots is full"
            );
        }
        Ok(Self { prod, cons })
    }

    /// Enqueues all of `ids` or none; returns the count enqueued.
    #[inline(always)]
    pub(crate) fn enqueue_bulk(&self, ids: &[ObjId]) -> usize {
        // SAFETY: a borrowed clone (type docs): `self.prod` outlives the copy, which is never
        // dropped and does not escape this call.
        let mut prod = ManuallyDrop::new(unsafe { ptr::read(&self.prod) });
        prod.enqueue_bulk(ids)
    }

    /// Dequeues exactly `out.len()` ids or none; returns the count dequeued.
    #[inline(always)]
    pub(crate) fn dequeue_bulk(&self, out: &mut [ObjId]) -> usize {
        // SAFETY: a borrowed clone (type docs), as in `enqueue_bulk`.
        let mut cons = ManuallyDrop::new(unsafe { ptr::read(&self.cons) });
        cons.dequeue_bulk(out)
    }

    /// Ids in the ring at the time of the call.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.cons.len()
    }

    /// Owned clones of both handles, for a cache.
    pub(crate) fn handles(&self) -> (Producer<ObjId, Multi>, Consumer<ObjId, Multi>) {
        (self.prod.clone(), self.cons.clone())
    }
}
