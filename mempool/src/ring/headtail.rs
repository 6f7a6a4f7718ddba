//! The index protocol shared by both sides: claim slots by moving a head, publish them by moving
//! a tail.
//!
//! Producer and consumer run the same two steps with different constants, as in DPDK's
//! `__rte_ring_headtail_move_head`/`__rte_ring_update_tail`:
//!
//! | side     | own head/tail            | opposite tail | `base`     | `avail = base + opp_tail - head` |
//! |----------|--------------------------|---------------|------------|----------------------------------|
//! | producer | `prod_head`, `prod_tail` | `cons_tail`   | `capacity` | free slots                       |
//! | consumer | `cons_head`, `cons_tail` | `prod_tail`   | `0`        | filled slots                     |
//!
//! All arithmetic is on free-running `u32` counters with wrapping operations; a counter is turned
//! into a slot index only by masking, in [`RawRing`](super::storage::RawRing).
//!
//! Ordering edges (labels are used at every atomic access in this module and in `mod.rs`):
//!
//! - **R1** producer's Release store of `prod_tail` / **A1** consumer's Acquire load of
//!   `prod_tail`: the slot writes of the enqueue happen-before the dequeue's slot reads.
//! - **R2** consumer's Release store of `cons_tail` / **A2** producer's Acquire load of
//!   `cons_tail`: the slot reads of the dequeue happen-before the next enqueue overwrites them.
//! - **R3** Release on a successful head CAS / **A3** Acquire on the head load and on a failed
//!   CAS (Multi only): a thread that continues from another thread's head has also seen at least
//!   the opposite tail that thread saw, so its `avail` can never be computed from an older
//!   opposite tail (which would underflow and overrun unpublished or unconsumed slots).
//! - **A4** Acquire in the Multi tail wait, pairing with R1/R2 of the same-side predecessor: the
//!   predecessor's slot accesses happen-before our tail store. A plain store does not continue a
//!   release sequence, so without A4 a consumer synchronising with our tail would not be ordered
//!   after the predecessor's slot writes.

use super::mode::SyncMode;
use crate::sync::Backoff;
use crate::sync::atomic::{AtomicU32, Ordering};

/// The shared indices of one side plus the opposite side's tail, borrowed from the header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Indices<'a> {
    /// This side's head: next counter to claim. Written only by Multi handles.
    pub(crate) head: &'a AtomicU32,
    /// This side's tail: everything before it is published to the opposite side.
    pub(crate) tail: &'a AtomicU32,
    /// The opposite side's tail.
    pub(crate) opp_tail: &'a AtomicU32,
    /// `capacity` for the producer, `0` for the consumer.
    pub(crate) base: u32,
}

/// Per-handle state of a side.
///
/// Used only by [`Single`](super::Single) handles; Multi handles carry one but never read it
/// (they work on the shared head).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor {
    /// This side's head, which equals its tail between operations. Single mode has one writer
    /// (this handle), so the authoritative copy lives here and shared memory only receives the
    /// tail.
    pub(crate) head: u32,
    /// The opposite side's tail as last loaded (A1/A2). Invariant:
    /// `base + cached_opp_tail - head <= capacity` (wrapping), i.e. the cache is never ahead of
    /// the truth: the opposite tail only grows, so a stale copy underestimates `avail` and the
    /// shared index is reloaded only when the cached value says there is not enough room
    /// (rtrb's "possibly full" rule). In steady streaming this keeps the opposite side's tail
    /// line out of our cache except when the ring really looks full (or empty), instead of
    /// pulling it on every operation. Measurement: on the shared 2-vCPU KVM development box an
    /// A/B run against an always-reload variant was dominated by noise from other workloads (the
    /// same binary varied by 10x between runs), so the number that justifies the cache is left
    /// to the ring benchmark in `benches/`.
    pub(crate) cached_opp_tail: u32,
}

impl Cursor {
    /// Loads the state of a Single side from shared memory when a handle is created.
    pub(crate) fn load(ix: &Indices<'_>) -> Self {
        // Acquire (attach edge): pairs with R1/R2 of whichever handle last used this side,
        // possibly in another process that has since handed the side over to us.
        let head = ix.tail.load(Ordering::Acquire);
        // A1/A2: pairs with R2/R1 of the opposite side.
        let cached_opp_tail = ix.opp_tail.load(Ordering::Acquire);
        Self {
            head,
            cached_opp_tail,
        }
    }

