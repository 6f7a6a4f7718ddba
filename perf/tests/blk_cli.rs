//! `dp-perf blk` end to end: RNBD over RTRS over the shm provider with `--pair` — fio's JSON
//! shape, data written and read back through a memory device, and clear refusals.

use std::process::{Command, Output};

use serde_json::Value;

fn dp_perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dp-perf"))
        .args(args)
        .output()
        .expect("run dp-perf")
}

/// Distinct ports per test: the tests of this file may run in parallel.
fn port(n: u16) -> String {
    (23_000 + n * 4 + (std::process::id() % 500) as u16 * 20).to_string()
}

#[test]
fn pair_json_has_fios_shape() {
    let p = port(0);
    let args = [
        "blk",
        "--pair",
        "--rw",
        "randread",
        "--bs",
        "4k",
        "--iodepth",
        "8",
        "--runtime",
        "300ms",
        "--json",
        "-p",
        &p,
    ];
    let out = dp_perf(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let read = &v["jobs"][0]["read"];
    let iops = read["iops"].as_f64().expect("jobs[0].read.iops");
    assert!(iops > 0.0, "no IO completed: {stdout}");
    assert!(read["bw"].as_f64().is_some());
    let p50 = read["clat_ns"]["percentile"]["50.000000"]
        .as_f64()
        .expect("clat_ns.percentile.50");
    let p99 = read["clat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .expect("clat_ns.percentile.99");
    assert!(p50 > 0.0 && p99 >= p50, "p50 {p50} p99 {p99}");
    assert_eq!(read["errors"].as_u64(), Some(0));
    assert!(v["jobs"][0]["write"]["iops"].as_f64().is_some());
}

/// Writes patterns through RNBD into the server's memory device and reads every block back
/// (the run fails on any mismatch, and reports the blocks it checked).
#[test]
fn pair_verify_round_trips_data_through_a_memory_device() {
    let p = port(1);
    let args = [
        "blk",
        "--pair",
        "--backend",
        "mem",
        "--dev-size",
        "8m",
        "--rw",
        "randrw",
        "--bs",
        "8k",
        "--iodepth",
        "8",
        "--verify",
        "--runtime",
        "300ms",
        "-p",
        &p,
    ];
    let out = dp_perf(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?} failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("verify:"))
        .unwrap_or_else(|| panic!("no verify line: {stdout}"));
    assert!(line.contains("all good"), "{line}");
    let n: u64 = line
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("a count of blocks");
    assert!(n > 0, "{line}");
}

#[test]
fn verify_on_the_null_device_is_refused() {
    let out = dp_perf(&["blk", "--pair", "--verify", "--rw", "randwrite"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--backend mem"), "{err}");
}

#[test]
fn a_remote_run_needs_one_job() {
    let out = dp_perf(&["blk", "--pair", "--numjobs", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--numjobs"));
}
