//! The end-of-run summary: totals, latency, per-lcore and per-stage figures, as text or JSON.

use std::fmt::Write as _;
use std::time::Duration;

use dp_plot::{Figure, PercentileSeries};
use lcore::LoopReport;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::monitor::{Monitor, delivered, entered, nanos, rate};
use crate::stats::{CounterSnapshot, LatencySummary, Role};

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// Every stage finished on its own (finite generators, connection limits).
    Finished,
    /// `--duration` elapsed.
    Duration,
    /// SIGINT or SIGTERM.
    Signal,
    /// A stage failed.
    Error,
}

impl StopCause {
    /// For progress messages.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Finished => "finished",
            Self::Duration => "duration reached",
            Self::Signal => "signal",
            Self::Error => "a stage failed",
        }
    }
}

/// Pipeline totals.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Totals {
    /// Messages that entered the pipeline (generated, or received by forwarding servers).
    pub in_msgs: u64,
    /// Messages delivered by terminal stages (consumed, or sent out by clients).
    pub out_msgs: u64,
    /// Bytes delivered.
    pub out_bytes: u64,
    /// Delivered messages per second over the run.
    pub msgs_per_s: f64,
    /// Delivered gigabits per second over the run.
    pub gbps: f64,
    /// Messages dropped anywhere.
    pub dropped: u64,
    /// Messages missing by sequence number at consumers.
    pub gaps: u64,
    /// Duplicate or reordered messages at consumers.
    pub dups: u64,
    /// Payload or header check failures.
    pub verify_errors: u64,
    /// No drops, gaps, duplicates or check failures, no stage error, and the drain finished.
    pub lossless: bool,
}

/// One lcore.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LcoreSummary {
    /// Its CPU.
    pub cpu: usize,
    /// Whether it is the main lcore (run on the launching thread).
    pub main: bool,
    /// The stages it ran.
    pub stages: Vec<String>,
    /// Busy share of its loop time, percent.
    pub busy_pct: f64,
    /// Loop iterations.
    pub iterations: u64,
    /// Iterations that did work.
    pub busy_iterations: u64,
    /// Whether its loop was cut off by the drain timeout.
    pub drain_timeout: bool,
}

impl LcoreSummary {
    /// From a loop report (`None` if the loop never ran).
    pub fn new(
        cpu: usize,
        main: bool,
        stages: Vec<String>,
        r: Option<&LoopReport>,
        drain_timeout: bool,
    ) -> Self {
        let (busy_pct, iterations, busy_iterations) = r.map_or((0.0, 0, 0), |r| {
            let total = r.busy_nanos + r.idle_nanos;
            let pct = if total == 0 {
                0.0
            } else {
                100.0 * r.busy_nanos as f64 / total as f64
            };
            (pct, r.iterations, r.busy_iterations)
        });
        Self {
            cpu,
            main,
            stages,
            busy_pct,
            iterations,
            busy_iterations,
            drain_timeout,
        }
    }
}

/// One stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSummary {
    /// Name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// CPU of its lcore.
    pub cpu: usize,
    /// Role in the totals.
    pub role: Role,
    /// Its counters.
    #[serde(flatten)]
    pub counters: CounterSnapshot,
    /// Its latency (sinks: end to end; echo clients: round trip), ns.
    pub latency_ns: Option<LatencySummary>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The summary of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The config file.
    pub config: String,
    /// This process.
    pub pid: u32,
    /// Wall time from launch to the last lcore's return, seconds.
    pub duration_s: f64,
    /// Why it ended.
    pub stopped_by: StopCause,
    /// Whether the drain timed out (in-flight messages lost).
    pub drain_timed_out: bool,
    /// Totals.
    pub totals: Totals,
    /// Latency over all stages that record it, ns.
    pub latency_ns: Option<LatencySummary>,
    /// Lcores that ran stages.
    pub lcores: Vec<LcoreSummary>,
    /// Stages in file order.
    pub stages: Vec<StageSummary>,
    /// Stage failures.
    pub errors: Vec<String>,
    /// The latency distribution of each stage that records it, for `dpctl run --plot`
    /// (not part of the JSON summary).
    #[serde(skip)]
    pub latency_plot: Vec<PercentileSeries>,
}

