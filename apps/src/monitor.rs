//! The control thread's view of a running pipeline: per-second rates, latency percentiles and
//! lcore busy time, computed from counter snapshots and the stages' published histograms.

use std::sync::Arc;
use std::time::Duration;

use dp_plot::PercentileSeries;
use hdrhistogram::Histogram;
use lcore::{LcoreId, Lcores};
use serde::{Deserialize, Serialize};

use crate::stats::{CounterSnapshot, LatencySummary, Role, StageStats, new_histogram};

/// One progress line's numbers (also served as `/progress` on the telemetry socket).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// Seconds since the start.
    pub t_s: f64,
    /// Messages per second entering the pipeline (generators, forwarding servers).
    pub in_msgs_per_s: f64,
    /// Messages per second delivered (terminal stages).
    pub out_msgs_per_s: f64,
    /// Gigabits per second delivered.
    pub out_gbps: f64,
    /// Median latency over the interval, ns.
    pub p50_ns: Option<u64>,
    /// 99th percentile latency over the interval, ns.
    pub p99_ns: Option<u64>,
    /// Busy percentage per hosting lcore over the interval: (cpu, percent).
    pub busy: Vec<(usize, f64)>,
    /// Messages dropped during the interval.
    pub dropped: u64,
}

impl Progress {
    /// The human-readable line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "[{:6.1}s] in {:>9}/s  out {:>9}/s  {:6.3} Gb/s",
            self.t_s,
            rate(self.in_msgs_per_s),
            rate(self.out_msgs_per_s),
            self.out_gbps,
        );
        if let (Some(p50), Some(p99)) = (self.p50_ns, self.p99_ns) {
            s.push_str(&format!("  p50 {:>8}  p99 {:>8}", nanos(p50), nanos(p99)));
        }
        s.push_str("  busy");
        for (cpu, b) in &self.busy {
            s.push_str(&format!(" cpu{cpu} {b:3.0}%"));
        }
        if self.dropped > 0 {
            s.push_str(&format!("  dropped {}", self.dropped));
        }
        s
    }
}

/// `1234567.0` as `1.23M`.
pub fn rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2}G", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.2}M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

/// Nanoseconds for humans: `850ns`, `12.3us`, `4.56ms`, `1.20s`.
pub fn nanos(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.2}s", ns as f64 / 1e9)
    }
}

/// What one stage delivers and brings in, by role.
pub(crate) fn delivered(role: Role, kind: &str, c: &CounterSnapshot) -> (u64, u64) {
    match role {
        Role::Terminal if kind == "rsocket_client" => (c.out_msgs, c.out_bytes),
        Role::Terminal => (c.in_msgs, c.in_bytes),
        _ => (0, 0),
    }
}

pub(crate) fn entered(role: Role, kind: &str, c: &CounterSnapshot) -> u64 {
    match role {
        Role::Source if kind == "generator" => c.out_msgs,
        Role::Source => c.in_msgs,
        _ => 0,
    }
}

/// The monitor: last snapshots, cumulative latency per stage, the latest progress.
pub struct Monitor {
    stages: Vec<Arc<StageStats>>,
    totals: Vec<Histogram<u64>>,
    interval: Histogram<u64>,
    last: Vec<CounterSnapshot>,
    lcores: Vec<(usize, Option<LcoreId>, u64, u64)>,
    last_t: Duration,
    latest: Option<Progress>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("stages", &self.stages.len())
            .field("latest", &self.latest)
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor of `stages`; `hosted` lists the CPUs that run stages.
    pub fn new(
        stages: Vec<Arc<StageStats>>,
        lcores: &Lcores<()>,
        hosted: &[(usize, Vec<String>)],
    ) -> Self {
        Self {
            totals: stages.iter().map(|_| new_histogram()).collect(),
            last: vec![CounterSnapshot::default(); stages.len()],
            stages,
            interval: new_histogram(),
            lcores: hosted
                .iter()
                .map(|(cpu, _)| (*cpu, lcores.by_cpu(*cpu), 0, 0))
                .collect(),
            last_t: Duration::ZERO,
            latest: None,
        }
    }

    /// Takes the latency samples the stages published into the cumulative histograms and
    /// the current interval.
    pub fn collect(&mut self) {
        let mut scratch = new_histogram();
        for (s, total) in self.stages.iter().zip(&mut self.totals) {
            if !s.has_latency() {
                continue;
            }
            scratch.reset();
            s.take_latency(&mut scratch);
            let _ = total.add(&scratch);
            let _ = self.interval.add(&scratch);
        }
    }

