//! `dp-perf rds-echo`: a byte-exact exchange with an echoing RDS peer, for interop checks
//! against another RDS (the kernel's, in the lab: `scripts/rds-ib-kernel-lab.sh` runs
//! `scripts/kernel-lab/rds_echo_peer.py` on an `AF_RDS` socket).
//!
//! This side sends `-c` messages from `-r ADDR:PORT` to `-s PEER:PEER_PORT`, their sizes
//! cycling through `--sizes` (0 to 1 MiB: fragmentation both ways), at most `-d` of them
//! unanswered; the peer checks each one and sends it back. Message `i` of `n` bytes is a
//! slice of a xorshift32 stream the peer computes the same way ([`pattern`](super::pattern)'s echo
//! stream), so both sides can check every byte and the order: the peer that the
//! `i`-th message it got is message `i`, this side that the `i`-th echo is. Afterwards it
//! waits a second for anything more (a duplicate). Any difference ends the run with the
//! first one found.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Args;
use dataplane::rds::{RdsError, Received, RecvFlags, SendFlags};
use lcore::time::{Clock, RealClock};
use serde_json::json;

use super::pattern::{EchoStream, MAX_MSG, difference};
use super::{RdsFabric, all_counters, node, set_buffers};
use crate::common::Common;
use crate::harness::run_on;
use crate::{PerfError, Report};

/// How long the run listens for more after the last echo.
const QUIET: Duration = Duration::from_secs(1);
/// Default sizes: around the 4 KiB fragment, the 48-byte header, and up to 1 MiB.
const SIZES: &str = "0,1,47,48,100,4095,4096,4097,8192,12289,65535,65536,262144,1048576";

