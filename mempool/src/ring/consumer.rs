//! The dequeue handle.

use core::fmt;
use core::marker::PhantomData;

use super::headtail::Cursor;
use super::index::lo;
use super::mode::{Rts, SharedMode, Single, SyncMode};
use super::storage::RawRing;
use crate::sync::atomic::Ordering;

/// The dequeue side of a ring.
///
/// `C` is [`Single`] (exactly one consumer thread, not `Clone`) or one of the shared modes
/// [`Multi`](super::Multi), [`Rts`] and [`Hts`](super::Hts) (`Clone`; one clone per consumer
/// thread). Every operation takes `&mut self`.
pub struct Consumer<T, C: SyncMode> {
    ring: RawRing<T>,
    cursor: Cursor,
    _mode: PhantomData<C>,
}

// SAFETY: a consumer takes `T` values that another thread put in, so `T: Send` is required and
// sufficient. The raw pointers refer to the ring region, which the handle keeps alive; for
// `Single` there is still only one handle on this side after the move.
unsafe impl<T: Send, C: SyncMode> Send for Consumer<T, C> {}

impl<T, C: SyncMode> fmt::Debug for Consumer<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("mode", &C::NAME)
            .field("capacity", &self.ring.capacity())
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl<T, C: SharedMode> Clone for Consumer<T, C> {
    /// Another handle on the same shared consumer side, for another thread.
    fn clone(&self) -> Self {
        Self {
            ring: self.ring.clone(),
            cursor: self.cursor,
            _mode: PhantomData,
        }
    }
}

impl<T: Copy + Send, C: SyncMode> Consumer<T, C> {
    /// Wraps a validated ring view; loads the Single-mode cursor from shared memory.
    pub(crate) fn new(ring: RawRing<T>) -> Self {
        let cursor = Cursor::load(&ring.consumer_indices(), ring.capacity());
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
        let ix = self.ring.consumer_indices();
        self.cursor.refresh::<C>(&ix);
    }

    /// Sets this handle's copy of the opposite side's tail, as if it had been loaded long ago
    /// (for tests of stale copies).
    #[cfg(test)]
    pub(crate) fn set_cached_opp_tail(&mut self, tail: u32) {
        self.cursor.cached_opp_tail = tail;
    }

    /// Sets this handle's copy of the opposite side's tail `ahead` counters past the real one,
    /// as a copy 2^32 - `ahead` counters old reads (for tests of stale copies).
    #[cfg(test)]
    pub(crate) fn alias_cached_opp_tail(&mut self, ahead: u32) {
        self.refresh_opp_tail();
        self.cursor.cached_opp_tail = self.cursor.cached_opp_tail.wrapping_add(ahead);
    }

    /// Dequeues one element, or `None` if the ring is empty.
    #[inline]
    #[must_use = "a dequeued element is gone from the ring"]
    pub fn dequeue(&mut self) -> Option<T> {
        let ix = self.ring.consumer_indices();
        let (start, n) = self.cursor.reserve::<C>(&ix, 1, true);
        if n == 0 {
            return None;
        }
        // SAFETY: counter `start` is claimed by us and was published by a producer (A1).
        let value = unsafe { self.ring.read_one(start) };
        self.cursor.commit::<C>(&ix, start, n);
        Some(value)
    }

    /// Fills all of `out` or nothing (DPDK "bulk").
    ///
    /// Returns `out.len()` on success and 0 when fewer elements are available (or `out` is
    /// empty, or longer than the capacity); on 0, `out` is untouched.
    #[inline]
    #[must_use = "a bulk dequeue may dequeue nothing; check the count"]
    pub fn dequeue_bulk(&mut self, out: &mut [T]) -> usize {
        match u32::try_from(out.len()) {
            Ok(n) if n != 0 && n <= self.ring.capacity() => self.dequeue_n(out, n, true),
            _ => 0,
        }
    }

    /// Dequeues as many elements as are available, up to `out.len()` (DPDK "burst").
    ///
    /// Returns the count `n`; the elements are in `out[..n]`.
    #[inline]
    #[must_use = "the count says how much of `out` was filled"]
    pub fn dequeue_burst(&mut self, out: &mut [T]) -> usize {
        let n = out.len().min(self.ring.capacity() as usize) as u32;
        if n == 0 {
            return 0;
        }
        self.dequeue_n(out, n, false)
    }

    /// Shared body of bulk and burst; `1 <= n <= min(out.len(), capacity)`.
    #[inline(always)]
    fn dequeue_n(&mut self, out: &mut [T], n: u32, fixed: bool) -> usize {
        debug_assert!(n != 0 && n as usize <= out.len() && n <= self.ring.capacity());
        let ix = self.ring.consumer_indices();
        let (start, k) = self.cursor.reserve::<C>(&ix, n, fixed);
        if k == 0 {
            return 0;
        }
        // SAFETY: `k <= n <= out.len()`.
        let dst = unsafe { out.get_unchecked_mut(..k as usize) };
        // SAFETY: counters `start .. start + k` are claimed by us and published (A1);
        // `k <= capacity`.
        unsafe { self.ring.read_run(start, dst) };
        self.cursor.commit::<C>(&ix, start, k);
        k as usize
    }

    /// Elements in the ring at the time of the call.
    ///
    /// With other threads active, the value may be stale by the time it is used.
    #[inline]
    pub fn len(&self) -> usize {
        let ix = self.ring.consumer_indices();
        let cons_tail = if C::MULTI {
            // Acquire: pairs with R2 of the consumer that stored it; that consumer had loaded a
            // producer tail at least this large (A1), so the producer tail we load next is too
            // (coherence), and the difference below cannot go negative.
            lo(ix.tail.load(Ordering::Acquire))
        } else {
            self.cursor.head
        };
        // A1: pairs with R1 of the producers.
        let prod_tail = ix.opp_pos();
        // The two loads are not one snapshot: producers may have lapped the older consumer tail
        // in between, hence the clamp (as in DPDK's `rte_ring_count`).
        prod_tail.wrapping_sub(cons_tail).min(self.ring.capacity()) as usize
    }

    /// Whether the ring held no elements at the time of the call.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Copy + Send> Consumer<T, Single> {
    /// Borrows the oldest element without dequeuing it, or `None` if the ring is empty.
    ///
    /// The slot is read in place; no producer can overwrite it until this consumer dequeues it,
    /// which the borrow of `self` rules out while the reference lives. Only a Single consumer
    /// can peek: with several consumers another one could take the element meanwhile.
    #[inline]
    pub fn peek(&mut self) -> Option<&T> {
        let ix = self.ring.consumer_indices();
        let (start, n) = self.cursor.reserve::<Single>(&ix, 1, true);
        if n == 0 {
            return None;
        }
        // SAFETY: counter `start` is published (A1) and stays unreleased while `self` is
        // mutably borrowed by the returned reference, since only this handle moves cons_tail.
        Some(unsafe { self.ring.slot_ref(start) })
    }
}

impl<T> Consumer<T, Rts> {
    /// How far this handle lets the consumer head run ahead of the consumer tail before its
    /// claims wait (DPDK's `rte_ring_get_cons_htd_max`). Default: `capacity / 8`.
    pub fn htd_max(&self) -> u32 {
        self.cursor.htd_max
    }

    /// Sets this handle's head/tail distance limit (DPDK's `rte_ring_set_cons_htd_max`); see
    /// [`Producer::set_htd_max`](super::Producer::set_htd_max).
    pub fn set_htd_max(&mut self, max: u32) {
        self.cursor.htd_max = max.min(self.ring.capacity());
    }
}
