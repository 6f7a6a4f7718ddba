//! The `dp-perf` binary end to end: argument errors exit with status 2 and one line on stderr,
//! and every command's `--json` output has exactly the documented shape with finite, positive
//! numbers (measured for real, with `--quick` sizes).

use std::process::{Command, Output};

use serde_json::Value;

fn dp_perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dp-perf"))
        .args(args)
        .output()
        .expect("run dp-perf")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit status 2, nothing on stdout, and exactly one line on stderr containing
/// `needle`.
fn assert_usage_error(args: &[&str], needle: &str) {
    let out = dp_perf(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err:?}");
    assert!(err.starts_with("dp-perf: error: "), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    assert_usage_error(&[], "no command given; one of: ring, mempool, lcore, limit");
    assert_usage_error(&["ring", "--bogus"], "unexpected argument '--bogus'");
    assert_usage_error(&["frobnicate"], "unrecognized subcommand 'frobnicate'");
    assert_usage_error(&["ring", "--cpus", "0,0"], "the two CPUs must differ");
    assert_usage_error(&["ring", "--cpus", "zero"], "expected two CPU numbers");
    assert_usage_error(&["--cpus", "0,100000", "limit"], "CPU 100000 is not in");
    assert_usage_error(&["ring", "--reps", "0"], "--reps");
    assert_usage_error(
        &["mempool", "--bulk", "3"],
        "bulk 3 does not divide keep 128",
    );
    assert_usage_error(&["mempool", "--cache", "513"], "--cache");
    assert_usage_error(
        &["mempool", "--seconds", "-1"],
        "expected seconds in (0, 3600]",
    );
    assert_usage_error(
        &["mempool", "--seconds", "0"],
        "expected seconds in (0, 3600]",
    );
    assert_usage_error(&["ring", "--mode", "lifo"], "invalid value 'lifo'");
    assert_usage_error(&["ring", "--cores", "3"], "--cores");
    assert_usage_error(
        &["mempool", "--ring-sync", "single"],
        "cannot be single; use multi, rts or hts",
    );
    assert_usage_error(
        &["mempool", "--ring-sync", "mpmc"],
        "use single, multi, rts or hts",
    );
    assert_usage_error(&["lcore", "--idle-pollers", "0"], "--idle-pollers");
}

#[test]
fn help_and_version_exit_0() {
    let out = dp_perf(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["ring", "mempool", "lcore", "limit", "--json", "--cpus"] {
        assert!(text.contains(cmd), "help lacks {cmd}: {text}");
    }
    let out = dp_perf(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("dp-perf "));
}

/// Runs `args` with `--quick --json` and returns the parsed single-line object.
fn json_of(args: &[&str]) -> Value {
    let mut all = vec!["--quick", "--json"];
    all.extend_from_slice(args);
    let out = dp_perf(&all);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

/// All four commands in one test, so that they do not run concurrently and fight over the two
/// CPUs they pin to.
#[test]
fn json_outputs_have_the_documented_shape() {
    if perf::harness::CpuPair::default().check().is_err() {
        eprintln!("skipped: CPUs 0 and 1 are not both available");
        return;
    }

    let ring = json_of(&["ring"]);
    assert_eq!(keys(&ring), ["ring"]);
    let rows = ring["ring"].as_array().expect("ring rows");
    assert_eq!(rows.len(), 40);
    for r in rows {
        assert_eq!(keys(r), ["batch", "cores", "mode", "ns_per_elem", "op"]);
        assert!(
            matches!(r["mode"].as_str(), Some("spsc" | "mpmc" | "rts" | "hts")),
            "{r}"
        );
        assert!(
            matches!(r["op"].as_str(), Some("single" | "bulk" | "burst")),
            "{r}"
        );
        assert!(matches!(r["cores"].as_u64(), Some(1 | 2)), "{r}");
        assert!(r["batch"].as_u64().is_some_and(|b| b >= 1), "{r}");
        positive(&r["ns_per_elem"], "ns_per_elem");
    }
    for (mode, op, batch, cores) in [
        ("spsc", "single", 1, 1),
        ("mpmc", "burst", 32, 1),
        ("spsc", "bulk", 32, 2),
        ("mpmc", "bulk", 8, 2),
        ("rts", "bulk", 32, 2),
        ("hts", "single", 1, 1),
    ] {
        assert!(
            rows.iter().any(|r| r["mode"] == mode
                && r["op"] == op
                && r["batch"] == batch
                && r["cores"] == cores),
            "missing {mode} {op} {batch} {cores}"
        );
    }

    let pool = json_of(&["mempool", "--seconds", "0.002"]);
    assert_eq!(keys(&pool), ["mempool"]);
    let rows = pool["mempool"].as_array().expect("mempool rows");
    assert_eq!(rows.len(), 12);
    for r in rows {
        assert_eq!(
            keys(r),
            ["bulk", "cache", "cores", "keep", "ops_per_sec", "ring"]
        );
        assert_eq!(r["ring"], "multi");
        positive(&r["ops_per_sec"], "ops_per_sec");
    }
    assert!(
        rows.iter()
            .any(|r| r["cache"] == 512 && r["bulk"] == 32 && r["cores"] == 2)
    );

    let lcore = json_of(&["lcore"]);
    assert_eq!(keys(&lcore), ["lcore"]);
    assert_eq!(
        keys(&lcore["lcore"]),
        ["empty_iter_ns", "msg_oneway_ns_p50", "msg_per_sec"]
    );
    for k in ["empty_iter_ns", "msg_oneway_ns_p50", "msg_per_sec"] {
        positive(&lcore["lcore"][k], k);
    }

    let limit = json_of(&["limit"]);
    assert_eq!(keys(&limit), ["limit"]);
    assert_eq!(
        keys(&limit["limit"]),
        ["cacheline_oneway_ns", "memcpy_gbps"]
    );
    positive(
        &limit["limit"]["cacheline_oneway_ns"],
        "cacheline_oneway_ns",
    );
    positive(&limit["limit"]["memcpy_gbps"], "memcpy_gbps");
}

#[test]
fn tables_are_printed_without_json() {
    if perf::harness::CpuPair::default().check().is_err() {
        return;
    }
    let out = dp_perf(&["--quick", "limit"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cache-line one-way hand-off"), "{text}");
    assert!(text.contains("Gb/s payload"), "{text}");
}
