//! Busy/idle accounting shared between a poll loop and its readers.
//!
//! # Publication model
//!
//! Every counter has exactly one writer: the lcore running the loop. It updates a counter with
//! a `Relaxed` load of its own last value and a `Relaxed` store of the new one (no locked
//! read-modify-write, so on x86_64 an update is two plain `mov`s plus an add). That is sound
//! because:
//!
//! - with one writer no update can be lost, so a counter only ever holds values the loop really
//!   reached, and each counter read alone is monotonic;
//! - 64-bit atomics do not tear, so a reader never sees half a value;
//! - nothing else is published through these counters, so they need no ordering of their own.
//!
//! Readers call [`StatsHandle::snapshot`] from any thread at any time. A snapshot taken while
//! the loop runs reads counters one by one, so it may mix iteration *n* of one counter with
//! *n + 1* of another (e.g. `busy + idle` can trail `iterations` by one iteration's worth). Once
//! [`LoopSnapshot::state`] reads [`LoopState::Finished`] the snapshot is exact: the loop stores
//! that state with `Release` after its last counter update, and the snapshot loads it with
//! `Acquire` first.
//!
//! Time is in the loop clock's nanoseconds (TSC-derived in production, virtual under
//! [`ManualClock`](crate::time::ManualClock)). `busy_nanos + idle_nanos` equals the time from
//! the loop's first clock read to its last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// A single-writer counter (see the [module docs](self) for why `Relaxed` is enough).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `v`. Must only be called by the counter's single writer.
    #[inline]
    pub(crate) fn add(&self, v: u64) {
        // Relaxed: single writer (the owning lcore), so load+store loses nothing; no other data
        // is published through the counter.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(v),
            Ordering::Relaxed,
        );
    }

    /// Current value.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        // Relaxed: a statistic; ordering with other counters comes from the state word (L1/L2).
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters of one poller (or of the inbox or timer pseudo-pollers).
#[derive(Debug, Default)]
pub(crate) struct PollerCounters {
    calls: Counter,
    busy_calls: Counter,
    work: Counter,
    nanos: Counter,
}

impl PollerCounters {
    /// Records one call that did `work` units in `nanos`.
    #[inline]
    pub(crate) fn record(&self, work: usize, nanos: u64) {
        self.calls.add(1);
        if work > 0 {
            self.busy_calls.add(1);
            self.work.add(work as u64);
        }
        self.nanos.add(nanos);
    }

    fn snapshot(&self, name: &str, kind: PollerKind) -> PollerSnapshot {
        PollerSnapshot {
            name: name.to_owned(),
            kind,
            calls: self.calls.get(),
            busy_calls: self.busy_calls.get(),
            work: self.work.get(),
            nanos: self.nanos.get(),
        }
    }
}

/// How a poller is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PollerKind {
    /// Called every iteration.
    Active,
    /// Called when its period has elapsed since its last call.
    Timed(Duration),
    /// The loop's built-in inbox drain.
    Inbox,
    /// The loop's built-in timer check.
    Timers,
}

/// Name and kind of one registered poller.
#[derive(Debug, Clone)]
pub(crate) struct PollerInfo {
    pub(crate) name: Box<str>,
    pub(crate) kind: PollerKind,
}

/// Lifecycle of a poll loop as seen by readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LoopState {
    /// Built, not yet running.
    Built = 0,
    /// Running normally.
    Running = 1,
    /// Stop seen; polling until idle or the drain timeout.
    Draining = 2,
    /// Returned; the snapshot is final until the loop is run again.
    Finished = 3,
}

impl LoopState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Running,
            2 => Self::Draining,
            3 => Self::Finished,
            _ => Self::Built,
        }
    }
}

/// Loop-level counters; one cache-padded block written only by the lcore.
#[derive(Debug, Default)]
pub(crate) struct LoopCounters {
    pub(crate) iterations: Counter,
    pub(crate) busy_iterations: Counter,
    pub(crate) busy_nanos: Counter,
    pub(crate) idle_nanos: Counter,
    pub(crate) sleep_nanos: Counter,
    pub(crate) sleeps: Counter,
}

/// Everything a loop publishes.
#[derive(Debug)]
pub(crate) struct LoopShared {
    pub(crate) name: Box<str>,
    pub(crate) counters: CachePadded<LoopCounters>,
    pub(crate) inbox: PollerCounters,
    pub(crate) timers: PollerCounters,
    pub(crate) pollers: Box<[PollerCounters]>,
    pub(crate) info: Box<[PollerInfo]>,
    state: AtomicU8,
}