    /// Claims up to `n` counters (exactly `n` or none when `fixed`).
    ///
    /// Returns the first claimed counter and the count; a count of 0 means nothing was claimed
    /// and the caller must not call [`Cursor::commit`]. `n` must be `1..=capacity`, which bounds
    /// the returned count by the capacity even if a peer process corrupted the indices.
    #[inline(always)]
    pub(crate) fn reserve<M: SyncMode>(
        &mut self,
        ix: &Indices<'_>,
        n: u32,
        fixed: bool,
    ) -> (u32, u32) {
        if M::MULTI {
            return reserve_multi(ix, n, fixed);
        }
        let head = self.head;
        let mut avail = ix
            .base
            .wrapping_add(self.cached_opp_tail)
            .wrapping_sub(head);
        if avail < n {
            // A1 (consumer, pairs with R1) / A2 (producer, pairs with R2): the opposite side's
            // slot accesses up to this tail happen-before ours.
            self.cached_opp_tail = ix.opp_tail.load(Ordering::Acquire);
            avail = ix
                .base
                .wrapping_add(self.cached_opp_tail)
                .wrapping_sub(head);
        }
        (head, grant(avail, n, fixed))
    }

    /// Publishes `n` counters starting at `start`, claimed by [`Cursor::reserve`] and filled or
    /// drained by the caller.
    #[inline(always)]
    pub(crate) fn commit<M: SyncMode>(&mut self, ix: &Indices<'_>, start: u32, n: u32) {
        debug_assert!(n != 0, "commit of an empty reservation");
        let end = start.wrapping_add(n);
        if M::MULTI {
            wait_for_tail(ix.tail, start);
        } else {
            debug_assert_eq!(start, self.head, "Single side committed out of order");
            self.head = end;
        }
        // R1 (producer, pairs with A1) / R2 (consumer, pairs with A2): publishes our slot
        // accesses, and through A4 those of every same-side predecessor.
        ix.tail.store(end, Ordering::Release);
    }
}

/// How many of `n` requested counters to grant when `avail` are available.
#[inline(always)]
fn grant(avail: u32, n: u32, fixed: bool) -> u32 {
    if avail >= n {
        n
    } else if fixed {
        0
    } else {
        avail
    }
}

/// DPDK's multi-thread head move: snapshot the head, compute `avail` against the opposite tail,
/// CAS the head forward.
#[inline(always)]
fn reserve_multi(ix: &Indices<'_>, n: u32, fixed: bool) -> (u32, u32) {
    // A3: pairs with R3 of the thread whose CAS wrote this head value.
    let mut old = ix.head.load(Ordering::Acquire);
    loop {
        // A1/A2 as in the Single path. Because of A3 this load cannot return an older opposite
        // tail than the one the previous head mover used, so `avail` does not underflow. It may
        // exceed the capacity if `old` is stale; then the CAS below fails and we retry.
        let opp_tail = ix.opp_tail.load(Ordering::Acquire);
        let avail = ix.base.wrapping_add(opp_tail).wrapping_sub(old);
        let k = grant(avail, n, fixed);
        if k == 0 {
            return (old, 0);
        }
        // R3 on success (pairs with A3 of the next head mover); A3 on failure (the returned head
        // was written by another mover's R3). Weak CAS: a spurious failure just loops.
        match ix.head.compare_exchange_weak(
            old,
            old.wrapping_add(k),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return (old, k),
            Err(current) => old = current,
        }
    }
}

/// Waits until every same-side thread that claimed counters before `start` has published them.
#[inline(always)]
fn wait_for_tail(tail: &AtomicU32, start: u32) {
    // A4: pairs with R1/R2 of the predecessor (see module docs).
    if tail.load(Ordering::Acquire) != start {
        wait_for_tail_slow(tail, start);
    }
}

/// Slow path of [`wait_for_tail`]: a predecessor is still copying, or was preempted mid-copy.
///
/// This wait is why Multi mode is not preemption-safe (see the module docs of `ring`): we cannot
/// publish until the predecessor does. Spin briefly, then yield so the predecessor can run if it
/// shares our core.
#[cold]
#[inline(never)]
fn wait_for_tail_slow(tail: &AtomicU32, start: u32) {
    let mut backoff = Backoff::default();
    // A4, as above.
    while tail.load(Ordering::Acquire) != start {
        backoff.snooze();
    }
}
