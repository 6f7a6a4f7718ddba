//! The enqueue handle.

use core::fmt;
use core::marker::PhantomData;

use super::headtail::Cursor;
use super::index::lo;
use super::mode::{Rts, SharedMode, SyncMode, SyncType};
use super::storage::RawRing;
use crate::sync::atomic::Ordering;

/// The enqueue side of a ring.
///
/// `P` is [`Single`](super::Single) (exactly one producer thread, not `Clone`) or one of the
/// shared modes [`Multi`](super::Multi), [`Rts`](super::Rts) and [`Hts`](super::Hts) (`Clone`;
/// one clone per producer thread). Every operation takes `&mut self`: a handle is used by one
/// thread at a time, and sharing a side means cloning a handle, not sharing a reference.
pub struct Producer<T, P: SyncMode> {
    ring: RawRing<T>,
    cursor: Cursor,
    _mode: PhantomData<P>,
}

// SAFETY: a producer moves `T` values into the ring, which another thread then takes out, so
// `T: Send` is required and sufficient. The raw pointers refer to the ring region, which the
// handle keeps alive; for `Single` there is still only one handle on this side after the move.
unsafe impl<T: Send, P: SyncMode> Send for Producer<T, P> {}

impl<T, P: SyncMode> fmt::Debug for Producer<T, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("mode", &P::NAME)
            .field("capacity", &self.ring.capacity())
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl<T, P: SharedMode> Clone for Producer<T, P> {
    /// Another handle on the same shared producer side, for another thread.
    fn clone(&self) -> Self {
        Self {
            ring: self.ring.clone(),
            cursor: self.cursor,
            _mode: PhantomData,
        }
    }
}

impl<T: Copy + Send, P: SyncMode> Producer<T, P> {
    /// Wraps a validated ring view; loads the Single-mode cursor from shared memory.
    pub(crate) fn new(ring: RawRing<T>) -> Self {
        let cursor = Cursor::load(&ring.producer_indices(), ring.capacity());
        Self {
            ring,
            cursor,
            _mode: PhantomData,
        }
    }

    /// Number of slots in the ring.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.ring.capacity() as usize
    }

    /// Reloads this handle's copy of the opposite side's tail (see `Cursor::refresh`).
    #[inline(always)]
    pub(crate) fn refresh_opp_tail(&mut self) {
        let ix = self.ring.producer_indices();
        self.cursor.refresh::<P>(&ix);
    }

    /// Enqueues one element, or gives it back if the ring is full.
    ///
    /// # Errors
    ///
    /// `Err(value)` when no slot is free.
    #[inline]
    pub fn enqueue(&mut self, value: T) -> Result<(), T> {
        let ix = self.ring.producer_indices();
        let (start, n) = self.cursor.reserve::<P>(&ix, 1, true);
        if n == 0 {
            return Err(value);
        }
        // SAFETY: counter `start` is claimed by us and not yet published.
        unsafe { self.ring.write_one(start, value) };
        self.cursor.commit::<P>(&ix, start, n);
        Ok(())
    }

    /// Enqueues all of `values` or none of them (DPDK "bulk").
    ///
    /// Returns `values.len()` on success and 0 when there is not enough free space (or `values`
    /// is empty, or longer than the capacity).
    #[inline]
    #[must_use = "a bulk enqueue may enqueue nothing; check the count"]
    pub fn enqueue_bulk(&mut self, values: &[T]) -> usize {
        match u32::try_from(values.len()) {
            Ok(n) if n != 0 && n <= self.ring.capacity() => self.enqueue_n(values, n, true),
            _ => 0,
        }
    }

    /// Enqueues as many elements from the front of `values` as fit (DPDK "burst").
    ///
    /// Returns how many were enqueued: `values[..n]` are in the ring, the rest are not.
    #[inline]
    #[must_use = "a burst enqueue may enqueue only a prefix; check the count"]
    pub fn enqueue_burst(&mut self, values: &[T]) -> usize {
        let n = values.len().min(self.ring.capacity() as usize) as u32;
        if n == 0 {
            return 0;
        }
        self.enqueue_n(values, n, false)
    }

    /// Shared body of bulk and burst; `1 <= n <= min(values.len(), capacity)`.
    #[inline(always)]
    fn enqueue_n(&mut self, values: &[T], n: u32, fixed: bool) -> usize {
        debug_assert!(n != 0 && n as usize <= values.len() && n <= self.ring.capacity());
        let ix = self.ring.producer_indices();
        let (start, k) = self.cursor.reserve::<P>(&ix, n, fixed);
        if k == 0 {
            return 0;
        }
        if P::TYPE == SyncType::Single {
            // Fetch the next batch's slots while this one is copied (`prefetch_ahead`). The
            // shared modes do not: their next claim may be another thread's.
            let next = start.wrapping_add(k);
            let room = ix.avail(next, self.cursor.cached_opp_tail);
            self.ring.prefetch_ahead(next, k, room);
        }
        // SAFETY: `k <= n <= values.len()`.
        let src = unsafe { values.get_unchecked(..k as usize) };
        // SAFETY: counters `start .. start + k` are claimed by us and not yet published;
        // `k <= capacity`.
        unsafe { self.ring.write_run(start, src) };
        self.cursor.commit::<P>(&ix, start, k);
        k as usize
    }

    /// Free slots at the time of the call.
    ///
    /// With other threads active on either side, the value may be stale by the time it is
    /// used; it is exact only when the ring is quiescent.
    #[inline]
    pub fn free_count(&self) -> usize {
        let ix = self.ring.producer_indices();
        let cap = self.ring.capacity();
        // A2: pairs with R2 of the consumers; loaded before our tail (see `len` in consumer.rs
        // for why the order keeps the difference non-negative).
        let cons_tail = ix.opp_pos();
        let prod_tail = if P::MULTI {
            // Acquire: pairs with R1 of the producers, so the tail is not older than the
            // consumer tail we just read.
            lo(ix.tail.load(Ordering::Acquire))
        } else {
            self.cursor.head
        };
        let used = prod_tail.wrapping_sub(cons_tail).min(cap);
        (cap - used) as usize
    }
}

impl<T> Producer<T, Rts> {
    /// How far this handle lets the producer head run ahead of the producer tail before its
    /// claims wait (DPDK's `rte_ring_get_prod_htd_max`). Default: `capacity / 8`.
    pub fn htd_max(&self) -> u32 {
        self.cursor.htd_max
    }

    /// Sets this handle's head/tail distance limit (DPDK's `rte_ring_set_prod_htd_max`, which
    /// sets it for the whole side; here it is per handle and clones inherit it). 0 serialises
    /// the side as HTS does; the capacity or more removes the limit. Values above the capacity
    /// are stored as the capacity.
    pub fn set_htd_max(&mut self, max: u32) {
        self.cursor.htd_max = max.min(self.ring.capacity());
    }
}
