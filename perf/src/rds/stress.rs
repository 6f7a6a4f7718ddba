//! `dp-perf rds-stress`: rds-tools' rds-stress over this RDS.
//!
//! The active side keeps `tasks × depth` requests of `-q` bytes outstanding, spread round
//! robin over `--sockets` sockets (default: one per task) bound to `port+1+k`, each sending
//! to the passive side's socket `k`; the passive side answers each request with an ack of
//! `-a` bytes. With `-o` (one way) nothing is acked by the application: the active side
//! sends as fast as its send buffers and the receiver's congestion allow, and the rate is
//! what the passive side received. Every second a line of rds-stress's columns; then the
//! average. Socket readiness comes from the engine's events, so the loop costs the same
//! with one socket or thousands. As in rds-stress, the socket buffers come to
//! `tasks × depth × (request + ack) × 2` bytes (split over the `--sockets`, each holding at
//! least one request), so `-d` also bounds what a one-way sender keeps queued.
//!
//! `--rdma` (rds-stress's `-D`): the payload moves by RDMA WRITE and the request message
//! (16 bytes) notifies the passive side; see the `rdma` module.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use dataplane::rds::node::RdsNode;
use dataplane::rds::uapi::{RDS_RDMA_NOTIFY_ME, RDS_RDMA_SUCCESS};
use dataplane::rds::{RdsError, RdsSocket, Received, RecvFlags, SendCmsg, SendFlags};
use dp_plot::{Figure, PercentileSeries, SweepPoint, SweepSeries};
use hdrhistogram::Histogram;
use lcore::time::{Clock, Instant, RealClock};
use serde_json::json;

use super::kernel::{self, KernelLoad, Phase};
use super::rdma::{self, HELLO};
use super::{
    PAIR_ACTIVE_TCP, PAIR_PASSIVE_TCP, RdsFabric, RdsTransport, all_counters, node_with_window,
    rendezvous, set_buffers,
};
use crate::common::Common;
use crate::harness::{run_on, run_pair};
use crate::{PerfError, Report};

/// Largest RDS message.
const MAX_MSG: usize = 1 << 20;
/// Bytes of the request header: sequence number and send time.
const REQ_HDR: usize = 16;
/// Unmeasured time after connecting.
const WARMUP: Duration = Duration::from_millis(300);

/// `dp-perf rds-stress` options (rds-stress's names).
#[derive(Debug, Clone, Args)]
pub struct StressArgs {
    /// Run both sides here: two nodes over shm, one per CPU of --cpus.
    #[arg(long)]
    pub pair: bool,
    /// This side's address (rds-stress -r). --pair: 10.80.0.1 (active), 10.80.0.2 (passive).
    #[arg(short = 'r', value_name = "ADDR")]
    pub local: Option<IpAddr>,
    /// The passive side's address; makes this the active side (rds-stress -s).
    #[arg(short = 's', value_name = "ADDR")]
    pub peer: Option<IpAddr>,
    /// Base RDS port: sockets bind port+1, port+2, ...
    #[arg(short = 'p', default_value_t = 4000)]
    pub port: u16,
    /// Request size in bytes (K, M suffixes), at most 1M.
    #[arg(short = 'q', default_value = "1024", value_parser = parse_size)]
    pub req: usize,
    /// Ack size in bytes (at least 16: the request's sequence number and time come back).
    #[arg(short = 'a', default_value = "60", value_parser = parse_size)]
    pub ack: usize,
    /// Tasks: each keeps -d requests outstanding.
    #[arg(short = 't', default_value_t = 1)]
    pub tasks: u32,
    /// Requests each task keeps outstanding.
    #[arg(short = 'd', default_value_t = 1)]
    pub depth: u32,
    /// Seconds to measure (after a short warm-up); --quick makes it 1.
    #[arg(short = 'T', default_value_t = 5)]
    pub seconds: u64,
    /// One way: requests only, no acks; the rate is what the passive side received.
    #[arg(short = 'o')]
    pub one_way: bool,
    /// RDMA mode (rds-stress -D): each request's -q payload moves by RDMA WRITE into a
    /// region the passive side registered for the socket (its cookie comes back in an
    /// RDS_CMSG_RDMA_DEST answer to a hello), and the request message, 16 bytes, carries
    /// the notification. gbps counts the RDMA payload. One way (-o), -d bounds the
    /// operations in flight (each is notified, RDS_RDMA_NOTIFY_ME). The fabric transport
    /// only (RDS-TCP has no RDMA).
    #[arg(long)]
    pub rdma: bool,
    /// Sockets per side on the one lcore the load is spread over (default: --tasks).
    #[arg(long)]
    pub sockets: Option<u32>,
    /// shm rendezvous directory (both processes of a two-process run must give the same).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Run the same load on the kernel's own RDS sockets (AF_RDS, SO_RDS_TRANSPORT
    /// --kernel-transport) instead of this RDS: the reference for ratios. Needs a kernel
    /// with rds_tcp (rds_rdma); --pair then measures the kernel's loopback transport (one
    /// namespace), two processes in two namespaces measure its RDS-TCP, two addresses of
    /// an RDMA device (initial namespace) its RDS-IB.
    #[arg(long)]
    pub kernel: bool,
    /// --kernel: the kernel sockets' SO_RDS_TRANSPORT: tcp (rds_tcp) or ib (rds_rdma).
    #[arg(long, value_enum, default_value_t = RdsTransport::Tcp)]
    pub kernel_transport: RdsTransport,
    /// The provider.
    #[command(flatten)]
    pub fabric: RdsFabric,
}

