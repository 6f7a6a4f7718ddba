//! The built-in stages and the [`Stage`] trait they implement.
//!
//! A stage is a poller: the lcore hosting it calls [`Stage::poll`] every loop iteration
//! (several stages can share an lcore; they run in file order). `poll` does one bounded round
//! of work and returns how much it did (0 means idle, which lets a hybrid-mode lcore sleep).
//! It never blocks, with one documented exception: closing an rsocket stream waits for its
//! last sends to complete.
//!
//! # Stopping
//!
//! Stopping is two-phase and travels with the data:
//!
//! 1. [`StageIo::quiesce`] turns true (Ctrl-C, `--duration`, or a failed stage). Sources stop
//!    producing and close their outputs. Other stages ignore it.
//! 2. Each stage drains its input until end of stream (every producer closed and the ring
//!    empty, see [`crate::link`]), then closes its outputs and reports
//!    [`Stage::is_finished`]. rsocket clients flush and close their connection; servers see
//!    the peer's end of stream. When every stage of an lcore has finished, its loop returns.
//!
//! A stage that cannot drain (a peer that never closes) is cut off by the drain timeout of
//! `[eal]`, after which the lcores are stopped regardless.

mod forward;
mod generator;
mod rsocket;
mod sink;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lcore::time::Instant;
use mempool::pool::Pool;

pub use forward::{Fanout, Forwarder};
pub use generator::Generator;
pub use rsocket::{RsClient, RsServer};
pub use sink::Sink;

use crate::config::{Config, StageKind};
use crate::link::{Rx, Tx};
use crate::msg::Msg;
use crate::payload::{self, Payloads};
use crate::run::{FabricDev, RunError};
use crate::stats::{FlowTracker, LatencyRecorder, Role, StageStats};

/// What a stage's poll gets from its host loop.
#[derive(Debug, Clone, Copy)]
pub struct StageIo {
    /// The loop clock's time before this call (TSC-derived; for rates and timeouts, not for
    /// message stamps).
    pub now: Instant,
    /// Sources must stop producing and end their streams.
    pub quiesce: bool,
    /// Every rsocket client of the process has connected: sources may start.
    /// Like testpmd waiting for link up, this keeps connection set-up time out of the
    /// latency figures.
    pub links_up: bool,
}

/// Counts the rsocket clients that have not connected yet; sources wait for zero.
#[derive(Debug, Clone)]
pub struct StartGate(Arc<AtomicUsize>);

impl StartGate {
    /// A gate waiting for `n` clients.
    pub fn new(n: usize) -> Self {
        Self(Arc::new(AtomicUsize::new(n)))
    }

    /// Whether every client has reported.
    #[inline]
    pub fn is_open(&self) -> bool {
        // Relaxed: a start signal with no data behind it; sources seeing it one iteration
        // late only start one iteration late.
        self.0.load(Ordering::Relaxed) == 0
    }

    /// One client has connected (call once per client).
    pub fn arrive(&self) {
        // Relaxed: see is_open. A read-modify-write, so concurrent arrivals are all counted.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A pipeline stage, run as a poller on an lcore.
pub trait Stage: Send {
    /// One bounded round of work; returns the amount done (0: idle).
    fn poll(&mut self, io: &StageIo) -> usize;

    /// Whether the stage has drained and closed its outputs; it will do no more work.
    fn is_finished(&self) -> bool;
}

/// A stage ready to be placed on its lcore.
pub struct Built {
    /// The stage.
    pub stage: Box<dyn Stage>,
    /// Its shared statistics.
    pub stats: Arc<StageStats>,
    /// The CPU of its lcore.
    pub cpu: usize,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("stage", &self.stats.name)
            .field("cpu", &self.cpu)
            .finish()
    }
}

/// Reads the host's `CLOCK_MONOTONIC` (the clock of message stamps; see [`crate::msg`]).
#[inline]
pub fn stamp_now() -> u64 {
    lcore::time::MonotonicClock::read_nanos()
}

/// The consumer side of a message's life: sequence tracking, checks and latency, shared by
/// sinks, terminal rsocket servers and echo clients. Counts locally and publishes per burst.
pub(crate) struct Terminus {
    pub(crate) stats: Arc<StageStats>,
    latency: LatencyRecorder,
    flows: FlowTracker,
    verify: bool,
    gaps: u64,
    dups: u64,
    bad: u64,
}

impl Terminus {
    pub(crate) fn new(stats: Arc<StageStats>, verify: bool) -> Self {
        Self {
            latency: LatencyRecorder::new(Arc::clone(&stats)),
            stats,
            flows: FlowTracker::default(),
            verify,
            gaps: 0,
            dups: 0,
            bad: 0,
        }
    }

