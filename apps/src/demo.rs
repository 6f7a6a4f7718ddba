//! `dpctl run` without a file: the market-data demo, two processes and no set-up.
//!
//! The demo runs the two example configs `apps/configs/demo-feed.toml` and
//! `demo-consumers.toml` (compiled in): this process is the feed (a tick generator fanned out
//! to four rsocket clients) and it starts the consumers (four rsocket servers) as a second
//! process, the same executable with the hidden `demo-consumers` subcommand. The processes
//! talk through the shm fabric provider in a private rendezvous directory, each on its own
//! CPU when there are two. The consumer process reports on stdout: one `ready` line once its
//! servers listen, then its summary as JSON; the feed shows the consumers' live numbers in
//! its progress lines by querying their telemetry socket.
//!
//! The demo ends by itself after `--duration` (5 s by default): the feed stops, its streams
//! close, the consumers see end of stream and exit. It succeeds when every tick reached every
//! consumer intact.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use dataplane::fabric::shm::default_rendezvous_dir;
use lcore::CpuSet;
use serde_json::{Value, json};

use crate::config::{Config, ConfigError, StageKind};
use crate::monitor::{nanos, rate};
use crate::run::{self, ProgressOut, RunError, RunOptions};
use crate::summary::{Summary, latency_line};
use crate::telemetry::Client;

/// The feed config.
pub const FEED: &str = include_str!("../configs/demo-feed.toml");
/// The consumers config.
pub const CONSUMERS: &str = include_str!("../configs/demo-consumers.toml");
/// Default length of the demo.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(5);

/// Why the demo could not run.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A compiled-in config is invalid (a build problem).
    #[error("demo config: {0}")]
    Config(#[from] ConfigError),
    /// A pipeline could not run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The consumer process could not be started or misbehaved.
    #[error("consumer process: {0}")]
    Consumers(String),
}

/// The outcome of a demo run.
#[derive(Debug)]
pub struct DemoReport {
    /// The feed's summary (this process).
    pub feed: Summary,
    /// The consumers' summary (the second process).
    pub consumers: Summary,
    /// Ticks the feed generated.
    pub ticks: u64,
    /// Streams (consumers) each tick was sent to.
    pub fan: u64,
    /// Ticks received over all consumers.
    pub received: u64,
}

/// The line after the summary on the consumer process's stdout: its latency distributions,
/// which the summary's JSON leaves out.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PlotLine {
    latency_plot: Vec<dp_plot::PercentileSeries>,
}

impl DemoReport {
    /// Whether every tick reached every consumer intact, and nothing failed.
    pub fn ok(&self) -> bool {
        self.feed.ok()
            && self.consumers.ok()
            && self.consumers.totals.lossless
            && self.feed.totals.lossless
            && self.received == self.ticks * self.fan
            && self.ticks > 0
    }

    /// The text report.
    pub fn render(&self) -> String {
        let c = &self.consumers;
        let f = &self.feed;
        let mut o = String::new();
        o.push_str(&format!(
            "market-data demo: a feed fanned out over rsocket (shm provider) to {} consumers in a second process\n",
            self.fan
        ));
        o.push_str(&format!(
            "  feed      pid {:>7}  cpu {}: {} ticks in {:.2} s ({}/s), {} frames sent on {} streams\n",
            f.pid,
            f.lcores.first().map_or(0, |l| l.cpu),
            self.ticks,
            f.duration_s,
            rate(self.ticks as f64 / f.duration_s.max(1e-9)),
            f.totals.out_msgs,
            self.fan
        ));
        o.push_str(&format!(
            "  consumers pid {:>7}  cpu {}: {} ticks received ({}/s, {:.3} Gb/s), lost {}, duplicates {}, check failures {}\n",
            c.pid,
            c.lcores.first().map_or(0, |l| l.cpu),
            self.received,
            rate(c.totals.msgs_per_s),
            c.totals.gbps,
            (self.ticks * self.fan).saturating_sub(self.received),
            c.totals.dups,
            c.totals.verify_errors
        ));
        if let Some(l) = &c.latency_ns {
            o.push_str(
                "  end-to-end latency, from generation in the feed to receipt in a consumer:\n",
            );
            o.push_str(&format!("    {}\n", latency_line(l)));
        }
        for s in &c.stages {
            let lat = s.latency_ns.map_or_else(String::new, |l| {
                format!(", p50 {} p99 {}", nanos(l.p50), nanos(l.p99))
            });
            o.push_str(&format!(
                "    {}: {} ticks{lat}\n",
                s.name, s.counters.in_msgs
            ));
        }
        for e in f.errors.iter().chain(&c.errors) {
            o.push_str(&format!("  error: {e}\n"));
        }
        o.push_str(if self.ok() {
            "  result: OK, every tick reached every consumer intact\n"
        } else {
            "  result: FAILED, see above\n"
        });
        o
    }

    /// The picture of `dpctl run --plot` for the demo: the end-to-end latency distribution,
    /// generation in the feed to receipt, of each consumer and of all four together.
    pub fn figure(&self) -> Option<dp_plot::Figure> {
        if self.consumers.latency_plot.is_empty() {
            return None;
        }
        let mut f = dp_plot::Figure::new(
            "dpctl demo: end-to-end latency, feed to consumers over rsockets (shm)",
        );
        f.percentiles = self.consumers.latency_plot.clone();
        Some(f)
    }

    /// The JSON report.
    pub fn json(&self) -> Value {
        json!({
            "ok": self.ok(),
            "ticks": self.ticks,
            "consumers": self.fan,
            "received": self.received,
            "feed": self.feed,
            "consumer_process": self.consumers,
        })
    }
}

