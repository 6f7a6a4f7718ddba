//! RDS over the fabric, measured as rds-tools measure the kernel's RDS: `dp-perf
//! rds-stress` ([`stress`]) and `dp-perf rds-ping` ([`ping`]).
//!
//! Each side is one RDS node (an engine with its address and the fabric transport over
//! shm) run by one pinned thread as an lcore would run it: a run-to-completion loop of
//! [`RdsNode::poll`] and the application's non-blocking socket calls, with readiness taken
//! from the engine's events (never a scan of every socket). `--pair` runs both nodes in
//! this process, one per CPU of `--cpus`; without it, one process is the passive side
//! (`-r ADDR`) and another the active side (`-s PEER -r ADDR`), meeting in the shm
//! rendezvous directory (`--dir`), both given the same options (rds-stress sends them over
//! a TCP control socket; here they are simply given twice). The passive side of a
//! two-process run stops `-T` + 30 s after it started.
//!
//! # The goals of issue 13, measured (ratios from one run, on an idle host)
//!
//! ```text
//! dp-perf limit --json                                              # hand-off H
//! dp-perf rds-ping --pair -c 100000 --json                          # p50 one way <= 3 H
//! dp-perf send-lat --pair -s 48 -n 100000 --json                    # the provider's own SEND
//! dp-perf rds-stress --pair -q 64 -o -d 256 -T 10 --json            # >= 10 M msgs/s
//! dp-perf send-bw --pair -s 112 --json                              # the provider's SEND rate
//! dp-perf rds-stress --pair -q 1M -o -d 16 -T 10 --json             # >= 0.5 x ...
//! dp-perf write-bw --pair -s 1048576 --json                         # ... shm write-bw
//! dp-perf rds-stress --pair -q 64 -a 16 -d 256 -T 10 --sockets 1 --json
//! dp-perf rds-stress --pair -q 64 -a 16 -d 256 -T 10 --sockets 1024 --json  # >= 0.8 x
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use clap::Args;
use dataplane::fabric::Provider;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsConfig, RdsEngine, TransportSpec};

use crate::PerfError;
use crate::harness::ProviderKind;
use crate::harness::open_verbs;

pub mod ping;
pub mod stress;

/// The passive side's address in `--pair` runs.
pub const PAIR_PASSIVE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 80, 0, 2));
/// The active side's address in `--pair` runs.
pub const PAIR_ACTIVE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 80, 0, 1));

/// Socket buffers of the benchmark sockets: room for 1 MiB messages several deep.
const SOCK_BUF: u32 = 16 << 20;

/// The rendezvous directory of a run.
pub(crate) fn rendezvous(given: Option<&PathBuf>, pair: bool, what: &str) -> Option<PathBuf> {
    if pair {
        Some(given.cloned().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("dp-perf-{what}-{}", std::process::id()))
        }))
    } else {
        given.cloned()
    }
}

/// Which provider the RDS nodes run on.
#[derive(Debug, Clone, Args)]
pub struct RdsFabric {
    /// Fabric provider: shm (one host), or verbs (RDMA hardware, Soft-RoCE; feature
    /// `verbs`; two processes with -r/-s on the device's addresses, not --pair).
    #[arg(long, value_enum, default_value_t = ProviderKind::Shm)]
    pub provider: ProviderKind,
    /// verbs device name, as `ibv_devices` lists it (default: the first).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
}

impl RdsFabric {
    /// Refuses `--pair` on a provider where two nodes in one process cannot have two
    /// addresses.
    pub(crate) fn check(&self, pair: bool) -> Result<(), PerfError> {
        if pair && self.provider == ProviderKind::Verbs {
            return Err(PerfError::Usage(
                "--pair runs both RDS nodes over shm; with --provider verbs run the two sides \
                 as two processes (-r ADDR, and -s PEER on the other) on the device's addresses"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// One RDS node owning `addr`, with the fabric transport on the chosen provider (shm: in
/// the rendezvous directory `dir`, the default one when `None`). `frags` sizes its message
/// memory.
pub(crate) fn node(
    fab: &RdsFabric,
    dir: Option<&Path>,
    addr: IpAddr,
    seed: u64,
    frags: u32,
    max_sockets: u32,
) -> Result<RdsNode, PerfError> {
    let fail = |e: String| PerfError::Fabric(e);
    let mut cfg = RdsConfig {
        name: format!("dp-perf-rds-{addr}"),
        transports: vec![TransportSpec::ib()],
        seed,
        max_sockets: max_sockets.max(16),
        msgs: (frags * 2).max(1024),
        wmem_max: SOCK_BUF,
        rmem_max: SOCK_BUF,
        ..RdsConfig::default()
    };
    cfg.frags.count = frags;
    cfg.frags.rx_reserve = (frags / 8).max(64);
    let mut engine = RdsEngine::new(cfg).map_err(|e| fail(e.to_string()))?;
    engine.add_local_addr(addr);
    match fab.provider {
        ProviderKind::Shm => {
            let dev = ShmDevice::open(ShmConfig {
                dir: dir.map(Path::to_path_buf),
                ..ShmConfig::default()
            })
            .map_err(|e| fail(format!("shm device: {e}")))?;
            attach::<Shm>(engine, dev)
        }
        #[cfg(feature = "verbs")]
        ProviderKind::Verbs => {
            attach::<dataplane::fabric::verbs::Verbs>(engine, open_verbs(fab.device.as_deref())?)
        }
        #[cfg(not(feature = "verbs"))]
        ProviderKind::Verbs => match open_verbs(fab.device.as_deref())? {},
    }
}

/// The node of `engine` with the fabric transport on `dev`.
fn attach<P: Provider>(engine: RdsEngine, dev: P::Device) -> Result<RdsNode, PerfError> {
    let fail = |e: String| PerfError::Fabric(e);
    let fcfg = FabricConfig {
        recv_depth: 1024,
        ..FabricConfig::default()
    };
    let t = FabricTransport::<P>::new(dev, &engine, fcfg).map_err(|e| fail(e.to_string()))?;
    let mut n = RdsNode::new(engine);
    n.add_transport(Box::new(t))
        .map_err(|e| fail(e.to_string()))?;
    Ok(n)
}

/// Sets both socket buffers of `s` to `bytes` (at most the engine's limit).
pub(crate) fn set_buffers(
    n: &mut RdsNode,
    now: lcore::time::Instant,
    s: dataplane::rds::RdsSocket,
    bytes: u64,
) -> Result<(), PerfError> {
    let b = bytes.min(u64::from(SOCK_BUF)) as u32;
    let e = n.engine_mut();
    e.set_sndbuf(now, s, b)
        .and_then(|()| e.set_rcvbuf(now, s, b))
        .map_err(|e| PerfError::Fabric(format!("RDS socket buffers: {e}")))
}

/// Every counter of a node: the engine's (`rds-info -c` names), then its transports'.
pub(crate) fn all_counters(n: &mut RdsNode) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = n.engine().stats().iter().collect();
    if let Some(t) = n.transport_mut(dataplane::rds::TransportKind::Ib) {
        t.counters(&mut |k, x| v.push((k, x)));
    }
    v
}
