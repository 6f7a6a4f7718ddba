//! `dp-perf rds-ping`: rds-tools' rds-ping over this RDS.
//!
//! Eight sockets bound to port 0 (ephemeral ports) on the source address send, round
//! robin, a 0-byte message to the destination's port 0 every `-i`; the destination's
//! engine answers each with a pong from port 0 (`net.rds.ping_enable`), and the time from
//! send to pong is the round trip. As the other latency tools of the lab, the JSON and the
//! percentiles give the one-way time, half the round trip; the table prints both.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use dataplane::rds::{RdsError, RdsSocket, Received, RecvFlags, SendFlags};
use dp_plot::{Figure, PercentileSeries};
use hdrhistogram::Histogram;
use lcore::time::{Clock, RealClock};
use serde_json::json;

use super::{RdsFabric, node, rendezvous};
use crate::common::Common;
use crate::harness::{run_on, run_pair};
use crate::{PerfError, Report};

/// Sockets rds-ping opens.
const SOCKETS: usize = 8;
/// A ping with no pong after this long counts as lost.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// `dp-perf rds-ping` options (rds-ping's names).
#[derive(Debug, Clone, Args)]
pub struct PingArgs {
    /// Run both sides here: two nodes over shm, one per CPU of --cpus.
    #[arg(long)]
    pub pair: bool,
    /// The address to ping. --pair: 10.80.0.2.
    pub dest: Option<IpAddr>,
    /// Source address (rds-ping -I). --pair: 10.80.0.1. Without a destination, this
    /// process is the side that answers (it runs -T seconds).
    #[arg(short = 'I', value_name = "ADDR")]
    pub local: Option<IpAddr>,
    /// Pings to send (--pair default 10000; --quick 1000).
    #[arg(short = 'c')]
    pub count: Option<u64>,
    /// Interval between pings: seconds, or with an ms/us suffix (default 1 s; --pair: 0).
    #[arg(short = 'i', value_parser = parse_interval)]
    pub interval: Option<Duration>,
    /// Seconds the answering side runs when alone.
    #[arg(short = 'T', default_value_t = 60)]
    pub seconds: u64,
    /// shm rendezvous directory (both processes of a two-process run must give the same).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The provider.
    #[command(flatten)]
    pub fabric: RdsFabric,
}

