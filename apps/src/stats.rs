//! Per-stage counters and latency histograms, written by the stage's lcore and read by the
//! control thread (progress lines, summary) and the telemetry socket.
//!
//! # Publication model
//!
//! Counters follow `lcore::stats`: each has exactly one writer, the lcore running the stage,
//! which adds with a `Relaxed` load and a `Relaxed` store (two plain moves on x86_64, no
//! locked instruction). With one writer no update is lost, 64-bit atomics do not tear, and
//! nothing else is published through the counters, so readers need no ordering: a snapshot
//! taken while the stage runs may mix one counter's value at burst *n* with another's at
//! *n + 1*. Stages add per burst, not per message.
//!
//! Latency is recorded per message into an HDR histogram private to the stage (no sharing,
//! no allocation: the bounds are fixed). Every [`FLUSH_PERIOD_NS`] the stage moves it into a
//! shared, mutex-protected histogram with `try_lock` (never waiting on the data path; a busy
//! lock just delays the flush), and once more, waiting, when the stage is dropped. The control
//! thread takes the shared histogram's contents once a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency recorded exactly (60 s); larger values are clamped.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;
/// How often a stage publishes its latency samples.
pub const FLUSH_PERIOD_NS: u64 = 50_000_000;

/// A latency histogram with the bounds every stage uses (1 ns .. 60 s, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy hdrhistogram's rules (low >= 1, high >= 2 * low,
    // sigfig <= 5), so creation cannot fail.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant, valid histogram bounds")
}

/// A single-writer counter (see the [module docs](self)).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `v`. Only the owning stage's lcore may call this.
    #[inline]
    pub fn add(&self, v: u64) {
        // Relaxed load + Relaxed store: single writer, so nothing is lost; the counter
        // publishes no other data (module docs).
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(v),
            Ordering::Relaxed,
        );
    }

    /// The current value.
    #[inline]
    pub fn get(&self) -> u64 {
        // Relaxed: a statistic read on its own; see the module docs.
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters of one stage. Which ones move depends on the kind (see each field).
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages taken in (dequeued, or received whole from a connection).
    pub in_msgs: Counter,
    /// Bytes taken in (message lengths).
    pub in_bytes: Counter,
    /// Messages passed on (enqueued, or handed to a connection).
    pub out_msgs: Counter,
    /// Bytes passed on.
    pub out_bytes: Counter,
    /// Messages dropped by an `on_full = "drop"` policy, or discarded after a failure.
    pub dropped: Counter,
    /// Messages missing by sequence number, as seen by a consumer.
    pub gaps: Counter,
    /// Messages that arrived with a sequence number already passed (duplicates or reordered).
    pub dups: Counter,
    /// Messages whose payload or header failed the pattern check.
    pub verify_errors: Counter,
    /// Times a full output ring or connection held the stage back.
    pub backpressure: Counter,
    /// Times a pool had no free object.
    pub pool_empty: Counter,
    /// Connections accepted or established.
    pub conns_opened: Counter,
    /// Connections ended.
    pub conns_closed: Counter,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSnapshot {
    /// See [`Counters::in_msgs`].
    pub in_msgs: u64,
    /// See [`Counters::in_bytes`].
    pub in_bytes: u64,
    /// See [`Counters::out_msgs`].
    pub out_msgs: u64,
    /// See [`Counters::out_bytes`].
    pub out_bytes: u64,
    /// See [`Counters::dropped`].
    pub dropped: u64,
    /// See [`Counters::gaps`].
    pub gaps: u64,
    /// See [`Counters::dups`].
    pub dups: u64,
    /// See [`Counters::verify_errors`].
    pub verify_errors: u64,
    /// See [`Counters::backpressure`].
    pub backpressure: u64,
    /// See [`Counters::pool_empty`].
    pub pool_empty: u64,
    /// See [`Counters::conns_opened`].
    pub conns_opened: u64,
    /// See [`Counters::conns_closed`].
    pub conns_closed: u64,
}

impl Counters {
    /// Reads every counter.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            in_msgs: self.in_msgs.get(),
            in_bytes: self.in_bytes.get(),
            out_msgs: self.out_msgs.get(),
            out_bytes: self.out_bytes.get(),
            dropped: self.dropped.get(),
            gaps: self.gaps.get(),
            dups: self.dups.get(),
            verify_errors: self.verify_errors.get(),
            backpressure: self.backpressure.get(),
            pool_empty: self.pool_empty.get(),
            conns_opened: self.conns_opened.get(),
            conns_closed: self.conns_closed.get(),
        }
    }
}

/// Where a stage sits in the pipeline, for the progress line and the summary totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Brings messages into this process: generators, and rsocket servers that forward.
    Source,
    /// Passes messages on inside the process.
    Inner,
    /// Ends messages in this process (sinks, servers without output) or sends them out of it
    /// (clients); its `in_msgs` (sinks, servers) or `out_msgs` (clients) are the
    /// pipeline's delivered messages.
    Terminal,
}

/// Everything shared about one stage.
#[derive(Debug)]
pub struct StageStats {
    /// Stage name.
    pub name: String,
    /// Stage kind as written in files.
    pub kind: &'static str,
    /// CPU of its lcore.
    pub cpu: usize,
    /// Its role.
    pub role: Role,
    /// Its counters.
    pub counters: Counters,
    latency: Option<Mutex<Histogram<u64>>>,
    error: Mutex<Option<String>>,
    finished: AtomicBool,
}

