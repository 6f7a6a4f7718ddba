//! Running pipelines: every example in apps/configs/ for a short duration (through the
//! `dpctl` binary, checking its JSON summary), the demo, `dpctl stats` against a running
//! pipeline and Ctrl-C, `dpctl check`, failures, and the library API.
//!
//! These tests run lcores, so they take one lock and run one at a time: two busy lcores per
//! test on a 2-CPU machine, never more. Every lcore is in hybrid mode (the busy-mode example
//! is run with `--mode hybrid`). Time limits are hang guards only; nothing here depends on
//! speed.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use apps::config::Config;
use apps::run::{ProgressOut, RunOptions};
use apps::summary::{StopCause, Summary};
use common::{TempDir, dpctl, example, heavy, run_example, spawn, stage, wait};
use serde_json::Value;

/// The examples each test below covers; `examples_are_all_covered` keeps this honest.
const COVERED: &[&str] = &[
    "pipeline.toml",
    "fanout-pool.toml",
    "fan-in.toml",
    "perf-busy.toml",
    "rsocket-echo.toml",
    "rsocket-server.toml",
    "rsocket-client.toml",
    "demo-feed.toml",
    "demo-consumers.toml",
    // Run by tests/rds.rs.
    "rds-pair.toml",
    "rds-sender.toml",
    "rds-receiver.toml",
    // Run by tests/rnbd.rs.
    "rnbd-server.toml",
];

