//! The index protocol of one side: claim counters by moving a head, publish them by moving a
//! tail, in the side's mode.
//!
//! [`Cursor`] is the per-handle part. [`Cursor::reserve`] and [`Cursor::commit`] dispatch on the
//! mode at compile time: the [`Single`](super::Single) path is here, the shared modes are in
//! `mt.rs`, `rts.rs` and `hts.rs`, and the words they work on are described in `index.rs`.

use super::index::{Indices, grant, lo};
use super::mode::{SyncMode, SyncType};
use super::rts::HTD_MAX_DIVISOR;
use super::{hts, mt, rts};
use crate::sync::atomic::Ordering;

/// Per-handle state of a side.
///
/// The head is used only by [`Single`](super::Single) handles; shared modes work on the shared
/// words. Single, RTS and HTS handles keep their own cached copy of the opposite tail (see
/// `Indices::avail_cached` for RTS and HTS); a Multi side caches it in its shared head word
/// (`mt.rs`). `htd_max` is used only by RTS handles.
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
    /// pulling it on every operation.
    pub(crate) cached_opp_tail: u32,
    /// RTS: how far the head may run ahead of the tail before this handle's claims wait
    /// (DPDK's `htd_max`). Per handle, never read from shared memory.
    pub(crate) htd_max: u32,
}

impl Cursor {
    /// Loads the state of a side from shared memory when a handle is created.
    pub(crate) fn load(ix: &Indices<'_>, capacity: u32) -> Self {
        // Acquire (attach edge): pairs with R1/R2 of whichever handle last used this side,
        // possibly in another process that has since handed the side over to us.
        let head = lo(ix.tail.load(Ordering::Acquire));
        Self {
            head,
            // A1/A2.
            cached_opp_tail: ix.opp_pos(),
            htd_max: capacity / HTD_MAX_DIVISOR,
        }
    }

    /// Replaces the cached opposite tail with a fresh load (A1/A2, in `opp_pos`).
    ///
    /// For handles whose cache cannot be trusted to be less than 2^32 counters old: the pool's
    /// borrowed clones (`pool/port.rs`) never keep what they learn, so their cache is the one
    /// loaded when the pool was made. A fresh copy is never ahead of the truth, and it is at
    /// most one operation's worth of counters behind by the time `reserve` uses it. A no-op for
    /// [`Multi`](super::Multi) sides, whose cache lives in the shared head word and cannot go
    /// stale (`mt.rs`).
    #[inline(always)]
    pub(crate) fn refresh<M: SyncMode>(&mut self, ix: &Indices<'_>) {
        if M::TYPE != SyncType::Multi {
            self.cached_opp_tail = ix.opp_pos();
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
        match M::TYPE {
            SyncType::Single => self.reserve_single(ix, n, fixed),
            SyncType::Multi => mt::reserve(ix, n, fixed),
            SyncType::Rts => rts::reserve(ix, &mut self.cached_opp_tail, self.htd_max, n, fixed),
            SyncType::Hts => hts::reserve(ix, &mut self.cached_opp_tail, n, fixed),
        }
    }

    /// Publishes `n` counters starting at `start`, claimed by [`Cursor::reserve`] and filled or
    /// drained by the caller.
    #[inline(always)]
    pub(crate) fn commit<M: SyncMode>(&mut self, ix: &Indices<'_>, start: u32, n: u32) {
        debug_assert!(n != 0, "commit of an empty reservation");
        let end = start.wrapping_add(n);
        match M::TYPE {
            SyncType::Single => {
                debug_assert_eq!(start, self.head, "Single side committed out of order");
                self.head = end;
                // R1 (producer, pairs with A1) / R2 (consumer, pairs with A2).
                ix.tail.store(u64::from(end), Ordering::Release);
            }
            SyncType::Multi => mt::commit(ix, start, end),
            SyncType::Rts => rts::commit(ix),
            SyncType::Hts => hts::commit(ix, end),
        }
    }

    /// The Single claim: against the cached opposite tail, reloaded only when it says there is
    /// not enough room.
    #[inline(always)]
    fn reserve_single(&mut self, ix: &Indices<'_>, n: u32, fixed: bool) -> (u32, u32) {
        let head = self.head;
        let mut avail = ix.avail(head, self.cached_opp_tail);
        if avail < n {
            // A1 (consumer, pairs with R1) / A2 (producer, pairs with R2), in `opp_pos`.
            self.cached_opp_tail = ix.opp_pos();
            avail = ix.avail(head, self.cached_opp_tail);
        }
        (head, grant(avail, n, fixed))
    }
}
