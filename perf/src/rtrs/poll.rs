//! How the two sides of `dp-perf rtrs` wait when they have nothing to do: busy (spin) on
//! dedicated cores, or hybrid (spin for 50 us of idleness, then sleep 20 us at a time) when
//! both sides share the machine with others, as lcore's hybrid poll mode does.

use std::time::{Duration, Instant};

/// Idleness since the last work, and the mode.
#[derive(Debug)]
pub(super) struct Idle {
    busy: bool,
    since: Option<Instant>,
}

/// Idleness before a hybrid poller sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// One hybrid sleep.
const NAP: Duration = Duration::from_micros(20);

impl Idle {
    pub(super) fn new(busy: bool) -> Self {
        Self { busy, since: None }
    }

    /// After a poll turn that did `work` things.
    pub(super) fn after(&mut self, work: usize) {
        if work > 0 || self.busy {
            self.since = None;
            return;
        }
        let t = *self.since.get_or_insert_with(Instant::now);
        if t.elapsed() > SPIN {
            std::thread::sleep(NAP);
        }
    }
}
