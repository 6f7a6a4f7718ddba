//! `dp-perf rtrs`: RTRS block IO over a fabric provider, as `fio` drives RNBD: one client
//! lcore keeps `--iodepth` requests of `--bs` bytes in flight for `-T` seconds over
//! `--paths` paths, against a server that answers READs from its memory (a RAM disk),
//! straight from it (`resp_rdma_from`) or, with `--server-copy`, through the chunk.
//!
//! ```text
//! dp-perf rtrs --pair --rw read --bs 4096 --iodepth 128 -T 5 [--paths N]
//!              [--policy rr|min-inflight|min-latency] [--kill-path-after S] [--plot FILE] [--json]
//! ```
//!
//! With `--json` it prints exactly `{"rtrs":{"iops":F,"gbps":F,"p50_ns":F,"p99_ns":F,
//! "paths":N,"failed":N}}`. Latency is per request, from submission to completion. Each
//! path is its own connection set to its own server address (`--port`, `--port + 1`, ...).
//! `--kill-path-after S` disconnects path 0 through the connection manager S seconds into
//! the run (with `--kill-how qp-error`, moves its queue pairs to the error state instead): its requests fail over to the other paths (`failed` counts any that did not),
//! and the table shows the failover time and the path's reconnect (after a 100 ms
//! reconnect delay and RTRS's 1 s backoff) and the requests it took afterwards.
//!
//! Both sides poll in hybrid mode by default (spin while busy, sleep 20 us after 50 us of
//! idleness) so a pair fits a shared 2-core machine; `--poll busy` on dedicated cores.
//!
//! | file | what |
//! |---|---|
//! | `client` | the measured client lcore, the kill and its follow-up |
//! | `server` | the RAM-disk server |
//! | `report` | the JSON line, the table, the figure |
//! | `poll` | busy and hybrid waiting |
//! | `msg` | the user message the two sides agree on |

mod client;
mod msg;
mod report;
mod server;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use dataplane::fabric::Provider;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rtrs::clt::MpPolicy;
use dataplane::rtrs::fabric::PathKill;
use dataplane::rtrs::work::Dir;

pub use report::{KillReport, RtrsReport};
pub use server::Served;

use crate::PerfError;
use crate::common::Common;
#[cfg(feature = "verbs")]
use crate::harness::verbs_pair_ip;
use crate::harness::{
    Peer, ProviderKind, SHM_PAIR_IP, Server, open_err, open_verbs, shm_dir, start_role,
};

/// `--rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rw {
    /// The server RDMA-writes the block into the client's buffer.
    Read,
    /// The client RDMA-writes the block into the server's chunk.
    Write,
}

/// `--policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Round-robin.
    Rr,
    /// The path with the fewest requests in flight.
    MinInflight,
    /// The path with the lowest recent latency.
    MinLatency,
}

/// `--kill-how`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KillHow {
    /// Every connection of the path disconnected through the connection manager.
    Disconnect,
    /// Every queue pair of the path moved to the error state.
    QpError,
}

/// `--poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PollKind {
    /// Spin, then sleep 20 us at a time after 50 us of idleness (shared cores).
    Hybrid,
    /// Spin always (dedicated cores).
    Busy,
}

