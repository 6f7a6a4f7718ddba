//! Running a pipeline: resources, lcores, the control thread, the two-phase stop.
//!
//! [`run`] turns a validated [`Config`] into a running pipeline:
//!
//! 1. **Resources.** Lcores for `[eal] cores` (checked against the process's CPUs), pools,
//!    the fabric device, the rings, then the stages (rsocket servers bind here, so a busy
//!    address fails before anything runs), and the telemetry socket.
//! 2. **Launch.** Every lcore that hosts stages runs one poll loop with one poller per
//!    stage, in file order; the loop ends once all of its stages have finished. Worker lcores run on their pinned threads; the main lcore, if it
//!    hosts stages, runs on the calling thread.
//! 3. **Control.** A control thread (not an lcore, mostly asleep) prints one progress line a
//!    second, watches Ctrl-C/SIGTERM, `--duration` and stage failures, and drives the stop;
//!    a telemetry thread answers `dpctl stats`.
//! 4. **Stop.** Phase one raises *quiesce*: sources stop and close their streams. Phase two
//!    is the drain: end of stream travels through the rings and connections, and each lcore
//!    returns when its stages are done. If the drain takes longer than `[eal]
//!    drain_timeout_ms`, the lcores' stop token is raised and the loops return regardless
//!    (the summary then says so and does not claim the run lossless).
//! 5. **Summary** of every stage and lcore, as text or JSON.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dataplane::fabric::shm::{ShmConfig, ShmDevice, default_rendezvous_dir};
use lcore::time::RealClock;
use lcore::{
    Ctx, DrainPolicy, Lcore, LcoreId, Lcores, LcoresConfig, LoopBuilder, LoopConfig,
    LoopConfigError, LoopExit, LoopReport, PollMode, Poller, Role as LcoreRole, StopToken,
    install_stop_signals,
};
use mempool::pool::{Pool, PoolConfig};

pub use crate::error::RunError;
pub use crate::stage::FabricDev;

use crate::config::{Config, Provider};
use crate::monitor::Monitor;
use crate::stage::{self, Resources, Stage, StageIo, StartGate};
use crate::stats::StageStats;
use crate::summary::{LcoreSummary, StopCause, Summary};
use crate::telemetry::{self, TelemetryListener};

/// Where progress lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressOut {
    /// Standard output.
    Stdout,
    /// Standard error (used with `--json`, whose summary owns stdout).
    Stderr,
    /// Nowhere.
    Off,
}

/// A hook adding text to each progress line (the demo shows its consumer process there).
pub type ProgressHook = Box<dyn FnMut() -> Option<String> + Send>;

/// Called once the pipeline is built (see [`RunOptions::on_ready`]).
pub type ReadyHook = Box<dyn FnOnce(&ReadyInfo) + Send>;

/// The stages of one lcore, by name.
type Hosted = Vec<(String, Box<dyn Stage>)>;

/// What [`run`] reports once the pipeline is built and about to start.
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    /// The telemetry socket, if any.
    pub telemetry: Option<PathBuf>,
}

