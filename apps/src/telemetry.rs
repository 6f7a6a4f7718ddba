//! The telemetry socket: per-lcore and per-stage counters of a running pipeline as JSON, in
//! the manner of DPDK's telemetry socket (`dpdk-telemetry.py`).
//!
//! Every `dpctl run` serves a Unix stream socket `dpctl-<pid>.sock` in the rendezvous
//! directory (the `[fabric]` shm `dir` if set, else `$DP_SHM_DIR`, `$XDG_RUNTIME_DIR/dataplane`
//! or `/tmp/dataplane-<uid>`). The protocol is line-based JSON:
//!
//! * on connect the server sends one line, `{"version":"dpctl 0.1.0","pid":1234,
//!   "max_output_len":1048576}`;
//! * each request is one line holding a command, `/` or `/stages` or `/stage,NAME` (DPDK's
//!   `command,parameter` form); each response is one line, a JSON object whose only key is
//!   the command, or `{"error": "..."}`.
//!
//! Commands: `/` (the list), `/help,CMD`, `/info`, `/lcores`, `/stages`, `/stage,NAME`,
//! `/progress` (the last per-second numbers), `/stats` (lcores and stages together, what
//! `dpctl stats` prints), `/rds` (the RDS nodes, what `dpctl rds-info` prints), `/rnbd` (the
//! RNBD servers' sessions, paths and devices: `dpctl rnbd-info`) and `/rtrs` (their RTRS
//! sessions and paths with the kernel's sysfs counters: `dpctl rtrs-info`). DPDK uses `SOCK_SEQPACKET` for message boundaries; a newline does
//! that job here, since JSON output never contains a raw newline.
//!
//! Requests are served one at a time by a thread that is not an lcore; reading the counters
//! never stops a stage (see [`crate::stats`]).

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lcore::{Lcores, Role as LcoreRole};
use serde_json::{Value, json};

use crate::monitor::Monitor;
use crate::stage::{InfoKind, InfoSlot};

/// How long `/rds`, `/rnbd` and `/rtrs` wait for a stage's lcore to answer.
const INFO_WAIT: Duration = Duration::from_secs(1);

/// Largest response line.
pub const MAX_OUTPUT_LEN: usize = 1 << 20;

const COMMANDS: &[(&str, &str)] = &[
    ("/", "Lists the commands."),
    ("/help", "Describes a command: /help,/stages"),
    (
        "/info",
        "The process: pid, config file, uptime, and whether it is running or stopping.",
    ),
    (
        "/lcores",
        "Per lcore: CPU, role, loop state, iterations, busy share, and per poller (one per stage) calls, busy calls, work and time.",
    ),
    (
        "/stages",
        "Per stage: kind, CPU, counters (in/out messages and bytes, drops, gaps, checks, back-pressure, connections), latency percentiles, error.",
    ),
    ("/stage", "One stage by name: /stage,NAME"),
    (
        "/progress",
        "The last per-second progress numbers (rates, Gb/s, p50/p99, busy %).",
    ),
    ("/stats", "/lcores and /stages together."),
    (
        "/rds",
        "Per RDS stage (node): connections, sockets, counters and congestion maps, as rds-info shows them; /rds,STAGE for one.",
    ),
    (
        "/rnbd",
        "Per RNBD server stage: exports, sessions with their paths and open devices (access mode, read/write counts and sectors), as rnbd-server's sysfs; /rnbd,STAGE for one.",
    ),
    (
        "/rtrs",
        "Per RNBD server stage: its RTRS server sessions and paths (state, hca, stats/rdma counters as the kernel's sysfs); /rtrs,STAGE for one.",
    ),
    (
        "/rtrs-reset",
        "As /rtrs, after zeroing every path's counters (stats/reset_all); /rtrs-reset,STAGE for one.",
    ),
];

/// `dpctl-<pid>.sock` in `dir`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("dpctl-{pid}.sock"))
}

/// A bound telemetry socket; the file is removed on drop.
#[derive(Debug)]
pub struct TelemetryListener {
    listener: UnixListener,
    path: PathBuf,
}

