//! The entry point: the options, the role (server, client, or both with `--pair`), the
//! client's sweep over sizes (one connection each) and the server's loop answering them.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Args;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::fabric::{
    CmChannel, CmEvent, ConnRequest, Device, Provider, RcQueuePair, RemoteAddr,
};

use super::bandwidth;
use super::endpoint::{Endpoint, accept_one, connect_one, fail, wait_disconnect};
use super::latency;
use super::latency::Measured;
use super::report::{BwRow, FabricReport};
use super::session::{Req, Test};
use crate::PerfError;
use crate::common::Common;
#[cfg(feature = "verbs")]
use crate::harness::verbs_pair_ip;
use crate::harness::{
    Peer, ProviderKind, SHM_PAIR_IP, Server, Timer, open_err, open_verbs, shm_dir, start_role,
};

/// Options of every fabric benchmark.
#[derive(Debug, Clone, Args)]
pub struct FabricArgs {
    /// Listen and serve one client run.
    #[arg(long, conflicts_with_all = ["client", "pair"])]
    pub server: bool,
    /// Connect to a server at ADDR (`ip` or `ip:port`).
    #[arg(long, value_name = "ADDR")]
    pub client: Option<String>,
    /// Run server and client here, on the two --cpus (server as a child process).
    #[arg(long, conflicts_with = "client")]
    pub pair: bool,
    /// Message size in bytes [default: 2 for latency, 65536 for bandwidth].
    #[arg(short = 's', long, value_name = "BYTES", conflicts_with = "all")]
    pub size: Option<usize>,
    /// Sweep sizes 2 .. 2^23 (perftest `-a`).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Iterations per size [default: 1000 for latency, 5000 for bandwidth].
    #[arg(short = 'n', long, value_name = "N")]
    pub iters: Option<u64>,
    /// Requests kept outstanding by bandwidth tests.
    #[arg(short = 't', long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub tx_depth: u32,
    /// Largest payload sent inline (latency tests).
    #[arg(short = 'I', long = "inline", default_value_t = 220)]
    pub inline_size: u32,
    /// TCP-style port of the server.
    #[arg(short = 'p', long, default_value_t = 18515)]
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
    /// verbs device name, as `ibv_devices` lists it (default: the first).
    #[arg(short = 'd', long, value_name = "NAME")]
    pub device: Option<String>,
    /// Pin this process to CPU N (used by --pair for the server child).
    #[arg(long, value_name = "N", hide = true)]
    pub pin: Option<usize>,
}