/// How to run a pipeline.
pub struct RunOptions {
    /// Stop after this long (phase one of the stop); `None` runs until Ctrl-C or until every
    /// stage has finished on its own.
    pub duration: Option<Duration>,
    /// Where the per-second progress lines go.
    pub progress: ProgressOut,
    /// Wire SIGINT/SIGTERM to the stop (only one run per process may do so at a time).
    pub signals: bool,
    /// Serve the telemetry socket.
    pub telemetry: bool,
    /// Directory of the telemetry socket; default: the shm rendezvous directory of the config,
    /// else the default one.
    pub telemetry_dir: Option<PathBuf>,
    /// Overrides `[eal] mode`.
    pub mode: Option<PollMode>,
    /// Extra text for progress lines.
    pub progress_hook: Option<ProgressHook>,
    /// Called once everything is built and bound, before the lcores start.
    pub on_ready: Option<ReadyHook>,
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("duration", &self.duration)
            .field("progress", &self.progress)
            .field("signals", &self.signals)
            .field("telemetry", &self.telemetry)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Default for RunOptions {
    /// No duration, progress on stdout, no signals, telemetry on.
    fn default() -> Self {
        Self {
            duration: None,
            progress: ProgressOut::Stdout,
            signals: false,
            telemetry: true,
            telemetry_dir: None,
            mode: None,
            progress_hook: None,
            on_ready: None,
        }
    }
}

/// State shared by the control thread, the telemetry thread and the lcores.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Phase one of the stop: sources stop.
    pub(crate) quiesce: AtomicBool,
    /// Poll loops still running.
    pub(crate) running: AtomicUsize,
    /// Set after every lcore was joined: helper threads exit.
    pub(crate) done: AtomicBool,
    /// Wall-clock start.
    pub(crate) start: Instant,
}

/// Decrements [`Shared::running`] when a loop's host returns (or unwinds).
struct RunningGuard(Arc<Shared>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        // R1: Release, pairs with A1 in control(): the loop's final stats (stage drops
        // flushed latency, closed links) happen before the control thread sees it gone.
        self.0.running.fetch_sub(1, Ordering::Release);
    }
}

/// One stage as a poller of its lcore's loop.
struct StagePoller {
    stage: Box<dyn Stage>,
    done: bool,
    /// Stages of this lcore that have finished, and how many it has.
    finished: Rc<Cell<usize>>,
    total: usize,
    shared: Arc<Shared>,
    gate: StartGate,
}

impl Poller<()> for StagePoller {
    #[inline]
    fn poll(&mut self, ctx: &mut Ctx<'_, ()>) -> usize {
        if self.done {
            return 0;
        }
        let io = StageIo {
            now: ctx.now(),
            // Relaxed: a flag with nothing published behind it; seeing it one iteration late
            // only delays the stop by one iteration.
            quiesce: self.shared.quiesce.load(Ordering::Relaxed) || ctx.is_stopping(),
            links_up: self.gate.is_open(),
        };
        let w = self.stage.poll(&io);
        if self.stage.is_finished() {
            self.done = true;
            self.finished.set(self.finished.get() + 1);
            if self.finished.get() == self.total {
                // The last stage of this lcore is done: its loop can return.
                ctx.stop_local();
            }
        }
        w
    }
}

/// Runs the stages of one lcore until they have all finished (or the lcores are stopped).
fn host(
    lc: &mut Lcore<()>,
    cfg: LoopConfig,
    stages: Hosted,
    shared: Arc<Shared>,
    gate: StartGate,
) -> Result<LoopReport, LoopConfigError> {
    let _running = RunningGuard(Arc::clone(&shared));
    let mut b = LoopBuilder::<(), _>::new(cfg, RealClock::new());
    let finished = Rc::new(Cell::new(0usize));
    let total = stages.len();
    for (name, stage) in stages {
        b.register(
            &name,
            StagePoller {
                stage,
                done: false,
                finished: Rc::clone(&finished),
                total,
                shared: Arc::clone(&shared),
                gate: gate.clone(),
            },
        );
    }
    let mut l = b.build()?;
    let report = lc.run(&mut l);
    // Dropping the loop drops the stages: outputs close, latency samples are published.
    drop(l);
    Ok(report)
}