/// `1`, `0.5`, `10ms`, `100us`.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let bad = || format!("'{s}' is not an interval (seconds, or with an ms or us suffix)");
    let (num, scale) = if let Some(n) = s.strip_suffix("ms").or_else(|| s.strip_suffix("msec")) {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("usec")) {
        (n, 1e-6)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(0.0..=3600.0).contains(&v) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct PingReport {
    /// Pongs received.
    pub count: u64,
    /// Pings that got no pong.
    pub lost: u64,
    /// One-way (half round trip) percentiles, nanoseconds.
    pub p50_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
    /// The first replies' round trips, nanoseconds (printed as rds-ping prints them).
    pub first: Vec<u64>,
    /// The one-way distribution.
    pub dist: Option<PercentileSeries>,
    /// Set on an answering side run alone.
    pub served: bool,
}

impl PingArgs {
    /// Runs the command.
    ///
    /// # Errors
    ///
    /// Bad options; a node that cannot be made; a failed send.
    pub fn run(&self, common: &Common) -> Result<PingReport, PerfError> {
        let count = match (self.count, common.quick, self.pair) {
            (Some(c), _, _) => c,
            (None, true, _) => 1000,
            (None, false, true) => 10_000,
            (None, false, false) => 10,
        };
        if count == 0 {
            return Err(PerfError::Usage("-c 0: give at least one ping".into()));
        }
        self.fabric.check(self.pair)?;
        let interval = self.interval.unwrap_or(if self.pair {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        });
        let dir = rendezvous(self.dir.as_ref(), self.pair, "rds-ping");
        let d = dir.as_deref();
        let [ca, cb] = common.cpus.as_array();
        let stop = AtomicBool::new(false);
        if self.pair {
            if let Some(d) = d {
                let _ = std::fs::create_dir_all(d);
            }
            let (pa, pp) = self.fabric.pair_addrs();
            let (a, b) = run_pair(
                [ca, cb],
                || {
                    let r = self.ping(d, pa, pp, count, interval);
                    // Relaxed: the answering side only needs to see it eventually.
                    stop.store(true, Ordering::Relaxed);
                    r
                },
                || answer(&self.fabric, d, pp, &stop, None),
            )?;
            if let Some(d) = d {
                let _ = std::fs::remove_dir_all(d);
            }
            b?;
            return a;
        }
        let Some(local) = self.local else {
            return Err(PerfError::Usage(
                "give -I ADDR (this side's address), or --pair".into(),
            ));
        };
        match self.dest {
            Some(dest) => run_on(ca, || self.ping(d, local, dest, count, interval))?,
            None => {
                let limit = Duration::from_secs(self.seconds);
                run_on(ca, || answer(&self.fabric, d, local, &stop, Some(limit)))??;
                Ok(PingReport {
                    count: 0,
                    lost: 0,
                    p50_ns: 0.0,
                    p99_ns: 0.0,
                    p999_ns: 0.0,
                    first: Vec::new(),
                    dist: None,
                    served: true,
                })
            }
        }
    }

    fn ping(
        &self,
        dir: Option<&std::path::Path>,
        local: IpAddr,
        dest: IpAddr,
        count: u64,
        interval: Duration,
    ) -> Result<PingReport, PerfError> {
        let clock = RealClock::new();
        let mut n = node(&self.fabric, dir, local, 1, 4096, 64)?;
        let fail = |w: &str, e: RdsError| PerfError::Fabric(format!("rds-ping {w}: {e}"));
        let mut socks: Vec<RdsSocket> = Vec::with_capacity(SOCKETS);
        for _ in 0..SOCKETS {
            let s = n.engine_mut().socket().map_err(|e| fail("socket", e))?;
            self.fabric.set_transport(&mut n, clock.now(), s)?;
            let e = n.engine_mut();
            e.bind(s, SocketAddr::new(local, 0))
                .map_err(|e| fail("bind", e))?;
            socks.push(s);
        }
        let to = SocketAddr::new(dest, 0);
        let mut h = Histogram::<u64>::new(3).map_err(|e| PerfError::Fabric(e.to_string()))?;
        let mut buf = [0u8; 64];
        let (mut got, mut lost) = (0u64, 0u64);
        let mut first = Vec::new();
        // The first ping also sets the connection up: give it longer, and do not count it.
        for i in 0..=count {
            let s = socks[i as usize % SOCKETS];
            let t0 = clock.now();
            n.engine_mut()
                .send_to(t0, s, Some(to), &[], SendFlags::DONTWAIT)
                .map_err(|e| fail("send", e))?;
            n.flush(t0);
            let limit = if i == 0 {
                Duration::from_secs(10)
            } else {
                PING_TIMEOUT
            };
            let rtt = loop {
                let now = clock.now();
                n.poll(now);
                match n
                    .engine_mut()
                    .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                {
                    // The round trip ends when the pong is in hand, as rds-ping's
                    // clock read after recvmsg: `now` came before the poll that found it.
                    Ok(Received::Data { from, .. }) if from == to => {
                        break Some(clock.now().nanos_since(t0));
                    }
                    Ok(_) | Err(RdsError::WouldBlock) => {}
                    Err(e) => return Err(fail("recv", e)),
                }
                if now.nanos_since(t0) > limit.as_nanos() as u64 {
                    break None;
                }
            };
            // Readiness events are not used here: drop them so they do not pile up.
            while n.engine_mut().poll_event().is_some() {}
            match (i, rtt) {
                (0, None) => {
                    return Err(PerfError::Fabric(format!(
                        "no pong from {dest} within 10 s: is the answering side running (same --dir)?"
                    )));
                }
                (0, Some(_)) => {}
                (_, Some(r)) => {
                    got += 1;
                    if first.len() < 10 {
                        first.push(r);
                    }
                    let _ = h.record((r / 2).max(1));
                }
                (_, None) => lost += 1,
            }
            if !interval.is_zero() {
                let t = clock.now();
                while clock.now().nanos_since(t) < interval.as_nanos() as u64 {
                    n.poll(clock.now());
                    std::thread::sleep(Duration::from_micros(100).min(interval));
                }
            }
        }
        let q = |p: f64| h.value_at_quantile(p) as f64;
        Ok(PingReport {
            count: got,
            lost,
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            first,
            dist: PercentileSeries::from_histogram("rds-ping one way", &h, 1.0),
            served: false,
        })
    }
}

/// The answering side: its engine pongs by itself; this only runs the node.
fn answer(
    fabric: &RdsFabric,
    dir: Option<&std::path::Path>,
    local: IpAddr,
    stop: &AtomicBool,
    limit: Option<Duration>,
) -> Result<(), PerfError> {
    let clock = RealClock::new();
    let mut n = node(fabric, dir, local, 2, 4096, 64)?;
    let start = clock.now();
    // Relaxed: a flag; nothing else is ordered by it.
    while !stop.load(Ordering::Relaxed) {
        let now = clock.now();
        n.poll(now);
        while n.engine_mut().poll_event().is_some() {}
        if limit.is_some_and(|l| now.nanos_since(start) > l.as_nanos() as u64) {
            break;
        }
    }
    Ok(())
}

impl Report for PingReport {
    fn to_json(&self) -> serde_json::Value {
        json!({ "rds_ping": {
            "count": self.count,
            "p50_ns": self.p50_ns,
            "p99_ns": self.p99_ns,
            "p999_ns": self.p999_ns,
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if self.served {
            return writeln!(out, "answered pings until the time ran out");
        }
        for (i, r) in self.first.iter().enumerate() {
            writeln!(out, "  {}: {} usec", i + 1, r / 1000)?;
        }
        if self.count > self.first.len() as u64 {
            writeln!(out, "  ... ({} replies in all)", self.count)?;
        }
        writeln!(
            out,
            "{} replies, {} lost; one way (half the round trip): p50 {:.0} ns, p99 {:.0} ns, p99.9 {:.0} ns; round trip p50 {:.2} usec",
            self.count,
            self.lost,
            self.p50_ns,
            self.p99_ns,
            self.p999_ns,
            self.p50_ns * 2.0 / 1000.0
        )
    }

    fn figure(&self) -> Option<Figure> {
        let d = self.dist.clone()?;
        let mut f = Figure::new("dp-perf rds-ping (one way, half the round trip), shm");
        f.percentiles.push(d);
        Some(f)
    }
}
