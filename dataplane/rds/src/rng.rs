//! The engine's randomness: one seeded generator, so a run is reproducible from its seed
//! (the simulator's tests depend on it) and nothing reads a global or OS source.

use rand_core::{Rng as _, SeedableRng};
use rand_xorshift::XorShiftRng;

/// A seeded pseudo-random generator (xorshift128; not for secrets: RDS needs none).
#[derive(Clone, Debug)]
pub struct Rng(XorShiftRng);

impl Rng {
    /// A generator from a 64-bit seed.
    pub fn new(seed: u64) -> Self {
        Self(XorShiftRng::seed_from_u64(seed))
    }

    /// A uniformly random `u32`.
    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    /// A uniformly random `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A random value in `0..n` (0 when `n` is 0), as the kernel's `rand % n`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rng_is_reproducible_from_its_seed() {
        let (mut a, mut b, mut c) = (Rng::new(7), Rng::new(7), Rng::new(8));
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
        assert!((0..1000).all(|_| a.below(10) < 10));
        assert_eq!(a.below(0), 0);
    }
}