impl FabricArgs {
    /// Runs `test` with these options.
    ///
    /// # Errors
    ///
    /// Usage errors (status 2) for bad combinations or a missing device; fabric errors
    /// otherwise.
    pub fn run(&self, test: Test, common: &Common) -> Result<FabricReport, PerfError> {
        start_role(self.server, self.client.as_deref(), self.pair, self.pin)?;
        match self.provider {
            ProviderKind::Shm => {
                let dir = shm_dir(self.shm_dir.as_ref(), self.pair, "dp-perf");
                let dev = ShmDevice::open(ShmConfig {
                    dir: dir.clone(),
                    ..ShmConfig::default()
                })
                .map_err(open_err)?;
                self.run_on::<Shm>(&dev, test, common, SHM_PAIR_IP, dir.as_ref())
            }
            #[cfg(feature = "verbs")]
            ProviderKind::Verbs => {
                let dev = open_verbs(self.device.as_deref())?;
                let ip = if self.pair {
                    verbs_pair_ip(&dev)?
                } else {
                    self.bind
                };
                self.run_on::<dataplane::fabric::verbs::Verbs>(&dev, test, common, ip, None)
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => match open_verbs(self.device.as_deref())? {},
        }
    }

    fn run_on<P: Provider>(
        &self,
        dev: &P::Device,
        test: Test,
        common: &Common,
        pair_ip: IpAddr,
        dir: Option<&PathBuf>,
    ) -> Result<FabricReport, PerfError> {
        let timer = Timer::new();
        let mut report = FabricReport {
            test,
            provider: P::NAME,
            lat: Vec::new(),
            dist: Vec::new(),
            bw: Vec::new(),
            served: None,
        };
        if self.server {
            let served = serve::<P>(dev, SocketAddr::new(self.bind, self.port))?;
            report.served = Some(served);
            return Ok(report);
        }
        let pair = self.pair.then(|| Server {
            command: test.name(),
            ip: pair_ip,
            port: self.port,
            provider: self.provider,
            shm_dir: dir.map(PathBuf::as_path),
            device: self.device.as_deref(),
            extra: Vec::new(),
        });
        let peer = Peer::start(pair, self.client.as_deref(), self.port, common.cpus)?;
        let addr = peer.addr;
        let sizes = sizes(self, test, common.quick);
        let count = sizes.len();
        let result = (|| {
            for (k, &size) in sizes.iter().enumerate() {
                let size32 = u32::try_from(size).ok().filter(|s| *s > 0).ok_or_else(|| {
                    PerfError::Usage(format!("--size {size} must be between 1 and 2^31"))
                })?;
                let req = Req {
                    test,
                    last: k + 1 == count,
                    size: size32,
                    iters: iterations(self, test, common.quick, size),
                    tx_depth: self.tx_depth,
                    inline_size: self.inline_size,
                    buf: RemoteAddr::default(),
                };
                let (lat, bw) = client_one::<P>(dev, addr, req, &timer)?;
                if let Some((row, dist)) = lat {
                    report.lat.push(row);
                    report.dist.push(dist);
                }
                report.bw.extend(bw);
            }
            Ok(())
        })();
        peer.finish(result).map(|()| report)
    }
}

fn sizes(args: &FabricArgs, test: Test, quick: bool) -> Vec<usize> {
    if args.all {
        let top = if quick { 12 } else { 23 };
        (1..=top).map(|k| 1usize << k).collect()
    } else {
        vec![
            args.size
                .unwrap_or(if test.is_latency() { 2 } else { 65536 }),
        ]
    }
}

fn iterations(args: &FabricArgs, test: Test, quick: bool, size: usize) -> u64 {
    let base = args
        .iters
        .unwrap_or(if test.is_latency() { 1000 } else { 5000 });
    // --quick shortens the default, never an explicit -n.
    let base = if quick && args.iters.is_none() {
        base.min(200)
    } else {
        base
    };
    // Keep the largest sweep sizes from taking minutes, as perftest's -a does.
    if args.iters.is_none() && size > 1 << 20 {
        (base / 4).max(100)
    } else {
        base
    }
}

/// Client side of one size: connects, runs the test, disconnects.
fn client_one<P: Provider>(
    dev: &P::Device,
    addr: SocketAddr,
    mut req: Req,
    timer: &Timer,
) -> Result<(Option<Measured>, Option<BwRow>), PerfError> {
    let (mut cm, _pd, mut ep, peer) = connect_one::<P>(dev, addr, &mut req)?;
    let size = req.size as usize;
    let inline = size <= req.inline_size as usize && size <= dev.attr().max_inline_data as usize;
    let result = match req.test {
        Test::WriteLat | Test::SendLat => (
            Some(latency::ping_pong(&mut ep, &req, peer, inline, timer)?),
            None,
        ),
        Test::ReadLat => (Some(latency::read_lat(&mut ep, &req, peer, timer)?), None),
        Test::WriteBw | Test::SendBw | Test::ReadBw => {
            (None, Some(bandwidth::stream(&mut ep, &req, peer, timer)?))
        }
    };
    cm.disconnect(ep.qp.conn_id()).map_err(fail)?;
    Ok(result)
}

/// Serves client runs until one marked last; returns the number of sizes served.
fn serve<P: Provider>(dev: &P::Device, bind: SocketAddr) -> Result<u64, PerfError> {
    let mut cm = dev.create_cm_channel().map_err(fail)?;
    cm.listen(bind, 16).map_err(fail)?;
    let mut served = 0;
    loop {
        let request = loop {
            match cm.wait_event(None) {
                Some(CmEvent::ConnectRequest { request, .. }) => break request,
                Some(_) | None => continue,
            }
        };
        let Some(req) = Req::decode(request.private_data()) else {
            cm.reject(request, b"not a dp-perf client").map_err(fail)?;
            continue;
        };
        let (conn, _pd, mut ep) = accept_one::<P>(dev, &mut cm, request, &req)?;
        serve_one(&mut ep, &req, &mut cm)?;
        let _ = cm.disconnect(conn);
        served += 1;
        if req.last {
            return Ok(served);
        }
    }
}

/// Server side of one size: the test's part, then waiting for the client to disconnect.
fn serve_one<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    cm: &mut P::Cm,
) -> Result<(), PerfError> {
    match req.test {
        Test::WriteLat | Test::SendLat => latency::pong(ep, req)?,
        Test::SendBw => bandwidth::sink(ep, req)?,
        Test::ReadLat | Test::WriteBw | Test::ReadBw => {}
    }
    wait_disconnect(ep, cm)
}
