//! Nanosecond timing on the calibrated TSC.

use lcore::time::{Clock, RealClock, TscClock};

/// A nanosecond timer: [`lcore::time::RealClock`], i.e. the TSC calibrated once against
/// `CLOCK_MONOTONIC` when it is invariant, else `CLOCK_MONOTONIC` through the vDSO.
///
/// Reading it costs an `rdtsc` and a multiply (no syscall), so it can bracket loops of a few
/// hundred nanoseconds. [`Timer::tsc_hz`] converts nanoseconds back to TSC cycles, the unit
/// DPDK's perf tests print.
#[derive(Debug, Clone, Copy)]
pub struct Timer {
    clock: RealClock,
    tsc_hz: Option<u64>,
}

impl Timer {
    /// The process-wide timer. The first call in a process calibrates the TSC (about 20 ms).
    pub fn new() -> Self {
        Self {
            clock: RealClock::new(),
            tsc_hz: TscClock::get().ok().map(|t| t.hz()),
        }
    }

    /// Nanoseconds since the clock's epoch.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.clock.now().as_nanos()
    }

    /// `"tsc"` or `"monotonic"`.
    pub fn source(&self) -> &'static str {
        self.clock.source()
    }

    /// The calibrated TSC rate in Hz, if the TSC is the clock.
    pub fn tsc_hz(&self) -> Option<u64> {
        self.tsc_hz
    }

    /// `ns` nanoseconds in TSC cycles, if the TSC rate is known.
    pub fn ns_to_cycles(&self, ns: f64) -> Option<f64> {
        self.tsc_hz.map(|hz| ns * hz as f64 / 1e9)
    }
}

impl Default for Timer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_advances_and_converts() {
        let t = Timer::new();
        let a = t.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = t.now_ns();
        assert!(b > a);
        if let Some(hz) = t.tsc_hz() {
            let c = t.ns_to_cycles(1e9).unwrap();
            assert!((c - hz as f64).abs() < 1.0);
        } else {
            assert_eq!(t.ns_to_cycles(1.0), None);
        }
    }
}