impl TelemetryListener {
    /// Binds `path` (creating its directory, mode 0700), replacing a stale socket file.
    ///
    /// # Errors
    ///
    /// If the directory cannot be created or the socket cannot be bound.
    pub fn bind(path: &Path) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves requests until the run is done.
    pub(crate) fn serve(&self, view: &View<'_>) {
        // Relaxed: `done` is a "please exit" flag; nothing is published through it.
        while !view.done.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((s, _)) => {
                    let _ = serve_client(s, view);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for TelemetryListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the telemetry thread can see: the lcores, the monitor, and the run's stop flags
/// (owned by the runner, read here).
pub(crate) struct View<'a> {
    pub(crate) lcores: &'a Lcores<()>,
    pub(crate) monitor: &'a Mutex<Monitor>,
    /// Phase one of the stop has begun: the pipeline is draining.
    pub(crate) quiesce: &'a AtomicBool,
    /// Every lcore was joined: the telemetry thread exits.
    pub(crate) done: &'a AtomicBool,
    /// Wall-clock start of the run.
    pub(crate) start: Instant,
    pub(crate) config: &'a str,
    pub(crate) hosted: &'a [(usize, Vec<String>)],
    /// The info slots of the RDS and RNBD stages.
    pub(crate) info: &'a [Arc<InfoSlot>],
}

fn serve_client(s: UnixStream, view: &View<'_>) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut w = s.try_clone()?;
    let hello = json!({
        "version": concat!("dpctl ", env!("CARGO_PKG_VERSION")),
        "pid": std::process::id(),
        "max_output_len": MAX_OUTPUT_LEN,
    });
    writeln!(w, "{hello}")?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let cmd = line.trim();
        if cmd.is_empty() {
            continue;
        }
        let resp = handle(cmd, view);
        writeln!(w, "{resp}")?;
        // Relaxed: see serve.
        if view.done.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

/// Answers one command.
pub(crate) fn handle(cmd: &str, view: &View<'_>) -> Value {
    let (name, param) = match cmd.split_once(',') {
        Some((n, p)) => (n.trim(), Some(p.trim())),
        None => (cmd, None),
    };
    let body = match (name, param) {
        ("/", _) => json!(COMMANDS.iter().map(|(c, _)| *c).collect::<Vec<_>>()),
        ("/help", Some(c)) => match COMMANDS.iter().find(|(n, _)| *n == c) {
            Some((_, h)) => json!({ c: h }),
            None => return unknown(c),
        },
        ("/help", None) => json!({ "/help": COMMANDS[1].1 }),
        ("/info", _) => info(view),
        ("/lcores", _) => lcores(view),
        ("/stages", _) => stages(view, None),
        ("/stage", Some(n)) => match stages(view, Some(n)) {
            Value::Array(mut v) if v.len() == 1 => v.remove(0),
            _ => return json!({ "error": format!("no stage `{n}`; /stages lists them") }),
        },
        ("/stage", None) => return json!({ "error": "usage: /stage,NAME" }),
        ("/progress", _) => {
            let m = view.monitor.lock().unwrap_or_else(PoisonError::into_inner);
            json!(m.latest())
        }
        ("/stats", _) => json!({ "lcores": lcores(view), "stages": stages(view, None) }),
        ("/rds", only) => match infos(view, InfoKind::Rds, None, only, false) {
            Ok(v) => v,
            Err(()) => {
                return json!({ "error": format!("no RDS stage `{}`; /rds lists them all", only.unwrap_or("")) });
            }
        },
        ("/rnbd" | "/rtrs" | "/rtrs-reset", only) => {
            let (part, reset) = match name {
                "/rnbd" => ("rnbd", false),
                "/rtrs" => ("rtrs", false),
                _ => ("rtrs", true),
            };
            match infos(view, InfoKind::Rnbd, Some(part), only, reset) {
                Ok(v) => v,
                Err(()) => {
                    return json!({ "error": format!("no rnbd_server stage `{}`; {name} lists them all", only.unwrap_or("")) });
                }
            }
        }
        _ => return unknown(name),
    };
    json!({ cmd: body })
}

/// The snapshots of the stages of `kind` (only the one named `only`, if given), each its
/// `part` if given (an RNBD server's snapshot holds `rnbd` and `rtrs`), after a reset of the
/// stages' resettable counters with `reset`; `Err` if `only` names no such stage.
fn infos(
    view: &View<'_>,
    kind: InfoKind,
    part: Option<&str>,
    only: Option<&str>,
    reset: bool,
) -> Result<Value, ()> {
    let v: Vec<Value> = view
        .info
        .iter()
        .filter(|s| s.kind() == kind && only.is_none_or(|n| n == s.stage()))
        .map(|s| {
            let mut snap = if reset {
                s.query_reset(INFO_WAIT)
            } else {
                s.query(INFO_WAIT)
            };
            match part {
                Some(p) if snap.get("error").is_none() => {
                    let mut v = snap[p].take();
                    v["stage"] = json!(s.stage());
                    v
                }
                _ => snap,
            }
        })
        .collect();
    if only.is_some() && v.is_empty() {
        return Err(());
    }
    Ok(json!(v))
}

fn unknown(cmd: &str) -> Value {
    json!({ "error": format!("unknown command `{cmd}`; send `/` for the list") })
}

fn info(view: &View<'_>) -> Value {
    // Relaxed: status flags for display.
    let state = if view.done.load(Ordering::Relaxed) {
        "finished"
    } else if view.quiesce.load(Ordering::Relaxed) {
        "draining"
    } else {
        "running"
    };
    json!({
        "pid": std::process::id(),
        "config": view.config,
        "uptime_s": view.start.elapsed().as_secs_f64(),
        "state": state,
        "lcores": view.lcores.len(),
    })
}

fn lcores(view: &View<'_>) -> Value {
    let mut out = Vec::new();
    for info in view.lcores.lcores() {
        let stages = view
            .hosted
            .iter()
            .find(|(c, _)| *c == info.cpu)
            .map_or_else(Vec::new, |(_, s)| s.clone());
        let mut v = json!({
            "lcore": info.id.index(),
            "cpu": info.cpu,
            "role": if info.role == LcoreRole::Main { "main" } else { "worker" },
            "stages": stages,
        });
        if let Some(s) = view.lcores.snapshot(info.id) {
            let total = s.busy_nanos + s.idle_nanos;
            v["state"] = json!(format!("{:?}", s.state).to_lowercase());
            v["iterations"] = json!(s.iterations);
            v["busy_iterations"] = json!(s.busy_iterations);
            v["busy_nanos"] = json!(s.busy_nanos);
            v["idle_nanos"] = json!(s.idle_nanos);
            v["sleeps"] = json!(s.sleeps);
            v["busy_pct"] = json!(if total == 0 {
                0.0
            } else {
                100.0 * s.busy_nanos as f64 / total as f64
            });
            v["pollers"] = s
                .pollers
                .iter()
                .map(|p| {
                    json!({
                        "name": p.name,
                        "calls": p.calls,
                        "busy_calls": p.busy_calls,
                        "work": p.work,
                        "nanos": p.nanos,
                    })
                })
                .collect();
        } else {
            v["state"] = json!("idle");
        }
        out.push(v);
    }
    Value::Array(out)
}

fn stages(view: &View<'_>, only: Option<&str>) -> Value {
    let mut m = view.monitor.lock().unwrap_or_else(PoisonError::into_inner);
    m.collect();
    let mut out = Vec::new();
    for (i, s) in m.stages().iter().enumerate() {
        if only.is_some_and(|n| n != s.name) {
            continue;
        }
        let mut v = json!({
            "name": s.name,
            "kind": s.kind,
            "cpu": s.cpu,
            "role": s.role,
            "finished": s.is_finished(),
            "counters": s.counters.snapshot(),
            "latency_ns": m.latency(i),
        });
        if let Some(e) = s.error() {
            v["error"] = json!(e);
        }
        out.push(v);
    }
    Value::Array(out)
}

/// A telemetry client connection.
#[derive(Debug)]
pub struct Client {
    r: BufReader<UnixStream>,
    w: UnixStream,
    /// The server's greeting.
    pub hello: Value,
}

impl Client {
    /// Connects and reads the greeting.
    ///
    /// # Errors
    ///
    /// If nothing listens at `path` or the greeting is not JSON.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let w = s.try_clone()?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line)?;
        let hello = serde_json::from_str(&line).map_err(io::Error::other)?;
        Ok(Self { r, w, hello })
    }

    /// Sends `cmd` and returns the response.
    ///
    /// # Errors
    ///
    /// On I/O errors or a response that is not JSON.
    pub fn query(&mut self, cmd: &str) -> io::Result<Value> {
        writeln!(self.w, "{cmd}")?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the pipeline closed the socket",
            ));
        }
        serde_json::from_str(&line).map_err(io::Error::other)
    }
}

/// The telemetry sockets in `dir` whose process is alive: (pid, path), by pid.
pub fn find_sockets(dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid: u32 = name
                .strip_prefix("dpctl-")?
                .strip_suffix(".sock")?
                .parse()
                .ok()?;
            alive(pid).then(|| (pid, e.path()))
        })
        .collect();
    out.sort();
    out
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}
