//! `dp-perf blk`'s output in fio's shapes: the human summary (`read: IOPS=..., BW=...`, clat
//! percentiles, run status group) and `--json` as fio's `--output-format=json` (`jobs[]`
//! with `read`/`write` objects holding `iops`, `bw` in KiB/s, `clat_ns.percentile`), so
//! tools that read fio's output read ours.

use std::io::{self, Write};

use dp_plot::{Figure, PercentileSeries};
use hdrhistogram::Histogram;
use serde_json::{Map, Value, json};

use super::engine::{DirStats, JobResult};
use crate::Report;

/// fio's default `percentile_list`.
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Everything one `dp-perf blk` run measured.
#[derive(Debug)]
pub struct BlkReport {
    /// One entry per job.
    pub jobs: Vec<JobResult>,
    /// What was measured: "file /dev/nvme0n1", "rnbd over shm (null backend)", ...
    pub target: String,
}

impl BlkReport {
    /// IOPS of all jobs together, reads and writes.
    pub fn total_iops(&self) -> f64 {
        self.jobs
            .iter()
            .map(|j| iops(&j.read, j.runtime_ns) + iops(&j.write, j.runtime_ns))
            .sum()
    }
}

fn iops(d: &DirStats, runtime_ns: u64) -> f64 {
    d.ios as f64 * 1e9 / runtime_ns as f64
}

fn bw_bytes(d: &DirStats, runtime_ns: u64) -> f64 {
    d.bytes as f64 * 1e9 / runtime_ns as f64
}

fn pct_key(p: f64) -> String {
    format!("{p:.6}")
}

fn lat_json(h: &Histogram<u64>, with_percentiles: bool) -> Value {
    let mut o = Map::new();
    let empty = h.is_empty();
    o.insert("min".into(), json!(if empty { 0 } else { h.min() }));
    o.insert("max".into(), json!(if empty { 0 } else { h.max() }));
    o.insert("mean".into(), json!(if empty { 0.0 } else { h.mean() }));
    o.insert("stddev".into(), json!(if empty { 0.0 } else { h.stdev() }));
    o.insert("N".into(), json!(h.len()));
    if with_percentiles {
        let mut p = Map::new();
        for q in PERCENTILES {
            let v = if empty {
                0
            } else {
                h.value_at_quantile(q / 100.0)
            };
            p.insert(pct_key(q), json!(v as f64));
        }
        o.insert("percentile".into(), Value::Object(p));
    }
    Value::Object(o)
}

fn dir_json(d: &DirStats, runtime_ns: u64) -> Value {
    let bw = bw_bytes(d, runtime_ns);
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": bw.round() as u64,
        "bw": bw / 1024.0,
        "iops": iops(d, runtime_ns),
        "runtime": runtime_ns / 1_000_000,
        "total_ios": d.ios + d.errors,
        "short_ios": 0,
        "drop_ios": 0,
        "errors": d.errors,
        "clat_ns": lat_json(&d.clat, true),
        // One timestamp pair per IO: submission time is inside the completion latency.
        "lat_ns": lat_json(&d.clat, false),
    })
}

fn job_json(j: &JobResult) -> Value {
    let s = &j.spec;
    let err = j.read.first_errno.or(j.write.first_errno).unwrap_or(0);
    let mut o = json!({
        "jobname": s.name,
        "groupid": 0,
        "error": err,
        "job options": {
            "rw": s.rw.name(),
            "bs": s.bs.to_string(),
            "iodepth": s.iodepth.to_string(),
            "size": s.size.to_string(),
            "offset": s.base.to_string(),
        },
        "job_runtime": j.runtime_ns / 1_000_000,
        "read": dir_json(&j.read, j.runtime_ns),
        "write": dir_json(&j.write, j.runtime_ns),
    });
    if let Some(v) = &j.verify {
        o["verify"] = json!({
            "checked_blocks": v.checked,
            "mismatches": v.mismatches,
            "first_mismatch": v.first.map(|m| m.to_string()),
        });
    }
    o
}

