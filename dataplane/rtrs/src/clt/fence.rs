//! The chunks a dead path may still be working in (see the session's module doc, "Failover
//! and the dead path's chunks"): which path fenced each chunk, and when the fence lifts.
//!
//! A chunk is fenced by every path that died with an unanswered request in it, and lifted
//! when each of those paths has connected again (the server then has dropped the old path
//! and drained its operations) or when the session closes. The permit pool does the
//! rest: a fenced permit returned by its holder stays taken until the last fence lifts
//! ([`Permits::fence`]).
//!
//! A path that is removed never connects again, so its fences become *holds* that lift
//! at a deadline instead (`ClientConfig::fence_hold`). Without that, every path removed
//! with requests in flight kept their chunks for the session's life, and a session that
//! adds and removes paths under load lost queue depth until no permit was left. A
//! removed path's index may go to a new path at once: the holds are kept apart from the
//! per-index bits, so the new path's fences and reconnects never touch them.

use std::collections::VecDeque;

use crate::permit::Permits;
use crate::timer::Instant;

/// Paths are tracked in a 128-bit mask: `MAX_PATHS` is 128.
const MASK_PATHS: usize = 128;

/// Per chunk, the paths that fenced it (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Fences {
    /// Per chunk, a bit per path index.
    by: Vec<u128>,
    /// Per path index, the generation of the path whose death set its bits.
    gens: Vec<u16>,
    /// Per chunk, the holds of removed paths on it.
    held: Vec<u16>,
    /// The holds, oldest deadline first: when they lift and the chunks they hold.
    holds: VecDeque<(Instant, Vec<u16>)>,
}

impl Fences {
    /// Chunk `id` had an unanswered request on path index `from` (generation `gen_`) when
    /// the path died.
    pub(crate) fn fence(&mut self, id: u16, from: usize, gen_: u16, permits: &Permits) {
        if from >= MASK_PATHS || id >= permits.depth() {
            return;
        }
        if self.by.len() != usize::from(permits.depth()) {
            self.by.resize(usize::from(permits.depth()), 0);
        }
        if self.gens.len() <= from {
            self.gens.resize(from + 1, 0);
        }
        self.gens[from] = gen_;
        self.by[usize::from(id)] |= 1u128 << from;
        permits.fence(id);
    }

    /// Path index `i` (generation `gen_`) connected again: its fences lift; a chunk no
    /// other dead path fenced is free again.
    pub(crate) fn lift(&mut self, i: usize, gen_: u16, permits: &Permits) {
        if i >= MASK_PATHS || self.gens.get(i) != Some(&gen_) {
            return;
        }
        let bit = 1u128 << i;
        for id in 0..self.by.len() {
            if self.by[id] & bit != 0 {
                self.by[id] &= !bit;
                self.unfence_if_free(id, permits);
            }
        }
    }

    /// Path index `i` (generation `gen_`) is removed: its fences become one hold that
    /// lifts at `until` ([`expire`](Self::expire)), and the index carries none any more.
    pub(crate) fn hold(&mut self, i: usize, gen_: u16, until: Instant) {
        if i >= MASK_PATHS || self.gens.get(i) != Some(&gen_) {
            return;
        }
        let bit = 1u128 << i;
        if self.held.len() != self.by.len() {
            self.held.resize(self.by.len(), 0);
        }
        let mut chunks = Vec::new();
        for (id, f) in self.by.iter_mut().enumerate() {
            if *f & bit != 0 {
                *f &= !bit;
                // At most one hold per removed path, and paths are removed one at a time:
                // the count cannot reach u16::MAX before earlier holds expire, but
                // saturate rather than wrap if a caller ever makes it.
                self.held[id] = self.held[id].saturating_add(1);
                chunks.push(id as u16);
            }
        }
        if chunks.is_empty() {
            return;
        }
        // Deadlines come from one configured hold after a monotonic `now`: appended in
        // order. Inserted in place should a clock step back.
        let at = self.holds.partition_point(|(t, _)| *t <= until);
        self.holds.insert(at, (until, chunks));
    }

    /// Lifts the holds due at `now`.
    pub(crate) fn expire(&mut self, now: Instant, permits: &Permits) {
        while self.holds.front().is_some_and(|(t, _)| *t <= now) {
            let Some((_, chunks)) = self.holds.pop_front() else {
                break;
            };
            for id in chunks {
                let id = usize::from(id);
                if let Some(h) = self.held.get_mut(id) {
                    *h = h.saturating_sub(1);
                    self.unfence_if_free(id, permits);
                }
            }
        }
    }