/// Options of `dp-perf rtrs`.
#[derive(Debug, Clone, Args)]
pub struct RtrsArgs {
    /// Listen and serve one client session.
    #[arg(long, conflicts_with_all = ["client", "pair"])]
    pub server: bool,
    /// Connect to a server at ADDR (`ip` or `ip:port`; paths use the ports after it).
    #[arg(long, value_name = "ADDR")]
    pub client: Option<String>,
    /// Run server and client here, the server as a child process on the second --cpus CPU.
    #[arg(long, conflicts_with = "client")]
    pub pair: bool,
    /// Direction of every request.
    #[arg(long, value_enum, default_value_t = Rw::Read)]
    pub rw: Rw,
    /// Bytes per request.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    pub bs: u32,
    /// Requests kept in flight (the server's queue depth).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub iodepth: u16,
    /// Seconds to measure.
    #[arg(short = 'T', long = "time", default_value_t = 5.0, value_parser = parse_secs)]
    pub time: f64,
    /// Paths of the session (connection sets to --port, --port + 1, ...).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub paths: u16,
    /// Multipath policy.
    #[arg(long, value_enum, default_value_t = Policy::MinInflight)]
    pub policy: Policy,
    /// Disconnect path 0 this many seconds into the run (needs --paths 2 or more for zero
    /// failures).
    #[arg(long, value_name = "SECONDS", value_parser = parse_secs)]
    pub kill_path_after: Option<f64>,
    /// How --kill-path-after kills: disconnect through the CM, or move the path's queue
    /// pairs to the error state (no CM event; the flushes tell the session).
    #[arg(long, value_enum, default_value_t = KillHow::Disconnect, requires = "kill_path_after")]
    pub kill_how: KillHow,
    /// How both sides wait when idle.
    #[arg(long, value_enum, default_value_t = PollKind::Hybrid)]
    pub poll: PollKind,
    /// Client: register each READ's buffer per IO (a memory window under a fresh key,
    /// invalidated before the request completes), as Linux's client does, instead of once.
    #[arg(long)]
    pub per_io_registration: bool,
    /// Server: copy each READ's block into the request's chunk and write it from there, as
    /// Linux's RTRS servers answer, instead of writing it straight from the RAM disk
    /// (`resp_rdma_from`, zero copy; the default).
    #[arg(long)]
    pub server_copy: bool,
    /// Server: invalidate each chunk's key while its request is handled and answer under a
    /// new one (`always_invalidate`, Linux's default: a memory window per chunk, over shm;
    /// verbs refuses it), instead of registering the chunks once.
    #[arg(long)]
    pub always_invalidate: bool,
    /// The first path's port.
    #[arg(short = 'p', long, default_value_t = 18600)]
    pub port: u16,
    /// Address the server listens on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Fabric provider.
    #[arg(long, value_enum, default_value_t = ProviderKind::Shm)]
    pub provider: ProviderKind,
    /// shm rendezvous directory (default: the provider's; --pair makes a private one).
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// verbs device name (default: the first).
    #[arg(short = 'd', long, value_name = "NAME")]
    pub device: Option<String>,
    /// Pin this process to CPU N (used by --pair for the server child).
    #[arg(long, value_name = "N", hide = true)]
    pub pin: Option<usize>,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("expected seconds in (0, 3600], got {s:?}")),
    }
}

