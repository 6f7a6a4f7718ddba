//! Randomised exponential reconnect backoff (`rds_queue_reconnect`).
//!
//! The first attempt after a drop goes at once and opens a window of `min`; each later one
//! waits a random time below the window, which then doubles up to `max`. Success closes
//! the window: on a message transport when the connection is established (the peer's
//! CM answer is its RDS accepting), on a stream transport when the peer's first message
//! arrives (a TCP connect alone may be the peer's kernel accepting what its RDS then
//! resets). Two sides that keep dialling each other at the same moment (duelling
//! connects) drift apart until one connect completes before the other side's timer fires.

use std::time::Duration;

use lcore::time::{Instant, duration_to_nanos};

use crate::rng::Rng;

/// The backoff window of a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    window_ns: u64,
}

impl Backoff {
    /// When to dial next, given the bounds: `now` the first time, then a random delay
    /// below the doubling window.
    pub fn next(&mut self, now: Instant, min: Duration, max: Duration, rng: &mut Rng) -> Instant {
        let (min, max) = (duration_to_nanos(min).max(1), duration_to_nanos(max));
        if self.window_ns == 0 {
            self.window_ns = min;
            return now;
        }
        let delay = rng.below(self.window_ns);
        self.window_ns = self.window_ns.saturating_mul(2).min(max.max(min));
        Instant::from_nanos(now.as_nanos().saturating_add(delay))
    }

    /// The connection came up: the next drop starts over.
    pub fn reset(&mut self) {
        self.window_ns = 0;
    }

    /// The current window (0 when closed).
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_backoff_first_at_once_then_random_below_a_doubling_window() {
        let (min, max) = (Duration::from_millis(1), Duration::from_millis(1000));
        let mut rng = Rng::new(1);
        let mut b = Backoff::default();
        let t0 = Instant::from_millis(10);
        assert_eq!(b.next(t0, min, max, &mut rng), t0, "first attempt: delay 0");
        let mut window = Duration::from_millis(1);
        for _ in 0..20 {
            assert_eq!(b.window(), window);
            let at = b.next(t0, min, max, &mut rng);
            assert!(at.nanos_since(t0) < duration_to_nanos(window));
            window = (window * 2).min(max);
        }
        assert_eq!(b.window(), max, "capped at max");
        b.reset();
        assert_eq!(b.next(t0, min, max, &mut rng), t0);
    }
}