fn open_fabric(cfg: &Config) -> Result<Option<FabricDev>, RunError> {
    let Some(f) = &cfg.fabric else {
        return Ok(None);
    };
    match &f.provider {
        Provider::Shm { dir, bounce_bytes } => {
            let dev = ShmDevice::open(ShmConfig {
                dir: dir.clone(),
                bounce_bytes: *bounce_bytes,
                ..ShmConfig::default()
            })
            .map_err(|source| RunError::Fabric {
                what: format!("{}:{}: opening the shm fabric device", cfg.source, f.line),
                source,
            })?;
            Ok(Some(FabricDev::Shm(dev)))
        }
        #[cfg(feature = "verbs")]
        Provider::Verbs { device } => {
            let dev = dataplane::fabric::verbs::VerbsDevice::open(device.as_deref()).map_err(
                |source| RunError::Fabric {
                    what: format!(
                        "{}:{}: opening the RDMA device (dpctl check lists devices; Soft-RoCE \
                         gives one without hardware)",
                        cfg.source, f.line
                    ),
                    source,
                },
            )?;
            Ok(Some(FabricDev::Verbs(dev)))
        }
        #[cfg(not(feature = "verbs"))]
        Provider::Verbs { .. } => Err(RunError::Fabric {
            what: format!("{}:{}: provider = \"verbs\"", cfg.source, f.line),
            source: dataplane::fabric::FabricError::NoDevice { name: None },
        }),
    }
}

fn make_pools(cfg: &Config) -> Result<Vec<Arc<Pool>>, RunError> {
    cfg.pools
        .iter()
        .map(|p| {
            let mut pc = PoolConfig::new(&p.name, p.obj_size, p.count).huge(cfg.memory.hugepages);
            if let Some(c) = p.cache {
                pc = pc.cache_size(c);
            }
            Pool::new(pc).map_err(|source| RunError::Pool {
                file: cfg.source.clone(),
                line: p.line,
                pool: p.name.clone(),
                source: Box::new(source),
            })
        })
        .collect()
}

/// The directory telemetry sockets live in by default.
pub fn telemetry_dir(cfg: Option<&Config>) -> PathBuf {
    if let Some(Provider::Shm { dir: Some(d), .. }) =
        cfg.and_then(|c| c.fabric.as_ref()).map(|f| &f.provider)
    {
        return d.clone();
    }
    default_rendezvous_dir()
}

/// What the control thread decided.
struct ControlOutcome {
    stopped_by: StopCause,
    drain_timed_out: bool,
}

struct Control<'a> {
    lcores: &'a Lcores<()>,
    shared: &'a Shared,
    monitor: &'a Mutex<Monitor>,
    stats: &'a [Arc<StageStats>],
    signal: &'a StopToken,
    duration: Option<Duration>,
    drain_timeout: Duration,
    out: ProgressOut,
    hook: Option<ProgressHook>,
}

fn say(out: ProgressOut, line: &str) {
    match out {
        ProgressOut::Stdout => {
            let mut o = io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        }
        ProgressOut::Stderr => eprintln!("{line}"),
        ProgressOut::Off => {}
    }
}

impl Control<'_> {
    fn run(mut self) -> ControlOutcome {
        let start = self.shared.start;
        let mut next_tick = start + Duration::from_secs(1);
        let mut stopped_by = None;
        let mut quiesced_at = None;
        let mut drain_timed_out = false;
        loop {
            let now = Instant::now();
            let nap = next_tick
                .saturating_duration_since(now)
                .min(Duration::from_millis(10));
            std::thread::sleep(nap);
            let now = Instant::now();
            // A1: Acquire, pairs with R1 in RunningGuard::drop.
            if self.shared.running.load(Ordering::Acquire) == 0 {
                break;
            }
            match quiesced_at {
                None => {
                    let cause = if self.signal.is_stopped() {
                        Some(StopCause::Signal)
                    } else if self.duration.is_some_and(|d| now - start >= d) {
                        Some(StopCause::Duration)
                    } else if self.stats.iter().any(|s| s.error().is_some()) {
                        Some(StopCause::Error)
                    } else {
                        None
                    };
                    if let Some(c) = cause {
                        // Relaxed: see StagePoller::poll.
                        self.shared.quiesce.store(true, Ordering::Relaxed);
                        quiesced_at = Some(now);
                        stopped_by = Some(c);
                        say(
                            self.out,
                            &format!("stopping ({}): sources stop, stages drain", c.describe()),
                        );
                    }
                }
                Some(q) if !drain_timed_out && now - q >= self.drain_timeout => {
                    drain_timed_out = true;
                    self.lcores.stop();
                    say(
                        self.out,
                        &format!(
                            "drain did not finish within {:?}; stopping the lcores (in-flight messages are lost)",
                            self.drain_timeout
                        ),
                    );
                }
                Some(_) => {}
            }
            if now >= next_tick {
                next_tick += Duration::from_secs(1);
                let p = self
                    .monitor
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .tick(self.lcores, now - start);
                if self.out != ProgressOut::Off {
                    let mut line = p.line();
                    if let Some(extra) = self.hook.as_mut().and_then(|h| h()) {
                        line.push_str("  |  ");
                        line.push_str(&extra);
                    }
                    say(self.out, &line);
                }
            }
        }
        ControlOutcome {
            stopped_by: stopped_by.unwrap_or(StopCause::Finished),
            drain_timed_out,
        }
    }
}

