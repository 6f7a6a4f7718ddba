//! `dp-perf rtrs` end to end over the shm provider with `--pair`: the JSON line exactly as
//! issue 15 fixes it, real measurements, failover under load with nothing failed, and
//! clear refusals of bad options.

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

/// Distinct ports per test (and per path): the tests of this file may run in parallel.
fn port(n: u16) -> String {
    (21_000 + n * 4 + (std::process::id() % 500) as u16 * 20).to_string()
}

#[test]
fn json_is_exactly_the_issues_line() {
    let p = port(0);
    let out = ok_stdout(&[
        "rtrs",
        "--pair",
        "--rw",
        "read",
        "--bs",
        "4096",
        "--iodepth",
        "16",
        "-T",
        "0.5",
        "--json",
        "-p",
        &p,
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {out:?}");
    let v: Value = serde_json::from_str(lines[0]).expect("JSON");
    let o = v["rtrs"].as_object().expect("an rtrs object");
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    let mut want = vec!["iops", "gbps", "p50_ns", "p99_ns", "paths", "failed"];
    let order: Vec<usize> = want
        .iter()
        .map(|k| lines[0].find(&format!("\"{k}\"")).expect("key present"))
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "keys in the issue's order: {}",
        lines[0]
    );
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want, "exactly the issue's keys");
    for k in ["iops", "gbps", "p50_ns", "p99_ns"] {
        let x = o[k].as_f64().unwrap();
        assert!(x.is_finite() && x > 0.0, "{k} = {x}");
    }
    assert_eq!(o["paths"].as_u64(), Some(1));
    assert_eq!(o["failed"].as_u64(), Some(0));
    let gbps = o["gbps"].as_f64().unwrap();
    let iops = o["iops"].as_f64().unwrap();
    assert!((gbps - iops * 4096.0 * 8.0 / 1e9).abs() < 1e-6 * gbps.max(1.0));
}

#[test]
fn killed_path_fails_over_with_nothing_failed_and_comes_back() {
    let p = port(1);
    let out = ok_stdout(&[
        "rtrs",
        "--pair",
        "--rw",
        "write",
        "--iodepth",
        "32",
        "--paths",
        "2",
        "--policy",
        "rr",
        "-T",
        "3",
        "--kill-path-after",
        "0.5",
        "-p",
        &p,
    ]);
    assert!(out.contains("2 path(s) rr"), "{out}");
    let row = out.lines().nth(2).expect("the numbers row");
    let failed: u64 = row
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .expect("failed column");
    assert_eq!(failed, 0, "{out}");
    assert!(
        out.contains("path 0 killed (CM disconnect) at 0.5"),
        "{out}"
    );
    assert!(
        out.contains("failover: all of them completed on other paths"),
        "{out}"
    );
    assert!(out.contains("reconnected "), "the path came back: {out}");
    let took: u64 = out
        .split("then took ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("requests after the reconnect");
    assert!(took > 0, "the path carried traffic again: {out}");
}

#[test]
fn kill_after_the_end_is_refused() {
    let out = dp_perf(&["rtrs", "--pair", "-T", "1", "--kill-path-after", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kill-path-after 2 must be below -T 1"),
        "{err}"
    );
}
