//! `dpctl`: run and inspect dataplane pipelines.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use apps::config::Config;
use apps::demo::{self, DemoOptions};
use apps::run::{self, ProgressOut, RunOptions};
use apps::telemetry::{self, Client};
use apps::{blkinfo, rdsinfo};
use clap::{Parser, Subcommand, ValueEnum};
use lcore::PollMode;

/// Run and inspect dataplane pipelines.
#[derive(Debug, Parser)]
#[command(name = "dpctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    /// Spin on idle (dedicated cores).
    Busy,
    /// Spin 50 us on idle, then sleep 50 us (shared or small machines).
    Hybrid,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the preflight report: cores, hugepages, memlock, RDMA devices, shm rendezvous
    /// directory, and what to fix. Exits 1 if something must be fixed before running.
    Check,
    /// Run a pipeline file (see apps/configs/). Without FILE, run the built-in market-data
    /// demo: a feed fanned out over rsockets to consumers in a second process.
    Run {
        /// The pipeline file (TOML).
        file: Option<PathBuf>,
        /// Stop after this long: `10`, `2.5s`, `500ms`, `1m` (the demo defaults to 5s).
        #[arg(long, value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Print the summary as JSON on stdout (progress lines go to stderr).
        #[arg(long)]
        json: bool,
        /// No progress lines.
        #[arg(long, short)]
        quiet: bool,
        /// Override the file's `[eal] mode`.
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Do not serve the telemetry socket.
        #[arg(long)]
        no_telemetry: bool,
        /// Draw the latency distribution (sinks: end to end; echo clients: round trip) as an
        /// HdrHistogram-style percentile plot, one series per stage, to FILE: .svg or .png,
        /// or .json for its data (`dp-perf plot` draws several runs in one chart). Repeatable.
        #[arg(long, value_name = "FILE", value_parser = parse_plot_file)]
        plot: Vec<PathBuf>,
    },
    /// Print the per-lcore and per-stage counters of a running pipeline, read from its
    /// telemetry socket as JSON.
    Stats {
        /// The command to send: /stats (default), /lcores, /stages, /stage,NAME, /progress,
        /// /info, /help,CMD, or / for the list.
        command: Option<String>,
        #[command(flatten)]
        pipeline: Pipeline,
    },
    /// Print the RDS nodes of a running pipeline (its rds_sender and rds_receiver stages)
    /// with the sections of Linux `rds-info`, read from its telemetry socket. No section
    /// option prints them all.
    RdsInfo {
        /// Counters (rds-info -c).
        #[arg(short = 'c')]
        counters: bool,
        /// Sockets (rds-info -k).
        #[arg(short = 'k')]
        sockets: bool,
        /// Connections (rds-info -n).
        #[arg(short = 'n')]
        connections: bool,
        /// Congestion maps.
        #[arg(short = 'g')]
        congestion: bool,
        #[command(flatten)]
        target: InfoTarget,
    },
    /// Print the RNBD servers of a running pipeline (its rnbd_server stages) as RNBD's server
    /// sysfs shows them: exports, sessions with their paths, and each session's open devices
    /// with access mode and read/write counts and sectors.
    RnbdInfo {
        #[command(flatten)]
        target: InfoTarget,
    },
    /// Print the RTRS server sessions and paths of a running pipeline's rnbd_server stages
    /// in the shape of the kernel's sysfs (/sys/class/rtrs-server/SESS/paths/PATH/): state,
    /// hca_name, stats/rdma (read-cnt read-bytes write-cnt write-bytes) and more counters.
    RtrsInfo {
        /// Zero every path's counters first, as writing 1 to stats/reset_all does, and print
        /// them from there.
        #[arg(long)]
        reset: bool,
        #[command(flatten)]
        target: InfoTarget,
    },
    /// The demo's consumer process (started by `dpctl run` without a file).
    #[command(hide = true)]
    DemoConsumers {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        cpu: usize,
        #[arg(long)]
        guard_secs: u64,
    },
}

/// Which pipeline and stage an info command asks, and how it prints.
#[derive(Debug, clap::Args)]
struct InfoTarget {
    /// Only this stage.
    #[arg(long)]
    stage: Option<String>,
    /// Print the telemetry answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pipeline: Pipeline,
}

