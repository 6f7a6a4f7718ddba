//! A path's timers: a table indexed by [`Timer`] (house style: timers are data).

use lcore::time::Instant;

/// The timers of a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// Dial (again): the connect worker (`cp_conn_w`).
    Reconnect = 0,
    /// Send the ack of received messages that did not ask for one.
    DelayedAck = 1,
}

impl Timer {
    /// Every timer, in table order.
    pub const ALL: [Self; 2] = [Self::Reconnect, Self::DelayedAck];
}

/// Deadlines by timer; `None` = not armed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerTable([Option<Instant>; 2]);

impl TimerTable {
    /// Arms `t` at `at` (replacing an earlier deadline).
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[t as usize] = Some(at);
    }
    /// Disarms `t`.
    pub fn stop(&mut self, t: Timer) {
        self.0[t as usize] = None;
    }
    /// The deadline of `t`.
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.0[t as usize]
    }
    /// True if `t` is armed and due at `now`.
    pub fn is_due(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|at| at <= now)
    }
    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
}
