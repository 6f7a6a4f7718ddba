//! The chunks a dead path may still be working in (see the session's module doc, "Failover
//! and the dead path's chunks"): which path fenced each chunk, and when the fence lifts.
//!
//! A chunk is fenced by every path that died with an unanswered request in it, and lifted
//! when each of those paths has connected again (the server then has dropped the old path
//! and drained its operations) or when the session closes. The permit pool does the
//! rest: a fenced permit returned by its holder stays taken until the last fence lifts
//! ([`Permits::fence`]).

use crate::permit::Permits;

/// Paths are tracked in a 128-bit mask: `MAX_PATHS` is 128.
const MASK_PATHS: usize = 128;

/// Per chunk, the paths that fenced it (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Fences {
    /// Per chunk, a bit per path index.
    by: Vec<u128>,
    /// Per path index, the generation of the path whose death set its bits.
    gens: Vec<u16>,
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
        for (id, f) in self.by.iter_mut().enumerate() {
            if *f & bit != 0 {
                *f &= !bit;
                if *f == 0 {
                    permits.unfence(id as u16);
                }
            }
        }
    }

    /// The session closed: every fence lifts.
    pub(crate) fn lift_all(&mut self, permits: &Permits) {
        for (id, f) in self.by.iter_mut().enumerate() {
            if std::mem::take(f) != 0 {
                permits.unfence(id as u16);
            }
        }
    }

    /// Chunks fenced now.
    pub(crate) fn count(&self) -> usize {
        self.by.iter().filter(|&&f| f != 0).count()
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
}
