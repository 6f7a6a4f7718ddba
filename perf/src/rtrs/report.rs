//! The result of `dp-perf rtrs`: the JSON line the issue fixes, a human table, and the
//! latency distribution for `--plot`.

use std::io;

use dp_plot::{Figure, PercentileSeries};

use super::server::Served;
use crate::Report;

/// What happened to the path `--kill-path-after` tore down.
#[derive(Debug, Clone, Copy, Default)]
pub struct KillReport {
    /// Seconds into the measurement when the path was killed.
    pub at_s: f64,
    /// Requests in flight on the path when it was killed.
    pub moved: u64,
    /// Of those, the ones that completed with an error (no other path took them).
    pub moved_failed: u64,
    /// From the kill until the last of those completed (on another path), if they did.
    pub failover_ns: Option<u64>,
    /// From the kill until the path was up again, if it came back.
    pub reconnect_ns: Option<u64>,
    /// Requests the path carried after it came back.
    pub after: u64,
    /// How it was killed: `CM disconnect` or `queue pairs to error`.
    pub how: &'static str,
}

/// The client's measurement (or, on the server side, what it served).
#[derive(Debug, Clone)]
pub struct RtrsReport {
    /// `read` or `write`.
    pub rw: &'static str,
    /// Bytes per request.
    pub bs: u32,
    /// Requests kept in flight.
    pub iodepth: u16,
    /// Seconds measured.
    pub secs: f64,
    /// Paths of the session.
    pub paths: usize,
    /// The multipath policy.
    pub policy: &'static str,
    /// The provider.
    pub provider: &'static str,
    /// Poll mode of both sides.
    pub poll: &'static str,
    /// Requests completed in the measured window.
    pub completed: u64,
    /// Requests per second.
    pub iops: f64,
    /// Payload Gb/s.
    pub gbps: f64,
    /// Median request latency (submit to completion), ns.
    pub p50_ns: f64,
    /// 99th percentile, ns.
    pub p99_ns: f64,
    /// 99.9th percentile, ns.
    pub p999_ns: f64,
    /// Requests that completed with an error, over the whole run.
    pub failed: u64,
    /// The killed path, with `--kill-path-after`.
    pub kill: Option<KillReport>,
    /// Per path at the end: its server address, state, and the sysfs files `stats/rdma`,
    /// `stats/reconnects` and `cur_latency` as Linux prints them (rtrs.md section 8).
    pub path_lines: Vec<String>,
    /// The latency distribution.
    pub dist: Option<PercentileSeries>,
    /// The server side: what it served (and nothing measured).
    pub served: Option<Served>,
}

fn us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1e3)
}

impl Report for RtrsReport {
    fn to_json(&self) -> serde_json::Value {
        if let Some(s) = self.served {
            return serde_json::json!({"rtrs": {"served_reads": s.reads, "served_writes": s.writes, "refused": s.refused}});
        }
        serde_json::json!({"rtrs": {
            "iops": self.iops,
            "gbps": self.gbps,
            "p50_ns": self.p50_ns,
            "p99_ns": self.p99_ns,
            "paths": self.paths,
            "failed": self.failed,
        }})
    }

    /// The keys in the order the issue gives them (`serde_json` objects sort theirs).
    fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if self.served.is_some() {
            return writeln!(out, "{}", self.to_json());
        }
        let n = |v: f64| serde_json::Value::from(v).to_string();
        writeln!(
            out,
            r#"{{"rtrs":{{"iops":{},"gbps":{},"p50_ns":{},"p99_ns":{},"paths":{},"failed":{}}}}}"#,
            n(self.iops),
            n(self.gbps),
            n(self.p50_ns),
            n(self.p99_ns),
            self.paths,
            self.failed
        )
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(s) = self.served {
            return writeln!(
                out,
                "rtrs server: {} READs answered from memory, {} WRITEs stored, {} refused",
                s.reads, s.writes, s.refused
            );
        }
        writeln!(
            out,
            "dp-perf rtrs: {} {} B, iodepth {}, {} path(s) {}, provider {}, {} polling, {:.1} s",
            self.rw,
            self.bs,
            self.iodepth,
            self.paths,
            self.policy,
            self.provider,
            self.poll,
            self.secs
        )?;
        writeln!(
            out,
            "  {:>12} {:>9} {:>10} {:>10} {:>10} {:>8}",
            "IOPS", "Gb/s", "p50", "p99", "p99.9", "failed"
        )?;
        writeln!(
            out,
            "  {:>12.0} {:>9.3} {:>10} {:>10} {:>10} {:>8}",
            self.iops,
            self.gbps,
            us(self.p50_ns as u64),
            us(self.p99_ns as u64),
            us(self.p999_ns as u64),
            self.failed
        )?;
        writeln!(out, "  {} requests completed in the window", self.completed)?;
        for l in &self.path_lines {
            writeln!(out, "  {l}")?;
        }
        if let Some(k) = self.kill {
            writeln!(
                out,
                "  path 0 killed ({}) at {:.2} s with {} requests in flight on it:",
                k.how, k.at_s, k.moved
            )?;
            match k.failover_ns {
                Some(ns) if k.moved_failed == 0 => writeln!(
                    out,
                    "    failover: all of them completed on other paths {} after the kill",
                    us(ns)
                )?,
                Some(ns) => writeln!(
                    out,
                    "    failover: {} of them failed (no other path was up); the last completed {} after the kill",
                    k.moved_failed,
                    us(ns)
                )?,
                None => writeln!(out, "    failover: NOT all of them completed")?,
            }
            match k.reconnect_ns {
                Some(ns) => writeln!(
                    out,
                    "    reconnected {:.3} s after the kill (100 ms delay + 1 s backoff), then took {} requests",
                    ns as f64 / 1e9,
                    k.after
                )?,
                None => writeln!(out, "    did not reconnect before the end")?,
            }
        }
        Ok(())
    }

    fn figure(&self) -> Option<Figure> {
        let d = self.dist.as_ref()?;
        let mut f = Figure::new(format!(
            "dp-perf rtrs {} {} B, iodepth {}, {} path(s), {}",
            self.rw, self.bs, self.iodepth, self.paths, self.provider
        ));
        f.percentiles.push(d.clone());
        Some(f)
    }
}
