//! How a side of a client/server benchmark waits when it has nothing to do: busy (spin) on
//! dedicated cores, or hybrid (spin for 50 us of idleness, then sleep 20 us at a time) when
//! both sides share the machine with others, as lcore's hybrid poll mode does.
//!
//! The clock is looked at once every [`Idle::CHECK_EVERY`] idle turns in a row, not on
//! every one: an idle turn is what a request that has just arrived waits for (half of one
//! on average, at queue depth 1 on each side of every round trip), and reading the clock
//! (`clock_gettime` through the vDSO, 27 ns on the lab's VMs) was a large part of a turn.
//! The callers' own periodic checks (a server's "is my client gone") ride on the same
//! turns: [`Idle::after`] says when.

use std::time::{Duration, Instant};

/// Idleness since the last work, and the mode.
#[derive(Debug)]
pub(crate) struct Idle {
    busy: bool,
    /// When the clock first saw this idle stretch.
    since: Option<Instant>,
    /// Idle turns in a row.
    turns: u32,
    /// The spin phase of this idle stretch is over: every idle turn sleeps.
    napping: bool,
}

/// Idleness before a hybrid poller sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// One hybrid sleep.
const NAP: Duration = Duration::from_micros(20);

impl Idle {
    /// Idle turns in a row between looks at the clock.
    pub(crate) const CHECK_EVERY: u32 = 64;

    pub(crate) fn new(busy: bool) -> Self {
        Self {
            busy,
            since: None,
            turns: 0,
            napping: false,
        }
    }

    /// After a poll turn that did `work` things: nothing after work, else the wait of an
    /// idle turn. True on the idle turns where the caller should make its periodic checks:
    /// every [`CHECK_EVERY`](Self::CHECK_EVERY)-th in a row while spinning, every one once
    /// napping.
    pub(crate) fn after(&mut self, work: usize) -> bool {
        if work > 0 {
            self.since = None;
            self.turns = 0;
            self.napping = false;
            return false;
        }
        if self.napping {
            std::thread::sleep(NAP);
            return true;
        }
        self.turns = self.turns.wrapping_add(1);
        if !self.turns.is_multiple_of(Self::CHECK_EVERY) {
            return false;
        }
        if !self.busy && self.since.get_or_insert_with(Instant::now).elapsed() > SPIN {
            self.napping = true;
            std::thread::sleep(NAP);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_every_nth_idle_turn_and_naps_only_in_hybrid_mode() {
        for busy in [true, false] {
            let mut idle = Idle::new(busy);
            // Work resets the count: the checks come at the CHECK_EVERY-th idle turn in a
            // row.
            for _ in 0..Idle::CHECK_EVERY - 1 {
                assert!(!idle.after(0));
            }
            assert!(!idle.after(1));
            let checks = (1..=Idle::CHECK_EVERY * 3)
                .filter(|_| idle.after(0))
                .count();
            assert_eq!(checks, 3, "busy {busy}");
            // Past the spin phase, a hybrid poller naps on every idle turn (and each is a
            // check); a busy one never does.
            std::thread::sleep(SPIN + Duration::from_millis(1));
            let t = Instant::now();
            let checks = (1..=Idle::CHECK_EVERY * 2)
                .filter(|_| idle.after(0))
                .count();
            if busy {
                assert_eq!(checks, 2);
                assert!(!idle.napping);
            } else {
                assert!(idle.napping, "the hybrid poller should be napping");
                assert!(checks > Idle::CHECK_EVERY as usize, "{checks} checks");
                assert!(t.elapsed() >= NAP * Idle::CHECK_EVERY, "it did not nap");
            }
            // Work ends the nap.
            assert!(!idle.after(1));
            assert!(!idle.napping);
        }
    }
}
