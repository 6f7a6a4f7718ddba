//! Acceptance: unmodified programs written for kernel sockets, run on this library's
//! rsockets through librdmacm's `librspreload.so` (which turns a program's socket calls into
//! rsocket calls), and programs that use the RDMA CM besides rsockets, loaded on it.
//!
//! * `rstream` with `LD_PRELOAD` set: the preload turns the library's own `AF_UNIX` sockets
//!   into `rsocket()` calls too, which once waited for the engine that was starting them;
//! * `rstream -T s` (plain sockets) through the preload, every size;
//! * `sockperf ping-pong --tcp` through the preload: it passes the peer's address on every
//!   send, which fails with `EISCONN` by default (librdmacm's behaviour) and works with
//!   `DP_RSOCKET_SENDTO=linux`;
//! * `iperf` through the preload;
//! * `qperf` loads: every symbol it imports (the RDMA CM and verbs) binds.
//!
//! Each program's server and client are separate processes on 127.0.0.1, one pair at a
//! time. Speed is not judged here (goals live in `scripts/preload-compare.sh` and the perf
//! lab); every run must complete, report no error, and both processes must exit.
//!
//! Skipped, saying so, where a program or the preload is not installed; CI installs them
//! (`scripts/setup.sh`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    BY_SETUP, TempDir, args, port, program, rows, rsocket_listening, run_client, serial,
    start_server, with_rsocket,
};

/// Hang guard for one client run.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// How long a server may take to exit after its client did.
const EXIT_LIMIT: Duration = Duration::from_secs(60);

/// librdmacm's `librspreload.so`, or `None` after printing why the test is skipped.
fn preload() -> Option<PathBuf> {
    let arch = std::env::consts::ARCH;
    let found = [
        format!("/usr/lib/{arch}-linux-gnu/rsocket/librspreload.so"),
        "/usr/lib64/rsocket/librspreload.so".into(),
        "/usr/lib/rsocket/librspreload.so".into(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    if found.is_none() {
        eprintln!("skipped: librspreload.so is not installed (apt-get install librdmacm1)");
    }
    found
}

/// How a program of a pair runs.
#[derive(Clone, Copy)]
struct Setup<'a> {
    /// `LD_PRELOAD` this library (librspreload.so).
    preload: Option<&'a Path>,
    /// Extra environment for both processes.
    env: &'a [(&'a str, &'a str)],
    /// What the server does after its client finished.
    server: ServerEnd,
}

/// What a server does once its client is done.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ServerEnd {
    /// Exits by itself, successfully.
    Exits,
    /// Serves on until stopped.
    Runs,
    /// Either (its outcome is not judged).
    Any,
}

fn command(dir: &Path, exe: &str, args: &[String], s: Setup<'_>) -> Command {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = with_rsocket(dir, exe, &args);
    if let Some(p) = s.preload {
        c.env("LD_PRELOAD", p);
    }
    for (k, v) in s.env {
        c.env(k, v);
    }
    c
}

/// Runs a server and a client of `exe`; returns the client's output and the server's
/// (stdout then stderr for each). Panics if either fails or hangs.
fn run_pair(
    exe: &str,
    port_offset: u16,
    server: impl Fn(u16) -> Vec<String>,
    client: impl Fn(u16) -> Vec<String>,
    s: Setup<'_>,
) -> (String, String) {
    let _one = serial();
    let name = Path::new(exe)
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let dir = TempDir::new(&format!("preload-{name}-{port_offset}"));
    let p = port(port_offset);
    let sargs = server(p);
    let mut srv = start_server(
        command(&dir.0, exe, &sargs, s),
        format!("{name} {sargs:?}"),
        || rsocket_listening(&dir.0, p),
    );
    let cargs = client(p);
    let (cst, cout, cerr) = run_client(
        command(&dir.0, exe, &cargs, s),
        format!("{name} {cargs:?}: the client"),
        RUN_LIMIT,
    );
    let (sst, sout, serr) = if s.server == ServerEnd::Exits {
        srv.wait_for(EXIT_LIMIT).unwrap_or_else(|| {
            panic!("{name} {sargs:?}: the server did not exit within {EXIT_LIMIT:?}")
        })
    } else {
        // A server that serves on: it must still be running (unless its end is not
        // judged), then it is stopped.
        assert!(
            srv.running() || s.server == ServerEnd::Any,
            "{name} {sargs:?}: the server died"
        );
        srv.stop()
    };
    let report = format!("client {cst}:\n{cout}\n{cerr}\nserver {sst}:\n{sout}\n{serr}");
    assert!(cst.success(), "{name} {cargs:?} failed:\n{report}");
    assert!(
        s.server != ServerEnd::Exits || sst.success(),
        "{name} {sargs:?} failed:\n{report}"
    );
    (format!("{cout}\n{cerr}"), format!("{sout}\n{serr}"))
}

