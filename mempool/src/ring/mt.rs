//! [`Multi`](super::Multi) sides: DPDK's default multi-thread sync (`rte_ring_c11_pvt.h`), with
//! the opposite tail cached in the head word.
//!
//! Claim: load the head word, compute the room against the opposite position cached in it,
//! CAS the word forward by `n`, retrying on contention. Publish: wait until the tail equals the
//! head we started from (every earlier claimant has published), then store the new tail.
//! Claims are serialised by the CAS, copies run in parallel, and publication happens in claim
//! order, so the opposite side only ever sees a gap-free prefix.
//!
//! **The cached opposite position.** The head word is `cached << 32 | head`: the high half is
//! a position of the opposite tail that some claimant of this side loaded (A1/A2) and wrote
//! with its CAS. DPDK loads the opposite tail on every operation, which pulls the opposite
//! side's line over while that side is busy; here a claimant loads it only when the cached
//! position says there is not enough room, and writes the fresh position with its claim, so
//! every thread of the side benefits from every reload. Because the cached position and the
//! head move in one CAS, the invariant `0 <= base + cached - head <= capacity` holds for every
//! value of the word (a claim grants at most `base + cached - head`), so the cache cannot
//! alias however long a handle sits idle: it belongs to the side, not to a handle. The
//! per-handle cache of the other modes (`Cursor::cached_opp_tail`) is not used.
//!
//! **Backoff.** A claimant whose CAS lost spins a few hints before retrying ([`Backoff`]): two
//! claimants in lockstep otherwise keep pulling the head line from each other between a claim
//! and its tail store.
//!
//! Ordering edges (labels as in the [ring module docs](super#memory-ordering-edges)):
//!
//! - **R3** Release on a successful head CAS / **A3** Acquire on the head load and on a failed
//!   CAS: a thread that continues from another thread's head word has also seen everything
//!   that thread saw before its CAS, in particular the opposite side's slot accesses below the
//!   cached position it wrote (it acquired them with A1/A2). So a claim granted from a cached
//!   position is ordered after those accesses even when another thread loaded the position,
//!   and a reload (read-read coherence after A3) is never older than the cached position, so
//!   the room never underflows. A successful CAS continues the release sequence of every
//!   earlier CAS on the word, so acquiring any later value synchronises with all of them.
//! - **A4** Acquire in the tail wait, pairing with R1/R2 of the same-side predecessor: the
//!   predecessor's slot accesses happen-before our tail store. A plain store does not continue
//!   a release sequence, so without A4 an opposite-side thread synchronising with our tail would
//!   not be ordered after the predecessor's slot accesses.

use super::index::{Indices, grant, hi, lo, word};
use crate::sync::atomic::Ordering;
use crate::sync::{Backoff, SpinWait};

/// Claims up to `n` counters (exactly `n` or none when `fixed`); returns the first counter and
/// the count (0: nothing claimed).
#[inline(always)]
pub(crate) fn reserve(ix: &Indices<'_>, n: u32, fixed: bool) -> (u32, u32) {
    // A3: pairs with R3 of the thread whose CAS wrote this word.
    let mut old = ix.head.load(Ordering::Acquire);
    let mut backoff = Backoff::new();
    loop {
        let head = lo(old);
        // The word's cached position, reloaded (A1/A2, after A3: not older than the cached
        // one, module docs) when it shows fewer than `n` or more than `capacity`: the latter
        // is impossible for a word the protocol wrote, but a peer process may have written it
        // (the grant stays <= n <= capacity).
        let mut cached = hi(old);
        let k = grant(ix.avail_cached(head, &mut cached, n), n, fixed);
        if k == 0 {
            return (head, 0);
        }
        // R3 on success (pairs with A3 of the next head mover); A3 on failure (the returned word
        // was written by another mover's R3). Weak CAS: a spurious failure just loops.
        match ix.head.compare_exchange_weak(
            old,
            word(cached, head.wrapping_add(k)),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return (head, k),
            Err(current) => {
                // Lost to another claimant: let it finish with the line (see `Backoff`).
                backoff.spin();
                old = current;
            }
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