    /// Closes the interval ending at `t` (since the start) and returns its numbers.
    pub fn tick(&mut self, lcores: &Lcores<()>, t: Duration) -> Progress {
        self.collect();
        let dt = (t - self.last_t).as_secs_f64().max(1e-9);
        self.last_t = t;
        let (mut in_msgs, mut out_msgs, mut out_bytes, mut dropped) = (0u64, 0u64, 0u64, 0u64);
        for (s, last) in self.stages.iter().zip(&mut self.last) {
            let now = s.counters.snapshot();
            let d = diff(&now, last);
            *last = now;
            in_msgs += entered(s.role, s.kind, &d);
            let (m, b) = delivered(s.role, s.kind, &d);
            out_msgs += m;
            out_bytes += b;
            dropped += d.dropped;
        }
        let busy = self
            .lcores
            .iter_mut()
            .map(|(cpu, id, busy, idle)| {
                let snap = id.and_then(|id| lcores.snapshot(id));
                let pct = snap.map_or(0.0, |s| {
                    let (db, di) = (
                        s.busy_nanos.saturating_sub(*busy),
                        s.idle_nanos.saturating_sub(*idle),
                    );
                    *busy = s.busy_nanos;
                    *idle = s.idle_nanos;
                    if db + di == 0 {
                        0.0
                    } else {
                        100.0 * db as f64 / (db + di) as f64
                    }
                });
                (*cpu, pct)
            })
            .collect();
        let lat = LatencySummary::of(&self.interval);
        self.interval.reset();
        let p = Progress {
            t_s: t.as_secs_f64(),
            in_msgs_per_s: in_msgs as f64 / dt,
            out_msgs_per_s: out_msgs as f64 / dt,
            out_gbps: out_bytes as f64 * 8.0 / dt / 1e9,
            p50_ns: lat.map(|l| l.p50),
            p99_ns: lat.map(|l| l.p99),
            busy,
            dropped,
        };
        self.latest = Some(p.clone());
        p
    }

    /// The latest progress numbers.
    pub fn latest(&self) -> Option<&Progress> {
        self.latest.as_ref()
    }

    /// The stages, in file order.
    pub fn stages(&self) -> &[Arc<StageStats>] {
        &self.stages
    }

    /// Cumulative latency of stage `i`.
    pub fn latency(&self, i: usize) -> Option<LatencySummary> {
        LatencySummary::of(&self.totals[i])
    }

    /// The latency distributions for `dpctl run --plot`: each stage that recorded latency,
    /// labelled by its name and kind, and with several of them all together.
    pub fn latency_series(&self) -> Vec<PercentileSeries> {
        let mut v: Vec<PercentileSeries> = self
            .stages
            .iter()
            .zip(&self.totals)
            .filter_map(|(s, h)| {
                PercentileSeries::from_histogram(format!("{} ({})", s.name, s.kind), h, 1.0)
            })
            .collect();
        if v.len() > 1 {
            let mut all = new_histogram();
            for t in &self.totals {
                let _ = all.add(t);
            }
            v.extend(PercentileSeries::from_histogram("all stages", &all, 1.0));
        }
        v
    }

    /// Cumulative latency over every stage that records it.
    pub fn merged_latency(&self) -> Option<LatencySummary> {
        let mut h = new_histogram();
        for t in &self.totals {
            let _ = h.add(t);
        }
        LatencySummary::of(&h)
    }
}

fn diff(now: &CounterSnapshot, last: &CounterSnapshot) -> CounterSnapshot {
    CounterSnapshot {
        in_msgs: now.in_msgs - last.in_msgs,
        in_bytes: now.in_bytes - last.in_bytes,
        out_msgs: now.out_msgs - last.out_msgs,
        out_bytes: now.out_bytes - last.out_bytes,
        dropped: now.dropped - last.dropped,
        gaps: now.gaps - last.gaps,
        dups: now.dups - last.dups,
        verify_errors: now.verify_errors - last.verify_errors,
        backpressure: now.backpressure - last.backpressure,
        pool_empty: now.pool_empty - last.pool_empty,
        conns_opened: now.conns_opened - last.conns_opened,
        conns_closed: now.conns_closed - last.conns_closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humane_units() {
        assert_eq!(rate(950.0), "950");
        assert_eq!(rate(12_345.0), "12.3k");
        assert_eq!(rate(2_500_000.0), "2.50M");
        assert_eq!(nanos(850), "850ns");
        assert_eq!(nanos(12_345), "12.3us");
        assert_eq!(nanos(4_560_000), "4.56ms");
    }
}