impl RtrsArgs {
    /// Runs the benchmark.
    ///
    /// # Errors
    /// Usage errors (status 2), a missing device (status 2), connection and IO errors.
    pub fn run(&self, common: &Common) -> Result<RtrsReport, PerfError> {
        start_role(self.server, self.client.as_deref(), self.pair, self.pin)?;
        if let Some(k) = self.kill_path_after
            && k >= self.time
        {
            return Err(PerfError::Usage(format!(
                "--kill-path-after {k} must be below -T {} so the kill happens under load",
                self.time
            )));
        }
        match self.provider {
            ProviderKind::Shm => {
                let dir = shm_dir(self.shm_dir.as_ref(), self.pair, "dp-rtrs");
                let dev = ShmDevice::open(ShmConfig {
                    dir: dir.clone(),
                    ..ShmConfig::default()
                })
                .map_err(open_err)?;
                let r = self.run_on::<Shm>(Arc::new(dev), common, SHM_PAIR_IP, dir.as_ref());
                // The private rendezvous directory of a pair: both processes are done.
                if self.pair
                    && self.shm_dir.is_none()
                    && let Some(d) = &dir
                {
                    let _ = std::fs::remove_dir_all(d);
                }
                r
            }
            #[cfg(feature = "verbs")]
            ProviderKind::Verbs => {
                let dev = open_verbs(self.device.as_deref())?;
                let ip = if self.pair {
                    verbs_pair_ip(&dev)?
                } else {
                    self.bind
                };
                self.run_on::<dataplane::fabric::verbs::Verbs>(Arc::new(dev), common, ip, None)
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => match open_verbs(self.device.as_deref())? {},
        }
    }

    fn addrs(&self, ip: IpAddr) -> Result<Vec<SocketAddr>, PerfError> {
        (0..self.paths)
            .map(|k| {
                self.port
                    .checked_add(k)
                    .map(|p| SocketAddr::new(ip, p))
                    .ok_or_else(|| {
                        PerfError::Usage(format!(
                            "--port {} + --paths {} passes 65535",
                            self.port, self.paths
                        ))
                    })
            })
            .collect()
    }

    fn run_on<P: Provider>(
        &self,
        dev: Arc<P::Device>,
        common: &Common,
        pair_ip: IpAddr,
        dir: Option<&PathBuf>,
    ) -> Result<RtrsReport, PerfError> {
        let busy = self.poll == PollKind::Busy;
        if self.server {
            let served = server::serve::<P>(
                dev,
                &self.addrs(self.bind)?,
                server::Answer {
                    queue_depth: self.iodepth,
                    bs: self.bs,
                    busy,
                    copy: self.server_copy,
                    always_invalidate: self.always_invalidate,
                },
            )?;
            return Ok(RtrsReport {
                rw: "",
                bs: self.bs,
                iodepth: self.iodepth,
                secs: 0.0,
                paths: usize::from(self.paths),
                policy: "",
                provider: P::NAME,
                poll: "",
                completed: 0,
                iops: 0.0,
                gbps: 0.0,
                p50_ns: 0.0,
                p99_ns: 0.0,
                p999_ns: 0.0,
                failed: 0,
                kill: None,
                path_lines: Vec::new(),
                dist: None,
                served: Some(served),
            });
        }
        let poll = match self.poll {
            PollKind::Hybrid => "hybrid",
            PollKind::Busy => "busy",
        };
        let pair = self.pair.then(|| Server {
            command: "rtrs",
            ip: pair_ip,
            port: self.port,
            provider: self.provider,
            shm_dir: dir.map(PathBuf::as_path),
            device: self.device.as_deref(),
            extra: [
                "--paths".to_string(),
                self.paths.to_string(),
                "--bs".into(),
                self.bs.to_string(),
                "--iodepth".into(),
                self.iodepth.to_string(),
                "--poll".into(),
                poll.into(),
            ]
            .into_iter()
            .chain(self.server_copy.then(|| "--server-copy".to_string()))
            .chain(
                self.always_invalidate
                    .then(|| "--always-invalidate".to_string()),
            )
            .map(Into::into)
            .collect(),
        });
        let peer = Peer::start(pair, self.client.as_deref(), self.port, common.cpus)?;
        let first = peer.addr;
        let result = (|| {
            let plan = client::Plan {
                addrs: self.addrs(first.ip()).map(|v| {
                    v.into_iter()
                        .enumerate()
                        .map(|(k, a)| SocketAddr::new(a.ip(), first.port() + k as u16))
                        .collect()
                })?,
                dir: match self.rw {
                    Rw::Read => Dir::Read,
                    Rw::Write => Dir::Write,
                },
                bs: self.bs,
                iodepth: self.iodepth,
                secs: if common.quick {
                    self.time.min(0.5)
                } else {
                    self.time
                },
                policy: match self.policy {
                    Policy::Rr => MpPolicy::RoundRobin,
                    Policy::MinInflight => MpPolicy::MinInflight,
                    Policy::MinLatency => MpPolicy::MinLatency,
                },
                kill_after: self.kill_path_after,
                per_io: self.per_io_registration,
                kill_how: match self.kill_how {
                    KillHow::Disconnect => PathKill::Disconnect,
                    KillHow::QpError => PathKill::QpError,
                },
                busy,
            };
            client::measure::<P>(dev, &plan)
        })();
        peer.finish(result)
    }
}
