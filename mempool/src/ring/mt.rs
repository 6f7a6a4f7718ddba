//! [`Multi`](super::Multi) sides: DPDK's default multi-thread sync (`rte_ring_c11_pvt.h`).
//!
//! Claim: load the head, compute the room against the opposite tail, CAS the head forward by
//! `n`, retrying on contention. Publish: wait until the tail equals the head we started from
//! (every earlier claimant has published), then store the new tail. Claims are serialised by the
//! CAS, copies run in parallel, and publication happens in claim order, so the opposite side
//! only ever sees a gap-free prefix.
//!
//! Ordering edges (labels as in the [ring module docs](super#memory-ordering-edges)):
//!
//! - **R3** Release on a successful head CAS / **A3** Acquire on the head load and on a failed
//!   CAS: a thread that continues from another thread's head has also seen at least the
//!   opposite tail that thread saw, so its `avail` is never computed from an older opposite
//!   tail (which would underflow and overrun unpublished or unconsumed slots).
//! - **A4** Acquire in the tail wait, pairing with R1/R2 of the same-side predecessor: the
//!   predecessor's slot accesses happen-before our tail store. A plain store does not continue
//!   a release sequence, so without A4 an opposite-side thread synchronising with our tail would
//!   not be ordered after the predecessor's slot accesses.

use super::index::{Indices, grant, lo, word};
use crate::sync::SpinWait;
use crate::sync::atomic::Ordering;

/// Claims up to `n` counters (exactly `n` or none when `fixed`); returns the first counter and
/// the count (0: nothing claimed). `cache` is the handle's copy of the opposite tail.
#[inline(always)]
pub(crate) fn reserve(ix: &Indices<'_>, cache: &mut u32, n: u32, fixed: bool) -> (u32, u32) {
    // A3: pairs with R3 of the thread whose CAS wrote this head value.
    let mut old = ix.head.load(Ordering::Acquire);
    loop {
        // A1/A2 (in `avail_cached`, when it reloads). Because of A3 a reload cannot return an
        // older opposite tail than the one the previous head mover used, so `avail` does not
        // underflow; a stale cached copy is caught by `avail_cached`. `avail` may exceed the
        // true count if `old` is stale; then the CAS below fails and we retry.
        let head = lo(old);
        let k = grant(ix.avail_cached(head, cache, n), n, fixed);
        if k == 0 {
            return (head, 0);
        }
        // R3 on success (pairs with A3 of the next head mover); A3 on failure (the returned head
        // was written by another mover's R3). Weak CAS: a spurious failure just loops.
        match ix.head.compare_exchange_weak(
            old,
            word(0, head.wrapping_add(k)),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return (head, k),
            Err(current) => old = current,
        }
    }
}

/// Publishes counters `start .. end`: waits for every same-side thread that claimed counters
/// before `start`, then stores the tail.
#[inline(always)]
pub(crate) fn commit(ix: &Indices<'_>, start: u32, end: u32) {
    // A4: pairs with R1/R2 of the predecessor (see module docs).
    if lo(ix.tail.load(Ordering::Acquire)) != start {
        wait_for_tail(ix, start);
    }
    // R1 (producer, pairs with A1) / R2 (consumer, pairs with A2): publishes our slot
    // accesses, and through A4 those of every same-side predecessor.
    ix.tail.store(word(0, end), Ordering::Release);
}

/// Slow path of [`commit`]: a predecessor is still copying, or was preempted mid-copy.
///
/// This wait is why Multi mode is not preemption-safe (see the ring module docs): we cannot
/// publish until the predecessor does.
#[cold]
#[inline(never)]
fn wait_for_tail(ix: &Indices<'_>, start: u32) {
    let mut wait = SpinWait::default();
    // A4, as above.
    while lo(ix.tail.load(Ordering::Acquire)) != start {
        wait.snooze();
    }
}