impl LoopShared {
    pub(crate) fn new(name: Box<str>, info: Box<[PollerInfo]>) -> Self {
        Self {
            name,
            counters: CachePadded::default(),
            inbox: PollerCounters::default(),
            timers: PollerCounters::default(),
            pollers: info.iter().map(|_| PollerCounters::default()).collect(),
            info,
            state: AtomicU8::new(LoopState::Built as u8),
        }
    }

    pub(crate) fn set_state(&self, s: LoopState) {
        // L1: Release, pairs with L2 in `snapshot`: a reader that sees `Finished` sees every
        // counter update made before it.
        self.state.store(s as u8, Ordering::Release);
    }

    pub(crate) fn state(&self) -> LoopState {
        // L2: Acquire, pairs with L1.
        LoopState::from_u8(self.state.load(Ordering::Acquire))
    }
}

/// A cloneable, thread-safe handle for reading a loop's statistics while it runs.
#[derive(Debug, Clone)]
pub struct StatsHandle {
    pub(crate) shared: Arc<LoopShared>,
}

impl StatsHandle {
    /// Reads every counter (see the [module docs](self) for consistency). Allocates: this is
    /// for monitoring threads, not for the lcore's fast path.
    pub fn snapshot(&self) -> LoopSnapshot {
        let s = &*self.shared;
        let state = s.state();
        let c = &*s.counters;
        LoopSnapshot {
            name: s.name.to_string(),
            state,
            iterations: c.iterations.get(),
            busy_iterations: c.busy_iterations.get(),
            busy_nanos: c.busy_nanos.get(),
            idle_nanos: c.idle_nanos.get(),
            sleep_nanos: c.sleep_nanos.get(),
            sleeps: c.sleeps.get(),
            inbox: s.inbox.snapshot("inbox", PollerKind::Inbox),
            timers: s.timers.snapshot("timers", PollerKind::Timers),
            pollers: s
                .pollers
                .iter()
                .zip(s.info.iter())
                .map(|(p, i)| p.snapshot(&i.name, i.kind))
                .collect(),
        }
    }

    /// The loop's state without reading the counters.
    pub fn state(&self) -> LoopState {
        self.shared.state()
    }

    /// Whether two handles read the same loop.
    pub fn same_loop(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// Statistics of one poller at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollerSnapshot {
    /// The name given at registration (`"inbox"` / `"timers"` for the built-ins).
    pub name: String,
    /// How it is scheduled.
    pub kind: PollerKind,
    /// Number of calls.
    pub calls: u64,
    /// Calls that reported work (> 0).
    pub busy_calls: u64,
    /// Sum of the work counts it returned (messages handled for the inbox, timers fired for the
    /// timer check).
    pub work: u64,
    /// Clock time spent in it, nanoseconds.
    pub nanos: u64,
}

/// Statistics of one loop at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopSnapshot {
    /// The loop's name ([`LoopConfig::name`](crate::LoopConfig::name)).
    pub name: String,
    /// Lifecycle state when the snapshot was taken.
    pub state: LoopState,
    /// Completed iterations.
    pub iterations: u64,
    /// Iterations in which something did work.
    pub busy_iterations: u64,
    /// Time in busy iterations, nanoseconds.
    pub busy_nanos: u64,
    /// Time in idle iterations, including hybrid-mode sleeps, nanoseconds.
    pub idle_nanos: u64,
    /// Part of `idle_nanos` spent sleeping or yielding in hybrid mode.
    pub sleep_nanos: u64,
    /// Number of hybrid-mode sleeps or yields.
    pub sleeps: u64,
    /// The inbox drain.
    pub inbox: PollerSnapshot,
    /// The timer check.
    pub timers: PollerSnapshot,
    /// Registered pollers in registration order.
    pub pollers: Vec<PollerSnapshot>,
}

impl LoopSnapshot {
    /// `busy / (busy + idle)`, or 0 before the first iteration.
    pub fn busy_ratio(&self) -> f64 {
        let total = self.busy_nanos + self.idle_nanos;
        if total == 0 {
            0.0
        } else {
            self.busy_nanos as f64 / total as f64
        }
    }

    /// The first poller registered under `name`.
    pub fn poller(&self, name: &str) -> Option<&PollerSnapshot> {
        self.pollers.iter().find(|p| p.name == name)
    }
}
