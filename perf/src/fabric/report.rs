//! The results of a fabric benchmark and how they print: perftest's tables, or one JSON
//! object per size and line.

use std::io;

use dp_plot::{Figure, PercentileSeries, SweepPoint, SweepSeries};
use serde_json::json;

use super::session::Test;
use crate::Report;

/// One size's latency result (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub size: usize,
    /// Iterations measured.
    pub iters: u64,
    /// Smallest sample.
    pub min_ns: f64,
    /// Largest sample.
    pub max_ns: f64,
    /// Median (`t_typical`).
    pub p50_ns: f64,
    /// Mean.
    pub mean_ns: f64,
    /// Standard deviation.
    pub stdev_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
}

/// One size's bandwidth result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub size: usize,
    /// Requests completed.
    pub iters: u64,
    /// Best window, Gb/s.
    pub peak_gbps: f64,
    /// Average, Gb/s.
    pub gbps: f64,
    /// Messages per second, millions.
    pub mpps: f64,
}

/// Results of one fabric benchmark run.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricReport {
    /// The test.
    pub test: Test,
    /// Provider name.
    pub provider: &'static str,
    /// Latency rows (latency tests).
    pub lat: Vec<LatRow>,
    /// The latency distribution of each row of `lat`, in the same order (for `--plot`).
    pub dist: Vec<PercentileSeries>,
    /// Bandwidth rows (bandwidth tests).
    pub bw: Vec<BwRow>,
    /// Set on the server side, which measures nothing.
    pub served: Option<u64>,
}

impl Report for FabricReport {
    fn to_json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self.rows_json();
        json!({ self.test.name(): rows })
    }

    fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
        // One object per size, one per line, as the perf lab documents for fabric tests.
        for r in self.rows_json() {
            writeln!(out, "{r}")?;
        }
        Ok(())
    }

    /// Latency tests: the distribution of each size, and with several sizes the median
    /// against size; bandwidth tests: the average bandwidth against size.
    fn figure(&self) -> Option<Figure> {
        if self.served.is_some() {
            return None;
        }
        let name = self.test.name();
        let mut f = Figure::new(format!("dp-perf {name}, provider {}", self.provider));
        if self.test.is_latency() {
            let what = if self.test == Test::ReadLat {
                "round trip"
            } else {
                "one way"
            };
            f.title = format!("{} ({what})", f.title);
            f.percentiles = self
                .dist
                .iter()
                .map(|d| PercentileSeries {
                    label: format!("{name} {}", d.label),
                    ..d.clone()
                })
                .collect();
            if self.lat.len() > 1 {
                f.sweep_latency = "p50".into();
                f.sweep.push(SweepSeries {
                    label: format!("{name} ({what}, {})", self.provider),
                    points: self
                        .lat
                        .iter()
                        .map(|r| SweepPoint {
                            bytes: r.size as u64,
                            gbps: None,
                            lat_ns: Some(r.p50_ns),
                        })
                        .collect(),
                });
            }
        } else {
            f.sweep.push(SweepSeries {
                label: format!("{name} ({})", self.provider),
                points: self
                    .bw
                    .iter()
                    .map(|r| SweepPoint {
                        bytes: r.size as u64,
                        gbps: Some(r.gbps),
                        lat_ns: None,
                    })
                    .collect(),
            });
        }
        Some(f)
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(out, "{}: served {n} size(s)", self.test.name());
        }
        let rule = "-".repeat(87);
        writeln!(out, "{rule}")?;
        writeln!(
            out,
            "{:>40} (dp-perf, provider {})",
            self.test.title(),
            self.provider
        )?;
        writeln!(out, "{rule}")?;
        if self.test.is_latency() {
            let what = if self.test == Test::ReadLat {
                "round trip"
            } else {
                "one way (half RTT)"
            };
            writeln!(out, " latency: {what}")?;
            writeln!(
                out,
                " {:<7} {:<11} {:>12} {:>12} {:>16} {:>12} {:>14} {:>22} {:>24}",
                "#bytes",
                "#iterations",
                "t_min[usec]",
                "t_max[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_stdev[usec]",
                "99% percentile[usec]",
                "99.9% percentile[usec]"
            )?;
            for r in &self.lat {
                writeln!(
                    out,
                    " {:<7} {:<11} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>22.2} {:>24.2}",
                    r.size,
                    r.iters,
                    r.min_ns / 1e3,
                    r.max_ns / 1e3,
                    r.p50_ns / 1e3,
                    r.mean_ns / 1e3,
                    r.stdev_ns / 1e3,
                    r.p99_ns / 1e3,
                    r.p999_ns / 1e3
                )?;
            }
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {:>16} {:>20} {:>14}",
                "#bytes", "#iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]"
            )?;
            for r in &self.bw {
                writeln!(
                    out,
                    " {:<10} {:<14} {:>16.2} {:>20.2} {:>14.6}",
                    r.size, r.iters, r.peak_gbps, r.gbps, r.mpps
                )?;
            }
        }
        writeln!(out, "{rule}")
    }
}

impl FabricReport {
    fn rows_json(&self) -> Vec<serde_json::Value> {
        if self.test.is_latency() {
            self.lat
                .iter()
                .map(|r| {
                    json!({"test": self.test.name(), "provider": self.provider, "size": r.size,
                           "iterations": r.iters, "p50_ns": r.p50_ns, "p99_ns": r.p99_ns,
                           "p999_ns": r.p999_ns, "mean_ns": r.mean_ns, "max_ns": r.max_ns,
                           "min_ns": r.min_ns, "stdev_ns": r.stdev_ns})
                })
                .collect()
        } else {
            self.bw
                .iter()
                .map(|r| {
                    json!({"test": self.test.name(), "provider": self.provider, "size": r.size,
                           "iterations": r.iters, "gbps": r.gbps, "peak_gbps": r.peak_gbps,
                           "mpps": r.mpps})
                })
                .collect()
        }
    }
}
