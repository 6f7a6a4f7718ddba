//! RDS over the fabric, measured as rds-tools measure the kernel's RDS: `dp-perf
//! rds-stress` ([`stress`]) and `dp-perf rds-ping` ([`ping`]); and checked: `dp-perf
//! rds-check` ([`check`]: every message once, in order, byte-exact, against our nodes or,
//! with `scripts/rds-check-kernel.py`, the kernel's AF_RDS).
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
//! dp-perf rds-stress --pair -q 1M -o -d 16 -T 10 --rdma --json      # (payload by RDMA)
//! dp-perf write-bw --pair -s 1048576 --json                         # ... shm write-bw
//! dp-perf rds-stress --pair -q 64 -a 16 -d 256 -T 10 --sockets 1 --json
//! dp-perf rds-stress --pair -q 64 -a 16 -d 256 -T 10 --sockets 1024 --json  # >= 0.8 x
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use dataplane::fabric::Provider;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rds::fabric::{FabricConfig, FabricTransport};
use dataplane::rds::node::RdsNode;
use dataplane::rds::path::PathConfig;
use dataplane::rds::tcp::{RDS_TCP_PORT, TcpConfig, TcpTransport};
use dataplane::rds::{RdsConfig, RdsEngine, TransportKind, TransportSpec};
use mempool::memory::Region;

use crate::PerfError;
use crate::harness::ProviderKind;
use crate::harness::open_verbs;

pub mod check;
pub mod echo;
mod kernel;
mod ksock;
pub mod pattern;
pub mod ping;
mod progress;
mod rdma;
pub mod stress;

/// The passive side's address in `--pair` runs.
pub const PAIR_PASSIVE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 80, 0, 2));
/// The active side's address in `--pair` runs.
pub const PAIR_ACTIVE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 80, 0, 1));

/// The passive side's address in `--pair --transport tcp` runs (a loopback address: TCP
/// needs addresses this host owns).
pub const PAIR_PASSIVE_TCP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 80, 2));
/// The active side's address in `--pair --transport tcp` runs.
pub const PAIR_ACTIVE_TCP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 80, 1));

/// `SO_RDS_TRANSPORT` of the benchmark's sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RdsTransport {
    /// The fabric transport (RDS-IB's protocol) on --provider: no system calls.
    Ib,
    /// RDS over kernel TCP sockets (Linux's rds_tcp wire format): system calls per poll.
    Tcp,
}

impl RdsTransport {
    /// `SO_RDS_TRANSPORT` of the kernel's sockets in a `--kernel` run.
    pub(crate) fn kernel_value(self) -> libc::c_int {
        match self {
            Self::Ib => ksock::RDS_TRANS_IB,
            Self::Tcp => ksock::RDS_TRANS_TCP,
        }
    }
}

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
    /// The RDS transport: ib (the fabric transport on --provider) or tcp (RDS-TCP over
    /// kernel sockets, single path; --provider is then unused).
    #[arg(long, value_enum, default_value_t = RdsTransport::Ib)]
    pub transport: RdsTransport,
    /// RDS-TCP: the port nodes listen on and dial (the kernel's 16385; a host with the
    /// rds_tcp module holds it, so use another there and redirect).
    #[arg(long, value_name = "PORT", default_value_t = RDS_TCP_PORT)]
    pub tcp_port: u16,
    /// RDS-TCP: the port to dial on the peer, if not --tcp-port (beside a kernel RDS:
    /// listen on 26385 behind a redirect, dial the kernel's 16385).
    #[arg(long, value_name = "PORT")]
    pub tcp_peer_port: Option<u16>,
    /// RDS-TCP paths: 1 (single path; a peer's probe ping is answered as a legacy peer
    /// would) or 8 (mprds: NPATHS 8 in the probe, `min(8, peer's)` paths negotiated).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_paths)]
    pub paths: u8,
    /// RDS-TCP multipath without SPORT_IDX, as Linux 6.1: our probes do not offer it, our
    /// dialler binds random ports, and accepted connections take the first path that is
    /// down. (With it, the default, a peer that does not offer it gets that rule anyway.)
    #[arg(long)]
    pub no_sport_idx: bool,
    /// The fabric transport's RDMA CM port over IPv4, listened on and dialled (RDS-IB's
    /// 18634). Beside the kernel's rds_rdma, which holds 18634 on every address, listen
    /// on another (this) and dial the kernel's with --ib-peer-port 18634.
    #[arg(long, value_name = "PORT", default_value_t = dataplane::rds::wire::IB_PORT_V4)]
    pub ib_port: u16,
    /// The fabric transport: the RDMA CM port to dial on the peer, if not --ib-port.
    #[arg(long, value_name = "PORT")]
    pub ib_peer_port: Option<u16>,
}

/// `--paths`: 1 or 8 (`RDS_MPATH_WORKERS`; the engine offers all 8 or none).
fn parse_paths(s: &str) -> Result<u8, String> {
    match s.parse::<u8>() {
        Ok(n @ (1 | 8)) => Ok(n),
        _ => Err(format!(
            "'{s}': RDS-TCP runs 1 path or negotiates 8 (RDS_MPATH_WORKERS): give 1 or 8"
        )),
    }
}

