//! Timers as a table indexed by an enum, and the heartbeat every path runs (rtrs.c
//! `hb_work`).
//!
//! Time is an argument: the state machines take `now` ([`Instant`], nanoseconds of the
//! caller's clock: TSC-derived on an lcore, virtual in the simulator) and say with
//! `poll_timeout()` when they next need `handle_timeout(now)`. A spurious `handle_timeout`
//! (early, or twice) does nothing.

use std::time::Duration;

pub use lcore::time::Instant;

/// Deadlines of `N` timers, indexed by a small enum (`usize::from(timer)`).
#[derive(Clone, Copy, Debug)]
pub struct TimerTable<const N: usize> {
    at: [Option<Instant>; N],
}

impl<const N: usize> Default for TimerTable<N> {
    fn default() -> Self {
        Self { at: [None; N] }
    }
}

impl<const N: usize> TimerTable<N> {
    /// Arms timer `i` for `at` (re-arming replaces the deadline).
    #[inline]
    pub fn set(&mut self, i: usize, at: Instant) {
        self.at[i] = Some(at);
    }

    /// Disarms timer `i`.
    #[inline]
    pub fn stop(&mut self, i: usize) {
        self.at[i] = None;
    }

    /// Disarms every timer.
    pub fn stop_all(&mut self) {
        self.at = [None; N];
    }

    /// The deadline of timer `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Instant> {
        self.at[i]
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }

    /// If timer `i` is due at `now`, disarms it and returns true.
    #[inline]
    pub fn take_due(&mut self, i: usize, now: Instant) -> bool {
        match self.at[i] {
            Some(t) if t <= now => {
                self.at[i] = None;
                true
            }
            _ => false,
        }
    }
}

/// `RTRS_HB_INTERVAL_MS`.
pub const HB_INTERVAL: Duration = Duration::from_millis(5000);
/// `RTRS_HB_MISSED_MAX`.
pub const HB_MISSED_MAX: u32 = 5;

/// What a heartbeat tick asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HbTick {
    /// Post a heartbeat (zero-length RDMA WRITE with immediate `HB_MSG` on connection 0).
    Send,
    /// One is outstanding: just wait for the next tick.
    Wait,
    /// Too many ticks without any traffic from the peer: the path is dead.
    Dead,
}

/// The heartbeat of one path (both sides run one).
///
/// Every `interval` a tick runs: if more than `missed_max` ticks passed without traffic the
/// path is dead; else if a heartbeat is outstanding the tick just counts; else a heartbeat is
/// sent. Any received message resets the count (the Linux fix of 2024, commit 3258cbbd:
/// before it only acks did, and loaded paths were closed for nothing). So a silent peer is
/// declared dead at most `(missed_max + 2) * interval` after the last thing it sent (35 s
/// with the defaults), and not before `(missed_max + 1) * interval` (30 s).
#[derive(Clone, Copy, Debug)]
pub struct Heartbeat {
    interval: Duration,
    missed_max: u32,
    missed: u32,
    last_sent: Option<Instant>,
    latency: Option<Duration>,
}

impl Heartbeat {
    /// A stopped heartbeat with this cadence.
    pub const fn new(interval: Duration, missed_max: u32) -> Self {
        Self {
            interval,
            missed_max,
            missed: 0,
            last_sent: None,
            latency: None,
        }
    }

    /// The tick interval.
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// The longest a silent peer goes unnoticed: `(missed_max + 2) * interval`.
    pub fn detection_bound(&self) -> Duration {
        self.interval * (self.missed_max + 2)
    }

    /// Resets the counters (`rtrs_stop_hb`): called when the path stops or starts.
    pub fn reset(&mut self) {
        self.missed = 0;
        self.last_sent = None;
    }

    /// One tick at `now`.
    pub fn tick(&mut self, now: Instant) -> HbTick {
        if self.missed > self.missed_max {
            return HbTick::Dead;
        }
        let outstanding = self.missed != 0;
        self.missed += 1;
        if outstanding {
            return HbTick::Wait;
        }
        self.last_sent = Some(now);
        HbTick::Send
    }

    /// Anything arrived from the peer.
    #[inline]
    pub fn on_traffic(&mut self) {
        self.missed = 0;
    }

    /// A heartbeat answer arrived at `now`: the round trip since the last heartbeat sent
    /// (the client's `hb_cur_latency`, which the min-latency policy reads).
    pub fn on_ack(&mut self, now: Instant) -> Option<Duration> {
        self.missed = 0;
        let rtt = now.saturating_duration_since(self.last_sent?);
        self.latency = Some(rtt);
        Some(rtt)
    }

    /// The last measured round trip.
    pub const fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// Ticks since the last traffic.
    pub const fn missed(&self) -> u32 {
        self.missed
    }
}

/// A small deterministic generator (splitmix64) for reconnect jitter: the state machines
/// draw no randomness from the OS, so a seed reproduces a run.
#[derive(Clone, Copy, Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        z % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> Instant {
        Instant::from_millis(s * 1000)
    }

    #[test]
    fn test_hb_silent_peer_dead_on_seventh_tick() {
        let mut hb = Heartbeat::new(HB_INTERVAL, HB_MISSED_MAX);
        let mut ticks = Vec::new();
        for k in 1..=8 {
            ticks.push(hb.tick(t(5 * k)));
        }
        assert_eq!(ticks[0], HbTick::Send);
        assert!(ticks[1..6].iter().all(|&x| x == HbTick::Wait));
        assert_eq!(
            ticks[6],
            HbTick::Dead,
            "the 7th tick: 35 s after the last traffic"
        );
        assert_eq!(hb.detection_bound(), Duration::from_secs(35));
    }

    #[test]
    fn test_hb_any_traffic_resets() {
        let mut hb = Heartbeat::new(HB_INTERVAL, HB_MISSED_MAX);
        for k in 1..=20 {
            let x = hb.tick(t(5 * k));
            assert_ne!(x, HbTick::Dead, "traffic every tick keeps the path alive");
            hb.on_traffic();
        }
    }

    #[test]
    fn test_hb_ack_measures_rtt() {
        let mut hb = Heartbeat::new(HB_INTERVAL, HB_MISSED_MAX);
        assert_eq!(hb.tick(t(5)), HbTick::Send);
        let rtt = hb.on_ack(Instant::from_micros(5_000_030)).unwrap();
        assert_eq!(rtt, Duration::from_micros(30));
        assert_eq!(hb.missed(), 0);
        assert_eq!(
            hb.tick(t(10)),
            HbTick::Send,
            "acked: the next tick sends again"
        );
    }

    #[test]
    fn test_timer_table() {
        let mut tt = TimerTable::<3>::default();
        assert_eq!(tt.next(), None);
        tt.set(2, t(9));
        tt.set(0, t(4));
        assert_eq!(tt.next(), Some(t(4)));
        assert!(!tt.take_due(0, t(3)), "not yet");
        assert!(tt.take_due(0, t(4)));
        assert!(!tt.take_due(0, t(5)), "a spurious call is a no-op");
        assert_eq!(tt.next(), Some(t(9)));
    }

    #[test]
    fn test_jitter_deterministic() {
        let (mut a, mut b) = (Jitter::new(7), Jitter::new(7));
        for _ in 0..100 {
            let x = a.below(8);
            assert!(x < 8);
            assert_eq!(x, b.below(8));
        }
    }
}