/// Demo options.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How long the feed runs.
    pub duration: Duration,
    /// Where progress lines go.
    pub progress: ProgressOut,
    /// The executable to start the consumers with (normally `std::env::current_exe()`).
    pub exe: PathBuf,
}

fn cpus() -> (usize, usize) {
    let set = CpuSet::process_affinity().unwrap_or_default();
    let mut it = set.iter();
    let a = it.next().unwrap_or(0);
    (a, it.next().unwrap_or(a))
}

struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the demo: starts the consumer process, runs the feed, collects both summaries.
///
/// # Errors
///
/// [`DemoError`] if either side cannot run.
pub fn run_demo(opts: &DemoOptions) -> Result<DemoReport, DemoError> {
    let (feed_cpu, consumer_cpu) = cpus();
    let dir = default_rendezvous_dir().join(format!("demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| DemoError::Consumers(format!("creating {}: {e}", dir.display())))?;
    let _cleanup = DirGuard(dir.clone());
    let mut feed = Config::parse(FEED, "apps/configs/demo-feed.toml")?;
    feed.place_all_on(feed_cpu);
    feed.set_shm_dir(&dir);
    let fan = feed
        .stages
        .iter()
        .find_map(|s| match &s.kind {
            StageKind::Fanout(f) => Some(f.outputs.len() as u64),
            _ => None,
        })
        .unwrap_or(1);

    let guard_secs = opts.duration.as_secs() + 60;
    let child = Command::new(&opts.exe)
        .arg("demo-consumers")
        .arg("--dir")
        .arg(&dir)
        .arg("--cpu")
        .arg(consumer_cpu.to_string())
        .arg("--guard-secs")
        .arg(guard_secs.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| DemoError::Consumers(format!("cannot start {}: {e}", opts.exe.display())))?;
    let mut child = ChildGuard(Some(child));
    let stdout = child
        .0
        .as_mut()
        .and_then(|c| c.stdout.take())
        .expect("piped stdout");
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let ready = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| DemoError::Consumers("did not report ready within 30 s".into()))?;
    let ready: Value = serde_json::from_str(&ready)
        .map_err(|e| DemoError::Consumers(format!("bad ready line `{ready}`: {e}")))?;
    let socket = ready["ready"]["telemetry"].as_str().map(PathBuf::from);

    let mut peer: Option<Client> = None;
    let hook = move || -> Option<String> {
        let path = socket.as_ref()?;
        if peer.is_none() {
            peer = Client::connect(path).ok();
        }
        let v = peer.as_mut()?.query("/progress").ok()?;
        let p: crate::monitor::Progress =
            serde_json::from_value(v.get("/progress")?.clone()).ok()?;
        Some(format!(
            "consumers {}/s p50 {} p99 {}",
            rate(p.out_msgs_per_s),
            p.p50_ns.map_or_else(|| "-".into(), nanos),
            p.p99_ns.map_or_else(|| "-".into(), nanos)
        ))
    };
    let feed_summary = run::run(
        &feed,
        RunOptions {
            duration: Some(opts.duration),
            progress: opts.progress,
            signals: true,
            telemetry: true,
            telemetry_dir: Some(dir.clone()),
            progress_hook: Some(Box::new(hook)),
            ..RunOptions::default()
        },
    )?;
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| DemoError::Consumers("no summary within 30 s of the feed's end".into()))?;
    let mut consumers: Summary = serde_json::from_str(&line)
        .map_err(|e| DemoError::Consumers(format!("bad summary: {e}")))?;
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| DemoError::Consumers("no latency line after the summary".into()))?;
    let plot: PlotLine = serde_json::from_str(&line)
        .map_err(|e| DemoError::Consumers(format!("bad latency line: {e}")))?;
    consumers.latency_plot = plot.latency_plot;
    if let Some(mut c) = child.0.take() {
        let _ = c.wait();
    }
    let ticks = feed_summary
        .stages
        .iter()
        .filter(|s| s.kind == "generator")
        .map(|s| s.counters.out_msgs)
        .sum();
    let received = consumers.totals.out_msgs;
    Ok(DemoReport {
        feed: feed_summary,
        consumers,
        ticks,
        fan,
        received,
    })
}

struct DirGuard(PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The consumer side (the hidden `demo-consumers` subcommand): runs the consumers config on
/// `cpu` in `dir`, prints a `ready` line, then the summary as JSON and a line with its latency
/// distributions on stdout. Stops by
/// itself when the feed's streams end, or after `guard` in case the feed never comes.
///
/// # Errors
///
/// [`DemoError`] if the pipeline cannot run.
pub fn run_consumers(dir: &Path, cpu: usize, guard: Duration) -> Result<Summary, DemoError> {
    let mut cfg = Config::parse(CONSUMERS, "apps/configs/demo-consumers.toml")?;
    cfg.place_all_on(cpu);
    cfg.set_shm_dir(dir);
    let summary = run::run(
        &cfg,
        RunOptions {
            duration: Some(guard),
            progress: ProgressOut::Off,
            signals: true,
            telemetry: true,
            telemetry_dir: Some(dir.to_path_buf()),
            on_ready: Some(Box::new(|info| {
                let line = json!({ "ready": { "telemetry": info.telemetry } });
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{line}");
                let _ = o.flush();
            })),
            ..RunOptions::default()
        },
    )?;
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{}", serde_json::to_string(&summary).unwrap_or_default());
    let plot = PlotLine {
        latency_plot: summary.latency_plot.clone(),
    };
    let _ = writeln!(o, "{}", serde_json::to_string(&plot).unwrap_or_default());
    let _ = o.flush();
    Ok(summary)
}