    /// Accounts one message that arrived at `now_ns`, with its payload bytes if they exist.
    #[inline]
    pub(crate) fn see(&mut self, m: &Msg, now_ns: u64, payload: Option<&[u8]>) {
        self.latency.record(now_ns.saturating_sub(m.stamp));
        let (gap, dup) = self.flows.see(m.flow, m.seq);
        self.gaps += gap;
        self.dups += u64::from(dup);
        if self.verify {
            let header_ok = m.pattern != crate::msg::Pattern::Ticks || payload::tick_ok(m.word);
            let body_ok = payload.is_none_or(|b| payload::check(m.pattern, m.flow, m.seq, b));
            self.bad += u64::from(!(header_ok && body_ok));
        }
    }

    /// Publishes what was counted since the last call.
    #[inline]
    pub(crate) fn publish(&mut self, now_ns: u64) {
        let c = &self.stats.counters;
        if self.gaps != 0 {
            c.gaps.add(std::mem::take(&mut self.gaps));
        }
        if self.dups != 0 {
            c.dups.add(std::mem::take(&mut self.dups));
        }
        if self.bad != 0 {
            c.verify_errors.add(std::mem::take(&mut self.bad));
        }
        self.latency.maybe_flush(now_ns);
    }
}

/// Moves `n` messages from the front of `pending` into `tx`; returns how many went.
#[inline]
pub(crate) fn push_pending(tx: &mut Tx, pending: &mut Vec<Msg>) -> usize {
    if pending.is_empty() {
        return 0;
    }
    let n = tx.send_burst(pending);
    pending.drain(..n);
    n
}

/// The ring ends and pools stages are built from.
pub struct Resources {
    /// Payload pools in config order.
    pub pools: Vec<Arc<Pool>>,
    /// The fabric device, if the config has one.
    pub fabric: Option<FabricDev>,
    /// The start gate of the rsocket clients.
    pub gate: StartGate,
    txs: HashMap<String, Vec<Tx>>,
    rxs: HashMap<String, Rx>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("pools", &self.pools.len())
            .field("rings", &self.rxs.len())
            .finish_non_exhaustive()
    }
}

impl Resources {
    /// Creates the rings of `cfg`; `pools` and `fabric` are made by the caller.
    ///
    /// # Errors
    ///
    /// [`RunError::Ring`] if a ring cannot be allocated.
    pub fn new(
        cfg: &Config,
        pools: Vec<Arc<Pool>>,
        fabric: Option<FabricDev>,
    ) -> Result<Self, RunError> {
        let mut txs = HashMap::new();
        let mut rxs = HashMap::new();
        for r in &cfg.rings {
            let (t, x) =
                crate::link::link(&r.name, r.capacity, r.producers.len()).map_err(|source| {
                    RunError::Ring {
                        ring: r.name.clone(),
                        source,
                    }
                })?;
            txs.insert(r.name.clone(), t);
            rxs.insert(r.name.clone(), x);
        }
        let clients = cfg
            .stages
            .iter()
            .filter(|s| matches!(s.kind, StageKind::RsocketClient(_)))
            .count();
        Ok(Self {
            pools,
            fabric,
            gate: StartGate::new(clients),
            txs,
            rxs,
        })
    }