/// Which running pipeline's telemetry socket a command asks (`stats` and the info commands).
#[derive(Debug, clap::Args)]
struct Pipeline {
    /// The pipeline's pid (needed when several run).
    #[arg(long, conflicts_with = "socket")]
    pid: Option<u32>,
    /// The telemetry socket path.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Where to look for sockets (default: the shm rendezvous directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn parse_plot_file(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    dp_plot::Format::of(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

/// Draws `figure` into every `--plot` file; false (after saying why) if any failed or there
/// was nothing to draw.
fn draw(figure: Option<dp_plot::Figure>, files: &[PathBuf]) -> bool {
    if files.is_empty() {
        return true;
    }
    let Some(fig) = figure else {
        eprintln!(
            "dpctl: --plot: no stage recorded latency (a sink, or an rsocket_client with echo, \
             records it); nothing to draw"
        );
        return false;
    };
    let mut ok = true;
    for f in files {
        if let Err(e) = dp_plot::write(&fig, f) {
            eprintln!("dpctl: --plot: {e}");
            ok = false;
        }
    }
    ok
}

/// `10`, `10s`, `2.5s`, `500ms`, `1m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration; write 10, 2.5s, 500ms or 1m"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{s}` must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

fn fail(msg: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("dpctl: {msg}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check => {
            let (text, blocking) = apps::check::report();
            print!("{text}");
            if blocking {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Run {
            file,
            duration,
            json,
            quiet,
            mode,
            no_telemetry,
            plot,
        } => {
            let progress = match (quiet, json) {
                (true, _) => ProgressOut::Off,
                (false, true) => ProgressOut::Stderr,
                (false, false) => ProgressOut::Stdout,
            };
            let mode = mode.map(|m| match m {
                Mode::Busy => PollMode::Busy,
                Mode::Hybrid => PollMode::hybrid_default(),
            });
            match file {
                Some(f) => run_file(&f, duration, json, progress, mode, !no_telemetry, &plot),
                None => run_demo(duration, json, progress, &plot),
            }
        }
        Command::Stats { command, pipeline } => {
            stats(command.as_deref().unwrap_or("/stats"), pipeline)
        }
        Command::RdsInfo {
            counters,
            sockets,
            connections,
            congestion,
            target,
        } => {
            let sections = rdsinfo::Sections {
                connections,
                sockets,
                counters,
                congestion,
            };
            info_cmd("/rds", target, |v| rdsinfo::render(v, sections))
        }
        Command::RnbdInfo { target } => info_cmd("/rnbd", target, blkinfo::render_rnbd),
        Command::RtrsInfo { reset, target } => {
            let base = if reset { "/rtrs-reset" } else { "/rtrs" };
            info_cmd(base, target, blkinfo::render_rtrs)
        }
        Command::DemoConsumers {
            dir,
            cpu,
            guard_secs,
        } => match demo::run_consumers(&dir, cpu, Duration::from_secs(guard_secs)) {
            Ok(s) if s.ok() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(e) => fail(e, 2),
        },
    }
}

fn say(progress: ProgressOut, line: &str) {
    match progress {
        ProgressOut::Stdout => println!("{line}"),
        ProgressOut::Stderr => eprintln!("{line}"),
        ProgressOut::Off => {}
    }
}

fn run_file(
    file: &Path,
    duration: Option<Duration>,
    json: bool,
    progress: ProgressOut,
    mode: Option<PollMode>,
    telemetry: bool,
    plot: &[PathBuf],
) -> ExitCode {
    let cfg = match Config::from_file(file) {
        Ok(c) => c,
        Err(e) => return fail(e, 2),
    };
    let mode_text = match mode.unwrap_or(cfg.eal.mode) {
        PollMode::Busy => "busy".to_owned(),
        PollMode::Hybrid { spin, sleep } => format!("hybrid (spin {spin:?}, sleep {sleep:?})"),
    };
    let placement: Vec<String> = cfg
        .used_cpus()
        .into_iter()
        .map(|cpu| {
            let names: Vec<&str> = cfg.stages_on(cpu).map(|s| s.name.as_str()).collect();
            format!("cpu{cpu} [{}]", names.join(", "))
        })
        .collect();
    say(
        progress,
        &format!(
            "dpctl: running {} on {}; mode {mode_text}{}",
            cfg.source,
            placement.join(" "),
            duration.map_or_else(
                || "; Ctrl-C stops".to_owned(),
                |d| format!("; stopping after {d:?}")
            )
        ),
    );
    let opts = RunOptions {
        duration,
        progress,
        signals: true,
        telemetry,
        mode,
        on_ready: Some(Box::new(move |info: &run::ReadyInfo| {
            if let Some(p) = &info.telemetry {
                say(
                    progress,
                    &format!(
                        "dpctl: telemetry on {} (dpctl stats --pid {})",
                        p.display(),
                        std::process::id()
                    ),
                );
            }
        })),
        ..RunOptions::default()
    };
    let summary = match run::run(&cfg, opts) {
        Ok(s) => s,
        Err(e) => return fail(e, 2),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
    } else {
        print!("{}", summary.render());
    }
    let _ = std::io::stdout().flush();
    if !draw(summary.figure(), plot) {
        return ExitCode::FAILURE;
    }
    if summary.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_demo(
    duration: Option<Duration>,
    json: bool,
    progress: ProgressOut,
    plot: &[PathBuf],
) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return fail(
                format!("cannot find my own executable to start the consumers: {e}"),
                2,
            );
        }
    };
    let duration = duration.unwrap_or(demo::DEFAULT_DURATION);
    say(
        progress,
        &format!(
            "dpctl demo: market-data feed -> 4 consumers in a second process over rsocket, for {duration:?} \
             (run a pipeline file with `dpctl run FILE`; examples in apps/configs/)"
        ),
    );
    match demo::run_demo(&DemoOptions {
        duration,
        progress,
        exe,
    }) {
        Ok(r) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&r.json()).unwrap_or_default()
                );
            } else {
                print!("{}", r.render());
            }
            if !draw(r.figure(), plot) {
                return ExitCode::FAILURE;
            }
            if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(e, 2),
    }
}

