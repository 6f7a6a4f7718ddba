//! The result of a run: its per-second rows and totals, as rds-stress's table, the
//! `--json` object (`{"rds_stress": {...}}`, a shape the perf lab's checks read) and a
//! figure.

use std::io;

use dp_plot::{Figure, PercentileSeries, SweepPoint, SweepSeries};
use serde_json::json;

use crate::Report;

/// One second of rds-stress's columns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SecRow {
    /// Requests sent per second.
    pub tx: f64,
    /// Requests received (one way) or acks received per second.
    pub rx: f64,
    /// Request and ack bytes sent and received, KiB/s.
    pub kbytes: f64,
    /// Mean microseconds per send call.
    pub tx_us: f64,
    /// Mean request-to-ack round trip, microseconds (0 one way).
    pub rtt_us: f64,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct StressReport {
    /// Requests completed per second: acked, or received one way.
    pub msgs_per_sec: f64,
    /// Request payload Gb/s at that rate.
    pub gbps: f64,
    /// -t.
    pub tasks: u32,
    /// -q.
    pub req_size: usize,
    /// Sockets per side.
    pub sockets: u32,
    /// -d.
    pub depth: u32,
    /// -o.
    pub one_way: bool,
    /// Per-second rows.
    pub rows: Vec<SecRow>,
    /// Round-trip distribution (request/ack mode).
    pub rtt: Option<PercentileSeries>,
    /// Set on a passive side run alone: requests served.
    pub served: Option<u64>,
    /// Sends of the active side that had to wait, while measuring: send buffer full
    /// (`EAGAIN`), destination congested (`ENOBUFS`), message store full (`ENOMEM`).
    pub waits: [u64; 3],
    /// Engine counters that are not zero: (name, active side, passive side).
    pub counters: Vec<(&'static str, u64, u64)>,
    /// Loop iterations while measuring: active side, passive side.
    pub iterations: [u64; 2],
}

impl StressReport {
    /// Seconds measured (from the per-second rows, at least 1).
    fn seconds(&self) -> f64 {
        (self.rows.len() as f64).max(1.0)
    }
}

impl Report for StressReport {
    fn to_json(&self) -> serde_json::Value {
        json!({ "rds_stress": {
            "msgs_per_sec": self.msgs_per_sec,
            "gbps": self.gbps,
            "tasks": self.tasks,
            "req_size": self.req_size,
            "sockets": self.sockets,
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(out, "passive side: {n} requests received while measured");
        }
        writeln!(
            out,
            "{:>4} {:>10} {:>10} {:>11} {:>9} {:>9} {:>8} {:>8} {:>6}",
            "tsks", "tx/s", "rx/s", "tx+rx K/s", "mbi K/s", "mbo K/s", "tx us/c", "rtt us", "cpu %"
        )?;
        let line = |out: &mut dyn io::Write, r: &SecRow, tail: &str| {
            writeln!(
                out,
                "{:>4} {:>10.0} {:>10.0} {:>11.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>6.2}{tail}",
                self.tasks, r.tx, r.rx, r.kbytes, 0.0, 0.0, r.tx_us, r.rtt_us, -1.0
            )
        };
        for r in &self.rows {
            line(out, r, "")?;
        }
        if !self.rows.is_empty() {
            let n = self.rows.len() as f64;
            let mut avg = SecRow::default();
            for r in &self.rows {
                avg.tx += r.tx / n;
                avg.rx += r.rx / n;
                avg.kbytes += r.kbytes / n;
                avg.tx_us += r.tx_us / n;
                avg.rtt_us += r.rtt_us / n;
            }
            line(out, &avg, " (average)")?;
        }
        writeln!(
            out,
            "{:.0} msgs/s ({:.3} Gb/s of {}-byte requests), {} task(s) x depth {}, {} socket(s) per side{}",
            self.msgs_per_sec,
            self.gbps,
            self.req_size,
            self.tasks,
            self.depth,
            self.sockets,
            if self.one_way { ", one way" } else { "" }
        )?;
        writeln!(
            out,
            "sends that waited: {} send buffer full (EAGAIN), {} congested (ENOBUFS), {} store full (ENOMEM)",
            self.waits[0], self.waits[1], self.waits[2]
        )?;
        writeln!(
            out,
            "loop iterations/s: active {:.0}, passive {:.0}",
            self.iterations[0] as f64 / self.seconds(),
            self.iterations[1] as f64 / self.seconds()
        )?;
        if !self.counters.is_empty() {
            writeln!(out, "{:<32} {:>14} {:>14}", "counter", "active", "passive")?;
            for (k, a, p) in &self.counters {
                writeln!(out, "{k:<32} {a:>14} {p:>14}")?;
            }
        }
        Ok(())
    }

    fn figure(&self) -> Option<Figure> {
        if self.served.is_some() {
            return None;
        }
        let mut f = Figure::new(format!(
            "dp-perf rds-stress -q {} -t {} -d {}{}, {} socket(s), shm",
            self.req_size,
            self.tasks,
            self.depth,
            if self.one_way { " -o" } else { "" },
            self.sockets
        ));
        match &self.rtt {
            Some(d) => f.percentiles.push(d.clone()),
            None => f.sweep.push(SweepSeries {
                label: "rds-stress".into(),
                points: vec![SweepPoint {
                    bytes: self.req_size as u64,
                    gbps: Some(self.gbps),
                    lat_ns: None,
                }],
            }),
        }
        Some(f)
    }
}
