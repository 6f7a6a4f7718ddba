//! The virtual clock of the RTRS and RNBD callgrind drivers (`rtrs_qd1_cost`, `rnbd_cost`):
//! 100 ns per turn, so two runs of the same count execute the same instructions.

use lcore::time::Instant;

/// Virtual time advanced by [`tick`](Self::tick), one call per turn (one poll of each side).
pub struct VirtualClock {
    /// Turns so far.
    pub turns: u64,
    /// The current virtual time, in nanoseconds.
    pub t: u64,
    /// `t` when the clock started.
    t0: u64,
    /// Warming up: the clock never runs behind real time. The CM's handshake takes real
    /// time (more under valgrind), and the connect timers must not fire before it had that.
    pub warm: bool,
}

impl VirtualClock {
    /// A clock at `t` nanoseconds, warming up.
    pub fn new(t: u64) -> Self {
        Self {
            turns: 0,
            t,
            t0: t,
            warm: true,
        }
    }

    /// The next turn's time: 100 ns later, or (while warming up) real time since the start
    /// (`real`) if that is later.
    pub fn tick(&mut self, real: std::time::Instant) -> Instant {
        self.turns += 1;
        self.t += 100;
        if self.warm {
            self.t = self.t.max(self.t0 + real.elapsed().as_nanos() as u64);
        }
        self.now()
    }

    /// The current time, as the state machines take it.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.t)
    }
}
