//! What every stage is written against: the [`Stage`] trait and the [`StageIo`] its host
//! passes in, the [`StartGate`] of the rsocket clients, the opened [`FabricDev`], and the
//! helpers stages share (message stamps, pending output, the consumer side [`Terminus`]).
//!
//! The stages in the sibling files and the builder use this file; it uses none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dataplane::fabric::shm::ShmDevice;
use lcore::time::Instant;

use crate::link::Tx;
use crate::msg::{Msg, Pattern};
use crate::payload;
use crate::stats::{FlowTracker, LatencyRecorder, StageStats};

/// What a stage's poll gets from its host loop.
#[derive(Debug, Clone, Copy)]
pub struct StageIo {
    /// The loop clock's time before this call (TSC-derived; for rates and timeouts, not for
    /// message stamps).
    pub now: Instant,
    /// Sources must stop producing and end their streams.
    pub quiesce: bool,
    /// Every rsocket client of the process has connected: sources may start.
    /// Like testpmd waiting for link up, this keeps connection set-up time out of the
    /// latency figures.
    pub links_up: bool,
}

/// Counts the rsocket clients that have not connected yet; sources wait for zero.
#[derive(Debug, Clone)]
pub struct StartGate(Arc<AtomicUsize>);

impl StartGate {
    /// A gate waiting for `n` clients.
    pub fn new(n: usize) -> Self {
        Self(Arc::new(AtomicUsize::new(n)))
    }

    /// Whether every client has reported.
    #[inline]
    pub fn is_open(&self) -> bool {
        // Relaxed: a start signal with no data behind it; sources seeing it one iteration
        // late only start one iteration late.
        self.0.load(Ordering::Relaxed) == 0
    }

    /// One client has connected (call once per client).
    pub fn arrive(&self) {
        // Relaxed: see is_open. A read-modify-write, so concurrent arrivals are all counted.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A pipeline stage, run as a poller on an lcore.
pub trait Stage: Send {
    /// One bounded round of work; returns the amount done (0: idle).
    fn poll(&mut self, io: &StageIo) -> usize;

    /// Whether the stage has drained and closed its outputs; it will do no more work.
    fn is_finished(&self) -> bool;
}

/// An opened fabric device.
#[derive(Debug, Clone)]
pub enum FabricDev {
    /// The shm provider.
    Shm(ShmDevice),
    /// The verbs provider.
    #[cfg(feature = "verbs")]
    Verbs(dataplane::fabric::verbs::VerbsDevice),
}

/// Reads the host's `CLOCK_MONOTONIC` (the clock of message stamps; see [`crate::msg`]).
#[inline]
pub fn stamp_now() -> u64 {
    lcore::time::MonotonicClock::read_nanos()
}

/// The consumer side of a message's life: sequence tracking, checks and latency, shared by
/// sinks, terminal rsocket servers and echo clients. Counts locally and publishes per burst.
pub(crate) struct Terminus {
    pub(crate) stats: Arc<StageStats>,
    latency: LatencyRecorder,
    flows: FlowTracker,
    verify: bool,
    gaps: u64,
    dups: u64,
    bad: u64,
}

impl Terminus {
    pub(crate) fn new(stats: Arc<StageStats>, verify: bool) -> Self {
        Self {
            latency: LatencyRecorder::new(Arc::clone(&stats)),
            stats,
            flows: FlowTracker::default(),
            verify,
            gaps: 0,
            dups: 0,
            bad: 0,
        }
    }

    /// Accounts one message that arrived at `now_ns`, with its payload bytes if they exist.
    #[inline]
    pub(crate) fn see(&mut self, m: &Msg, now_ns: u64, payload: Option<&[u8]>) {
        self.latency.record(now_ns.saturating_sub(m.stamp));
        let (gap, dup) = self.flows.see(m.flow, m.seq);
        self.gaps += gap;
        self.dups += u64::from(dup);
        if self.verify {
            let header_ok = m.pattern != Pattern::Ticks || payload::tick_ok(m.word);
            let body_ok = payload.is_none_or(|b| payload::check(m.pattern, m.flow, m.seq, b));
            self.bad += u64::from(!(header_ok && body_ok));
        }
    }

    /// Publishes what was counted since the last call.
    #[inline]
    pub(crate) fn publish(&mut self, now_ns: u64) {
        let c = &self.stats.counters;
        if self.gaps != 0 {
            c.gaps.add(std::mem::take(&mut self.gaps));
        }
        if self.dups != 0 {
            c.dups.add(std::mem::take(&mut self.dups));
        }
        if self.bad != 0 {
            c.verify_errors.add(std::mem::take(&mut self.bad));
        }
        self.latency.maybe_flush(now_ns);
    }
}

/// Moves `n` messages from the front of `pending` into `tx`; returns how many went.
#[inline]
pub(crate) fn push_pending(tx: &mut Tx, pending: &mut Vec<Msg>) -> usize {
    if pending.is_empty() {
        return 0;
    }
    let n = tx.send_burst(pending);
    pending.drain(..n);
    n
}