/// `4.5k`, `1503k`, `2.1M` as fio prints IOPS.
fn short_count(v: f64) -> String {
    if v >= 10e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 10e3 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// `5871MiB/s (6156MB/s)`.
fn bw_pair(bytes_per_s: f64) -> String {
    let (bin, bu) = scale(bytes_per_s, 1024.0, ["B", "KiB", "MiB", "GiB", "TiB"]);
    let (dec, du) = scale(bytes_per_s, 1000.0, ["B", "kB", "MB", "GB", "TB"]);
    format!("{bin:.0}{bu}/s ({dec:.0}{du}/s)")
}

fn scale(mut v: f64, base: f64, units: [&'static str; 5]) -> (f64, &'static str) {
    let mut u = 0;
    while v >= 10.0 * base && u < units.len() - 1 {
        v /= base;
        u += 1;
    }
    (v, units[u])
}

fn size_str(bytes: u64) -> String {
    let (v, u) = scale(bytes as f64, 1024.0, ["B", "KiB", "MiB", "GiB", "TiB"]);
    if v >= 100.0 {
        format!("{v:.0}{u}")
    } else {
        format!("{v:.1}{u}")
    }
}

fn write_dir(out: &mut dyn Write, name: &str, d: &DirStats, runtime_ns: u64) -> io::Result<()> {
    if d.ios + d.errors == 0 {
        return Ok(());
    }
    let ms = runtime_ns / 1_000_000;
    writeln!(
        out,
        "  {name}: IOPS={}, BW={}({}/{ms}msec)",
        short_count(iops(d, runtime_ns)),
        bw_pair(bw_bytes(d, runtime_ns)),
        size_str(d.bytes)
    )?;
    let h = &d.clat;
    if !h.is_empty() {
        writeln!(
            out,
            "    clat (nsec): min={}, max={}, avg={:.2}, stdev={:.2}",
            h.min(),
            h.max(),
            h.mean(),
            h.stdev()
        )?;
        writeln!(out, "     clat percentiles (nsec):")?;
        for row in PERCENTILES.chunks(4) {
            let cells: Vec<String> = row
                .iter()
                .map(|&p| format!("{:>5.2}th=[{:>7}]", p, h.value_at_quantile(p / 100.0)))
                .collect();
            writeln!(out, "     | {}", cells.join(", "))?;
        }
    }
    if d.errors > 0 {
        writeln!(
            out,
            "    errors: {} (first: errno {})",
            d.errors,
            d.first_errno.unwrap_or(0)
        )?;
    }
    Ok(())
}

impl Report for BlkReport {
    fn to_json(&self) -> Value {
        json!({
            "fio version": "dp-perf-blk",
            "target": self.target,
            "jobs": self.jobs.iter().map(job_json).collect::<Vec<_>>(),
        })
    }

    fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        for j in &self.jobs {
            let s = &j.spec;
            let err = j.read.first_errno.or(j.write.first_errno).unwrap_or(0);
            writeln!(
                out,
                "{}: (groupid=0, jobs=1): err={err:>2}: rw={}, bs={}, iodepth={}, target {}",
                s.name,
                s.rw,
                size_str(u64::from(s.bs)),
                s.iodepth,
                self.target
            )?;
            write_dir(out, "read", &j.read, j.runtime_ns)?;
            write_dir(out, "write", &j.write, j.runtime_ns)?;
            if let Some(v) = &j.verify {
                match &v.first {
                    None => writeln!(out, "  verify: {} blocks checked, all good", v.checked)?,
                    Some(m) => writeln!(
                        out,
                        "  verify: {} of {} blocks BAD; first: {m}",
                        v.mismatches, v.checked
                    )?,
                }
            }
        }
        writeln!(out, "\nRun status group 0 (all jobs):")?;
        for (name, pick) in [("READ", true), ("WRITE", false)] {
            let (mut bytes, mut ios, mut max_ns) = (0u64, 0u64, 1u64);
            for j in &self.jobs {
                let d = if pick { &j.read } else { &j.write };
                bytes += d.bytes;
                ios += d.ios;
                max_ns = max_ns.max(j.runtime_ns);
            }
            if ios == 0 {
                continue;
            }
            writeln!(
                out,
                "  {name:>5}: bw={}, io={}, iops={}, run={}msec",
                bw_pair(bytes as f64 * 1e9 / max_ns as f64),
                size_str(bytes),
                short_count(ios as f64 * 1e9 / max_ns as f64),
                max_ns / 1_000_000
            )?;
        }
        Ok(())
    }

    fn figure(&self) -> Option<Figure> {
        let mut f = Figure::new(format!("dp-perf blk, {}", self.target));
        for j in &self.jobs {
            for (dir, d) in [("read", &j.read), ("write", &j.write)] {
                let label = format!(
                    "{} {dir} {} bs={} QD{}",
                    j.spec.name,
                    j.spec.rw,
                    size_str(u64::from(j.spec.bs)),
                    j.spec.iodepth
                );
                if let Some(p) = PercentileSeries::from_histogram(label, &d.clat, 1.0) {
                    f.percentiles.push(p);
                }
            }
        }
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blk::engine::{JobSpec, VerifyStats};
    use crate::blk::spec::RwMode;

    fn stats(ios: u64, lat: &[u64]) -> DirStats {
        let mut h = Histogram::new_with_bounds(1, 100_000_000_000, 3).unwrap();
        for &l in lat {
            h.record(l).unwrap();
        }
        DirStats {
            ios,
            bytes: ios * 4096,
            errors: 0,
            first_errno: None,
            clat: h,
        }
    }

    fn report() -> BlkReport {
        BlkReport {
            target: "test".into(),
            jobs: vec![JobResult {
                spec: JobSpec {
                    name: "job0".into(),
                    rw: RwMode::RandRead,
                    bs: 4096,
                    iodepth: 32,
                    base: 0,
                    size: 1 << 20,
                    runtime_ns: Some(1_000_000_000),
                    rwmixread: 50,
                    verify: false,
                    nap: false,
                    seed: 1,
                },
                read: stats(2_000_000, &[1000, 2000, 3000, 4000]),
                write: stats(0, &[]),
                runtime_ns: 2_000_000_000,
                verify: Some(VerifyStats::default()),
            }],
        }
    }

    #[test]
    fn json_has_fios_shape() {
        let v = report().to_json();
        let r = &v["jobs"][0]["read"];
        assert_eq!(r["iops"].as_f64(), Some(1_000_000.0));
        assert_eq!(r["bw"].as_f64(), Some(1_000_000.0 * 4096.0 / 1024.0));
        assert!(r["clat_ns"]["percentile"]["50.000000"].as_f64().unwrap() >= 1999.0);
        assert!(r["clat_ns"]["percentile"]["99.000000"].as_f64().unwrap() >= 3999.0);
        let w = &v["jobs"][0]["write"];
        assert_eq!(w["iops"].as_f64(), Some(0.0));
        assert_eq!(w["clat_ns"]["percentile"]["50.000000"].as_f64(), Some(0.0));
    }

    #[test]
    fn summary_reads_like_fio() {
        let mut out = Vec::new();
        report().write_table(&mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("read: IOPS=1.0M, BW=3906MiB/s (4096MB/s)"),
            "{s}"
        );
        assert!(s.contains("50.00th=["), "{s}");
        assert!(s.contains("READ: bw=3906MiB/s"), "{s}");
        assert!(!s.contains("write: IOPS"), "{s}");
    }
}