    fn tx(&mut self, ring: &str) -> Tx {
        // Validation guarantees one producer end per (stage, ring) pair.
        self.txs
            .get_mut(ring)
            .and_then(Vec::pop)
            .expect("validated config: one producer end per writer")
    }

    fn rx(&mut self, ring: &str) -> Rx {
        self.rxs
            .remove(ring)
            .expect("validated config: one consumer per ring")
    }

    fn pool_byte(&self, cfg: &Config, name: Option<&str>) -> u8 {
        // Validation guarantees the name exists and there are at most MAX_POOLS pools.
        name.and_then(|n| cfg.pool_index(n))
            .map_or(0, |i| (i + 1) as u8)
    }
}

/// Builds every stage of `cfg` from `res`, binding rsocket listeners.
///
/// # Errors
///
/// [`RunError`] if a listener cannot bind or an rsocket context cannot be created.
pub fn build(cfg: &Config, res: &mut Resources) -> Result<Vec<Built>, RunError> {
    let mut out = Vec::new();
    let mut flow: u16 = 0;
    let mut ctxs = rsocket::Contexts::new(res.fabric.clone());
    for s in &cfg.stages {
        let kind = s.kind.name();
        let (stage, stats): (Box<dyn Stage>, _) = match &s.kind {
            StageKind::Generator(g) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Source, false);
                let pool = res.pool_byte(cfg, g.pool.as_deref());
                let st = Generator::new(
                    g,
                    flow,
                    pool,
                    res.tx(&g.output),
                    Payloads::new(&res.pools),
                    stats.clone(),
                );
                flow = flow.wrapping_add(1);
                (Box::new(st), stats)
            }
            StageKind::Forwarder(f) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Inner, false);
                let st =
                    Forwarder::new(res.rx(&f.input), res.tx(&f.output), f.burst, stats.clone());
                (Box::new(st), stats)
            }
            StageKind::Fanout(f) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Inner, false);
                let outs = f.outputs.iter().map(|o| res.tx(o)).collect();
                let st = Fanout::new(
                    res.rx(&f.input),
                    outs,
                    f,
                    Payloads::new(&res.pools),
                    stats.clone(),
                );
                (Box::new(st), stats)
            }
            StageKind::Sink(k) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Terminal, true);
                let st = Sink::new(
                    res.rx(&k.input),
                    k,
                    Payloads::new(&res.pools),
                    stats.clone(),
                );
                (Box::new(st), stats)
            }
            StageKind::RsocketServer(v) => {
                let role = match (v.mode, &v.output) {
                    (crate::config::ServerMode::Echo, _) => Role::Inner,
                    (_, Some(_)) => Role::Source,
                    (_, None) => Role::Terminal,
                };
                let latency = v.output.is_none() && v.mode == crate::config::ServerMode::Sink;
                let stats = StageStats::new(&s.name, kind, s.lcore, role, latency);
                let out = v.output.as_deref().map(|o| res.tx(o));
                let pool = res.pool_byte(cfg, v.pool.as_deref());
                let payloads = Payloads::new(&res.pools);
                let at = rsocket::Site {
                    stage: &s.name,
                    cpu: s.lcore,
                    stats: stats.clone(),
                };
                let st = rsocket::server(&mut ctxs, at, v, out, pool, payloads)?;
                (st, stats)
            }
            StageKind::RsocketClient(c) => {
                let role = if c.output.is_some() {
                    Role::Inner
                } else {
                    Role::Terminal
                };
                let stats = StageStats::new(&s.name, kind, s.lcore, role, c.echo);
                let out = c.output.as_deref().map(|o| res.tx(o));
                let input = res.rx(&c.input);
                let payloads = Payloads::new(&res.pools);
                let gate = res.gate.clone();
                let at = rsocket::Site {
                    stage: &s.name,
                    cpu: s.lcore,
                    stats: stats.clone(),
                };
                let st = rsocket::client(&mut ctxs, at, c, input, out, payloads, gate)?;
                (st, stats)
            }
        };
        out.push(Built {
            stage,
            stats,
            cpu: s.lcore,
        });
    }
    Ok(out)
}