#[test]
fn examples_are_all_covered() {
    let found: BTreeSet<String> = std::fs::read_dir(example(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    let covered: BTreeSet<String> = COVERED.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        found, covered,
        "every example in apps/configs/ needs a run test here"
    );
}

#[test]
fn example_pipeline_forwards_everything() {
    let _g = heavy();
    let dir = TempDir::new("test", "pipeline");
    let s = run_example(&dir.0, "pipeline.toml", &["--duration", "1.5"]);
    assert_eq!(s.stopped_by, StopCause::Duration);
    let sent = stage(&s, "gen").counters.out_msgs;
    assert!(sent > 0);
    assert_eq!(stage(&s, "fwd").counters.in_msgs, sent);
    let sink = stage(&s, "sink");
    assert_eq!(
        sink.counters.in_msgs, sent,
        "the drain delivers everything generated"
    );
    assert_eq!(sink.latency_ns.unwrap().count, sent);
    assert!(s.totals.lossless && s.ok(), "{s:#?}");
    assert_eq!(s.totals.out_msgs, sent);
    assert_eq!(s.lcores.len(), 2);
}

#[test]
fn example_fanout_pool_copies_payloads_intact() {
    let _g = heavy();
    let dir = TempDir::new("test", "fanout");
    let s = run_example(&dir.0, "fanout-pool.toml", &["--duration", "1.5"]);
    let sent = stage(&s, "gen").counters.out_msgs;
    assert!(sent > 0);
    for sink in ["sink0", "sink1", "sink2"] {
        let k = stage(&s, sink);
        assert_eq!(k.counters.in_msgs, sent, "{sink}");
        assert_eq!(k.counters.verify_errors, 0, "{sink}: payload bytes checked");
        assert!(k.latency_ns.is_some());
    }
    assert_eq!(s.totals.out_msgs, 3 * sent);
    assert!(s.totals.lossless, "{s:#?}");
}

#[test]
fn example_fan_in_finishes_by_itself() {
    let _g = heavy();
    let dir = TempDir::new("test", "fanin");
    let s = run_example(&dir.0, "fan-in.toml", &["--duration", "60"]);
    assert_eq!(
        s.stopped_by,
        StopCause::Finished,
        "finite generators end the run"
    );
    assert_eq!(stage(&s, "sink").counters.in_msgs, 600_000);
    assert_eq!(
        stage(&s, "sink").counters.gaps,
        0,
        "flows are tracked separately"
    );
    assert!(s.totals.lossless);
}

#[test]
fn example_perf_busy_runs_in_hybrid_mode_for_tests() {
    let _g = heavy();
    let dir = TempDir::new("test", "perf");
    let s = run_example(
        &dir.0,
        "perf-busy.toml",
        &["--duration", "1", "--mode", "hybrid"],
    );
    let sent = stage(&s, "gen").counters.out_msgs;
    assert!(sent > 0);
    assert_eq!(stage(&s, "sink").counters.in_msgs, sent);
    assert!(s.totals.lossless, "{s:#?}");
}

#[test]
fn example_rsocket_echo_round_trips_every_message() {
    let _g = heavy();
    let dir = TempDir::new("test", "echo");
    let (json, svg) = (dir.0.join("echo.json"), dir.0.join("echo.svg"));
    let s = run_example(
        &dir.0,
        "rsocket-echo.toml",
        &[
            "--duration",
            "1.5",
            "--plot",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let sent = stage(&s, "gen").counters.out_msgs;
    assert!(sent > 0);
    let client = stage(&s, "client");
    assert_eq!(client.counters.in_msgs, sent);
    assert_eq!(
        client.latency_ns.unwrap().count,
        sent,
        "every message came back"
    );
    assert_eq!(client.counters.verify_errors, 0);
    // --plot draws the client's round trips: the same histogram as the summary's.
    let fig = dp_plot::Figure::read(&json).unwrap();
    assert_eq!(fig.percentiles.len(), 1, "one stage records latency");
    let dist = &fig.percentiles[0];
    assert_eq!(dist.label, "client (rsocket_client)");
    assert_eq!(dist.count, sent);
    let lat = client.latency_ns.unwrap();
    assert_eq!(dist.at(50.0), Some(lat.p50 as f64));
    assert_eq!(dist.at(99.0), Some(lat.p99 as f64));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("client (rsocket_client)") && svg.contains("99.9%"));
    assert_eq!(stage(&s, "server").counters.in_msgs, sent);
    assert_eq!(s.totals.out_msgs, sent);
    assert!(s.totals.lossless, "{s:#?}");
}

#[test]
fn example_rsocket_pair_across_two_processes() {
    let _g = heavy();
    let dir = TempDir::new("test", "pair");
    let mut c = dpctl(&dir.0);
    c.arg("run").arg(example("rsocket-server.toml")).args([
        "--json",
        "--quiet",
        "--duration",
        "60",
    ]);
    let server = spawn(c);
    let client = run_example(&dir.0, "rsocket-client.toml", &["--duration", "1.5"]);
    let f = wait(server, Duration::from_secs(60));
    assert!(f.status.success(), "server: {}\n{}", f.stdout, f.stderr);
    let server: Summary = serde_json::from_str(&f.stdout).unwrap();
    let sent = stage(&client, "gen").counters.out_msgs;
    assert!(sent > 0);
    assert_eq!(stage(&client, "client").counters.out_msgs, sent);
    assert_eq!(
        server.stopped_by,
        StopCause::Finished,
        "the server ends when its client leaves"
    );
    assert_eq!(stage(&server, "server").counters.in_msgs, sent);
    let sink = stage(&server, "sink");
    assert_eq!(sink.counters.in_msgs, sent);
    assert_eq!(
        sink.counters.verify_errors, 0,
        "payloads crossed the fabric and two pools intact"
    );
    assert!(sink.latency_ns.is_some());
    assert!(client.totals.lossless && server.totals.lossless);
}

#[test]
fn demo_runs_two_processes_and_reports_latency() {
    let _g = heavy();
    let dir = TempDir::new("test", "demo");
    let plot = dir.0.join("demo.json");
    let mut c = dpctl(&dir.0);
    c.args(["run", "--duration", "2", "--json", "--quiet", "--plot"])
        .arg(&plot);
    let f = wait(spawn(c), Duration::from_secs(90));
    assert!(f.status.success(), "{}\n{}", f.stdout, f.stderr);
    let v: Value = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v:#}");
    let ticks = v["ticks"].as_u64().unwrap();
    assert!(ticks > 0);
    assert_eq!(v["received"].as_u64().unwrap(), 4 * ticks);
    let consumers: Summary = serde_json::from_value(v["consumer_process"].clone()).unwrap();
    assert_ne!(consumers.pid, std::process::id());
    assert_eq!(consumers.stages.len(), 4);
    assert_eq!(consumers.latency_ns.unwrap().count, 4 * ticks);
    assert_eq!(consumers.stopped_by, StopCause::Finished);
    // --plot: the consumer process's end-to-end distributions crossed to the feed's.
    let fig = dp_plot::Figure::read(&plot).unwrap();
    let labels: Vec<&str> = fig.percentiles.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels.len(), 5, "{labels:?}");
    assert_eq!(labels[4], "all stages");
    assert_eq!(fig.percentiles[4].count, 4 * ticks);
    assert_eq!(
        fig.percentiles[4].at(50.0),
        Some(consumers.latency_ns.unwrap().p50 as f64)
    );
}

#[test]
fn stats_reads_a_running_pipeline_and_ctrl_c_stops_it_cleanly() {
    let _g = heavy();
    let dir = TempDir::new("test", "stats");
    let mut c = dpctl(&dir.0);
    c.arg("run")
        .arg(example("pipeline.toml"))
        .args(["--json", "--quiet", "--duration", "60"]);
    let child = spawn(c);
    let pid = child.id();
    let sock = dir.0.join(format!("dpctl-{pid}.sock"));
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no telemetry socket at {}",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = |args: &[&str]| -> Value {
        let mut c = dpctl(&dir.0);
        c.arg("stats").args(args);
        let f = wait(spawn(c), Duration::from_secs(30));
        assert!(
            f.status.success(),
            "dpctl stats {args:?}: {}\n{}",
            f.stdout,
            f.stderr
        );
        serde_json::from_str(&f.stdout).unwrap()
    };
    // Found without --pid: it is the only pipeline in the directory.
    let v = stats(&[]);
    let lcores = v["/stats"]["lcores"].as_array().unwrap();
    assert_eq!(lcores.len(), 2);
    let stages = v["/stats"]["stages"].as_array().unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gen", "fwd", "sink"]);
    // Counters move while it runs.
    let pid_s = pid.to_string();
    let count = |v: &Value| v["/stage,sink"]["counters"]["in_msgs"].as_u64().unwrap();
    let first = count(&stats(&["/stage,sink", "--pid", &pid_s]));
    let t0 = Instant::now();
    loop {
        let v = stats(&["/stage,sink", "--pid", &pid_s]);
        if count(&v) > first {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the sink's counter never moved"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let l = stats(&["/lcores", "--pid", &pid_s]);
    let pollers = l["/lcores"][0]["pollers"].as_array().unwrap();
    assert!(pollers.iter().any(|p| p["name"] == "sink"), "{l:#}");
    let list = stats(&["/"]);
    assert!(list["/"].as_array().unwrap().iter().any(|c| c == "/stages"));
    // Ctrl-C: phase one stops the generator, the drain delivers the rest, exit 0.
    // SAFETY: kill(2) on our own child's pid with SIGINT.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    let f = wait(child, Duration::from_secs(60));
    assert!(f.status.success(), "{}\n{}", f.stdout, f.stderr);
    let s: Summary = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(s.stopped_by, StopCause::Signal);
    assert!(s.totals.lossless, "{s:#?}");
    assert_eq!(
        stage(&s, "sink").counters.in_msgs,
        stage(&s, "gen").counters.out_msgs
    );
    assert!(!sock.exists(), "the socket is removed on exit");
}

#[test]
fn failed_stage_stops_the_run_and_exits_1() {
    let _g = heavy();
    let dir = TempDir::new("test", "fail");
    let cfg = dir.0.join("fail.toml");
    std::fs::write(
        &cfg,
        "[eal]\ncores = \"0\"\n[fabric]\nprovider = \"shm\"\n[ring.r]\n\
         [stage.gen]\nkind = \"generator\"\nlcore = 0\noutput = \"r\"\n\
         [stage.cli]\nkind = \"rsocket_client\"\nlcore = 0\ninput = \"r\"\n\
         connect = \"10.9.9.9:9\"\nconnect_timeout_ms = 300\n",
    )
    .unwrap();
    let mut c = dpctl(&dir.0);
    c.arg("run")
        .arg(&cfg)
        .args(["--json", "--quiet", "--duration", "60"]);
    let f = wait(spawn(c), Duration::from_secs(60));
    assert_eq!(f.status.code(), Some(1), "{}\n{}", f.stdout, f.stderr);
    let s: Summary = serde_json::from_str(&f.stdout).unwrap();
    assert_eq!(s.stopped_by, StopCause::Error);
    assert!(
        s.errors[0].contains("cannot connect to 10.9.9.9:9"),
        "{:?}",
        s.errors
    );
    assert_eq!(
        stage(&s, "gen").counters.out_msgs,
        0,
        "sources wait for their connections"
    );
}

#[test]
fn plot_needs_a_picture_format() {
    let dir = TempDir::new("test", "plotfmt");
    let mut c = dpctl(&dir.0);
    c.arg("run")
        .arg(example("pipeline.toml"))
        .args(["--plot", "latency.gif"]);
    let f = wait(spawn(c), Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(2), "{}", f.stderr);
    assert!(
        f.stderr.contains("end it in .svg, .png or .json"),
        "{}",
        f.stderr
    );
}

#[test]
fn bad_config_exits_2_naming_file_line_and_key() {
    let dir = TempDir::new("test", "bad");
    let cfg = dir.0.join("bad.toml");
    std::fs::write(&cfg, "[eal]\ncores = \"0\"\nmdoe = \"busy\"\n").unwrap();
    let mut c = dpctl(&dir.0);
    c.arg("run").arg(&cfg);
    let f = wait(spawn(c), Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(2));
    assert!(
        f.stderr.contains("bad.toml:3: unknown key `mdoe` in [eal]"),
        "{}",
        f.stderr
    );
}

#[test]
fn check_reports_rdma_devices_and_the_rendezvous_directory() {
    let dir = TempDir::new("test", "check");
    let mut c = dpctl(&dir.0);
    c.arg("check");
    let f = wait(spawn(c), Duration::from_secs(30));
    assert!(f.stdout.contains("cores:"), "{}", f.stdout);
    assert!(f.stdout.contains("memlock:"), "{}", f.stdout);
    assert!(f.stdout.contains("RDMA device"), "{}", f.stdout);
    assert!(
        f.stdout
            .contains(&format!("shm rendezvous directory {}", dir.0.display())),
        "{}",
        f.stdout
    );
    if !cfg!(feature = "verbs") {
        assert!(
            f.stdout.contains("--features verbs") && f.stdout.contains("Soft-RoCE"),
            "{}",
            f.stdout
        );
    }
}

#[test]
fn library_run_with_finite_generators_counts_exactly() {
    let _g = heavy();
    let text = "[eal]\ncores = \"0-1\"\n\
        [pool.p]\nobj_size = 256\ncount = 8192\ncache = 64\n\
        [ring.in]\ncapacity = 256\n[ring.o0]\ncapacity = 256\n[ring.o1]\ncapacity = 256\n\
        [stage.gen]\nkind = \"generator\"\nlcore = 1\noutput = \"in\"\ncount = 20000\n\
        sizes = [40, 100, 296]\npattern = \"random\"\npool = \"p\"\n\
        [stage.fan]\nkind = \"fanout\"\nlcore = 0\ninput = \"in\"\noutputs = [\"o0\", \"o1\"]\n\
        [stage.s0]\nkind = \"sink\"\nlcore = 0\ninput = \"o0\"\n\
        [stage.s1]\nkind = \"sink\"\nlcore = 1\ninput = \"o1\"\n";
    let cfg = Config::parse(text, "inline.toml").unwrap();
    let s = apps::run::run(
        &cfg,
        RunOptions {
            duration: Some(Duration::from_secs(60)),
            progress: ProgressOut::Off,
            telemetry: false,
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert_eq!(s.stopped_by, StopCause::Finished);
    assert_eq!(stage(&s, "gen").counters.out_msgs, 20_000);
    for k in ["s0", "s1"] {
        let c = &stage(&s, k).counters;
        assert_eq!(
            (c.in_msgs, c.gaps, c.dups, c.verify_errors),
            (20_000, 0, 0, 0),
            "{k}"
        );
    }
    // 40 + 100 + 296 bytes, in turn.
    assert_eq!(
        stage(&s, "s0").counters.in_bytes,
        (20_000 / 3) * 436 + 40 + 100
    );
    assert!(s.totals.lossless);
}