impl StageStats {
    /// Stats for a stage; `latency` if it records latency.
    pub fn new(name: &str, kind: &'static str, cpu: usize, role: Role, latency: bool) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            kind,
            cpu,
            role,
            counters: Counters::default(),
            latency: latency.then(|| Mutex::new(new_histogram())),
            error: Mutex::new(None),
            finished: AtomicBool::new(false),
        })
    }

    /// Whether the stage records latency.
    pub fn has_latency(&self) -> bool {
        self.latency.is_some()
    }

    /// Moves the latency samples published since the last call into `into`.
    pub fn take_latency(&self, into: &mut Histogram<u64>) {
        if let Some(l) = &self.latency {
            let mut h = l.lock().unwrap_or_else(PoisonError::into_inner);
            // Same bounds on both sides: adding cannot fail.
            let _ = into.add(&*h);
            h.reset();
        }
    }

    /// Records the stage's failure (control path: allocates). The first error is kept.
    pub fn fail(&self, message: String) {
        let mut e = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if e.is_none() {
            *e = Some(message);
        }
    }

    /// The stage's error, if it failed.
    pub fn error(&self) -> Option<String> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Marks the stage finished.
    pub fn set_finished(&self) {
        // Relaxed: a status flag for displays; the end of the run is established by joining
        // the lcore threads, not by this flag.
        self.finished.store(true, Ordering::Relaxed);
    }

    /// Whether the stage has finished.
    pub fn is_finished(&self) -> bool {
        // Relaxed: see set_finished.
        self.finished.load(Ordering::Relaxed)
    }
}

/// A stage's private latency histogram, published periodically (see the module docs).
pub struct LatencyRecorder {
    local: Histogram<u64>,
    shared: Arc<StageStats>,
    last_flush: u64,
}

impl std::fmt::Debug for LatencyRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyRecorder")
            .field("stage", &self.shared.name)
            .field("pending", &self.local.len())
            .finish()
    }
}

impl LatencyRecorder {
    /// A recorder publishing into `shared` (which must have been made with `latency`).
    pub fn new(shared: Arc<StageStats>) -> Self {
        debug_assert!(shared.has_latency());
        Self {
            local: new_histogram(),
            shared,
            last_flush: 0,
        }
    }

    /// Records one latency.
    #[inline]
    pub fn record(&mut self, nanos: u64) {
        self.local.saturating_record(nanos);
    }

    /// Publishes the samples if [`FLUSH_PERIOD_NS`] has passed since the last time and the
    /// shared histogram is free.
    #[inline]
    pub fn maybe_flush(&mut self, now_ns: u64) {
        if now_ns.wrapping_sub(self.last_flush) < FLUSH_PERIOD_NS || self.local.is_empty() {
            return;
        }
        if let Some(l) = &self.shared.latency
            && let Ok(mut h) = l.try_lock()
        {
            let _ = h.add(&self.local);
            self.local.reset();
            self.last_flush = now_ns;
        }
    }

    /// Publishes the samples, waiting for the lock.
    pub fn flush(&mut self) {
        if self.local.is_empty() {
            return;
        }
        if let Some(l) = &self.shared.latency {
            let mut h = l.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = h.add(&self.local);
            self.local.reset();
        }
    }
}

impl Drop for LatencyRecorder {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Percentiles of a latency histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl LatencySummary {
    /// The summary of `h`, or `None` if it is empty.
    pub fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        Some(Self {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        })
    }
}

/// Tracks per-flow sequence numbers at a consumer: gaps (lost messages) and repeats.
#[derive(Debug)]
pub struct FlowTracker {
    next: Vec<u64>,
}

/// Flows a consumer tracks (generator indices); messages of higher flows are not checked.
pub const MAX_FLOWS: usize = 256;

impl Default for FlowTracker {
    fn default() -> Self {
        Self {
            next: vec![0; MAX_FLOWS],
        }
    }
}

impl FlowTracker {
    /// Accounts `seq` of `flow`; returns (missing before it, whether it is a repeat).
    #[inline]
    pub fn see(&mut self, flow: u16, seq: u64) -> (u64, bool) {
        let Some(next) = self.next.get_mut(usize::from(flow)) else {
            return (0, false);
        };
        if seq < *next {
            return (0, true);
        }
        let gap = seq - *next;
        *next = seq + 1;
        (gap, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_tracker_counts_gaps_and_repeats() {
        let mut f = FlowTracker::default();
        assert_eq!(f.see(0, 0), (0, false));
        assert_eq!(f.see(0, 1), (0, false));
        assert_eq!(f.see(0, 4), (2, false));
        assert_eq!(f.see(0, 3), (0, true));
        assert_eq!(f.see(1, 0), (0, false), "flows are independent");
        assert_eq!(f.see(u16::MAX, 9), (0, false), "untracked flow");
    }

    #[test]
    fn latency_reaches_the_shared_histogram_on_flush_and_drop() {
        let s = StageStats::new("s", "sink", 0, Role::Terminal, true);
        let mut r = LatencyRecorder::new(s.clone());
        r.record(1000);
        r.maybe_flush(1); // too early: stays local
        let mut h = new_histogram();
        s.take_latency(&mut h);
        assert_eq!(h.len(), 0);
        r.maybe_flush(FLUSH_PERIOD_NS + 1);
        s.take_latency(&mut h);
        assert_eq!(h.len(), 1);
        r.record(2000);
        drop(r);
        s.take_latency(&mut h);
        assert_eq!(h.len(), 2);
        let sum = LatencySummary::of(&h).unwrap();
        assert!(sum.min <= 1000 && sum.max >= 1999, "{sum:?}");
    }
}
