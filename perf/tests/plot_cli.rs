//! `--plot FILE` end to end: the picture's data is the run's own measurement (the figure's
//! percentiles and sweep points equal the `--json` numbers printed beside them, whose shape
//! `--plot` leaves unchanged), `dp-perf plot` puts several runs in one chart, and every
//! misuse is refused before anything runs, with one line saying what to do.

use std::path::PathBuf;
use std::process::{Command, Output};

use dp_plot::Figure;
use serde_json::Value;

fn dp_perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dp-perf"))
        .args(args)
        .output()
        .expect("run dp-perf")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = dp_perf(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn json_lines(args: &[&str]) -> Vec<Value> {
    ok_stdout(args)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {l:?}: {e}")))
        .collect()
}

fn tmp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("dp-perf-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).display().to_string()
}

fn figure(path: &str) -> Figure {
    Figure::read(&PathBuf::from(path)).unwrap()
}

fn svg_has(path: &str, texts: &[&str]) {
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.starts_with("<svg"), "{path}");
    for t in texts {
        assert!(svg.contains(t), "{path} lacks {t:?}");
    }
}

fn png_ok(path: &str) {
    let b = std::fs::read(path).unwrap();
    assert!(
        b.starts_with(b"\x89PNG\r\n\x1a\n") && b.len() > 10_000,
        "{path}"
    );
}

/// Distinct TCP ports per test (the rsocket runs use a private shm directory each).
fn port(n: u16) -> String {
    (21_000 + n + (std::process::id() % 500) as u16 * 10).to_string()
}

fn usage_error(args: &[&str], needle: &str) {
    let out = dp_perf(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} ran");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
}

#[test]
fn latency_plot_is_the_measured_distribution() {
    let (json, svg, png) = (tmp("wl.json"), tmp("wl.svg"), tmp("wl.png"));
    let rows = json_lines(&[
        "write-lat",
        "--pair",
        "--quick",
        "-s",
        "64",
        "-n",
        "400",
        "--json",
        "--plot",
        &json,
        "--plot",
        &svg,
        "--plot",
        &png,
    ]);
    // --json is what it was without --plot: one object per size, the same keys.
    assert_eq!(rows.len(), 1);
    let mut keys: Vec<&str> = rows[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "iterations",
            "max_ns",
            "mean_ns",
            "min_ns",
            "p50_ns",
            "p999_ns",
            "p99_ns",
            "provider",
            "size",
            "stdev_ns",
            "test"
        ]
    );
    let f = figure(&json);
    assert_eq!(f.percentiles.len(), 1);
    assert!(f.sweep.is_empty(), "one size: no sweep");
    let s = &f.percentiles[0];
    assert_eq!(s.label, "write-lat 64 B");
    assert_eq!(s.count, 400);
    let row = &rows[0];
    // The same histogram: its median and 99th percentile are points of the curve, its
    // maximum is the last one (within the histogram's 3 significant digits).
    assert_eq!(s.at(50.0).unwrap(), row["p50_ns"].as_f64().unwrap());
    assert_eq!(s.at(99.0).unwrap(), row["p99_ns"].as_f64().unwrap());
    let max = s.points.last().unwrap().ns;
    assert!(
        (max / row["max_ns"].as_f64().unwrap() - 1.0).abs() < 2e-3,
        "{max} vs {row}"
    );
    svg_has(
        &svg,
        &[
            "dp-perf write-lat, provider shm (one way)",
            "write-lat 64 B (400 samples)",
            "99.9%",
        ],
    );
    png_ok(&png);
}

#[test]
fn bandwidth_sweep_plot_has_every_size() {
    let json = tmp("wb.json");
    let rows = json_lines(&[
        "write-bw", "--pair", "--quick", "-a", "--json", "--plot", &json,
    ]);
    let f = figure(&json);
    assert!(f.percentiles.is_empty());
    assert_eq!(f.sweep.len(), 1);
    let pts = &f.sweep[0].points;
    assert_eq!(pts.len(), rows.len());
    for (p, r) in pts.iter().zip(&rows) {
        assert_eq!(p.bytes, r["size"].as_u64().unwrap());
        assert_eq!(p.gbps, r["gbps"].as_f64());
        assert_eq!(p.lat_ns, None);
    }
}