    /// When the next hold lifts.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.holds.front().map(|(t, _)| *t)
    }

    fn unfence_if_free(&self, id: usize, permits: &Permits) {
        if self.by[id] == 0 && self.held.get(id).is_none_or(|&h| h == 0) {
            permits.unfence(id as u16);
        }
    }

    /// The session closed: every fence and hold lifts.
    pub(crate) fn lift_all(&mut self, permits: &Permits) {
        self.holds.clear();
        for id in 0..self.by.len() {
            let held = self.held.get_mut(id).map_or(0, std::mem::take);
            if std::mem::take(&mut self.by[id]) != 0 || held != 0 {
                permits.unfence(id as u16);
            }
        }
    }

    /// Chunks fenced or held now.
    pub(crate) fn count(&self) -> usize {
        (0..self.by.len())
            .filter(|&id| self.by[id] != 0 || self.held.get(id).is_some_and(|&h| h != 0))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permit::{ConType, Wait};

    #[test]
    fn test_fence_lifts_when_every_fencing_path_is_back() {
        let p = Permits::new(8, 1);
        let a = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let id = a.id();
        let mut f = Fences::default();
        f.fence(id, 0, 5, &p);
        f.fence(id, 3, 9, &p);
        p.put(a);
        assert!(p.is_taken(id), "parked while fenced");
        f.lift(0, 4, &p);
        assert_eq!(f.count(), 1, "another generation of path 0 lifts nothing");
        f.lift(0, 5, &p);
        assert!(p.is_taken(id), "path 3 still fences it");
        f.lift(3, 9, &p);
        assert_eq!(f.count(), 0);
        assert!(!p.is_taken(id), "free once both paths are back");
    }

    #[test]
    fn test_a_removed_paths_hold_lifts_at_its_deadline_and_spares_the_index() {
        let t0 = Instant::from_nanos(1_000);
        let p = Permits::new(8, 1);
        let (a, b) = (
            p.get(ConType::Io, 0, Wait::NoWait).unwrap(),
            p.get(ConType::Io, 0, Wait::NoWait).unwrap(),
        );
        let (ia, ib) = (a.id(), b.id());
        let mut f = Fences::default();
        // Path index 2 (generation 7) dies with both in flight; path 5 also fenced `ib`.
        f.fence(ia, 2, 7, &p);
        f.fence(ib, 2, 7, &p);
        f.fence(ib, 5, 1, &p);
        p.put(a);
        p.put(b);
        f.hold(2, 7, t0 + std::time::Duration::from_secs(30));
        assert_eq!(f.count(), 2, "a hold still keeps both");
        assert_eq!(
            f.next_deadline(),
            Some(t0 + std::time::Duration::from_secs(30))
        );
        // Index 2 goes to a new path (generation 8), which dies and comes back: it lifts
        // nothing of the old path's.
        f.fence(ia, 2, 8, &p);
        f.lift(2, 8, &p);
        assert!(
            p.is_taken(ia),
            "the new path at the index lifted the old path's hold"
        );
        f.expire(t0 + std::time::Duration::from_secs(29), &p);
        assert!(p.is_taken(ia), "lifted before its deadline");
        f.expire(t0 + std::time::Duration::from_secs(30), &p);
        assert!(!p.is_taken(ia), "the hold lifts at its deadline");
        assert!(p.is_taken(ib), "path 5 still fences it");
        assert_eq!(f.next_deadline(), None);
        f.lift(5, 1, &p);
        assert_eq!(f.count(), 0);
        assert!(!p.is_taken(ib));
    }

    #[test]
    fn test_session_close_lifts_holds_too() {
        let p = Permits::new(4, 1);
        let a = p.get(ConType::Io, 0, Wait::NoWait).unwrap();
        let id = a.id();
        let mut f = Fences::default();
        f.fence(id, 0, 0, &p);
        p.put(a);
        f.hold(0, 0, Instant::from_nanos(u64::MAX / 2));
        f.lift_all(&p);
        assert_eq!(f.count(), 0);
        assert!(!p.is_taken(id));
        assert_eq!(f.next_deadline(), None);
    }
}