/// Runs `cfg` until it finishes or is stopped, and returns its summary.
///
/// # Errors
///
/// [`RunError`] if the pipeline cannot be set up (CPUs, pools, fabric, listeners, telemetry)
/// or an lcore cannot be launched. Failures of running stages are not errors: they stop the
/// pipeline and appear in [`Summary::errors`].
pub fn run(cfg: &Config, mut opts: RunOptions) -> Result<Summary, RunError> {
    let lcores = Lcores::<()>::init(&LcoresConfig {
        cores: cfg.eal.cores.clone(),
        main_cpu: cfg.eal.main,
        inbox_capacity: 64,
    })
    .map_err(|source| RunError::Lcores {
        file: cfg.source.clone(),
        line: cfg.eal.cores_line,
        source: Box::new(source),
    })?;
    for s in &cfg.stages {
        if lcores.by_cpu(s.lcore).is_none() {
            return Err(RunError::StageCpu {
                file: cfg.source.clone(),
                line: s.line,
                stage: s.name.clone(),
                cpu: s.lcore,
            });
        }
    }
    let pools = make_pools(cfg)?;
    let fabric = open_fabric(cfg)?;
    let mut res = Resources::new(cfg, pools, fabric)?;
    let built = stage::build(cfg, &mut res)?;
    let stats: Vec<Arc<StageStats>> = built.iter().map(|b| Arc::clone(&b.stats)).collect();
    let mut groups: BTreeMap<usize, Hosted> = BTreeMap::new();
    for b in built {
        groups
            .entry(b.cpu)
            .or_default()
            .push((b.stats.name.clone(), b.stage));
    }

    let telemetry = if opts.telemetry {
        let dir = opts
            .telemetry_dir
            .clone()
            .unwrap_or_else(|| telemetry_dir(Some(cfg)));
        let path = telemetry::socket_path(&dir, std::process::id());
        Some(
            TelemetryListener::bind(&path)
                .map_err(|source| RunError::Telemetry { path, source })?,
        )
    } else {
        None
    };
    let signal = StopToken::new();
    let _signals = if opts.signals {
        Some(install_stop_signals(&signal)?)
    } else {
        None
    };
    let loop_cfg = |cpu: usize| LoopConfig {
        name: format!("cpu{cpu}"),
        mode: opts.mode.unwrap_or(cfg.eal.mode),
        msg_batch: 1,
        timer_interval: 64,
        timer_capacity: 4,
        drain: DrainPolicy {
            idle_iterations: 1,
            timeout: Duration::from_millis(100),
        },
    };
    let shared = Arc::new(Shared {
        quiesce: AtomicBool::new(false),
        running: AtomicUsize::new(groups.len()),
        done: AtomicBool::new(false),
        start: Instant::now(),
    });
    let hosted: Vec<(usize, Vec<String>)> = groups
        .iter()
        .map(|(cpu, v)| (*cpu, v.iter().map(|(n, _)| n.clone()).collect()))
        .collect();
    let monitor = Mutex::new(Monitor::new(stats.clone(), &lcores, &hosted));
    if let Some(f) = opts.on_ready.take() {
        f(&ReadyInfo {
            telemetry: telemetry.as_ref().map(|t| t.path().to_path_buf()),
        });
    }

    let main = lcores.main_lcore();
    let main_cpu = lcores.info(main)?.cpu;
    let main_stages = groups.remove(&main_cpu);
    let (reports, outcome) = std::thread::scope(|scope| -> Result<_, RunError> {
        let mut handles = Vec::new();
        for (cpu, stages) in groups {
            let id: LcoreId = lcores.by_cpu(cpu).expect("checked above");
            let (c, sh, g) = (loop_cfg(cpu), Arc::clone(&shared), res.gate.clone());
            match lcores.launch(id, move |lc| host(lc, c, stages, sh, g)) {
                Ok(h) => handles.push((cpu, h)),
                Err(e) => {
                    lcores.stop();
                    for (_, h) in handles {
                        let _ = h.join();
                    }
                    return Err(e.into());
                }
            }
        }
        let control = Control {
            lcores: &lcores,
            shared: &shared,
            monitor: &monitor,
            stats: &stats,
            signal: &signal,
            duration: opts.duration,
            drain_timeout: cfg.eal.drain_timeout,
            out: opts.progress,
            hook: opts.progress_hook.take(),
        };
        let ctl = scope.spawn(move || control.run());
        let tel = telemetry.as_ref().map(|t| {
            let view = telemetry::View {
                lcores: &lcores,
                monitor: &monitor,
                quiesce: &shared.quiesce,
                done: &shared.done,
                start: shared.start,
                config: &cfg.source,
                hosted: &hosted,
                info: &res.info,
            };
            scope.spawn(move || t.serve(&view))
        });
        let mut reports = Vec::new();
        let mut first_err = None;
        if let Some(stages) = main_stages {
            let sh = Arc::clone(&shared);
            let (c, g) = (loop_cfg(main_cpu), res.gate.clone());
            match lcores.run_on_main(move |lc| host(lc, c, stages, sh, g)) {
                Ok(Ok(r)) => reports.push((main_cpu, r)),
                Ok(Err(e)) => first_err = Some(RunError::from(e)),
                Err(e) => first_err = Some(RunError::from(e)),
            }
        }
        for (cpu, h) in handles {
            match h.join() {
                Ok(Ok(r)) => reports.push((cpu, r)),
                Ok(Err(e)) => first_err = first_err.or(Some(RunError::from(e))),
                Err(e) => first_err = first_err.or(Some(RunError::from(e))),
            }
        }
        // Relaxed: the helper threads only need to notice eventually; they are joined next.
        shared.done.store(true, Ordering::Relaxed);
        let outcome = ctl.join().unwrap_or(ControlOutcome {
            stopped_by: StopCause::Error,
            drain_timed_out: false,
        });
        if let Some(t) = tel {
            let _ = t.join();
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((reports, outcome)),
        }
    })?;
    let elapsed = shared.start.elapsed();
    let mut monitor = monitor.into_inner().unwrap_or_else(PoisonError::into_inner);
    let lcore_sums = hosted
        .iter()
        .map(|(cpu, names)| {
            let r = reports.iter().find(|(c, _)| c == cpu).map(|(_, r)| *r);
            let role = lcores
                .by_cpu(*cpu)
                .and_then(|id| lcores.info(id).ok())
                .map_or(LcoreRole::Worker, |i| i.role);
            LcoreSummary::new(
                *cpu,
                role == LcoreRole::Main,
                names.clone(),
                r.as_ref(),
                r.is_some_and(|r| r.exit == LoopExit::DrainTimeout),
            )
        })
        .collect();
    Ok(Summary::build(
        cfg,
        &mut monitor,
        lcore_sums,
        elapsed,
        outcome.stopped_by,
        outcome.drain_timed_out,
    ))
}