#[test]
fn rstream_and_its_tcp_twin_share_a_chart() {
    let (rs, tcp, both) = (tmp("rs.json"), tmp("tcp.json"), tmp("both.svg"));
    let rs_rows = json_lines(&["rstream", "--pair", "--quick", "--json", "--plot", &rs]);
    let p = port(1);
    json_lines(&[
        "rstream", "--pair", "--quick", "--tcp", "-p", &p, "--json", "--plot", &tcp,
    ]);
    let f = figure(&rs);
    let pts = &f.sweep[0].points;
    // The default sizes, each with its bandwidth row and its latency row.
    let sizes: Vec<u64> = pts.iter().map(|p| p.bytes).collect();
    assert_eq!(sizes, [64, 4096, 65536, 1 << 20]);
    for r in rs_rows[0]["rstream"].as_array().unwrap() {
        let size = r["bytes"].as_u64().unwrap();
        let pt = pts.iter().find(|p| p.bytes == size).unwrap();
        let name = r["name"].as_str().unwrap();
        if name.ends_with("_bw") {
            assert_eq!(pt.gbps, r["gbps"].as_f64(), "{r}");
        } else {
            let us = r["usec_per_xfer"].as_f64().unwrap();
            assert!((pt.lat_ns.unwrap() / (us * 1e3) - 1.0).abs() < 1e-9, "{r}");
        }
    }
    let out = ok_stdout(&[
        "plot",
        &rs,
        &tcp,
        "--title",
        "rsockets and TCP",
        "--plot",
        &both,
    ]);
    assert!(out.contains("rsockets on shm (dp-perf rstream)"), "{out}");
    assert!(out.contains("kernel TCP (dp-perf rstream --tcp)"), "{out}");
    svg_has(
        &both,
        &[
            "rsockets and TCP",
            "rsockets on shm (dp-perf rstream)",
            "kernel TCP (dp-perf rstream --tcp)",
            "bandwidth against size",
            "latency against size",
        ],
    );
}

#[test]
fn limit_plots_the_hand_off_distribution() {
    if perf::harness::CpuPair::default().check().is_err() {
        return;
    }
    let json = tmp("limit.json");
    ok_stdout(&["--quick", "limit", "--plot", &json]);
    let f = figure(&json);
    assert_eq!(f.percentiles.len(), 1);
    assert_eq!(f.percentiles[0].count, 2000);
}

#[test]
fn misuse_is_refused_before_running() {
    usage_error(&["ring", "--plot", "x.svg"], "`dp-perf ring` draws no plot");
    usage_error(
        &["mempool", "--plot", "x.svg"],
        "`dp-perf mempool` draws no plot",
    );
    usage_error(
        &["write-lat", "--pair", "--plot", "x.gif"],
        "end it in .svg, .png or .json",
    );
    usage_error(
        &["write-lat", "--server", "--plot", "x.svg"],
        "the server side measures nothing",
    );
    usage_error(&["plot", "a.json"], "give --plot FILE");
    let missing = tmp("missing.json");
    usage_error(
        &["plot", &missing, "--plot", "x.svg"],
        "missing.json: No such file",
    );
    let bad = tmp("bad.json");
    std::fs::write(&bad, "{\"dp-plot\": 1, \"title\": \"t\", \"colour\": 3}").unwrap();
    usage_error(&["plot", &bad, "--plot", "x.svg"], "unknown field `colour`");
    let empty = tmp("empty.json");
    std::fs::write(&empty, Figure::new("e").to_json()).unwrap();
    usage_error(&["plot", &empty, "--plot", "x.svg"], "nothing to plot");
}
