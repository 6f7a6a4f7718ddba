//! How blocking rsocket calls wait: spin first, then sleep on the completion queue's
//! notifier ([`Armed`]) where the provider has one, else yield, then nap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dp_fabric::CqNotify;

/// A sleeper announced on a completion queue's notifier ([`CqNotify::arm`]). Sleep on it
/// with [`Armed::sleep`] after one more attempt; dropping it unslept disarms.
pub(crate) struct Armed {
    n: Option<Arc<dyn CqNotify>>,
    token: u32,
}

impl Armed {
    /// Longest sleep: a bound on a missed wake (the provider documents none) and on how
    /// late a timer the sleeping call would have run is noticed.
    pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(1);

    pub(crate) fn new(n: Arc<dyn CqNotify>) -> Self {
        let token = n.arm();
        Self { n: Some(n), token }
    }

    /// Sleeps until the queue's next news after the arm (or [`Self::MAX_SLEEP`]).
    pub(crate) fn sleep(mut self) {
        if let Some(n) = self.n.take() {
            n.sleep(self.token, Self::MAX_SLEEP);
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(n) = self.n.take() {
            n.disarm();
        }
    }
}

/// Spins for `polling_time` (like librdmacm's `polling_time`), then yields for a while,
/// then sleeps in short steps: a blocking call busy-polls first (latency) and stops burning
/// a core when nothing comes.
///
/// Reading the clock costs as much as a poll on some hosts (a vDSO call under a hypervisor
/// clock source), so the waiter reads it only every [`Waiter::CHECK`] spins while spinning.
#[derive(Debug)]
pub(crate) struct Waiter {
    start: Option<Instant>,
    spin: Duration,
    spins: u32,
    spun_out: bool,
}

impl Waiter {
    /// Spins between clock reads.
    pub(crate) const CHECK: u32 = 256;

    pub(crate) fn new(spin: Duration) -> Self {
        Self {
            start: None,
            spin,
            spins: 0,
            spun_out: false,
        }
    }

    /// Starts over (after progress).
    pub(crate) fn reset(&mut self) {
        self.start = None;
        self.spins = 0;
        self.spun_out = false;
    }

    /// True once the busy-poll phase is over (the caller may then do costlier checks).
    pub(crate) fn spun_out(&self) -> bool {
        self.spun_out
    }

    /// True once the busy-poll phase and `d` of the yielding phase after it are over.
    pub(crate) fn yielded_for(&mut self, d: Duration) -> bool {
        self.spun_out && self.elapsed() >= self.spin + d
    }

    fn elapsed(&mut self) -> Duration {
        self.start.get_or_insert_with(Instant::now).elapsed()
    }

    /// True if `timeout` has passed since the first wait (checked every [`Self::CHECK`]
    /// spins while spinning, every call afterwards).
    pub(crate) fn expired(&mut self, timeout: Option<Duration>) -> bool {
        let Some(t) = timeout else {
            return false;
        };
        if !self.spun_out && !self.spins.is_multiple_of(Self::CHECK) {
            return false;
        }
        self.elapsed() >= t
    }

    /// Waits a little.
    pub(crate) fn wait(&mut self) {
        if !self.spun_out {
            self.spins += 1;
            if !self.spins.is_multiple_of(Self::CHECK) {
                core::hint::spin_loop();
                return;
            }
            if self.elapsed() >= self.spin {
                self.spun_out = true;
            }
            return;
        }
        if self.elapsed() < self.spin + Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
