//! The entry point: the options, the role (server, client, or both with `--pair`), the
//! transport (rsockets on a provider, or kernel TCP), and the run over the planned tests.

use std::ffi::OsString;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Args;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};

use super::conn::{BgSpec, ConnOpts, Transport, fabric_err};
use super::plan::{Plan, Verify, inline_size, name, plans, run_test};
use super::rsocket::Rs;
use super::table::{Row, RstreamReport, Scale};
use super::tcp::Tcp;
use crate::PerfError;
use crate::common::Common;
#[cfg(feature = "verbs")]
use crate::harness::verbs_pair_ip;
use crate::harness::{
    Peer, ProviderKind, SHM_PAIR_IP, Server, Summary, Timer, open_err, open_verbs, shm_dir,
    start_role,
};

/// Options of `dp-perf rstream` (rstream's letters where it has them).
#[derive(Debug, Clone, Args)]
pub struct RstreamArgs {
    /// Listen and serve one client run.
    #[arg(long, conflicts_with_all = ["client", "pair"])]
    pub server: bool,
    /// Connect to a server at ADDR (`ip` or `ip:port`) (rstream `-s`).
    #[arg(long, value_name = "ADDR")]
    pub client: Option<String>,
    /// Run server and client here, the server as a child process on the second --cpus CPU.
    #[arg(long, conflicts_with = "client")]
    pub pair: bool,
    /// Over kernel TCP instead of rsockets (rstream `-T s`).
    #[arg(long)]
    pub tcp: bool,
    /// Transfer size, or `all` for every size of the table (rstream `-S`).
    #[arg(short = 'S', long = "size", value_name = "N|all")]
    pub size: Option<String>,
    /// Iterations of a custom-size test (rstream `-I`).
    #[arg(short = 'I', long = "iterations", value_name = "N")]
    pub iterations: Option<u64>,
    /// Transfers per iteration of a custom-size test (rstream `-C`).
    #[arg(short = 'C', long = "count", value_name = "N")]
    pub count: Option<u64>,
    /// SO_SNDBUF and SO_RCVBUF (rstream `-B`).
    #[arg(short = 'B', long = "buffer", default_value_t = 1 << 19)]
    pub buffer: u32,
    /// Inline size for latency runs (rstream `-i`).
    #[arg(short = 'i', long = "inline", default_value_t = 64)]
    pub inline: u32,
    /// Port (rstream `-p`).
    #[arg(short = 'p', long, default_value_t = 7471)]
    pub port: u16,
    /// Address the server binds (rstream `-b`).
    #[arg(short = 'b', long = "bind", default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Test options (rstream `-T`): `b` blocking, `n` non-blocking (default), `v` verify,
    /// `s` sockets (same as --tcp); letters combine.
    #[arg(short = 'T', long = "test-opts", default_value = "")]
    pub opts: String,
    /// Fabric provider carrying the rsockets.
    #[arg(long, value_enum, default_value_t = ProviderKind::Shm)]
    pub provider: ProviderKind,
    /// verbs device name, as `ibv_devices` lists it (default: the first).
    #[arg(short = 'd', long, value_name = "NAME")]
    pub device: Option<String>,
    /// shm rendezvous directory (default: the provider's; --pair makes a private one).
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Open N connections and measure one while the other N-1 carry traffic at --rate,
    /// all driven from one thread on each side (rsockets, non-blocking mode only).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub sockets: usize,
    /// With --sockets: messages per second on each background connection (the test's
    /// size; the server echoes them).
    #[arg(long, value_name = "MSG/S", default_value_t = 100.0)]
    pub rate: f64,
    /// Pin this process to CPU N (used by --pair).
    #[arg(long, value_name = "N", hide = true)]
    pub pin: Option<usize>,
}

impl RstreamArgs {
    /// True when `--sockets` was given, even as 1 (the baseline of a scale run, which
    /// reports the same per-round latencies).
    fn sockets_given(&self) -> bool {
        std::env::args().any(|a| a == "--sockets" || a.starts_with("--sockets="))
    }

    fn blocking(&self) -> bool {
        self.opts.contains('b')
    }

    fn conn_opts(&self) -> ConnOpts {
        ConnOpts {
            buffer: self.buffer,
            blocking: self.blocking(),
        }
    }

