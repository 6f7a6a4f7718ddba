//! [`Hts`](super::Hts) sides: head/tail sync, DPDK's `rte_ring_hts_elem_pvt.h`.
//!
//! Head and tail positions share the side's tail word (head in the high half, tail in the low
//! half, so the opposite side reads the tail like any other mode's). A claim waits until the
//! two are equal (no operation in flight), then CASes the whole word to `(head + n, tail)`; the
//! publication stores `(head + n, head + n)`. One operation at a time per side: the CAS can only
//! succeed from a word with head == tail, and only the claimant that made them differ makes
//! them equal again, with a plain store (no other thread writes the word in between).
//!
//! Ordering edges (labels as in the [ring module docs](super#memory-ordering-edges)):
//!
//! - **A5** Acquire on the loads of the word and on a failed CAS, pairing with the Release
//!   store that published the same-side predecessor's operation (R1/R2 below): we claim only
//!   from a word with head == tail, which that store wrote, so the predecessor's slot accesses
//!   (and its view of the opposite tail) happen-before our claim, and through our own Release
//!   store they are published with ours.
//! - The CAS itself is Relaxed on success: A5 already ordered us after the store it replaces
//!   (positions never repeat within 2^32 operations, so the value the CAS reads is the one A5
//!   read), and nothing is published by making head and tail differ.
//! - **R1/R2** the publishing store is Release, pairing with A1/A2 of the opposite side and A5
//!   of the next same-side claimant.

use super::index::{Indices, grant, hi, lo, word};
use crate::sync::SpinWait;
use crate::sync::atomic::Ordering;

/// Claims up to `n` counters (exactly `n` or none when `fixed`) once no other operation of the
/// side is in flight; returns the first counter and the count (0: nothing claimed). `cache` is
/// the handle's copy of the opposite tail.
#[inline(always)]
pub(crate) fn reserve(ix: &Indices<'_>, cache: &mut u32, n: u32, fixed: bool) -> (u32, u32) {
    // A5: pairs with the Release store of the same-side predecessor.
    let mut old = ix.tail.load(Ordering::Acquire);
    loop {
        if hi(old) != lo(old) {
            old = wait_idle(ix);
        }
        let head = hi(old);
        // A1/A2 (in `avail_cached`, when it reloads), after A5: a reload is not older than the
        // opposite tail the predecessor used, so `avail` does not underflow.
        let k = grant(ix.avail_cached(head, cache, n), n, fixed);
        if k == 0 {
            return (head, 0);
        }
        // Relaxed on success (see module docs); A5 on failure.
        match ix.tail.compare_exchange_weak(
            old,
            word(head.wrapping_add(k), lo(old)),
            Ordering::Relaxed,
            Ordering::Acquire,
        ) {
            Ok(_) => return (head, k),
            Err(current) => old = current,
        }
    }
}

/// Waits until no operation of the side is in flight (head == tail); returns the word.
///
/// Like the Multi tail wait, this is where a preempted thread blocks its side.
#[cold]
#[inline(never)]
fn wait_idle(ix: &Indices<'_>) -> u64 {
    let mut wait = SpinWait::default();
    loop {
        wait.snooze();
        // A5, as in `reserve`.
        let w = ix.tail.load(Ordering::Acquire);
        if hi(w) == lo(w) {
            return w;
        }
    }
}

/// Publishes the claimed counters up to `end`: head and tail both become `end`.
#[inline(always)]
pub(crate) fn commit(ix: &Indices<'_>, end: u32) {
    // R1 (producer, pairs with A1) / R2 (consumer, pairs with A2); also pairs with A5 of the
    // next same-side claimant.
    ix.tail.store(word(end, end), Ordering::Release);
}
