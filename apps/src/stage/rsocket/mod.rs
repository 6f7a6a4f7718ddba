//! `kind = "rsocket_server"` and `kind = "rsocket_client"`: fabric connections between
//! stages, possibly in different processes, as rsocket streams of framed messages (the frame
//! format is in [`crate::msg`]).
//!
//! Stages use an [`RsContext`] per lcore and side ([`Contexts`]; rsockets advise one context
//! per thread) and make progress on it from their poll: sockets are non-blocking and every call
//! passes `MSG_DONTWAIT`. Partial sends and receives are the normal case: the client keeps a
//! send buffer of encoded frames, the server a receive buffer per connection, and a full
//! buffer is back-pressure (the rsocket credits then hold the peer back).

mod bytes;
mod client;
mod server;

use std::collections::HashMap;

use dataplane::fabric::shm::Shm;
use dataplane::rsocket::{RsConfig, RsContext};

pub use client::RsClient;
pub use server::RsServer;

use super::env::{FabricDev, Stage, StartGate};
use crate::config::{ClientDef, ServerDef};
use crate::error::RunError;
use crate::link::{Rx, Tx};
use crate::payload::Payloads;
use crate::stats::StageStats;

/// The rsocket contexts of a process: one per lcore and side (servers, clients), shared by
/// the stages of that side on that lcore. A context is one data lock, one connection-manager
/// thread and one registered buffer arena, so sharing keeps a fanout to many clients from
/// multiplying them, while stages on different lcores never contend for a lock.
pub(crate) struct Contexts {
    fabric: Option<FabricDev>,
    shm: HashMap<(usize, bool), RsContext<Shm>>,
    #[cfg(feature = "verbs")]
    verbs: HashMap<(usize, bool), RsContext<dataplane::fabric::verbs::Verbs>>,
}

impl Contexts {
    /// Contexts on `fabric` (none yet).
    pub(crate) fn new(fabric: Option<FabricDev>) -> Self {
        Self {
            fabric,
            shm: HashMap::new(),
            #[cfg(feature = "verbs")]
            verbs: HashMap::new(),
        }
    }
}

impl std::fmt::Debug for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contexts")
            .field("shm", &self.shm.len())
            .finish_non_exhaustive()
    }
}

fn context<P: dataplane::fabric::Provider>(
    map: &mut HashMap<(usize, bool), RsContext<P>>,
    key: (usize, bool),
    stage: &str,
    dev: &P::Device,
) -> Result<RsContext<P>, RunError>
where
    P::Device: Clone,
{
    if let Some(c) = map.get(&key) {
        return Ok(c.clone());
    }
    let c = RsContext::with_config(dev.clone(), RsConfig::from_system()).map_err(|source| {
        RunError::Fabric {
            what: format!("creating the rsocket context of stage `{stage}`"),
            source,
        }
    })?;
    map.insert(key, c.clone());
    Ok(c)
}

/// Where a stage runs, what it is called, and its statistics.
pub(crate) struct Site<'a> {
    pub(crate) stage: &'a str,
    pub(crate) cpu: usize,
    pub(crate) stats: std::sync::Arc<StageStats>,
}

/// Builds an rsocket server stage on the configured provider and binds its listener.
pub(super) fn server(
    ctxs: &mut Contexts,
    at: Site<'_>,
    def: &ServerDef,
    out: Option<Tx>,
    pool: u8,
    payloads: Payloads,
) -> Result<Box<dyn Stage>, RunError> {
    let key = (at.cpu, true);
    let stats = at.stats;
    match ctxs.fabric.clone().ok_or(RunError::NoFabric)? {
        FabricDev::Shm(d) => {
            let ctx = context(&mut ctxs.shm, key, at.stage, &d)?;
            Ok(Box::new(RsServer::new(
                ctx, def, out, pool, payloads, stats,
            )?))
        }
        #[cfg(feature = "verbs")]
        FabricDev::Verbs(d) => {
            let ctx = context(&mut ctxs.verbs, key, at.stage, &d)?;
            Ok(Box::new(RsServer::new(
                ctx, def, out, pool, payloads, stats,
            )?))
        }
    }
}

/// Builds an rsocket client stage on the configured provider (it connects from its poll).
pub(super) fn client(
    ctxs: &mut Contexts,
    at: Site<'_>,
    def: &ClientDef,
    input: Rx,
    out: Option<Tx>,
    payloads: Payloads,
    gate: StartGate,
) -> Result<Box<dyn Stage>, RunError> {
    let key = (at.cpu, false);
    let stats = at.stats;
    match ctxs.fabric.clone().ok_or(RunError::NoFabric)? {
        FabricDev::Shm(d) => {
            let ctx = context(&mut ctxs.shm, key, at.stage, &d)?;
            Ok(Box::new(RsClient::new(
                ctx, def, input, out, payloads, gate, stats,
            )))
        }
        #[cfg(feature = "verbs")]
        FabricDev::Verbs(d) => {
            let ctx = context(&mut ctxs.verbs, key, at.stage, &d)?;
            Ok(Box::new(RsClient::new(
                ctx, def, input, out, payloads, gate, stats,
            )))
        }
    }
}