/// `4096`, `4K`, `1M`: bytes.
fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1024),
        Some((i, 'm' | 'M')) => (&s[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (bytes, or with a K, M or G suffix)"))
}

/// One second of rds-stress's columns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SecRow {
    /// Requests sent per second.
    pub tx: f64,
    /// Requests received (one way) or acks received per second.
    pub rx: f64,
    /// Request and ack bytes sent and received, KiB/s.
    pub kbytes: f64,
    /// Mean microseconds per send call.
    pub tx_us: f64,
    /// Mean request-to-ack round trip, microseconds (0 one way).
    pub rtt_us: f64,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct StressReport {
    /// Requests completed per second: acked, or received one way.
    pub msgs_per_sec: f64,
    /// Request payload Gb/s at that rate.
    pub gbps: f64,
    /// -t.
    pub tasks: u32,
    /// -q.
    pub req_size: usize,
    /// Sockets per side.
    pub sockets: u32,
    /// -d.
    pub depth: u32,
    /// -o.
    pub one_way: bool,
    /// Per-second rows.
    pub rows: Vec<SecRow>,
    /// Round-trip distribution (request/ack mode).
    pub rtt: Option<PercentileSeries>,
    /// Set on a passive side run alone: requests served.
    pub served: Option<u64>,
    /// Sends of the active side that had to wait, while measuring: send buffer full
    /// (`EAGAIN`), destination congested (`ENOBUFS`), message store full (`ENOMEM`).
    pub waits: [u64; 3],
    /// Engine counters that are not zero: (name, active side, passive side).
    pub counters: Vec<(&'static str, u64, u64)>,
    /// Loop iterations while measuring: active side, passive side.
    pub iterations: [u64; 2],
}

/// What the passive side ends with: requests received while measuring, loop iterations
/// while measuring, and its node's counters.
type PassiveResult = (u64, u64, Vec<(&'static str, u64)>);

/// What the two sides share.
struct Shared {
    /// 0 warm-up, 1 measuring, 2 done (written by the active side).
    phase: AtomicU8,
    /// Requests the passive side received (published by it, for per-second rows).
    passive_rx: AtomicU64,
}

const WARM: u8 = 0;
const MEASURE: u8 = 1;
const DONE: u8 = 2;

impl StressArgs {
    fn check(&self) -> Result<u32, PerfError> {
        let usage = |m: String| Err(PerfError::Usage(m));
        if self.req > MAX_MSG || self.ack > MAX_MSG {
            return usage(format!(
                "-q {} / -a {}: RDS messages are at most 1M bytes (EMSGSIZE)",
                self.req, self.ack
            ));
        }
        if !self.one_way && self.ack < REQ_HDR {
            return usage(format!(
                "-a {}: acks carry the request's sequence number and time: at least {REQ_HDR}",
                self.ack
            ));
        }
        if self.tasks == 0 || self.depth == 0 {
            return usage("-t and -d must be at least 1".into());
        }
        let sockets = self.sockets.unwrap_or(self.tasks);
        if sockets == 0 || sockets > 16384 {
            return usage(format!("--sockets {sockets}: 1..=16384"));
        }
        if u32::from(self.port) + sockets > 65535 {
            return usage(format!(
                "-p {} with {sockets} sockets runs past port 65535",
                self.port
            ));
        }
        if self.rdma && (self.kernel || self.fabric.transport == RdsTransport::Tcp) {
            return usage(
                "--rdma needs the fabric transport (RDS-TCP has no RDMA, as in Linux)".into(),
            );
        }
        if self.rdma && self.req == 0 {
            return usage("--rdma moves -q bytes per request: give -q of at least 1".into());
        }
        if self.seconds == 0 {
            return usage(
                "-T 0 (run forever) is not supported: give the seconds to measure".into(),
            );
        }
        self.fabric.check(self.pair)?;
        if !self.pair && self.local.is_none() {
            return usage("give -r ADDR (this side's address), or --pair".into());
        }
        Ok(sockets)
    }

    /// Runs the command.
    ///
    /// # Errors
    ///
    /// Bad options; a node that cannot be made; a transfer that fails.
    pub fn run(&self, common: &Common) -> Result<StressReport, PerfError> {
        let sockets = self.check()?;
        let secs = if common.quick { 1 } else { self.seconds };
        if self.kernel {
            return self.run_kernel(common, sockets, secs);
        }
        let dir = rendezvous(self.dir.as_ref(), self.pair, "rds-stress");
        let shared = Shared {
            phase: AtomicU8::new(WARM),
            passive_rx: AtomicU64::new(0),
        };
        let [ca, cb] = common.cpus.as_array();
        let d = dir.as_deref();
        if self.pair {
            if let Some(d) = d {
                let _ = std::fs::create_dir_all(d);
            }
            let (pa, pp) = self.fabric.pair_addrs();
            let (a, b) = run_pair(
                [ca, cb],
                || self.active(d, pa, pp, sockets, secs, &shared),
                || self.passive(d, pp, sockets, &shared, None),
            )?;
            if let Some(d) = d {
                let _ = std::fs::remove_dir_all(d);
            }
            let (_, piters, pstats) = b?;
            a.map(|mut r| {
                r.iterations[1] = piters;
                for (c, (_, v)) in r.counters.iter_mut().zip(pstats) {
                    c.2 = v;
                }
                r.counters.retain(|c| c.1 != 0 || c.2 != 0);
                r
            })
        } else {
            let local = self.local.expect("checked");
            match self.peer {
                Some(peer) => run_on(ca, || self.active(d, local, peer, sockets, secs, &shared))?,
                None => {
                    let limit = Duration::from_secs(secs + 30);
                    let (served, _, _) =
                        run_on(ca, || self.passive(d, local, sockets, &shared, Some(limit)))??;
                    Ok(StressReport {
                        served: Some(served),
                        ..self.report(sockets, 0.0)
                    })
                }
            }
        }
    }

    /// A report of `rate` requests/s over `sockets` with this run's parameters and nothing
    /// else measured (the callers add what they measured).
    fn report(&self, sockets: u32, rate: f64) -> StressReport {
        StressReport {
            msgs_per_sec: rate,
            gbps: rate * self.req as f64 * 8.0 / 1e9,
            tasks: self.tasks,
            req_size: self.req,
            sockets,
            depth: self.depth,
            one_way: self.one_way,
            rows: Vec::new(),
            rtt: None,
            served: None,
            waits: [0; 3],
            counters: Vec::new(),
            iterations: [0; 2],
        }
    }

    /// `--kernel`: the load on the kernel's AF_RDS sockets.
    fn run_kernel(
        &self,
        common: &Common,
        sockets: u32,
        secs: u64,
    ) -> Result<StressReport, PerfError> {
        let load = KernelLoad {
            port: self.port,
            req: self.req,
            ack: self.ack.max(1),
            inflight: u64::from(self.tasks * self.depth),
            sockets,
            one_way: self.one_way,
            warmup: WARMUP,
            transport: self.kernel_transport.kernel_value(),
        };
        let phase = Phase(AtomicU8::new(WARM));
        let [ca, cb] = common.cpus.as_array();
        let report = |rate: f64, waits: u64, served: Option<u64>| StressReport {
            served,
            waits: [waits, 0, 0],
            ..self.report(sockets, rate)
        };
        if self.pair {
            let (a, b) = run_pair(
                [ca, cb],
                || kernel::active(&load, PAIR_ACTIVE_TCP, PAIR_PASSIVE_TCP, secs, &phase),
                || {
                    kernel::passive(
                        &load,
                        PAIR_PASSIVE_TCP,
                        &phase,
                        Some(Duration::from_secs(secs + 30)),
                    )
                },
            )?;
            b?;
            let (rate, waits) = a?;
            return Ok(report(rate, waits, None));
        }
        let local = self.local.expect("checked");
        match self.peer {
            Some(peer) => {
                let (rate, waits) =
                    run_on(ca, || kernel::active(&load, local, peer, secs, &phase))??;
                Ok(report(rate, waits, None))
            }
            None => {
                let limit = Some(Duration::from_secs(secs + 30));
                let served = run_on(ca, || kernel::passive(&load, local, &phase, limit))??;
                Ok(report(0.0, 0, Some(served)))
            }
        }
    }

    fn bind_all(
        &self,
        n: &mut RdsNode,
        now: Instant,
        addr: IpAddr,
        sockets: u32,
    ) -> Result<(Vec<RdsSocket>, HashMap<u32, usize>), PerfError> {
        let mut socks = Vec::with_capacity(sockets as usize);
        let mut index = HashMap::with_capacity(sockets as usize);
        for k in 0..sockets {
            let e = n.engine_mut();
            let s = e
                .socket()
                .map_err(|e| PerfError::Fabric(format!("RDS socket: {e}")))?;
            let port = self.port + 1 + k as u16;
            self.fabric.set_transport(n, now, s)?;
            let e = n.engine_mut();
            e.bind(s, SocketAddr::new(addr, port))
                .map_err(|e| PerfError::Fabric(format!("bind {addr}:{port}: {e}")))?;
            // rds-stress's sizing: tasks x depth x (request + ack) x 2 for both buffers
            // (RDS counts half of SO_SNDBUF), so the depth bounds what is queued; spread
            // over the sockets (each still holds one request), so that --sockets changes
            // how the load is spread, not how much is queued.
            let per = self.req as u64 + self.ack as u64;
            let bytes =
                (u64::from(self.tasks * self.depth) * per * 2 / u64::from(sockets)).max(per * 2);
            set_buffers(n, now, s, bytes)?;
            index.insert(s.index(), k as usize);
            socks.push(s);
        }
        Ok((socks, index))
    }

    /// The passive side: receive requests, answer each with an ack. Returns the requests
    /// received while measuring.
    fn passive(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        sockets: u32,
        shared: &Shared,
        limit: Option<Duration>,
    ) -> Result<PassiveResult, PerfError> {
        let clock = RealClock::new();
        let frags = frags_for(self.req.max(self.ack), self.tasks * self.depth);
        let win = self
            .rdma
            .then(|| {
                rdma::window(
                    &format!("dp-perf-rdma-{addr}"),
                    sockets as usize,
                    self.req,
                    0,
                )
            })
            .transpose()?;
        let mut n = node_with_window(&self.fabric, dir, addr, 2, frags, sockets, win.clone())?;
        let start = clock.now();
        let (socks, index) = self.bind_all(&mut n, start, addr, sockets)?;
        // --rdma: each socket's region, offered to the active side on its hello.
        let mut cookies = Vec::new();
        if let Some(w) = &win {
            for (k, &s) in socks.iter().enumerate() {
                cookies.push(rdma::register(&mut n, s, w, k, self.req)?);
            }
        }
        let mut ready = Readable::new(sockets as usize);
        let mut buf = vec![0u8; MAX_MSG];
        let mut ack = vec![0u8; self.ack.max(REQ_HDR)];
        // Acks that found the send buffer full: (socket, destination, request header).
        let mut backlog: std::collections::VecDeque<(usize, SocketAddr, [u8; REQ_HDR])> =
            std::collections::VecDeque::new();
        let (mut rx, mut rx_at_start) = (0u64, 0u64);
        let (mut iters, mut iters_at_start) = (0u64, 0u64);
        let mut seen = WARM;
        loop {
            iters += 1;
            let now = clock.now();
            // Relaxed: a flag read each iteration; nothing else is ordered by it.
            let phase = shared.phase.load(Ordering::Relaxed);
            if phase != seen {
                if phase == MEASURE {
                    rx_at_start = rx;
                    iters_at_start = iters;
                }
                if phase == DONE {
                    return Ok((
                        rx - rx_at_start,
                        iters - iters_at_start,
                        all_counters(&mut n),
                    ));
                }
                seen = phase;
            }
            if limit.is_some_and(|l| now.nanos_since(start) > l.as_nanos() as u64) {
                return Ok((
                    rx - rx_at_start,
                    iters - iters_at_start,
                    all_counters(&mut n),
                ));
            }
            n.poll(now);
            ready.take_events(&mut n, &index);
            // Old acks first, in order.
            while let Some(&(k, to, hdr)) = backlog.front() {
                ack[..REQ_HDR].copy_from_slice(&hdr);
                match n
                    .engine_mut()
                    .send_to(now, socks[k], Some(to), &ack, SendFlags::DONTWAIT)
                {
                    Ok(_) => {
                        backlog.pop_front();
                    }
                    Err(e) if blocked(e) => break,
                    Err(e) => return Err(PerfError::Fabric(format!("ack send: {e}"))),
                }
            }
            while let Some(k) = ready.next() {
                let s = socks[k];
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data { len, from, .. }) => {
                            if self.rdma && len >= 8 && buf[..8] == HELLO.to_le_bytes() {
                                // Offer the socket's region; a hello that finds the send
                                // buffer full is sent again by the active side.
                                let cm = [SendCmsg::RdmaDest(cookies[k])];
                                match n.engine_mut().send_msg(
                                    now,
                                    s,
                                    Some(from),
                                    &HELLO.to_le_bytes(),
                                    &cm,
                                    SendFlags::DONTWAIT,
                                ) {
                                    Ok(_) => {}
                                    Err(e) if blocked(e) => {}
                                    Err(e) => {
                                        return Err(PerfError::Fabric(format!(
                                            "RDMA_DEST answer: {e}"
                                        )));
                                    }
                                }
                                continue;
                            }
                            rx += 1;
                            if self.one_way {
                                continue;
                            }
                            let mut hdr = [0u8; REQ_HDR];
                            let h = len.min(REQ_HDR);
                            hdr[..h].copy_from_slice(&buf[..h]);
                            ack[..REQ_HDR].copy_from_slice(&hdr);
                            if !backlog.is_empty() {
                                backlog.push_back((k, from, hdr));
                                continue;
                            }
                            match n.engine_mut().send_to(
                                now,
                                s,
                                Some(from),
                                &ack,
                                SendFlags::DONTWAIT,
                            ) {
                                Ok(_) => {}
                                Err(e) if blocked(e) => backlog.push_back((k, from, hdr)),
                                Err(e) => {
                                    return Err(PerfError::Fabric(format!("ack send: {e}")));
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            n.flush(now);
            // Relaxed: a statistic the active side samples once a second.
            shared.passive_rx.store(rx, Ordering::Relaxed);
        }
    }

    /// The active side.
    fn active(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        peer: IpAddr,
        sockets: u32,
        secs: u64,
        shared: &Shared,
    ) -> Result<StressReport, PerfError> {
        let r = self.active_inner(dir, addr, peer, sockets, secs, shared);
        // Relaxed: the passive side only needs to see it eventually.
        shared.phase.store(DONE, Ordering::Relaxed);
        r
    }

    fn active_inner(
        &self,
        dir: Option<&std::path::Path>,
        addr: IpAddr,
        peer: IpAddr,
        sockets: u32,
        secs: u64,
        shared: &Shared,
    ) -> Result<StressReport, PerfError> {
        let clock = RealClock::new();
        let inflight_max = u64::from(self.tasks * self.depth);
        let frags = frags_for(self.req.max(self.ack), self.tasks * self.depth);
        let win = self
            .rdma
            .then(|| rdma::window(&format!("dp-perf-rdma-{addr}"), 1, self.req, 0xa5))
            .transpose()?;
        let mut n = node_with_window(&self.fabric, dir, addr, 1, frags, sockets, win.clone())?;
        let t0 = clock.now();
        // --rdma: the passive side's cookie per socket, asked for with hellos.
        let mut cookies: Vec<Option<u64>> = vec![None; sockets as usize];
        let mut missing = if self.rdma { sockets as usize } else { 0 };
        let mut next_hello = t0;
        let rdma_flags = if self.one_way { RDS_RDMA_NOTIFY_ME } else { 0 };
        let (socks, index) = self.bind_all(&mut n, t0, addr, sockets)?;
        let dests: Vec<SocketAddr> = (0..sockets)
            .map(|k| SocketAddr::new(peer, self.port + 1 + k as u16))
            .collect();
        let mut ready = Readable::new(sockets as usize);
        let mut req = vec![0xa5u8; self.req];
        let mut buf = vec![0u8; MAX_MSG];
        let mut hist = Histogram::<u64>::new(3).map_err(|e| PerfError::Fabric(e.to_string()))?;
        let (mut tx, mut rx, mut inflight, mut seq) = (0u64, 0u64, 0u64, 0u64);
        let (mut send_ns, mut sends) = (0u64, 0u64);
        let mut rtt_sum = 0u64;
        let mut rr = 0usize;
        let mut waits = [0u64; 3];
        let mut rows = Vec::new();
        let mut measure_start: Option<(Instant, u64, u64)> = None;
        let mut tick = (t0, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
        let connect_deadline = t0.saturating_add(Duration::from_secs(10));
        let mut connected = false;
        let (mut iters, mut iters0) = (0u64, 0u64);
        loop {
            iters += 1;
            let now = clock.now();
            n.poll(now);
            ready.take_events(&mut n, &index);
            while let Some(k) = ready.next() {
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, socks[k], &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data {
                            rdma_dest: Some(c), ..
                        }) if self.rdma => {
                            if cookies[k].replace(c).is_none() {
                                missing -= 1;
                            }
                        }
                        Ok(Received::RdmaStatus(st)) if self.rdma => {
                            if st.status != RDS_RDMA_SUCCESS {
                                return Err(PerfError::Fabric(format!(
                                    "RDMA operation {} failed: RDS_RDMA status {}",
                                    st.user_token, st.status
                                )));
                            }
                            inflight = inflight.saturating_sub(1);
                            // One way by RDMA, the notifications count the requests done
                            // (so a two-process run measures it too).
                            rx += 1;
                        }
                        Ok(Received::Data { len, .. }) if len >= REQ_HDR => {
                            rx += 1;
                            inflight = inflight.saturating_sub(1);
                            let sent = u64::from_le_bytes(buf[8..16].try_into().expect("8"));
                            let rtt = now.as_nanos().saturating_sub(sent);
                            rtt_sum += rtt;
                            if measure_start.is_some() {
                                let _ = hist.record(rtt.max(1));
                            }
                        }
                        Ok(_) => {}
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            if missing > 0 && now >= next_hello {
                // --rdma: ask each socket's peer for its region (again until answered).
                next_hello = now.saturating_add(Duration::from_millis(50));
                for (k, c) in cookies.iter().enumerate() {
                    if c.is_none() {
                        let hello = [HELLO.to_le_bytes(), [0; 8]].concat();
                        match n.engine_mut().send_to(
                            now,
                            socks[k],
                            Some(dests[k]),
                            &hello,
                            SendFlags::DONTWAIT,
                        ) {
                            Ok(_) => {}
                            Err(e) if blocked(e) => {}
                            Err(e) => return Err(PerfError::Fabric(format!("hello: {e}"))),
                        }
                    }
                }
            }
            // Issue requests up to the window (one way: until the sockets push back; one
            // way by RDMA: up to the window of notified operations).
            let t_send = clock.now();
            let mut issued = 0u64;
            while missing == 0 && ((self.one_way && !self.rdma) || inflight < inflight_max) {
                let k = rr;
                let mut hdr = [0u8; REQ_HDR];
                hdr[..8].copy_from_slice(&seq.to_le_bytes());
                hdr[8..16].copy_from_slice(&t_send.as_nanos().to_le_bytes());
                if self.req >= REQ_HDR {
                    req[..REQ_HDR].copy_from_slice(&hdr);
                }
                let sent = match (&win, cookies[k]) {
                    (Some(w), Some(c)) => n.engine_mut().send_msg(
                        t_send,
                        socks[k],
                        Some(dests[k]),
                        &hdr,
                        &[rdma::write_args(w, self.req, c, seq, rdma_flags)],
                        SendFlags::DONTWAIT,
                    ),
                    _ => n.engine_mut().send_to(
                        t_send,
                        socks[k],
                        Some(dests[k]),
                        &req,
                        SendFlags::DONTWAIT,
                    ),
                };
                match sent {
                    Ok(_) => {
                        seq += 1;
                        tx += 1;
                        inflight += 1;
                        issued += 1;
                        rr = if rr + 1 == socks.len() { 0 } else { rr + 1 };
                    }
                    Err(e) if blocked(e) => {
                        if measure_start.is_some() {
                            waits[match e {
                                RdsError::WouldBlock => 0,
                                RdsError::Congested { .. } => 1,
                                _ => 2,
                            }] += 1;
                        }
                        break;
                    }
                    Err(e) => return Err(PerfError::Fabric(format!("send: {e}"))),
                }
            }
            if issued > 0 {
                send_ns += clock.now().nanos_since(t_send);
                sends += issued;
            }
            n.flush(now);
            // Warm-up ends once the first answer came back (the connection is up).
            let answered = if self.passive_counts() {
                // Relaxed: a statistic.
                shared.passive_rx.load(Ordering::Relaxed) > 0
            } else {
                rx > 0
            };
            if !connected {
                if answered {
                    connected = true;
                    tick.0 = now;
                } else if now > connect_deadline {
                    return Err(PerfError::Fabric(format!(
                        "no answer from {peer} within 10 s: is the passive side running (same --dir)?"
                    )));
                }
                continue;
            }
            let since_connect = now.nanos_since(tick.0.min(now));
            if measure_start.is_none() && since_connect >= WARMUP.as_nanos() as u64 {
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                measure_start = Some((now, rx, prx));
                iters0 = iters;
                tick = (now, tx, rx, prx, send_ns, sends, rtt_sum);
                // Relaxed: see `active`.
                shared.phase.store(MEASURE, Ordering::Relaxed);
            }
            let Some((m0, rx0, prx0)) = measure_start else {
                continue;
            };
            let el = now.nanos_since(tick.0);
            if el >= 1_000_000_000 {
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                rows.push(self.row(&tick, &(now, tx, rx, prx, send_ns, sends, rtt_sum)));
                tick = (now, tx, rx, prx, send_ns, sends, rtt_sum);
            }
            let total = now.nanos_since(m0);
            if total >= secs * 1_000_000_000 {
                let s = total as f64 / 1e9;
                let prx = shared.passive_rx.load(Ordering::Relaxed);
                let done = if self.passive_counts() {
                    prx - prx0
                } else {
                    rx - rx0
                };
                let rate = done as f64 / s;
                let rtt = (!self.one_way)
                    .then(|| PercentileSeries::from_histogram("round trip", &hist, 1.0))
                    .flatten();
                return Ok(StressReport {
                    rows,
                    rtt,
                    waits,
                    counters: all_counters(&mut n)
                        .into_iter()
                        .map(|(k, v)| (k, v, 0))
                        .collect(),
                    iterations: [iters - iters0, 0],
                    ..self.report(sockets, rate)
                });
            }
        }
    }

    /// Whether the passive side's count is the rate (one way without RDMA: nothing comes
    /// back to the active side; one way by RDMA, the notifications do).
    fn passive_counts(&self) -> bool {
        self.one_way && !self.rdma
    }

    /// One per-second row from two counter snapshots
    /// (time, tx, rx, passive rx, send ns, sends, rtt sum).
    fn row(
        &self,
        a: &(Instant, u64, u64, u64, u64, u64, u64),
        b: &(Instant, u64, u64, u64, u64, u64, u64),
    ) -> SecRow {
        let s = b.0.nanos_since(a.0).max(1) as f64 / 1e9;
        let tx = (b.1 - a.1) as f64;
        let rx = if self.passive_counts() {
            (b.3 - a.3) as f64
        } else {
            (b.2 - a.2) as f64
        };
        let bytes = if self.one_way {
            tx * self.req as f64
        } else {
            tx * self.req as f64 + rx * self.ack as f64
        };
        let sends = (b.5 - a.5).max(1) as f64;
        SecRow {
            tx: tx / s,
            rx: rx / s,
            kbytes: bytes / 1024.0 / s,
            tx_us: (b.4 - a.4) as f64 / sends / 1000.0,
            rtt_us: if self.one_way || rx == 0.0 {
                0.0
            } else {
                (b.6 - a.6) as f64 / rx / 1000.0
            },
        }
    }
}

/// Fragments for `inflight` messages of `size` bytes each way, with room to spare.
fn frags_for(size: usize, inflight: u32) -> u32 {
    let per = size.div_ceil(4096).max(1) as u64;
    (per * u64::from(inflight) * 4 + 8192).min(1 << 19) as u32
}

/// A send that must wait: the send buffer is full (`EAGAIN`), the destination is
/// congested (`ENOBUFS`) or the message store is full (`ENOMEM`).
fn blocked(e: RdsError) -> bool {
    matches!(
        e,
        RdsError::WouldBlock | RdsError::Congested { .. } | RdsError::NoMemory(_)
    )
}

/// The sockets that became readable, from the engine's readiness events (each once).
struct Readable {
    queue: std::collections::VecDeque<usize>,
    queued: Vec<bool>,
}

impl Readable {
    fn new(n: usize) -> Self {
        Self {
            queue: std::collections::VecDeque::with_capacity(n),
            queued: vec![false; n],
        }
    }

    fn take_events(&mut self, n: &mut RdsNode, index: &HashMap<u32, usize>) {
        while let Some(ev) = n.engine_mut().poll_event() {
            if !ev.ready.readable() {
                continue;
            }
            if let Some(&k) = index.get(&ev.sock.index())
                && !self.queued[k]
            {
                self.queued[k] = true;
                self.queue.push_back(k);
            }
        }
    }

    fn next(&mut self) -> Option<usize> {
        let k = self.queue.pop_front()?;
        self.queued[k] = false;
        Some(k)
    }
}

impl StressReport {
    /// Seconds measured (from the per-second rows, at least 1).
    fn seconds(&self) -> f64 {
        (self.rows.len() as f64).max(1.0)
    }
}

impl Report for StressReport {
    fn to_json(&self) -> serde_json::Value {
        json!({ "rds_stress": {
            "msgs_per_sec": self.msgs_per_sec,
            "gbps": self.gbps,
            "tasks": self.tasks,
            "req_size": self.req_size,
            "sockets": self.sockets,
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(out, "passive side: {n} requests received while measured");
        }
        writeln!(
            out,
            "{:>4} {:>10} {:>10} {:>11} {:>9} {:>9} {:>8} {:>8} {:>6}",
            "tsks", "tx/s", "rx/s", "tx+rx K/s", "mbi K/s", "mbo K/s", "tx us/c", "rtt us", "cpu %"
        )?;
        let line = |out: &mut dyn io::Write, r: &SecRow, tail: &str| {
            writeln!(
                out,
                "{:>4} {:>10.0} {:>10.0} {:>11.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>6.2}{tail}",
                self.tasks, r.tx, r.rx, r.kbytes, 0.0, 0.0, r.tx_us, r.rtt_us, -1.0
            )
        };
        for r in &self.rows {
            line(out, r, "")?;
        }
        if !self.rows.is_empty() {
            let n = self.rows.len() as f64;
            let mut avg = SecRow::default();
            for r in &self.rows {
                avg.tx += r.tx / n;
                avg.rx += r.rx / n;
                avg.kbytes += r.kbytes / n;
                avg.tx_us += r.tx_us / n;
                avg.rtt_us += r.rtt_us / n;
            }
            line(out, &avg, " (average)")?;
        }
        writeln!(
            out,
            "{:.0} msgs/s ({:.3} Gb/s of {}-byte requests), {} task(s) x depth {}, {} socket(s) per side{}",
            self.msgs_per_sec,
            self.gbps,
            self.req_size,
            self.tasks,
            self.depth,
            self.sockets,
            if self.one_way { ", one way" } else { "" }
        )?;
        writeln!(
            out,
            "sends that waited: {} send buffer full (EAGAIN), {} congested (ENOBUFS), {} store full (ENOMEM)",
            self.waits[0], self.waits[1], self.waits[2]
        )?;
        writeln!(
            out,
            "loop iterations/s: active {:.0}, passive {:.0}",
            self.iterations[0] as f64 / self.seconds(),
            self.iterations[1] as f64 / self.seconds()
        )?;
        if !self.counters.is_empty() {
            writeln!(out, "{:<32} {:>14} {:>14}", "counter", "active", "passive")?;
            for (k, a, p) in &self.counters {
                writeln!(out, "{k:<32} {a:>14} {p:>14}")?;
            }
        }
        Ok(())
    }

    fn figure(&self) -> Option<Figure> {
        if self.served.is_some() {
            return None;
        }
        let mut f = Figure::new(format!(
            "dp-perf rds-stress -q {} -t {} -d {}{}, {} socket(s), shm",
            self.req_size,
            self.tasks,
            self.depth,
            if self.one_way { " -o" } else { "" },
            self.sockets
        ));
        match &self.rtt {
            Some(d) => f.percentiles.push(d.clone()),
            None => f.sweep.push(SweepSeries {
                label: "rds-stress".into(),
                points: vec![SweepPoint {
                    bytes: self.req_size as u64,
                    gbps: Some(self.gbps),
                    lat_ns: None,
                }],
            }),
        }
        Some(f)
    }
}
