//! Building the stages of a configuration: the rings and pools they are made from
//! ([`Resources`]), and each stage placed on the CPU of its lcore ([`Built`]).

use std::collections::HashMap;
use std::sync::Arc;

use mempool::pool::Pool;

use super::env::{FabricDev, Stage, StartGate};
use super::forward::{Fanout, Forwarder};
use super::generator::Generator;
use super::info::{InfoKind, InfoSlot};
use super::rds::{self, RdsReceiver, RdsSender};
use super::rnbd;
use super::rsocket;
use super::sink::Sink;
use crate::config::{Config, ServerMode, StageKind};
use crate::error::RunError;
use crate::link::{self, Rx, Tx};
use crate::payload::Payloads;
use crate::stats::{Role, StageStats};

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

/// The ring ends and pools stages are built from.
pub struct Resources {
    /// Payload pools in config order.
    pub pools: Vec<Arc<Pool>>,
    /// The fabric device, if the config has one.
    pub fabric: Option<FabricDev>,
    /// The start gate of the rsocket clients.
    pub gate: StartGate,
    /// The info slots of the RDS and RNBD stages, for `dpctl rds-info`, `rnbd-info` and
    /// `rtrs-info` (filled by [`build`]).
    pub info: Vec<Arc<InfoSlot>>,
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
            let (t, x) = link::link(&r.name, r.capacity, r.producers.len()).map_err(|source| {
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
            info: Vec::new(),
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
                    (ServerMode::Echo, _) => Role::Inner,
                    (_, Some(_)) => Role::Source,
                    (_, None) => Role::Terminal,
                };
                let latency = v.output.is_none() && v.mode == ServerMode::Sink;
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
            StageKind::RdsSender(d) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Terminal, false);
                let fabric = res.fabric.as_ref().ok_or(RunError::NoFabric)?;
                let node = rds::node(fabric, &s.name, d.bind.ip(), d.sndbuf)?;
                let input = res.rx(&d.input);
                let payloads = Payloads::new(&res.pools);
                let info = InfoSlot::new(stats.clone(), InfoKind::Rds);
                res.info.push(info.clone());
                let st = RdsSender::new(node, d, input, payloads, stats.clone(), info)?;
                (Box::new(st), stats)
            }
            StageKind::RdsReceiver(d) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Source, false);
                let fabric = res.fabric.as_ref().ok_or(RunError::NoFabric)?;
                let node = rds::node(fabric, &s.name, d.bind.ip(), d.rcvbuf)?;
                let out = res.tx(&d.output);
                let pool = res.pool_byte(cfg, d.pool.as_deref());
                let payloads = Payloads::new(&res.pools);
                let info = InfoSlot::new(stats.clone(), InfoKind::Rds);
                res.info.push(info.clone());
                let st = RdsReceiver::new(node, d, out, pool, payloads, stats.clone(), info)?;
                (Box::new(st), stats)
            }
            StageKind::RnbdServer(d) => {
                let stats = StageStats::new(&s.name, kind, s.lcore, Role::Terminal, false);
                let fabric = res.fabric.as_ref().ok_or(RunError::NoFabric)?;
                let info = InfoSlot::new(stats.clone(), InfoKind::Rnbd);
                res.info.push(info.clone());
                let st = rnbd::server(fabric, d, &cfg.source, stats.clone(), info)?;
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
