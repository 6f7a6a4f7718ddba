//! The results and how they print: rstream's table (its `size_str`/`cnt_str` number
//! formats included) or one JSON object.

use std::io::{self, Write};

use dp_plot::{Figure, SweepPoint, SweepSeries};
use serde_json::json;

use super::conn::BgReport;
use crate::Report;
use crate::harness::Summary;

fn scaled(v: u64, bases: [(u64, char); 3]) -> String {
    let (base, mag) = bases
        .iter()
        .copied()
        .find(|(b, _)| v >= *b)
        .map_or((1, None), |(b, m)| (b, Some(m)));
    let whole = v / base;
    let fraction = if whole < 10 {
        (v % base) * 10 / base
    } else {
        0
    };
    let m = mag.map(String::from).unwrap_or_default();
    if fraction != 0 {
        format!("{whole}.{fraction}{m}")
    } else {
        format!("{whole}{m}")
    }
}

/// rstream's `size_str`: powers of 1024 with k/m/g, one decimal below 10 units.
pub fn size_str(v: u64) -> String {
    scaled(v, [(1 << 30, 'g'), (1 << 20, 'm'), (1 << 10, 'k')])
}

/// rstream's `cnt_str`: powers of 1000 with k/m/b.
pub fn cnt_str(v: u64) -> String {
    scaled(v, [(1_000_000_000, 'b'), (1_000_000, 'm'), (1_000, 'k')])
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `64_lat`, `1m_bw`, ...
    pub name: String,
    /// Transfer size.
    pub bytes: usize,
    /// Transfers per iteration.
    pub xfers: u64,
    /// Iterations.
    pub iters: u64,
    /// Elapsed seconds.
    pub secs: f64,
}

impl Row {
    fn total(&self) -> u64 {
        self.iters * self.xfers * self.bytes as u64 * 2
    }
    fn usec(&self) -> f64 {
        self.secs * 1e6
    }
    /// Payload gigabits per second, both directions.
    pub fn gbps(&self) -> f64 {
        8.0 * self.total() as f64 / (1000.0 * self.usec())
    }
    /// Microseconds per transfer (one way for latency rows).
    pub fn usec_per_xfer(&self) -> f64 {
        self.usec() / self.iters as f64 / (self.xfers as f64 * 2.0)
    }
}

/// The results.
#[derive(Debug, Clone, PartialEq)]
pub struct RstreamReport {
    /// "rsocket (shm)" or "tcp".
    pub transport: &'static str,
    /// Rows in run order.
    pub rows: Vec<Row>,
    /// Set on the server, which measures nothing.
    pub served: Option<usize>,
    /// `--sockets`: the measured connection's latency per row, and the background.
    pub scale: Option<Scale>,
}

/// What a `--sockets N` run adds to the rows (which are measured on one connection).
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    /// Connections open in all (N).
    pub sockets: usize,
    /// Messages per second per background connection.
    pub rate: f64,
    /// Per row: one-way nanoseconds per transfer of each round (one round trip per round in
    /// latency rows).
    pub latency: Vec<(String, Option<Summary>)>,
    /// The client's background connections: cost to open, traffic carried (per row group).
    pub background: Vec<BgReport>,
}

