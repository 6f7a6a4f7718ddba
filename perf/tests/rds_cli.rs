//! `dp-perf rds-stress` and `rds-ping` end to end with `--pair` (two RDS nodes over shm in
//! one process): the JSON shapes the perf lab's checks read, exactly, with real
//! measurements; the table's rds-stress columns; bad options refused with a clear line.
//! `dp-perf rds-check` between two processes over RDS-TCP on loopback.

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

fn one_object(args: &[&str], key: &str, fields: &[&str]) -> Value {
    let out = ok_stdout(args);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: one JSON object on one line: {out}"
    );
    let v: Value = serde_json::from_str(lines[0]).expect("JSON");
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 1, "only {key} at the top: {v}");
    let inner = v[key]
        .as_object()
        .unwrap_or_else(|| panic!("{key} missing in {v}"));
    let mut got: Vec<&str> = inner.keys().map(String::as_str).collect();
    let mut want = fields.to_vec();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "exactly these fields: {v}");
    v[key].clone()
}

#[test]
fn rds_stress_pair_prints_the_documented_object() {
    let v = one_object(
        &[
            "rds-stress",
            "--pair",
            "-q",
            "64",
            "-T",
            "5",
            "--json",
            "--quick",
        ],
        "rds_stress",
        &["msgs_per_sec", "gbps", "tasks", "req_size", "sockets"],
    );
    assert!(v["msgs_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["tasks"], 1);
    assert_eq!(v["req_size"], 64);
    assert_eq!(v["sockets"], 1);
    let v = one_object(
        &[
            "rds-stress",
            "--pair",
            "-q",
            "256",
            "-t",
            "2",
            "-d",
            "4",
            "--sockets",
            "64",
            "-o",
            "--json",
            "--quick",
        ],
        "rds_stress",
        &["msgs_per_sec", "gbps", "tasks", "req_size", "sockets"],
    );
    assert_eq!(
        (v["tasks"].as_u64(), v["sockets"].as_u64()),
        (Some(2), Some(64))
    );
    let rate = v["msgs_per_sec"].as_f64().unwrap();
    let gbps = v["gbps"].as_f64().unwrap();
    assert!(
        rate > 0.0 && (gbps - rate * 256.0 * 8.0 / 1e9).abs() < 1e-9,
        "{v}"
    );
}

#[test]
fn rds_stress_table_has_rds_stress_columns() {
    let out = ok_stdout(&["rds-stress", "--pair", "-q", "1K", "-d", "8", "--quick"]);
    let head = out.lines().next().expect("a header line");
    for col in [
        "tsks",
        "tx/s",
        "rx/s",
        "tx+rx K/s",
        "mbi K/s",
        "mbo K/s",
        "tx us/c",
        "rtt us",
        "cpu %",
    ] {
        assert!(head.contains(col), "column {col} missing: {head}");
    }
    assert!(out.contains("(average)"), "{out}");
}

#[test]
fn rds_ping_pair_prints_the_documented_object() {
    let v = one_object(
        &["rds-ping", "--pair", "-c", "200", "--json"],
        "rds_ping",
        &["count", "p50_ns", "p99_ns", "p999_ns"],
    );
    assert_eq!(v["count"], 200, "every ping answered: {v}");
    let p50 = v["p50_ns"].as_f64().unwrap();
    let p99 = v["p99_ns"].as_f64().unwrap();
    assert!(p50 > 0.0 && p99 >= p50, "{v}");
}

#[test]
fn bad_rds_options_are_refused_with_a_reason() {
    let out = dp_perf(&["rds-stress", "--pair", "-q", "2M"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 1M"), "{err}");
    let out = dp_perf(&["rds-stress", "-q", "64"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-r ADDR"));
    let out = dp_perf(&["rds-ping", "--pair", "-c", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = dp_perf(&["rds-stress", "--pair", "--provider", "verbs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("two processes"));
}

/// `dp-perf rds-check` between two processes over RDS-TCP on loopback, 8 paths, 8 sender
/// sockets: the receiver's JSON says every message came once, in order, intact (the
/// shape scripts/rds-kernel-lab.sh reads), the sender's that it heard DONE.
#[test]
fn rds_check_tcp_loopback_run_is_whole() {
    let port = (21000 + std::process::id() % 9000).to_string();
    let common = [
        "--transport",
        "tcp",
        "--tcp-port",
        port.as_str(),
        "--paths",
        "8",
        "-n",
        "40",
        "--json",
    ];
    let recv = Command::new(env!("CARGO_BIN_EXE_dp-perf"))
        .args(["rds-check", "--recv", "-r", "127.0.81.2", "--idle", "5"])
        .args(common)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run dp-perf");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut send_args = vec![
        "rds-check",
        "--send",
        "-r",
        "127.0.81.1",
        "-s",
        "127.0.81.2",
    ];
    send_args.extend(["--sockets", "8", "--timeout", "20"]);
    send_args.extend(common);
    let sent: Value = serde_json::from_str(ok_stdout(&send_args).trim()).expect("JSON");
    let out = recv.wait_with_output().expect("receiver");
    let got: Value = serde_json::from_slice(&out.stdout).expect("receiver JSON");
    let (s, r) = (&sent["rds_check"], &got["rds_check"]);
    assert_eq!(s["sent"], 40, "{s}");
    assert_eq!(s["done"], true, "{s}");
    for (k, want) in [
        ("received", 40),
        ("missing", 0),
        ("duplicated", 0),
        ("out_of_order", 0),
        ("corrupt", 0),
    ] {
        assert_eq!(r[k], want, "{k}: {r}");
    }
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["npaths"], 8, "{r}");
}

#[test]
fn bad_rds_check_options_are_refused_with_a_reason() {
    let out = dp_perf(&["rds-check", "--send", "-r", "127.0.0.1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-s ADDR"));
    let out = dp_perf(&["rds-check", "--recv", "-r", "127.0.0.1", "--paths", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give 1 or 8"));
}

#[test]
fn rds_stress_rdma_moves_the_payload_by_rdma_and_keeps_the_object() {
    let v = one_object(
        &[
            "rds-stress",
            "--pair",
            "-q",
            "64K",
            "-o",
            "-d",
            "4",
            "--rdma",
            "--json",
            "--quick",
        ],
        "rds_stress",
        &["msgs_per_sec", "gbps", "tasks", "req_size", "sockets"],
    );
    let rate = v["msgs_per_sec"].as_f64().unwrap();
    let gbps = v["gbps"].as_f64().unwrap();
    assert!(
        rate > 0.0 && (gbps - rate * 65536.0 * 8.0 / 1e9).abs() < 1e-9,
        "gbps counts the RDMA payload: {v}"
    );
    // The counters show the payload went by RDMA, and the messages stayed small.
    let out = ok_stdout(&[
        "rds-stress",
        "--pair",
        "-q",
        "64K",
        "-a",
        "16",
        "-d",
        "4",
        "--rdma",
        "--quick",
    ]);
    let count = |name: &str| -> u64 {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {out}"))
    };
    let (ops, bytes) = (count("fabric_rdma_ops"), count("fabric_rdma_bytes"));
    assert!(ops > 0 && bytes == ops * 65536, "{ops} ops, {bytes} bytes");
    assert!(
        count("copy_from_user") < ops * 64,
        "the request messages carry 16 bytes, not the payload"
    );
    let out = dp_perf(&["rds-stress", "--pair", "--rdma", "--transport", "tcp"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RDS-TCP has no RDMA"));
}