/// `dp-perf rds-echo` options.
#[derive(Debug, Clone, Args)]
pub struct EchoArgs {
    /// This side's address.
    #[arg(short = 'r', value_name = "ADDR")]
    pub local: IpAddr,
    /// The echoing peer's address.
    #[arg(short = 's', value_name = "ADDR")]
    pub peer: IpAddr,
    /// This side's RDS port.
    #[arg(short = 'p', default_value_t = 5001)]
    pub port: u16,
    /// The peer's RDS port.
    #[arg(long, default_value_t = 5001)]
    pub peer_port: u16,
    /// Messages to send (and have echoed).
    #[arg(short = 'c', default_value_t = 42)]
    pub count: u64,
    /// Message sizes in bytes, comma separated, used in turn (each at most 1048576).
    #[arg(long, default_value = SIZES, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Messages sent and not yet echoed, at most.
    #[arg(short = 'd', default_value_t = 4)]
    pub depth: u64,
    /// Seconds the whole exchange may take.
    #[arg(short = 'T', default_value_t = 60)]
    pub timeout: u64,
    /// The provider.
    #[command(flatten)]
    pub fabric: RdsFabric,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct EchoReport {
    /// Messages sent.
    pub sent: u64,
    /// Echoes received, every one byte-exact and in order.
    pub echoed: u64,
    /// Payload bytes sent (as many came back).
    pub bytes: u64,
    /// Seconds from the first send to the last echo.
    pub seconds: f64,
    /// Counters of this side's node that are not zero.
    pub counters: Vec<(&'static str, u64)>,
}

impl EchoArgs {
    fn check(&self) -> Result<(), PerfError> {
        let usage = |m: String| Err(PerfError::Usage(m));
        if let Some(&s) = self.sizes.iter().find(|&&s| s > MAX_MSG) {
            return usage(format!(
                "--sizes: {s} bytes is more than an RDS message can hold (1048576, EMSGSIZE)"
            ));
        }
        if self.sizes.is_empty() || self.count == 0 || self.depth == 0 {
            return usage("--sizes, -c and -d need at least one".into());
        }
        Ok(())
    }

    /// Runs the exchange.
    ///
    /// # Errors
    ///
    /// Bad options; a node that cannot be made; an echo that is missing, late, extra, out
    /// of order or not byte-exact.
    pub fn run(&self, common: &Common) -> Result<EchoReport, PerfError> {
        self.check()?;
        let [ca, _] = common.cpus.as_array();
        run_on(ca, || self.exchange())?
    }

    fn size(&self, i: u64) -> usize {
        self.sizes[(i % self.sizes.len() as u64) as usize]
    }

    fn exchange(&self) -> Result<EchoReport, PerfError> {
        let fail = |m: String| Err(PerfError::Fabric(format!("rds-echo: {m}")));
        let stream = EchoStream::new();
        let clock = RealClock::new();
        let frags = (self.depth as u32 * 2 * 257 + 1024).min(1 << 19);
        let mut n = node(&self.fabric, None, self.local, 3, frags, 16)?;
        let t0 = clock.now();
        let s = n
            .engine_mut()
            .socket()
            .map_err(|e| PerfError::Fabric(format!("RDS socket: {e}")))?;
        self.fabric.set_transport(&mut n, t0, s)?;
        let at = SocketAddr::new(self.local, self.port);
        n.engine_mut()
            .bind(s, at)
            .map_err(|e| PerfError::Fabric(format!("bind {at}: {e}")))?;
        set_buffers(&mut n, t0, s, 16 << 20)?;
        let to = SocketAddr::new(self.peer, self.peer_port);
        let deadline = t0.saturating_add(Duration::from_secs(self.timeout));
        let mut buf = vec![0u8; MAX_MSG + 1];
        let (mut sent, mut echoed, mut bytes) = (0u64, 0u64, 0u64);
        let mut done_at = None;
        loop {
            let now = clock.now();
            n.poll(now);
            while sent < self.count && sent - echoed < self.depth {
                let m = stream.message(sent, self.size(sent));
                match n
                    .engine_mut()
                    .send_to(now, s, Some(to), m, SendFlags::DONTWAIT)
                {
                    Ok(_) => {
                        sent += 1;
                        bytes += m.len() as u64;
                    }
                    Err(RdsError::WouldBlock | RdsError::Congested { .. }) => break,
                    Err(RdsError::NoMemory(_)) => break,
                    Err(e) => return fail(format!("send of message {sent} to {to}: {e}")),
                }
            }
            loop {
                match n
                    .engine_mut()
                    .recv_from(now, s, &mut buf, RecvFlags::DONTWAIT)
                {
                    Ok(Received::Data {
                        len,
                        from,
                        truncated,
                        ..
                    }) => {
                        if from != to {
                            return fail(format!("a message from {from}, expected only {to}"));
                        }
                        if echoed >= self.count {
                            return fail(format!(
                                "an echo more than the {} sent ({len} bytes): a duplicate",
                                self.count
                            ));
                        }
                        if truncated {
                            return fail(format!("echo {echoed} is longer than 1 MiB"));
                        }
                        let want = stream.message(echoed, self.size(echoed));
                        if let Some(d) = difference(&buf[..len], want) {
                            return fail(format!(
                                "echo {echoed} (message of {} bytes): {d}",
                                want.len()
                            ));
                        }
                        echoed += 1;
                        if echoed == self.count {
                            done_at = Some(now);
                        }
                    }
                    Ok(_) => {}
                    Err(RdsError::WouldBlock) => break,
                    Err(e) => return fail(format!("recv: {e}")),
                }
            }
            n.flush(now);
            if let Some(at) = done_at
                && now.nanos_since(at) >= QUIET.as_nanos() as u64
            {
                let mut counters = all_counters(&mut n);
                counters.retain(|c| c.1 != 0);
                return Ok(EchoReport {
                    sent,
                    echoed,
                    bytes,
                    seconds: at.nanos_since(t0) as f64 / 1e9,
                    counters,
                });
            }
            if done_at.is_none() && now > deadline {
                let mut c = all_counters(&mut n);
                c.retain(|c| c.1 != 0);
                let c: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
                return fail(format!(
                    "{echoed} of {} echoes within {} s ({sent} sent); counters: {}",
                    self.count,
                    self.timeout,
                    c.join(" ")
                ));
            }
        }
    }
}

impl Report for EchoReport {
    fn to_json(&self) -> serde_json::Value {
        json!({ "rds_echo": {
            "sent": self.sent,
            "echoed": self.echoed,
            "bytes": self.bytes,
            "seconds": self.seconds,
        }})
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        writeln!(
            out,
            "rds-echo: {} messages ({} payload bytes) sent and echoed back byte-exact, in order, \
             once each, in {:.2} s",
            self.echoed, self.bytes, self.seconds
        )?;
        for (k, v) in &self.counters {
            writeln!(out, "  {k:<32} {v:>12}")?;
        }
        Ok(())
    }
}
