//! `dp-perf rds-check`: does every message arrive once, in order, byte-exact?
//!
//! One side sends (`--send -r ADDR -s PEER`), the other receives (`--recv -r ADDR`): a run
//! of `-n` messages whose sizes and bytes both sides derive from `(-n, --seed)` (see
//! [`pattern`]: 0 B, 1 B, 47, 48, 4095..4097, 65535, 65536, 1 MiB, then
//! random sizes up to 1 MiB), sent from `--sockets` sockets (ports `-p`+1.., message `j`
//! from socket `j % sockets`) to the receiver's one socket on port `-p`. The receiver
//! identifies each message by its number and pattern and counts what came intact, twice,
//! late (after a later one of the same sender socket) and wrong; once every message came
//! (or nothing came for `--idle` seconds) it answers each sender socket with a 4-byte
//! `DONE`, and the sender, which waits for it, ends. So a run ends only when the receiving
//! application has everything, not when the sender's transport let go of it.
//!
//! `--stall-after K --stall-secs S` makes the receiver stop reading for S seconds after K
//! messages (its node keeps running): the sender must see congestion (`ENOBUFS` from
//! the destination's congestion map, or `EAGAIN` from its own send buffer) and nothing may
//! be lost. The sender counts the sends that waited, by reason.
//!
//! `scripts/rds-check-kernel.py` is the same program over the kernel's `AF_RDS` sockets,
//! with the same `--json` shape, so every combination of our RDS and the kernel's runs the
//! same check (`scripts/rds-kernel-lab.sh`).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dataplane::rds::node::RdsNode;
use dataplane::rds::tcp::TcpTransport;
use dataplane::rds::{RdsError, RdsSocket, Received, RecvFlags, SendFlags, TransportKind};
use lcore::time::{Clock, Instant, RealClock};
use serde_json::json;

use super::progress::Progress;

use super::pattern::{self, Checker, MAX_MSG, Tally};
use super::{RdsFabric, node, set_buffers};
use crate::common::Common;
use crate::harness::run_on;
use crate::{PerfError, Report};

/// What the receiver answers when it is done.
const DONE: &[u8; 4] = b"DONE";
/// Idle loop iterations before the loop naps (a lab VM has few CPUs).
const SPIN: u32 = 2000;

/// `dp-perf rds-check` options.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Send the run to -s PEER.
    #[arg(long, conflicts_with = "recv", required_unless_present = "recv")]
    pub send: bool,
    /// Receive a run and check it.
    #[arg(long)]
    pub recv: bool,
    /// This side's address.
    #[arg(short = 'r', value_name = "ADDR")]
    pub local: IpAddr,
    /// The receiver's address (--send).
    #[arg(short = 's', value_name = "ADDR")]
    pub peer: Option<IpAddr>,
    /// The receiver's RDS port; sender sockets bind port+1, port+2, ...
    #[arg(short = 'p', default_value_t = 4000)]
    pub port: u16,
    /// Messages in the run (both sides must give the same).
    #[arg(short = 'n', default_value_t = 400)]
    pub count: u64,
    /// Seed of the random sizes (both sides must give the same).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sender sockets (each its own RDS port, so with mprds each hashes to its path).
    #[arg(long, default_value_t = 1)]
    pub sockets: u16,
    /// Receiver: stop reading after this many messages ...
    #[arg(long, value_name = "K")]
    pub stall_after: Option<u64>,
    /// ... for this many seconds (the node keeps running).
    #[arg(long, default_value_t = 3)]
    pub stall_secs: u64,
    /// Socket buffers (SO_SNDBUF/SO_RCVBUF), bytes: what a stalled receiver holds before
    /// its port is congested.
    #[arg(long, default_value_t = 4 << 20)]
    pub sockbuf: u32,
    /// Receiver: give up after this many seconds with nothing new.
    #[arg(long, default_value_t = 20)]
    pub idle: u64,
    /// Either side: give up after this many seconds in all.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Append a progress line to FILE twice a second (the count so far, each RDS-TCP
    /// path's state, every non-zero counter): to read a stalled run afterwards.
    #[arg(long, value_name = "FILE")]
    pub progress: Option<PathBuf>,
    /// shm rendezvous directory (--transport ib over shm, both sides the same).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The transport.
    #[command(flatten)]
    pub fabric: RdsFabric,
}