impl Report for RstreamReport {
    fn to_json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "bytes": r.bytes, "xfers": r.xfers, "iters": r.iters,
                       "usec_per_xfer": r.usec_per_xfer(), "gbps": r.gbps()})
            })
            .collect();
        let Some(sc) = &self.scale else {
            return json!({ "rstream": rows });
        };
        // The rows stay as without --sockets; what the scale run adds is beside them.
        let latency: Vec<_> = sc
            .latency
            .iter()
            .map(|(name, s)| json!({"name": name, "one_way_ns": s}))
            .collect();
        let bg: Vec<_> = sc
            .background
            .iter()
            .map(|b| {
                json!({"connections": b.count, "rss_bytes_per_socket": b.rss_per_socket,
                       "vm_bytes_per_socket": b.vm_per_socket, "messages_sent": b.sent,
                       "bytes_received": b.received,
                       "rate_achieved_per_socket": b.rate_achieved()})
            })
            .collect();
        json!({
            "rstream": rows,
            "sockets": {"count": sc.sockets, "rate_per_socket": sc.rate,
                        "latency": latency, "background": bg},
        })
    }

    /// Bandwidth (the `_bw` rows) and one-way time per transfer (the `_lat` rows) against
    /// size, one series; a custom test (`-S N`, `-I`, `-C`) is one point with both.
    fn figure(&self) -> Option<Figure> {
        if self.served.is_some() {
            return None;
        }
        let mut points: Vec<SweepPoint> = Vec::new();
        for r in &self.rows {
            let bytes = r.bytes as u64;
            let i = match points.iter().position(|p| p.bytes == bytes) {
                Some(i) => i,
                None => {
                    points.push(SweepPoint {
                        bytes,
                        gbps: None,
                        lat_ns: None,
                    });
                    points.len() - 1
                }
            };
            let custom = !r.name.ends_with("_lat") && !r.name.ends_with("_bw");
            if r.name.ends_with("_bw") || custom {
                points[i].gbps = Some(r.gbps());
            }
            if r.name.ends_with("_lat") || custom {
                points[i].lat_ns = Some(r.usec_per_xfer() * 1e3);
            }
        }
        points.sort_by_key(|p| p.bytes);
        let mut f = Figure::new("rstream: bandwidth and latency against size");
        f.sweep_latency = "one way, time per transfer".into();
        let label = if self.transport == "tcp" {
            "kernel TCP (dp-perf rstream --tcp)".to_owned()
        } else {
            format!("rsockets on {} (dp-perf rstream)", self.transport)
        };
        f.sweep.push(SweepSeries { label, points });
        Some(f)
    }

    fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(
                out,
                "rstream server ({}): served {n} connection(s)",
                self.transport
            );
        }
        writeln!(
            out,
            "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
            "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
        )?;
        for r in &self.rows {
            writeln!(
                out,
                "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8.2}s{:>10.2}{:>11.2}",
                r.name,
                size_str(r.bytes as u64),
                cnt_str(r.xfers),
                cnt_str(r.iters),
                size_str(r.total()),
                r.secs,
                r.gbps(),
                r.usec_per_xfer()
            )?;
        }
        if let Some(sc) = &self.scale {
            writeln!(
                out,
                "measured on 1 of {} connections; the other {} carry {} msg/s each",
                sc.sockets,
                sc.sockets - 1,
                sc.rate
            )?;
            for (name, s) in &sc.latency {
                if let Some(s) = s {
                    writeln!(
                        out,
                        "  {name:<10} one-way per transfer: p50 {:.3} us  p99 {:.3} us  \
                         ({} rounds)",
                        s.p50 as f64 / 1e3,
                        s.p99 as f64 / 1e3,
                        s.count
                    )?;
                }
            }
            for b in &sc.background {
                let mib = |v: Option<u64>| {
                    v.map_or_else(|| "?".into(), |v| format!("{:.1} KiB", v as f64 / 1024.0))
                };
                writeln!(
                    out,
                    "  background: {} connections, per idle connection {} resident, {} \
                     virtual (this process); {} messages written ({:.0} msg/s each), {} \
                     bytes read back",
                    b.count,
                    mib(b.rss_per_socket),
                    mib(b.vm_per_socket),
                    b.sent,
                    b.rate_achieved(),
                    b.received
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_count_strings_match_rstream() {
        assert_eq!(size_str(64), "64");
        assert_eq!(size_str(4096), "4k");
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(1 << 20), "1m");
        assert_eq!(size_str(3 << 19), "1.5m");
        assert_eq!(size_str(12_800_000), "12m");
        assert_eq!(cnt_str(100_000), "100k");
        assert_eq!(cnt_str(1), "1");
        assert_eq!(cnt_str(1500), "1.5k");
    }

    #[test]
    fn row_math_matches_rstream() {
        // 64_lat of the TCP baseline: 100k iterations of one 64 B transfer in 2.73 s.
        let r = Row {
            name: "64_lat".into(),
            bytes: 64,
            xfers: 1,
            iters: 100_000,
            secs: 2.732,
        };
        assert!((r.usec_per_xfer() - 13.66).abs() < 0.01);
        assert_eq!(size_str(r.total()), "12m");
        assert!((r.gbps() - 0.0375).abs() < 0.001);
    }
}
