//! The shared index words of a ring side and the arithmetic every mode shares.
//!
//! Each side owns 64-bit words in the header (see `layout.rs`): `tail`, an RTS `head` beside it
//! on the same cache-line pair, and a Multi `head` on a line pair of its own; a mode uses at
//! most one of the two head words (`Indices::head` or `Indices::rts_head`). Their meaning
//! depends on the side's mode, with one rule common to all: the **low 32 bits of `tail` are the side's published position**, the counter below which every
//! slot is handed to the opposite side. The opposite side reads only that, so it never needs to
//! know this side's mode (DPDK gets the same effect by placing `tail` at one offset in all
//! three of its head/tail structs and reading it with a 32-bit load; Rust's memory model has no
//! mixed-size atomic accesses, so here every access is a whole 64-bit word).
//!
//! | mode   | its head word            | `tail` word                          |
//! |--------|--------------------------|--------------------------------------|
//! | Single | none                     | position                             |
//! | Multi  | `head`: cached opposite position << 32 \| position (CAS) | position |
//! | RTS    | `rts_head`: op count << 32 \| position | finish count << 32 \| position |
//! | HTS    | none                     | head position << 32 \| tail position |
//!
//! All arithmetic is on free-running `u32` counters with wrapping operations; a counter is turned
//! into a slot index only by masking, in [`RawRing`](super::storage::RawRing).
//!
//! Producer and consumer run the same protocol with different constants, as in DPDK's
//! `__rte_ring_headtail_move_head`:
//!
//! | side     | own words                | opposite tail | `base`     | `avail = base + opp_tail - head` |
//! |----------|--------------------------|---------------|------------|----------------------------------|
//! | producer | `prod.head`, `prod.tail` | `cons.tail`   | `capacity` | free slots                       |
//! | consumer | `cons.head`, `cons.tail` | `prod.tail`   | `0`        | filled slots                     |

use super::mode::SyncType;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The shared words of one side plus the opposite side's tail, borrowed from the header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Indices<'a> {
    /// This side's Multi head word, on a line pair of its own.
    pub(crate) head: &'a AtomicU64,
    /// This side's RTS head word, beside its tail word.
    pub(crate) rts_head: &'a AtomicU64,
    /// This side's tail word; its low half is the published position.
    pub(crate) tail: &'a AtomicU64,
    /// The opposite side's tail word.
    pub(crate) opp_tail: &'a AtomicU64,
    /// `capacity` for the producer, `0` for the consumer.
    pub(crate) base: u32,
    /// Slots in the ring (copied from the validated header at attach time).
    pub(crate) capacity: u32,
}

impl Indices<'_> {
    /// The opposite side's published position.
    ///
    /// Acquire: A1 (consumer loading `prod.tail`, pairs with R1) / A2 (producer loading
    /// `cons.tail`, pairs with R2): the opposite side's slot accesses below the returned
    /// position happen-before ours.
    #[inline(always)]
    pub(crate) fn opp_pos(&self) -> u32 {
        lo(self.opp_tail.load(Ordering::Acquire))
    }

    /// Counters available to claim from `head` against the opposite position `opp`.
    #[inline(always)]
    pub(crate) fn avail(&self, head: u32, opp: u32) -> u32 {
        self.base.wrapping_add(opp).wrapping_sub(head)
    }

    /// Counters available to claim from a shared head `head`, computed against `*cache` (this
    /// handle's last load of the opposite tail) and reloading the cache (A1/A2, in `opp_pos`)
    /// only when it says fewer than `n` are available or cannot be right.
    ///
    /// The opposite tail only grows, so a cached copy is never ahead of the truth and gives an
    /// underestimate: safe to act on. A copy so old that `head` (moved meanwhile by other
    /// threads of this side) is beyond it by more than the capacity makes the subtraction wrap
    /// to more than `capacity`, which no true count can be; that also reloads, except for a
    /// copy about 2^32 counters old, which reads as valid again (see the module docs: the pools
    /// reload before they call this on a handle that may have been idle). The slots a claim
    /// computed from the cache covers were published by the opposite side before the cached
    /// tail was acquired, by this handle, so our accesses to them are ordered after theirs.
    ///
    /// This is the Single handles' rule (see [`Cursor`](super::headtail::Cursor)) carried over
    /// to the shared sides (RTS and HTS pass the handle's cache; Multi passes the position
    /// cached in its head word, see `mt.rs`): DPDK's multi-thread paths load the opposite tail
    /// on every operation.
    /// A handle that keeps claiming while the ring has room reads the opposite side's line
    /// about once per `avail` counters instead of once per operation.
    #[inline(always)]
    pub(crate) fn avail_cached(&self, head: u32, cache: &mut u32, n: u32) -> u32 {
        let avail = self.avail(head, *cache);
        if avail >= n && avail <= self.capacity {
            return avail;
        }
        *cache = self.opp_pos();
        self.avail(head, *cache)
    }
}

/// The low half of a word: a position.
#[inline(always)]
pub(crate) const fn lo(word: u64) -> u32 {
    word as u32
}

/// The high half of a word: a count (RTS) or the head position (HTS).
#[inline(always)]
pub(crate) const fn hi(word: u64) -> u32 {
    (word >> 32) as u32
}

/// A word from its two halves.
#[inline(always)]
pub(crate) const fn word(hi: u32, lo: u32) -> u64 {
    (hi as u64) << 32 | lo as u64
}

/// The `(head, tail)` words of a side of mode `mode` whose counters all start at `start`.
pub(crate) const fn initial_words(mode: SyncType, start: u32) -> (u64, u64) {
    match mode {
        // Counts start at 0; the HTS word holds the head position in its high half. The Multi
        // head caches the opposite tail, which starts at `start` too (an empty ring: no room
        // for the consumer, `capacity` for the producer).
        SyncType::Single | SyncType::Rts => (word(0, start), word(0, start)),
        SyncType::Multi => (word(start, start), word(0, start)),
        SyncType::Hts => (word(0, start), word(start, start)),
    }
}

/// How many of `n` requested counters to grant when `avail` are available.
#[inline(always)]
pub(crate) fn grant(avail: u32, n: u32, fixed: bool) -> u32 {
    if avail >= n {
        n
    } else if fixed {
        0
    } else {
        avail
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn words_pack_and_unpack() {
        let w = word(0xdead_beef, 0x1234_5678);
        assert_eq!((hi(w), lo(w)), (0xdead_beef, 0x1234_5678));
        assert_eq!(initial_words(SyncType::Hts, 7), (7, word(7, 7)));
        assert_eq!(
            initial_words(SyncType::Rts, u32::MAX),
            (0xffff_ffff, 0xffff_ffff)
        );
        assert_eq!(grant(3, 4, true), 0);
        assert_eq!(grant(3, 4, false), 3);
        assert_eq!(grant(5, 4, true), 4);
    }
}