/// The result of one side.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckReport {
    /// "send" or "recv".
    pub role: &'static str,
    /// Messages in the run.
    pub count: u64,
    /// Sender: messages handed to RDS.
    pub sent: u64,
    /// Receiver: what arrived.
    pub tally: Tally,
    /// Receiver: messages that never came.
    pub missing: u64,
    /// Sender: sends that waited because the destination port was congested (`ENOBUFS`).
    pub enobufs: u64,
    /// Sender: sends that waited for send buffer space (`EAGAIN`).
    pub eagain: u64,
    /// Sender: sends that waited for message memory (`ENOMEM`).
    pub enomem: u64,
    /// Sender: the receiver said DONE.
    pub done: bool,
    /// Receiver: seconds it stalled.
    pub stalled_secs: f64,
    /// Seconds from the first message to the end.
    pub seconds: f64,
    /// Paths negotiated with the peer (RDS-TCP; 0 before negotiation or single path).
    pub npaths: u8,
    /// RDS-TCP paths with a live connection at the end: (index, bytes written, bytes read).
    pub paths: Vec<(u8, u64, u64)>,
    /// RDS-TCP connections that ended under the run (`tcp_conn_lost`: reset, end of
    /// stream or error; each path was reconnected and its unacked messages resent).
    pub conn_lost: u64,
}

impl CheckArgs {
    fn check(&self) -> Result<(), PerfError> {
        let usage = |m: &str| Err(PerfError::Usage(m.into()));
        if self.send && self.peer.is_none() {
            return usage("--send needs -s ADDR: the receiver's address");
        }
        if self.count == 0 {
            return usage("-n 0: give the number of messages of the run (at least 1)");
        }
        if self.sockets == 0 || u32::from(self.port) + u32::from(self.sockets) > 65535 {
            return usage("--sockets: at least 1, and -p + --sockets at most 65535");
        }
        Ok(())
    }

    /// Runs the command.
    ///
    /// # Errors
    ///
    /// Bad options; a node that cannot be made; a socket call that fails for a reason
    /// other than back-pressure. A run with losses is not an error: the report says so.
    pub fn run(&self, common: &Common) -> Result<CheckReport, PerfError> {
        self.check()?;
        let [ca, _] = common.cpus.as_array();
        if self.send {
            run_on(ca, || self.sender())?
        } else {
            run_on(ca, || self.receiver())?
        }
    }

    fn node_and_socks(
        &self,
        n_socks: u16,
        base: u16,
    ) -> Result<(RdsNode, Vec<RdsSocket>), PerfError> {
        let frags = ((self.sockbuf as usize / 4096) * 2 + 2048).max(4096) as u32;
        let mut n = node(
            &self.fabric,
            self.dir.as_deref(),
            self.local,
            self.seed ^ u64::from(self.send),
            frags,
            u32::from(n_socks),
        )?;
        let now = RealClock::new().now();
        let mut socks = Vec::new();
        for k in 0..n_socks {
            let s = n
                .engine_mut()
                .socket()
                .map_err(|e| PerfError::Fabric(format!("RDS socket: {e}")))?;
            self.fabric.set_transport(&mut n, now, s)?;
            let at = SocketAddr::new(self.local, base + k);
            n.engine_mut()
                .bind(s, at)
                .map_err(|e| PerfError::Fabric(format!("bind {at}: {e}")))?;
            set_buffers(&mut n, now, s, u64::from(self.sockbuf))?;
            socks.push(s);
        }
        Ok((n, socks))
    }

    fn progress(&self, t0: Instant) -> Result<Progress, PerfError> {
        Progress::open(self.progress.as_deref(), t0).map_err(|e| {
            PerfError::Usage(format!(
                "--progress {}: {e} (give a file in a writable directory)",
                self.progress
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ))
        })
    }

    fn report(&self, role: &'static str, n: &mut RdsNode) -> CheckReport {
        let npaths = n
            .engine()
            .connections()
            .filter(|(_, k, _)| k.transport == TransportKind::Tcp)
            .map(|(_, _, p)| p)
            .max()
            .unwrap_or(0);
        let paths = n
            .transport_mut(TransportKind::Tcp)
            .and_then(|t| t.as_any())
            .and_then(|a| a.downcast_ref::<TcpTransport>())
            .map(|t| {
                let mut v: Vec<_> = t.path_bytes().map(|(p, w, r)| (p.index, w, r)).collect();
                v.sort_unstable();
                v
            })
            .unwrap_or_default();
        let mut conn_lost = 0;
        if let Some(t) = n.transport_mut(TransportKind::Tcp) {
            t.counters(&mut |k, v| {
                if k == "tcp_conn_lost" {
                    conn_lost = v;
                }
            });
        }
        CheckReport {
            role,
            count: self.count,
            sent: 0,
            tally: Tally::default(),
            missing: 0,
            enobufs: 0,
            eagain: 0,
            enomem: 0,
            done: false,
            stalled_secs: 0.0,
            seconds: 0.0,
            npaths,
            paths,
            conn_lost,
        }
    }

