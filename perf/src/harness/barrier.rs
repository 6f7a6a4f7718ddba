//! Spinning with a bounded budget, and a reusable spin barrier built on it.

use core::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

/// Spins with [`core::hint::spin_loop`] for a bounded number of rounds, then yields the CPU on
/// every further round.
///
/// Two budgets: [`Backoff::new`] yields after [`Backoff::SPIN_LIMIT`] pause hints (tens of
/// microseconds), for waits whose length does not matter (barriers, set-up);
/// [`Backoff::measuring`] spins for [`Backoff::MEASURE_SPIN_LIMIT`] hints (milliseconds) first,
/// for waits inside a timed loop. DPDK's perf tests spin with `rte_pause` forever; yielding
/// early inside a timed loop hands the CPU to whatever else is runnable and makes a loaded
/// host look far slower for us than for DPDK. The bounded budget still lets an oversubscribed
/// host (tests) make progress.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    spins: u32,
    limit: u32,
}

impl Backoff {
    /// Pause hints before the first yield with [`Backoff::new`]: about 10-50 us depending on
    /// the CPU's `pause` cost.
    pub const SPIN_LIMIT: u32 = 1024;

    /// Pause hints before the first yield with [`Backoff::measuring`]: about 3-15 ms, longer
    /// than a scheduler time slice, so a peer preempted by another process is waited for by
    /// spinning, as DPDK does.
    pub const MEASURE_SPIN_LIMIT: u32 = 1 << 19;

    /// A fresh backoff with the short budget.
    #[inline]
    pub const fn new() -> Self {
        Self {
            spins: 0,
            limit: Self::SPIN_LIMIT,
        }
    }

    /// A fresh backoff with the long budget, for waits inside timed loops.
    #[inline]
    pub const fn measuring() -> Self {
        Self {
            spins: 0,
            limit: Self::MEASURE_SPIN_LIMIT,
        }
    }

    /// Waits a little: one pause hint, or a `sched_yield` once the spin budget is spent.
    #[inline]
    pub fn snooze(&mut self) {
        if self.spins < self.limit {
            self.spins += 1;
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    /// Starts the spin budget over (call after progress).
    #[inline]
    pub fn reset(&mut self) {
        self.spins = 0;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// A reusable barrier for `parties` threads that spins (with [`Backoff`]) instead of sleeping,
/// so that the threads leave it within a few hundred nanoseconds of each other.
///
/// Generation-counting: the last arriver resets the arrival count and bumps the generation;
/// everyone else waits for the generation to change.
#[derive(Debug)]
pub struct SpinBarrier {
    parties: usize,
    arrived: CachePadded<AtomicUsize>,
    generation: CachePadded<AtomicUsize>,
}

impl SpinBarrier {
    /// A barrier for `parties` threads (at least 1).
    pub fn new(parties: usize) -> Self {
        Self {
            parties: parties.max(1),
            arrived: CachePadded::new(AtomicUsize::new(0)),
            generation: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Blocks (spinning) until all parties have called `wait` for this round. Returns `true` in
    /// exactly one thread per round, the last to arrive.
    pub fn wait(&self) -> bool {
        // B1: Acquire, pairs with B3 of the previous round: we see that round's reset of
        // `arrived` before adding ourselves to this round.
        let generation = self.generation.load(Ordering::Acquire);
        // B2: AcqRel. Release publishes what this thread did before the barrier to the last
        // arriver; Acquire (in the last arriver) collects every earlier arriver's writes.
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            // Relaxed: nobody touches `arrived` again until they have seen the B3 bump below,
            // which is ordered after this store in program order and released by B3.
            self.arrived.store(0, Ordering::Relaxed);
            // B3: Release, pairs with B1/B4 in the waiters: publishes the reset and everything
            // the arrivers published to us through B2.
            self.generation.fetch_add(1, Ordering::Release);
            true
        } else {
            let mut backoff = Backoff::new();
            // B4: Acquire, pairs with B3: after the barrier we see what every party did
            // before it.
            while self.generation.load(Ordering::Acquire) == generation {
                backoff.snooze();
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn barrier_separates_rounds() {
        const ROUNDS: u64 = 200;
        let barrier = SpinBarrier::new(2);
        let counter = AtomicU64::new(0);
        let leaders = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for round in 0..ROUNDS {
                        // Relaxed: ordering comes from the barrier (B2/B3/B4).
                        counter.fetch_add(1, Ordering::Relaxed);
                        if barrier.wait() {
                            leaders.fetch_add(1, Ordering::Relaxed);
                        }
                        // Both increments of this round are visible, and none of the next.
                        assert_eq!(counter.load(Ordering::Relaxed), 2 * (round + 1));
                        barrier.wait();
                    }
                });
            }
        });
        assert_eq!(leaders.load(Ordering::Relaxed), ROUNDS);
    }

    #[test]
    fn single_party_never_waits() {
        let b = SpinBarrier::new(1);
        assert!(b.wait());
        assert!(b.wait());
    }
}