impl RdsFabric {
    /// Refuses `--pair` on a provider where two nodes in one process cannot have two
    /// addresses.
    pub(crate) fn check(&self, pair: bool) -> Result<(), PerfError> {
        if pair && self.provider == ProviderKind::Verbs && self.transport == RdsTransport::Ib {
            return Err(PerfError::Usage(
                "--pair runs both RDS nodes over shm; with --provider verbs run the two sides \
                 as two processes (-r ADDR, and -s PEER on the other) on the device's addresses"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The (active, passive) addresses of a `--pair` run.
    pub(crate) fn pair_addrs(&self) -> (IpAddr, IpAddr) {
        match self.transport {
            RdsTransport::Ib => (PAIR_ACTIVE, PAIR_PASSIVE),
            RdsTransport::Tcp => (PAIR_ACTIVE_TCP, PAIR_PASSIVE_TCP),
        }
    }

    /// Gives a new socket the run's transport (before bind: a loopback address would
    /// otherwise take the loopback transport).
    pub(crate) fn set_transport(
        &self,
        n: &mut RdsNode,
        now: lcore::time::Instant,
        s: dataplane::rds::RdsSocket,
    ) -> Result<(), PerfError> {
        let kind = match self.transport {
            RdsTransport::Ib => TransportKind::Ib,
            RdsTransport::Tcp => TransportKind::Tcp,
        };
        n.engine_mut()
            .set_transport(now, s, kind.value())
            .map_err(|e| PerfError::Fabric(format!("SO_RDS_TRANSPORT: {e}")))
    }
}

/// The RDS-TCP spec of the benchmark: single path unless `--paths 8`, 64 frames handed to
/// the transport per batch.
fn tcp_spec(paths: u8, no_sport_idx: bool) -> TransportSpec {
    TransportSpec {
        multipath: paths > 1,
        sport_idx: !no_sport_idx,
        path: PathConfig {
            send_depth: 64,
            ..PathConfig::stream()
        },
        ..TransportSpec::tcp()
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
    node_with_window(fab, dir, addr, seed, frags, max_sockets, None)
}

/// [`node`], and with `window` the fabric transport gets it as its RDMA window
/// (`RDS_GET_MR` and the local side of RDMA operations).
pub(crate) fn node_with_window(
    fab: &RdsFabric,
    dir: Option<&Path>,
    addr: IpAddr,
    seed: u64,
    frags: u32,
    max_sockets: u32,
    window: Option<Arc<Region>>,
) -> Result<RdsNode, PerfError> {
    let fail = |e: String| PerfError::Fabric(e);
    let tcp = fab.transport == RdsTransport::Tcp;
    let mut cfg = RdsConfig {
        name: format!("dp-perf-rds-{addr}"),
        transports: vec![if tcp {
            tcp_spec(fab.paths, fab.no_sport_idx)
        } else {
            TransportSpec::ib()
        }],
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
    if tcp {
        let mut n = RdsNode::new(engine);
        let tcfg = TcpConfig {
            peer_port: fab.tcp_peer_port.unwrap_or(fab.tcp_port),
            ..TcpConfig::with_port(fab.tcp_port)
        };
        n.add_transport(Box::new(TcpTransport::new(tcfg)))
            .map_err(|e| fail(e.to_string()))?;
        n.add_local_addr(addr).map_err(|e| fail(e.to_string()))?;
        return Ok(n);
    }
    engine.add_local_addr(addr);
    match fab.provider {
        ProviderKind::Shm => {
            let dev = ShmDevice::open(ShmConfig {
                dir: dir.map(Path::to_path_buf),
                ..ShmConfig::default()
            })
            .map_err(|e| fail(format!("shm device: {e}")))?;
            attach::<Shm>(fab, engine, dev, window)
        }
        #[cfg(feature = "verbs")]
        ProviderKind::Verbs => attach::<dataplane::fabric::verbs::Verbs>(
            fab,
            engine,
            open_verbs(fab.device.as_deref())?,
            window,
        ),
        #[cfg(not(feature = "verbs"))]
        ProviderKind::Verbs => match open_verbs(fab.device.as_deref())? {},
    }
}

/// The node of `engine` with the fabric transport on `dev` (and its RDMA window).
fn attach<P: Provider>(
    fab: &RdsFabric,
    mut engine: RdsEngine,
    dev: P::Device,
    window: Option<Arc<Region>>,
) -> Result<RdsNode, PerfError> {
    let fail = |e: String| PerfError::Fabric(e);
    let fcfg = FabricConfig {
        port_v4: fab.ib_port,
        peer_port: fab.ib_peer_port,
        recv_depth: 1024,
        ..FabricConfig::default()
    };
    let mut t = FabricTransport::<P>::new(dev, &engine, fcfg).map_err(|e| fail(e.to_string()))?;
    if let Some(w) = window {
        t.expose_window(&mut engine, w)
            .map_err(|e| fail(e.to_string()))?;
    }
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
    for kind in [TransportKind::Ib, TransportKind::Tcp] {
        if let Some(t) = n.transport_mut(kind) {
            t.counters(&mut |k, x| v.push((k, x)));
        }
    }
    v
}
