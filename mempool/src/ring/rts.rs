//! [`Rts`](super::Rts) sides: relaxed tail sync, DPDK's `rte_ring_rts_elem_pvt.h`.
//!
//! Head and tail words each hold a position (low half) and a count (high half). A claim CASes
//! the head forward by `n` and its count by one; a finish CASes the tail's count up by one and,
//! when that makes the tail's count equal to the head's (no claim is unfinished), also sets the
//! tail position to the head position. Nobody waits for another thread to finish; a thread that
//! is preempted mid-operation only holds the tail back, and the others keep claiming until the
//! head is more than `htd_max` counters ahead of the tail (DPDK's head/tail distance limit,
//! `capacity / 8` by default; 0 serialises the side).
//!
//! Why the count makes this correct: a finisher reads the head after its own claim, so it sees
//! at least its own claim; it moves the tail only when the number of finishes (its own
//! included) equals the number of claims up to the head it read, i.e. when every claim up to
//! that head has finished. The finishes counted are exactly claims at or below that head,
//! because each earlier finisher read a head at least as new as its own claim, and A6 below
//! makes our head read at least as new as theirs.
//!
//! Ordering edges (labels as in the [ring module docs](super#memory-ordering-edges)):
//!
//! - **R3/A3** as in Multi mode, on the head word: a claimant that continues from another's
//!   head has seen at least the opposite tail that claimant saw.
//! - **A6** Acquire on the tail-word load and on a failed tail CAS, pairing with the Release
//!   tail CAS of earlier finishers: their head reads happen-before ours, so by coherence the
//!   head we read is at least as new as any head an earlier finisher read, and we never move the
//!   tail on a stale head.
//! - **R1/R2** the tail CAS is Release. An opposite-side thread that acquires a tail position
//!   synchronises with every finisher counted in it, not only the one that moved the position:
//!   all tail updates are read-modify-writes, so each finisher's Release heads a release
//!   sequence that the later updates continue.
//! - The head load inside the finish and the tail load of the distance wait are Relaxed: the
//!   first is ordered by A6 (coherence), the second only throttles claims and guards no data.

use super::index::{Indices, grant, hi, lo, word};
use crate::sync::SpinWait;
use crate::sync::atomic::Ordering;

/// DPDK's `HTD_MAX_DEF`: the default head/tail distance limit is `capacity / 8`.
pub(crate) const HTD_MAX_DIVISOR: u32 = 8;

/// Claims up to `n` counters (exactly `n` or none when `fixed`), waiting while the head is more
/// than `htd_max` ahead of the tail; returns the first counter and the count (0: nothing
/// claimed). `cache` is the handle's copy of the opposite tail.
#[inline(always)]
pub(crate) fn reserve(
    ix: &Indices<'_>,
    cache: &mut u32,
    htd_max: u32,
    n: u32,
    fixed: bool,
) -> (u32, u32) {
    // A3: pairs with R3 of the claimant whose CAS wrote this head word.
    let mut old = ix.rts_head.load(Ordering::Acquire);
    loop {
        if too_far_ahead(ix, old, htd_max) {
            old = wait_distance(ix, htd_max);
        }
        let head = lo(old);
        // A1/A2 (in `avail_cached`, when it reloads), after A3 as in Multi mode.
        let k = grant(ix.avail_cached(head, cache, n), n, fixed);
        if k == 0 {
            return (head, 0);
        }
        // R3 on success (pairs with A3 of the next claimant); A3 on failure.
        match ix.rts_head.compare_exchange_weak(
            old,
            word(hi(old).wrapping_add(1), head.wrapping_add(k)),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return (head, k),
            Err(current) => old = current,
        }
    }
}

/// Whether the head in `head_word` is more than `htd_max` counters ahead of the tail.
///
/// The tail is loaded after the head, so it may be newer than a stale head word; a distance that
/// is negative as an `i32` is such a stale head, not a long distance (the CAS will fail on it).
#[inline(always)]
fn too_far_ahead(ix: &Indices<'_>, head_word: u64, htd_max: u32) -> bool {
    // Relaxed: only throttles claims; no slot is accessed on the strength of this load.
    let tail = lo(ix.tail.load(Ordering::Relaxed));
    let distance = lo(head_word).wrapping_sub(tail);
    distance > htd_max && (distance as i32) > 0
}

/// Waits until the head is at most `htd_max` ahead of the tail; returns the head word.
#[cold]
#[inline(never)]
fn wait_distance(ix: &Indices<'_>, htd_max: u32) -> u64 {
    let mut wait = SpinWait::default();
    loop {
        wait.snooze();
        // A3, as in `reserve`.
        let head = ix.rts_head.load(Ordering::Acquire);
        if !too_far_ahead(ix, head, htd_max) {
            return head;
        }
    }
}

/// Finishes an operation: counts it on the tail, and moves the tail position to the head if
/// no other claim is unfinished. Never waits.
#[inline(always)]
pub(crate) fn commit(ix: &Indices<'_>) {
    // A6: pairs with the R1/R2 tail CAS of earlier finishers (see module docs).
    let mut old = ix.tail.load(Ordering::Acquire);
    loop {
        // Relaxed: ordered after every earlier finisher's head read by A6 (coherence).
        let head = ix.rts_head.load(Ordering::Relaxed);
        let count = hi(old).wrapping_add(1);
        let pos = if count == hi(head) { lo(head) } else { lo(old) };
        // R1 (producer, pairs with A1) / R2 (consumer, pairs with A2) on success, also
        // continuing the release sequences of earlier finishers; A6 on failure.
        match ix.tail.compare_exchange_weak(
            old,
            word(count, pos),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(current) => old = current,
        }
    }
}