    fn sender(&self) -> Result<CheckReport, PerfError> {
        let clock = RealClock::new();
        let (mut n, socks) = self.node_and_socks(self.sockets, self.port + 1)?;
        let dest = SocketAddr::new(self.peer.expect("checked"), self.port);
        let sizes = pattern::schedule(self.count, self.seed);
        let mut buf = vec![0u8; MAX_MSG];
        let mut built = None;
        let (mut next, mut waits, mut done) = (0u64, [0u64; 3], false);
        let t0 = clock.now();
        let deadline = t0.saturating_add(Duration::from_secs(self.timeout));
        let mut idle = 0u32;
        let mut progress = self.progress(t0)?;
        while !done && clock.now() < deadline {
            let now = clock.now();
            let mut work = n.poll(now);
            progress.tick(now, "sent", next, &mut n, false);
            while next < self.count {
                let j = next;
                let len = sizes[j as usize];
                if built != Some(j) {
                    pattern::fill(j, &mut buf[..len]);
                    built = Some(j);
                }
                let s = socks[(j % u64::from(self.sockets)) as usize];
                match n
                    .engine_mut()
                    .send_to(now, s, Some(dest), &buf[..len], SendFlags::DONTWAIT)
                {
                    Ok(_) => {
                        next += 1;
                        work += 1;
                    }
                    Err(
                        e @ (RdsError::WouldBlock
                        | RdsError::Congested { .. }
                        | RdsError::NoMemory(_)),
                    ) => {
                        waits[match e {
                            RdsError::Congested { .. } => 0,
                            RdsError::WouldBlock => 1,
                            _ => 2,
                        }] += 1;
                        break;
                    }
                    Err(e) => {
                        return Err(PerfError::Fabric(format!(
                            "send of message {j} ({len} B): {e}"
                        )));
                    }
                }
            }
            work += n.flush(now);
            for &s in &socks {
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data { len, .. }) => {
                            work += 1;
                            built = None;
                            done |= len == DONE.len() && buf[..len] == DONE[..];
                        }
                        Ok(_) => work += 1,
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            nap(&mut idle, work);
        }
        progress.tick(clock.now(), "sent", next, &mut n, true);
        let mut r = self.report("send", &mut n);
        r.sent = next;
        r.enobufs = waits[0];
        r.eagain = waits[1];
        r.enomem = waits[2];
        r.done = done;
        r.seconds = clock.now().nanos_since(t0) as f64 / 1e9;
        Ok(r)
    }