/// `rstream` (rsocket calls) with librspreload.so preloaded: the preload sends the
/// library's own socket() calls to rsocket() as well. The first rsocket call starts the
/// engine, which opens AF_UNIX sockets; those used to wait on the engine being started
/// (a self-deadlock on every run).
#[test]
fn rsocket_programs_start_with_the_preload_loaded() {
    let (Some(exe), Some(pre)) = (program("rstream", BY_SETUP), preload()) else {
        return;
    };
    let setup = Setup {
        preload: Some(&pre),
        env: &[],
        server: ServerEnd::Exits,
    };
    let opts = ["-S", "64", "-C", "20000"];
    let (c, s) = run_pair(
        &exe,
        0,
        |p| args(&[&["-p", &p.to_string()][..], &opts[..]].concat()),
        |p| args(&[&["-s", "127.0.0.1", "-p", &p.to_string()][..], &opts[..]].concat()),
        setup,
    );
    assert_eq!(rows(&c), ["custom"], "client:\n{c}");
    assert_eq!(rows(&s), ["custom"], "server:\n{s}");
}

/// `rstream -T s` (kernel socket calls) through librspreload.so completes every size.
#[test]
fn rstream_sockets_through_the_preload_every_size() {
    let (Some(exe), Some(pre)) = (program("rstream", BY_SETUP), preload()) else {
        return;
    };
    let setup = Setup {
        preload: Some(&pre),
        env: &[],
        server: ServerEnd::Exits,
    };
    let (c, _) = run_pair(
        &exe,
        1,
        |p| args(&["-T", "s", "-S", "all", "-p", &p.to_string()]),
        |p| {
            args(&[
                "-T",
                "s",
                "-S",
                "all",
                "-s",
                "127.0.0.1",
                "-p",
                &p.to_string(),
            ])
        },
        setup,
    );
    let got = rows(&c);
    assert_eq!(got.len(), 66, "33 sizes, latency and bandwidth:\n{c}");
    assert_eq!(
        (got[0].as_str(), got[65].as_str()),
        ("64_lat", "6m_bw"),
        "{c}"
    );
}

/// The invocation: the server runs rstream's default plan (`64_lat` first: read 64
/// bytes, write 64), the client a custom one (20000 writes of 64 bytes, then 20000 reads).
/// Over kernel TCP the client completes: the socket buffers absorb the server's replies
/// and the client's writes (1.28 MB). Message credits alone (librdmacm's rsockets, here
/// too before sends were buffered) cannot: each side's writes waited for credits the other
/// only returns by reading, and the client hung.
#[test]
fn rstream_sockets_with_different_plans_at_each_end_complete_like_tcp() {
    let (Some(exe), Some(pre)) = (program("rstream", BY_SETUP), preload()) else {
        return;
    };
    let setup = Setup {
        preload: Some(&pre),
        env: &[],
        server: ServerEnd::Any,
    };
    let (c, _) = run_pair(
        &exe,
        5,
        |p| args(&["-T", "s", "-p", &p.to_string()]),
        |p| {
            args(&[
                "-T",
                "s",
                "-s",
                "127.0.0.1",
                "-p",
                &p.to_string(),
                "-S",
                "64",
                "-C",
                "20000",
            ])
        },
        setup,
    );
    assert_eq!(rows(&c), ["custom"], "client:\n{c}");
}

/// The p50 sockperf prints (`---> percentile 50.000 = 1.234`), in microseconds.
fn sockperf_p50(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.rsplit('=').next())
        .and_then(|v| v.trim().parse().ok())
}

fn sockperf(port_offset: u16, env: &[(&str, &str)]) -> Option<(String, String)> {
    let (Some(exe), Some(pre)) = (program("sockperf", BY_SETUP), preload()) else {
        return None;
    };
    let setup = Setup {
        preload: Some(&pre),
        env,
        server: ServerEnd::Runs,
    };
    Some(run_pair(
        &exe,
        port_offset,
        |p| args(&["sr", "--tcp", "-i", "127.0.0.1", "-p", &p.to_string()]),
        |p| {
            args(&[
                "pp",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &p.to_string(),
                "-m",
                "64",
                "-t",
                "2",
                // sockperf sizes its sequence window from the rate it expects (`--mps max`
                // by default) and fails with "_seqN > m_maxSequenceNo" when a faster
                // ping-pong overruns it, as ours does on an idle machine.
                "--mps",
                "100000",
            ])
        },
        setup,
    ))
}

