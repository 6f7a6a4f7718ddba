//! The fabric and rstream commands of `dp-perf` end to end, over the shm provider with
//! `--pair` (server and client as two processes): one JSON object per size with the
//! documented keys and real measurements, rstream's row names, data verification, and the
//! verbs provider's clear refusal when it is not available.

use std::process::{Command, Output};

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

fn num(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x} in {v}");
    x
}

/// Distinct ports per test: the tests of this file may run in parallel.
fn port(n: u16) -> String {
    (19_000 + n + (std::process::id() % 500) as u16 * 10).to_string()
}

#[test]
fn latency_tests_print_one_object_per_size() {
    for (i, test) in ["write-lat", "send-lat", "read-lat"].iter().enumerate() {
        let p = port(i as u16);
        let rows = json_lines(&[
            test, "--pair", "--quick", "-s", "64", "-n", "300", "--json", "-p", &p,
        ]);
        assert_eq!(rows.len(), 1, "{test}: {rows:?}");
        let r = &rows[0];
        assert_eq!(r["test"], *test);
        assert_eq!(r["provider"], "shm");
        assert_eq!(r["size"], 64);
        assert_eq!(r["iterations"], 300);
        let (p50, p99, p999) = (num(r, "p50_ns"), num(r, "p99_ns"), num(r, "p999_ns"));
        let (mean, max, min) = (num(r, "mean_ns"), num(r, "max_ns"), num(r, "min_ns"));
        assert!(
            min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max * 1.001,
            "{r}"
        );
        assert!(min <= mean && mean <= max, "{r}");
    }
}

#[test]
fn bandwidth_tests_sweep_sizes() {
    for (i, test) in ["write-bw", "send-bw", "read-bw"].iter().enumerate() {
        let p = port(3 + i as u16);
        let rows = json_lines(&[test, "--pair", "--quick", "-a", "--json", "-p", &p]);
        assert!(
            rows.len() >= 3,
            "{test}: a sweep has several sizes: {rows:?}"
        );
        let mut last = 0;
        for r in &rows {
            assert_eq!(r["test"], *test);
            let size = r["size"].as_u64().expect("size");
            assert!(size > last, "sizes increase: {rows:?}");
            last = size;
            let (gbps, mpps) = (num(r, "gbps"), num(r, "mpps"));
            // Gb/s is payload bits over time, Mpps messages over time: they must agree.
            let implied = mpps * 1e6 * size as f64 * 8.0 / 1e9;
            assert!((implied - gbps).abs() <= gbps * 1e-6 + 1e-9, "{r}");
            assert!(num(r, "peak_gbps") >= gbps * 0.999, "{r}");
        }
    }
}

#[test]
fn tables_follow_perftest() {
    let p = port(6);
    let t = ok_stdout(&["write-lat", "--pair", "--quick", "-s", "8", "-p", &p]);
    for col in [
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_typical[usec]",
        "99.9% percentile[usec]",
    ] {
        assert!(t.contains(col), "{col} missing:\n{t}");
    }
    let p = port(7);
    let t = ok_stdout(&["write-bw", "--pair", "--quick", "-s", "4096", "-p", &p]);
    for col in ["BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]"] {
        assert!(t.contains(col), "{col} missing:\n{t}");
    }
}

#[test]
fn verbs_without_a_device_exits_2_and_says_how_to_get_one() {
    let out = dp_perf(&["write-lat", "--pair", "--provider", "verbs"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    // Without the feature: how to build it; with it but no device: how to get one.
    assert!(
        err.contains("--features verbs") || err.contains("rdma link add"),
        "{err}"
    );
}

#[test]
fn fabric_commands_need_a_role() {
    let out = dp_perf(&["write-lat"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server, --client ADDR, or --pair"));
}

#[test]
fn rstream_rows_match_rstream_and_verify_data() {
    let p = port(8);
    let out = json_lines(&[
        "rstream", "--pair", "--quick", "-T", "v", "--json", "-p", &p,
    ]);
    assert_eq!(out.len(), 1);
    let rows = out[0]["rstream"].as_array().expect("rstream array");
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "64_lat", "4k_lat", "64k_lat", "1m_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw"
        ]
    );
    for r in rows {
        num(r, "usec_per_xfer");
        num(r, "gbps");
        num(r, "xfers");
        num(r, "iters");
        num(r, "bytes");
    }
    // Kernel TCP with the same table, for comparison.
    let p = port(9);
    let out = json_lines(&[
        "rstream", "--pair", "--tcp", "--quick", "-S", "4096", "-C", "20", "--json", "-p", &p,
    ]);
    let rows = out[0]["rstream"].as_array().expect("rstream array");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "custom");
    assert_eq!(rows[0]["xfers"], 20);
}

/// `--sockets N`: the usual rows, measured on one connection while the other N-1 carry
/// traffic, and beside them the measured connection's per-round latency and what the
/// background connections cost and carried.
#[test]
fn rstream_sockets_measures_one_of_n_connections() {
    let p = port(10);
    let out = json_lines(&[
        "rstream",
        "--pair",
        "--sockets",
        "16",
        "--rate",
        "1000",
        "-B",
        "16384",
        "-S",
        "64",
        "-C",
        "1",
        "-I",
        "2000",
        "--json",
        "-p",
        &p,
    ]);
    assert_eq!(out.len(), 1);
    let rows = out[0]["rstream"].as_array().expect("rstream array");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["name"], "custom");
    assert_eq!(rows[0]["bytes"], 64);
    assert_eq!(rows[0]["iters"], 2000);
    num(&rows[0], "usec_per_xfer");
    let s = &out[0]["sockets"];
    assert_eq!(s["count"], 16);
    let lat = &s["latency"][0]["one_way_ns"];
    assert_eq!(lat["count"], 2000, "one sample per round trip: {s}");
    assert!(num(lat, "p50") > 0.0);
    let bg = &s["background"][0];
    assert_eq!(bg["connections"], 15);
    assert!(num(bg, "rss_bytes_per_socket") > 0.0, "{s}");
    assert!(
        num(bg, "messages_sent") > 0.0,
        "the background carried nothing: {s}"
    );
    assert!(num(bg, "bytes_received") > 0.0, "no echo came back: {s}");
    // And the usage errors say what to do.
    let out = dp_perf(&[
        "rstream",
        "--pair",
        "--sockets",
        "4",
        "--tcp",
        "-p",
        &port(11),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("over rsockets"));
}