    fn receiver(&self) -> Result<CheckReport, PerfError> {
        let clock = RealClock::new();
        let (mut n, socks) = self.node_and_socks(1, self.port)?;
        let s = socks[0];
        let mut check = Checker::new(self.count, self.seed);
        let mut buf = vec![0u8; MAX_MSG];
        let mut senders: Vec<SocketAddr> = Vec::new();
        let t0 = clock.now();
        let deadline = t0.saturating_add(Duration::from_secs(self.timeout));
        let idle_limit = Duration::from_secs(self.idle).as_nanos() as u64;
        let (mut first, mut last) = (None::<Instant>, t0);
        let mut stall: Option<(Instant, Instant)> = None;
        let mut idle = 0u32;
        let mut progress = self.progress(t0)?;
        loop {
            let now = clock.now();
            let mut work = n.poll(now);
            progress.tick(now, "received", check.tally().received, &mut n, false);
            let heard = first.is_some();
            if check.complete() || now >= deadline || (heard && now.nanos_since(last) > idle_limit)
            {
                break;
            }
            let stalled = match (stall, self.stall_after) {
                (None, Some(k)) if check.tally().received >= k => {
                    let until = now.saturating_add(Duration::from_secs(self.stall_secs));
                    stall = Some((now, until));
                    true
                }
                (Some((_, until)), _) => now < until,
                _ => false,
            };
            if stalled {
                last = now;
            } else {
                loop {
                    match n
                        .engine_mut()
                        .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                    {
                        Ok(Received::Data { len, from, .. }) => {
                            work += 1;
                            first.get_or_insert(now);
                            last = now;
                            if !senders.contains(&from) {
                                senders.push(from);
                            }
                            let bad = check.tally().corrupt;
                            check.take(from.port(), &buf[..len]);
                            if check.tally().corrupt > bad && bad < 5 {
                                let h = &buf[..len.min(16)];
                                eprintln!(
                                    "rds-check: message {} from {from} is none of the run's: \
                                     {len} bytes, starting {h:02x?}",
                                    check.tally().received + check.tally().corrupt
                                );
                            }
                        }
                        Ok(_) => work += 1,
                        Err(RdsError::WouldBlock) => break,
                        Err(e) => return Err(PerfError::Fabric(format!("recv: {e}"))),
                    }
                }
            }
            work += n.flush(now);
            nap(&mut idle, work);
        }
        let end = clock.now();
        progress.tick(end, "received", check.tally().received, &mut n, true);
        let mut r = self.report("recv", &mut n);
        // DONE to every sender socket, then a moment for it to leave.
        let mut left = senders.clone();
        let linger = end.saturating_add(Duration::from_secs(2));
        while clock.now() < linger {
            let now = clock.now();
            n.poll(now);
            left.retain(|&to| {
                n.engine_mut()
                    .send_to(now, s, Some(to), DONE, SendFlags::DONTWAIT)
                    .is_err()
            });
            n.flush(now);
            if left.is_empty() && now.nanos_since(end) > 500_000_000 {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        r.tally = check.tally().clone();
        r.missing = check.missing();
        r.stalled_secs = stall.map_or(0.0, |(a, b)| b.nanos_since(a) as f64 / 1e9);
        r.seconds = first.map_or(0.0, |f| end.nanos_since(f) as f64 / 1e9);
        Ok(r)
    }
}

/// After `SPIN` idle iterations, sleep a little per iteration (a lab VM has few CPUs and
/// the other side may share this one).
fn nap(idle: &mut u32, work: usize) {
    if work > 0 {
        *idle = 0;
    } else if *idle >= SPIN {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        *idle += 1;
    }
}

impl CheckReport {
    /// True if the run is whole: the receiver has every message once, in order, intact;
    /// the sender sent them all and heard DONE.
    pub fn ok(&self) -> bool {
        match self.role {
            "send" => self.done && self.sent == self.count,
            _ => {
                self.missing == 0
                    && self.tally.duplicated == 0
                    && self.tally.out_of_order == 0
                    && self.tally.corrupt == 0
            }
        }
    }
}

impl Report for CheckReport {
    fn to_json(&self) -> serde_json::Value {
        let t = &self.tally;
        json!({ "rds_check": {
            "role": self.role,
            "ok": self.ok(),
            "count": self.count,
            "sent": self.sent,
            "received": t.received,
            "missing": self.missing,
            "duplicated": t.duplicated,
            "out_of_order": t.out_of_order,
            "corrupt": t.corrupt,
            "bytes": t.bytes,
            "enobufs": self.enobufs,
            "eagain": self.eagain,
            "enomem": self.enomem,
            "done": self.done,
            "stalled_secs": self.stalled_secs,
            "seconds": self.seconds,
            "npaths": self.npaths,
            "conn_lost": self.conn_lost,
            "paths": self.paths.iter().map(|&(i, w, r)| json!({"index": i, "tx_bytes": w, "rx_bytes": r})).collect::<Vec<_>>(),
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let t = &self.tally;
        if self.role == "send" {
            writeln!(
                out,
                "sent {} of {} messages in {:.2} s; receiver said DONE: {}; sends that waited: \
                 {} congested (ENOBUFS), {} send buffer full (EAGAIN), {} no memory (ENOMEM)",
                self.sent,
                self.count,
                self.seconds,
                self.done,
                self.enobufs,
                self.eagain,
                self.enomem
            )?;
        } else {
            writeln!(
                out,
                "received {} of {} messages ({} bytes) in {:.2} s: missing {}, duplicated {}, \
                 out of order {}, corrupt {}{}",
                t.received,
                self.count,
                t.bytes,
                self.seconds,
                self.missing,
                t.duplicated,
                t.out_of_order,
                t.corrupt,
                if self.stalled_secs > 0.0 {
                    format!("; stalled {:.1} s", self.stalled_secs)
                } else {
                    String::new()
                }
            )?;
        }
        if !self.paths.is_empty() {
            writeln!(
                out,
                "RDS-TCP paths (negotiated {}; connections lost under the run: {}):",
                self.npaths, self.conn_lost
            )?;
            for (i, w, r) in &self.paths {
                writeln!(out, "  path {i}: {w} bytes written, {r} bytes read")?;
            }
        }
        writeln!(
            out,
            "{}",
            if self.ok() {
                "result: OK"
            } else {
                "result: FAILED"
            }
        )
    }
}