/// With `DP_RSOCKET_SENDTO=linux`, `rsendto` on a connected stream ignores the address as
/// Linux TCP does, and sockperf's TCP ping-pong (which sends with `sendto` and the peer's
/// address) runs through the preload and reports its latency.
#[test]
fn sockperf_tcp_ping_pong_with_linux_sendto() {
    let Some((c, _)) = sockperf(2, &[("DP_RSOCKET_SENDTO", "linux")]) else {
        return;
    };
    let p50 = sockperf_p50(&c).unwrap_or_else(|| panic!("no p50 in sockperf's output:\n{c}"));
    assert!(p50 > 0.0, "{c}");
    assert!(c.contains("# dropped messages = 0"), "{c}");
}

/// By default a destination address on a connected stream fails with `EISCONN`, as in
/// librdmacm, so sockperf's TCP ping-pong cannot send.
#[test]
fn sockperf_tcp_ping_pong_keeps_librdmacm_eisconn_by_default() {
    let (Some(exe), Some(pre)) = (program("sockperf", BY_SETUP), preload()) else {
        return;
    };
    let _one = serial();
    let dir = TempDir::new("preload-sockperf-default");
    let p = port(3);
    let setup = Setup {
        preload: Some(&pre),
        env: &[],
        server: ServerEnd::Runs,
    };
    let ps = p.to_string();
    let _srv = start_server(
        command(
            &dir.0,
            &exe,
            &args(&["sr", "--tcp", "-i", "127.0.0.1", "-p", &ps]),
            setup,
        ),
        "sockperf server",
        || rsocket_listening(&dir.0, p),
    );
    let (_, out, err) = run_client(
        command(
            &dir.0,
            &exe,
            &args(&[
                "pp",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &ps,
                "-m",
                "64",
                "-t",
                "1",
            ]),
            setup,
        ),
        "sockperf client",
        RUN_LIMIT,
    );
    let all = format!("{out}\n{err}");
    assert!(
        all.contains("Transport endpoint is already connected") || all.contains("EISCONN"),
        "sockperf should have failed to send with EISCONN:\n{all}"
    );
    assert!(
        sockperf_p50(&all).is_none(),
        "no latency without sends:\n{all}"
    );
}

/// `iperf` (kernel socket calls, a thread per connection) through the preload.
#[test]
fn iperf_through_the_preload() {
    let (Some(exe), Some(pre)) = (program("iperf", BY_SETUP), preload()) else {
        return;
    };
    let setup = Setup {
        preload: Some(&pre),
        env: &[],
        server: ServerEnd::Runs,
    };
    let (c, _) = run_pair(
        &exe,
        4,
        |p| args(&["-s", "-p", &p.to_string()]),
        |p| args(&["-c", "127.0.0.1", "-p", &p.to_string(), "-t", "2"]),
        setup,
    );
    let line = c
        .lines()
        .rfind(|l| l.contains("bits/sec"))
        .unwrap_or_else(|| panic!("no bandwidth line in iperf's output:\n{c}"));
    assert!(!line.contains(" 0.00 bits/sec"), "{c}");
}

/// `qperf` uses the RDMA CM and verbs besides sockets: every symbol it imports must bind to
/// this library (`LD_BIND_NOW` makes the loader resolve them all at start).
#[test]
fn qperf_loads() {
    let Some(exe) = program("qperf", BY_SETUP) else {
        return;
    };
    let _one = serial();
    let dir = TempDir::new("preload-qperf");
    let out = with_rsocket(&dir.0, &exe, &["--version"])
        .env("LD_BIND_NOW", "1")
        .output()
        .expect("running qperf");
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qperf did not load:\n{all}");
    assert!(all.contains("qperf"), "{all}");
    // And the library that served it was this one.
    let ldd = with_rsocket(&dir.0, "ldd", &[&exe])
        .output()
        .expect("running ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout);
    let lib = common::library()
        .parent()
        .expect("library directory")
        .join("rsocket-c/librdmacm.so.1");
    assert!(
        ldd.lines()
            .any(|l| l.contains("librdmacm.so.1") && l.contains(&*lib.to_string_lossy())),
        "qperf bound another librdmacm:\n{ldd}"
    );
}
