//! Acceptance: Debian's unmodified rdmacm-utils programs over this library, through
//! `scripts/with-rsocket`, with server and client as separate processes on 127.0.0.1.
//!
//! rstream runs its default test and `-S all` in the default non-blocking mode, `-T b`
//! (blocking) and `-T a` (rpoll before every call), and with `-T v` (data verified) in each
//! mode; riostream runs its default test, plain and verified. Every run must print its whole
//! table, report no error, and both processes must exit: the client within a generous limit,
//! the server soon after it (a hang at exit fails the test). One pair runs at a time.
//!
//! Skipped, saying so, where rdmacm-utils is not installed; CI installs it.

mod common;

use std::time::Duration;

use common::{
    Guarded, TempDir, port, program, rsocket_listening, run_client, serial, start_server,
    with_rsocket,
};

/// Hang guard for one client run (release builds take seconds).
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// How long the server may take to exit after its client did.
const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// rstream's and riostream's sizes, as they print them (`test_size[]`, `size_str`).
const ALL_SIZES: [&str; 33] = [
    "64", "128", "192", "256", "384", "512", "768", "1k", "1.5k", "2k", "3k", "4k", "6k", "8k",
    "12k", "16k", "24k", "32k", "48k", "64k", "96k", "128k", "192k", "256k", "384k", "512k",
    "768k", "1m", "1.5m", "2m", "3m", "4m", "6m",
];
/// The sizes of a default run.
const DEFAULT_SIZES: [&str; 4] = ["64", "4k", "64k", "1m"];

/// How to install the programs these tests run.
const RDMACM_UTILS: &str = "install rdmacm-utils (apt-get install rdmacm-utils)";

/// Runs server and client; returns both standard outputs.
fn run_pair(prog: &str, port_offset: u16, args: &[&str]) -> Option<(String, String)> {
    let exe = program(prog, RDMACM_UTILS)?;
    let _one = serial();
    let dir = TempDir::new(&format!("{prog}-{port_offset}"));
    let p = port(port_offset);
    let ps = p.to_string();
    let mut sargs = vec!["-p", ps.as_str()];
    sargs.extend_from_slice(args);
    // The server listens once its listener socket appears in the rendezvous directory:
    // proof that it runs on this library's shm fabric, not on kernel sockets.
    let mut server = start_server(
        with_rsocket(&dir.0, &exe, &sargs),
        format!("{prog} server"),
        || rsocket_listening(&dir.0, p),
    );
    let mut cargs = vec!["-s", "127.0.0.1", "-p", ps.as_str()];
    cargs.extend_from_slice(args);
    let (cst, cout, cerr) = run_client(
        with_rsocket(&dir.0, &exe, &cargs),
        format!("{prog} {args:?}: the client"),
        RUN_LIMIT,
    );
    let Some((sst, sout, serr)) = server.wait_for(EXIT_LIMIT) else {
        panic!("{prog} {args:?}: the server did not exit within {EXIT_LIMIT:?} of its client");
    };
    let report = format!("client {cst}:\n{cout}\n{cerr}\nserver {sst}:\n{sout}\n{serr}");
    assert!(
        cst.success() && sst.success(),
        "{prog} {args:?} failed:\n{report}"
    );
    assert!(
        cerr.trim().is_empty() && serr.trim().is_empty(),
        "{prog} {args:?} reported errors:\n{report}"
    );
    Some((cout, sout))
}

/// Checks a result table: one row per size, latency runs then bandwidth runs, nothing else.
fn check_table(out: &str, sizes: &[&str], what: &str) {
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("name"),
        "{what}: no table header:\n{out}"
    );
    let names: Vec<&str> = lines
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    let want: Vec<String> = ["lat", "bw"]
        .iter()
        .flat_map(|k| sizes.iter().map(move |s| format!("{s}_{k}")))
        .collect();
    assert_eq!(
        names, want,
        "{what}: rows differ from the expected sizes:\n{out}"
    );
}

fn rstream(port_offset: u16, args: &[&str], sizes: &[&str]) {
    let Some((client, server)) = run_pair("rstream", port_offset, args) else {
        return;
    };
    check_table(&client, sizes, &format!("rstream {args:?} client"));
    check_table(&server, sizes, &format!("rstream {args:?} server"));
}