fn stats(cmd: &str, pipeline: Pipeline) -> ExitCode {
    let (mut c, path) = match connect(pipeline) {
        Ok(x) => x,
        Err(code) => return code,
    };
    match c.query(cmd) {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            if v.get("error").is_some() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(format!("querying {}: {e}", path.display()), 1),
    }
}

/// `dpctl rds-info`, `rnbd-info` and `rtrs-info`: `base` (`/rds`, `/rnbd`, `/rtrs`) asked
/// of the pipeline, printed as JSON or by `render`.
fn info_cmd(
    base: &str,
    t: InfoTarget,
    render: impl FnOnce(&serde_json::Value) -> Result<String, String>,
) -> ExitCode {
    let (mut c, path) = match connect(t.pipeline) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let cmd = t
        .stage
        .as_deref()
        .map_or_else(|| base.to_owned(), |s| format!("{base},{s}"));
    let v = match c.query(&cmd) {
        Ok(v) => v,
        Err(e) => return fail(format!("querying {}: {e}", path.display()), 1),
    };
    if let Some(e) = v.get("error") {
        return fail(format!("{}: {e}", path.display()), 1);
    }
    let Some(answer) = v.get(&cmd) else {
        return fail(
            format!(
                "{} does not know `{base}` (an older dpctl?): {v}",
                path.display()
            ),
            1,
        );
    };
    if t.json {
        println!(
            "{}",
            serde_json::to_string_pretty(answer).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    match render(answer) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e, 1),
    }
}

/// Connects to the telemetry socket of a running pipeline: the given socket, the given
/// pid's, or the only one in the directory.
fn connect(Pipeline { pid, socket, dir }: Pipeline) -> Result<(Client, PathBuf), ExitCode> {
    let dir = dir.unwrap_or_else(|| run::telemetry_dir(None));
    let path = match (socket, pid) {
        (Some(s), _) => s,
        (None, Some(p)) => telemetry::socket_path(&dir, p),
        (None, None) => {
            let found = telemetry::find_sockets(&dir);
            match found.as_slice() {
                [(_, p)] => p.clone(),
                [] => {
                    return Err(fail(
                        format!(
                            "no running pipeline has a telemetry socket in {}; start one with \
                             `dpctl run FILE`, or pass --socket PATH or --dir DIR",
                            dir.display()
                        ),
                        1,
                    ));
                }
                many => {
                    let pids: Vec<String> = many.iter().map(|(p, _)| p.to_string()).collect();
                    return Err(fail(
                        format!(
                            "several pipelines are running (pids {}); pick one with --pid",
                            pids.join(", ")
                        ),
                        1,
                    ));
                }
            }
        }
    };
    match Client::connect(&path) {
        Ok(c) => Ok((c, path)),
        Err(e) => Err(fail(
            format!(
                "cannot connect to {}: {e}; is the pipeline running?",
                path.display()
            ),
            1,
        )),
    }
}