impl Summary {
    pub(crate) fn build(
        cfg: &Config,
        monitor: &mut Monitor,
        lcores: Vec<LcoreSummary>,
        elapsed: Duration,
        stopped_by: StopCause,
        drain_timed_out: bool,
    ) -> Self {
        monitor.collect();
        let mut stages = Vec::new();
        let mut errors = Vec::new();
        let (mut in_msgs, mut out_msgs, mut out_bytes) = (0, 0, 0);
        let (mut dropped, mut gaps, mut dups, mut verify) = (0, 0, 0, 0);
        for (i, s) in monitor.stages().iter().enumerate() {
            let c = s.counters.snapshot();
            in_msgs += entered(s.role, s.kind, &c);
            let (m, b) = delivered(s.role, s.kind, &c);
            out_msgs += m;
            out_bytes += b;
            dropped += c.dropped;
            gaps += c.gaps;
            dups += c.dups;
            verify += c.verify_errors;
            let error = s.error();
            if let Some(e) = &error {
                errors.push(e.clone());
            }
            stages.push(StageSummary {
                name: s.name.clone(),
                kind: s.kind.to_owned(),
                cpu: s.cpu,
                role: s.role,
                counters: c,
                latency_ns: monitor.latency(i),
                error,
            });
        }
        let secs = elapsed.as_secs_f64().max(1e-9);
        Self {
            config: cfg.source.clone(),
            pid: std::process::id(),
            duration_s: elapsed.as_secs_f64(),
            stopped_by,
            drain_timed_out,
            totals: Totals {
                in_msgs,
                out_msgs,
                out_bytes,
                msgs_per_s: out_msgs as f64 / secs,
                gbps: out_bytes as f64 * 8.0 / secs / 1e9,
                dropped,
                gaps,
                dups,
                verify_errors: verify,
                lossless: dropped == 0
                    && gaps == 0
                    && dups == 0
                    && verify == 0
                    && errors.is_empty()
                    && !drain_timed_out,
            },
            latency_ns: monitor.merged_latency(),
            lcores,
            stages,
            errors,
            latency_plot: monitor.latency_series(),
        }
    }

    /// The picture of `dpctl run --plot`: the latency distribution of every stage that
    /// records it (sinks: end to end; echo clients: round trip). `None` if none does.
    pub fn figure(&self) -> Option<Figure> {
        if self.latency_plot.is_empty() {
            return None;
        }
        let mut f = Figure::new(format!(
            "dpctl run {}: latency (sinks end to end, echo clients round trip)",
            self.config
        ));
        f.percentiles = self.latency_plot.clone();
        Some(f)
    }

    /// Whether the run had no stage failures.
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }

    /// The summary of stage `name`.
    pub fn stage(&self, name: &str) -> Option<&StageSummary> {
        self.stages.iter().find(|s| s.name == name)
    }

    /// The text form.
    pub fn render(&self) -> String {
        let t = &self.totals;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "summary of {} (pid {}): {:.2} s, stopped by {}{}",
            self.config,
            self.pid,
            self.duration_s,
            self.stopped_by.describe(),
            if self.drain_timed_out {
                ", drain timed out"
            } else {
                ""
            }
        );
        let _ = writeln!(
            o,
            "  in {} msgs, delivered {} msgs ({}/s, {:.3} Gb/s), dropped {}, gaps {}, dups {}, check failures {}: {}",
            t.in_msgs,
            t.out_msgs,
            rate(t.msgs_per_s),
            t.gbps,
            t.dropped,
            t.gaps,
            t.dups,
            t.verify_errors,
            if t.lossless {
                "lossless"
            } else {
                "NOT lossless"
            }
        );
        if let Some(l) = &self.latency_ns {
            let _ = writeln!(o, "  latency {}", latency_line(l));
        }
        for l in &self.lcores {
            let _ = writeln!(
                o,
                "  cpu{}{}: busy {:.1}% of {} iterations; stages {}{}",
                l.cpu,
                if l.main { " (main)" } else { "" },
                l.busy_pct,
                l.iterations,
                l.stages.join(", "),
                if l.drain_timeout {
                    "; cut off by the drain timeout"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(
            o,
            "  {:<16} {:<15} {:>4} {:>12} {:>12} {:>10} {:>8} {:>8}",
            "stage", "kind", "cpu", "in", "out", "dropped", "gaps", "checks"
        );
        for s in &self.stages {
            let c = &s.counters;
            let _ = writeln!(
                o,
                "  {:<16} {:<15} {:>4} {:>12} {:>12} {:>10} {:>8} {:>8}",
                s.name, s.kind, s.cpu, c.in_msgs, c.out_msgs, c.dropped, c.gaps, c.verify_errors
            );
            if let Some(l) = &s.latency_ns {
                let _ = writeln!(o, "  {:<16} latency {}", "", latency_line(l));
            }
            if let Some(e) = &s.error {
                let _ = writeln!(o, "  {:<16} FAILED: {e}", "");
            }
        }
        o
    }
}

/// `p50 3.1us  p90 ...` for one latency summary.
pub fn latency_line(l: &LatencySummary) -> String {
    format!(
        "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  ({} samples)",
        nanos(l.p50),
        nanos(l.p90),
        nanos(l.p99),
        nanos(l.p999),
        nanos(l.max),
        l.count
    )
}