#[test]
fn rstream_default_nonblocking() {
    rstream(0, &[], &DEFAULT_SIZES);
}

#[test]
fn rstream_all_sizes_nonblocking() {
    rstream(1, &["-S", "all"], &ALL_SIZES);
}

#[test]
fn rstream_default_blocking() {
    rstream(2, &["-T", "b"], &DEFAULT_SIZES);
}

#[test]
fn rstream_all_sizes_blocking() {
    rstream(3, &["-S", "all", "-T", "b"], &ALL_SIZES);
}

#[test]
fn rstream_default_async() {
    rstream(4, &["-T", "a"], &DEFAULT_SIZES);
}

#[test]
fn rstream_all_sizes_async() {
    rstream(5, &["-S", "all", "-T", "a"], &ALL_SIZES);
}

#[test]
fn rstream_verified_nonblocking() {
    rstream(6, &["-T", "v"], &DEFAULT_SIZES);
}

#[test]
fn rstream_verified_blocking() {
    rstream(7, &["-T", "b", "-T", "v"], &DEFAULT_SIZES);
}

#[test]
fn rstream_verified_async() {
    rstream(8, &["-T", "a", "-T", "v"], &DEFAULT_SIZES);
}

#[test]
fn riostream_default() {
    let Some((client, server)) = run_pair("riostream", 9, &[]) else {
        return;
    };
    check_table(&client, &DEFAULT_SIZES, "riostream client");
    check_table(&server, &DEFAULT_SIZES, "riostream server");
}

#[test]
fn riostream_verified() {
    let Some((client, server)) = run_pair("riostream", 10, &["-T", "v"]) else {
        return;
    };
    check_table(&client, &DEFAULT_SIZES, "riostream -T v client");
    check_table(&server, &DEFAULT_SIZES, "riostream -T v server");
}

/// `scripts/rstream-compare.sh` runs both transports and prints both tables and the
/// per-size ratios.
#[test]
fn rstream_compare_prints_both_tables_and_ratios() {
    if program("rstream", RDMACM_UTILS).is_none() {
        return;
    }
    let _one = serial();
    let mut c = std::process::Command::new(common::repo().join("scripts/rstream-compare.sh"));
    c.env("DP_RSOCKET_LIB", common::library())
        .env("PORT", port(11).to_string())
        .env("TIMEOUT", "600")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut run = Guarded::new(c.spawn().expect("starting rstream-compare.sh"), "compare");
    let Some((st, out, err)) = run.wait_for(Duration::from_secs(1200)) else {
        panic!("rstream-compare.sh did not finish within 20 minutes (killed)");
    };
    assert!(
        st.success(),
        "rstream-compare.sh failed ({st}):\n{out}\n{err}"
    );
    let sections: Vec<&str> = out.split("\n== ").collect();
    assert_eq!(sections.len(), 3, "three sections expected:\n{out}");
    for s in &sections[..2] {
        let table = s.split_once('\n').map_or("", |(_, t)| t);
        check_table(table.trim_end(), &DEFAULT_SIZES, "rstream-compare.sh table");
    }
    let ratios: Vec<&str> = sections[2].lines().skip(2).collect();
    assert_eq!(ratios.len(), 8, "one ratio row per size:\n{out}");
    // name, TCP Gb/s, rsocket Gb/s, TCP usec/xfer, rsocket usec/xfer, ratio.
    let names: Vec<&str> = ratios
        .iter()
        .map(|r| r.split_whitespace().next().unwrap_or(""))
        .collect();
    let want: Vec<String> = ["lat", "bw"]
        .iter()
        .flat_map(|k| DEFAULT_SIZES.iter().map(move |s| format!("{s}_{k}")))
        .collect();
    assert_eq!(names, want, "ratio rows:\n{out}");
    for r in ratios {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f.len(), 6, "ratio row '{r}'");
        for x in [f[3], f[4], f[5]] {
            assert!(
                x.parse::<f64>().is_ok_and(|v| v > 0.0),
                "'{x}' in ratio row '{r}' is not a positive number"
            );
        }
    }
}