    /// Runs the benchmark.
    ///
    /// # Errors
    /// Usage errors (status 2), a missing device (status 2), connection and data errors.
    pub fn run(&self, common: &Common) -> Result<RstreamReport, PerfError> {
        if let Some(bad) = self.opts.chars().find(|c| !"bnvs".contains(*c)) {
            return Err(PerfError::Usage(format!(
                "-T {bad}: supported test options are b (blocking), n (nonblocking), v (verify) \
                 and s (kernel TCP sockets)"
            )));
        }
        start_role(self.server, self.client.as_deref(), self.pair, self.pin)?;
        let tcp = self.tcp || self.opts.contains('s');
        if self.sockets == 0 {
            return Err(PerfError::Usage("--sockets 0: give at least 1".into()));
        }
        if self.sockets > 1 && (tcp || self.blocking()) {
            return Err(PerfError::Usage(format!(
                "--sockets {}: one thread drives every connection, so this runs over rsockets \
                 in the non-blocking mode only; drop --tcp / -T s / -T b",
                self.sockets
            )));
        }
        if !(self.rate.is_finite() && self.rate >= 0.0) {
            return Err(PerfError::Usage(format!(
                "--rate {}: give messages per second, 0 or more",
                self.rate
            )));
        }
        if tcp {
            let ip = if self.pair { SHM_PAIR_IP } else { self.bind };
            return self.run_with(&Tcp, common, ip, None);
        }
        match self.provider {
            ProviderKind::Shm => {
                let dir = shm_dir(self.shm_dir.as_ref(), self.pair, "dp-rstream");
                let dev = ShmDevice::open(ShmConfig {
                    dir: dir.clone(),
                    bounce_bytes: 4096,
                    ..ShmConfig::default()
                })
                .map_err(open_err)?;
                let t = Rs::<Shm>::open(dev, self.blocking())?;
                self.run_with(&t, common, SHM_PAIR_IP, dir.as_ref())
            }
            #[cfg(feature = "verbs")]
            ProviderKind::Verbs => {
                let dev = open_verbs(self.device.as_deref())?;
                let ip = if self.pair {
                    verbs_pair_ip(&dev)?
                } else {
                    self.bind
                };
                let t = Rs::<dataplane::fabric::verbs::Verbs>::open(dev, self.blocking())?;
                self.run_with(&t, common, ip, None)
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => match open_verbs(self.device.as_deref())? {},
        }
    }

    /// The options a `--pair` server needs besides the common ones: it runs the same test
    /// sequence as the client, so it needs the same counts.
    fn server_args(&self, quick: bool) -> Vec<OsString> {
        let mut v: Vec<String> = vec![
            "-B".into(),
            self.buffer.to_string(),
            "-i".into(),
            self.inline.to_string(),
        ];
        if !self.opts.is_empty() {
            v.extend(["-T".into(), self.opts.clone()]);
        }
        if self.tcp {
            v.push("--tcp".into());
        }
        if quick {
            v.push("--quick".into());
        }
        if let Some(s) = &self.size {
            v.extend(["-S".into(), s.clone()]);
        }
        if let Some(n) = self.iterations {
            v.extend(["-I".into(), n.to_string()]);
        }
        if let Some(n) = self.count {
            v.extend(["-C".into(), n.to_string()]);
        }
        if self.sockets != 1 {
            v.extend([
                "--sockets".into(),
                self.sockets.to_string(),
                "--rate".into(),
                self.rate.to_string(),
            ]);
        }
        v.into_iter().map(OsString::from).collect()
    }

    fn run_with(
        &self,
        t: &dyn Transport,
        common: &Common,
        pair_ip: IpAddr,
        dir: Option<&PathBuf>,
    ) -> Result<RstreamReport, PerfError> {
        let (lat, bw) = plans(
            self.size.as_deref(),
            self.iterations,
            self.count,
            common.quick,
        )?;
        let custom = lat.is_empty();
        let groups: Vec<(Vec<Plan>, bool)> = [(lat, true), (bw, false)]
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .collect();
        let biggest = groups
            .iter()
            .flat_map(|(g, _)| g.iter().map(|p| p.size))
            .max()
            .unwrap_or(16);
        let mut buf = vec![0u8; biggest];
        let mut v = Verify::new(self.opts.contains('v'));
        let opts = self.conn_opts();
        let timer = Timer::new();
        let data_err = |e: io::Error| fabric_err("transfer", e);
        // --sockets: the background connections carry messages of the first test's size.
        let scale = self.sockets > 1 || self.sockets_given();
        let bg = |size: usize| {
            (self.sockets > 1).then_some(BgSpec {
                count: self.sockets - 1,
                rate: self.rate,
                size,
            })
        };
        if self.server {
            let bind = SocketAddr::new(self.bind, self.port);
            let l = t.listen(bind, opts)?;
            let mut served = 0;
            for (plans, is_lat) in &groups {
                let inline = inline_size(*is_lat, custom, self.inline);
                let mut c = l.accept(opts, inline, bg(plans[0].size))?;
                for p in plans {
                    run_test(c.as_mut(), false, *p, &mut buf, &mut v, &timer, None)
                        .map_err(data_err)?;
                }
                served += 1;
            }
            return Ok(RstreamReport {
                transport: t.describe(),
                rows: vec![],
                served: Some(served),
                scale: None,
            });
        }
        let pair = self.pair.then(|| Server {
            command: "rstream",
            ip: pair_ip,
            port: self.port,
            provider: self.provider,
            shm_dir: dir.map(PathBuf::as_path),
            device: self.device.as_deref(),
            extra: self.server_args(common.quick),
        });
        let peer = Peer::start(pair, self.client.as_deref(), self.port, common.cpus)?;
        let addr = peer.addr;
        let mut latency = Vec::new();
        let mut background = Vec::new();
        let result = (|| -> Result<Vec<Row>, PerfError> {
            let mut rows = Vec::new();
            for (plans, is_lat) in &groups {
                let inline = inline_size(*is_lat, custom, self.inline);
                let mut c = t.connect(addr, opts, inline, bg(plans[0].size))?;
                for p in plans {
                    let mut samples = Vec::new();
                    let secs = run_test(
                        c.as_mut(),
                        true,
                        *p,
                        &mut buf,
                        &mut v,
                        &timer,
                        scale.then_some(&mut samples),
                    )
                    .map_err(data_err)?;
                    let name = name(p, *is_lat, custom);
                    if scale {
                        latency.push((name.clone(), Summary::from_samples(samples)));
                    }
                    rows.push(Row {
                        name,
                        bytes: p.size,
                        xfers: p.xfers,
                        iters: p.iters,
                        secs,
                    });
                }
                background.extend(c.background());
            }
            Ok(rows)
        })();
        Ok(RstreamReport {
            transport: t.describe(),
            rows: peer.finish(result)?,
            served: None,
            scale: scale.then_some(Scale {
                sockets: self.sockets,
                rate: self.rate,
                latency,
                background,
            }),
        })
    }
}
