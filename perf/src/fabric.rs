//! perftest-style fabric benchmarks: `write-lat`, `write-bw`, `send-lat`, `send-bw`,
//! `read-lat`, `read-bw`, over any fabric provider.
//!
//! Conventions follow perftest (`ib_write_lat` and friends), so numbers can be read side by
//! side with its output on the same device:
//!
//! * **Latency** tests ping-pong one message at a time and report, per size, `t_min`,
//!   `t_max`, `t_typical` (the median), `t_avg`, `t_stdev`, 99% and 99.9%, from an
//!   hdrhistogram of per-iteration samples. WRITE and SEND latency is **half the round
//!   trip** (one way), as perftest prints it; READ latency is the **full** time of one
//!   READ, which is itself a round trip (perftest's `rtt_factor` of 1 for READ).
//!   `write-lat` works like `ib_write_lat`: each side polls the last byte of its buffer
//!   for the peer's RDMA WRITE, no completion is involved on the receiving side.
//! * **Bandwidth** tests keep `--tx-depth` requests outstanding, signal one in
//!   `cq_mod = min(100, tx_depth / 2)`, and report `BW average` (payload bits over the time
//!   from the first post to the last completion), `BW peak` (the best window of
//!   `max(iters / 20, tx_depth)` consecutive requests) and `MsgRate` in Mpps. Every Gb/s is
//!   payload bits per second over 10^9.
//!
//! Roles: `--server` listens, `--client ADDR` connects, `--pair` runs the server as a child
//! process pinned to the second CPU and the client on the first. Each size is one
//! connection: the client's connect request carries the test, size and iteration count,
//! the server's accept carries its buffer's address and key.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command as ProcCommand, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::fabric::{
    CmChannel, CmEvent, Completion, CompletionQueue, ConnRequest, Device, FabricError,
    MemoryRegion, Payload, ProtectionDomain, Provider, QpCaps, QpInit, RcQueuePair, RecvWr,
    RemoteAddr, SendFlags, SendOp, SendWr, WcOpcode,
};
use hdrhistogram::Histogram;
use mempool::memory::{Region, RegionConfig};
use serde_json::json;

use crate::cli::Common;
use crate::harness::{Timer, pin_current};
use crate::{PerfError, Report};

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE ping-pong.
    WriteLat,
    /// RDMA WRITE streaming.
    WriteBw,
    /// SEND/RECV ping-pong.
    SendLat,
    /// SEND streaming.
    SendBw,
    /// One RDMA READ at a time.
    ReadLat,
    /// RDMA READ streaming.
    ReadBw,
}

impl Test {
    /// The command name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::WriteLat => "write-lat",
            Self::WriteBw => "write-bw",
            Self::SendLat => "send-lat",
            Self::SendBw => "send-bw",
            Self::ReadLat => "read-lat",
            Self::ReadBw => "read-bw",
        }
    }

    const fn code(self) -> u8 {
        match self {
            Self::WriteLat => 1,
            Self::WriteBw => 2,
            Self::SendLat => 3,
            Self::SendBw => 4,
            Self::ReadLat => 5,
            Self::ReadBw => 6,
        }
    }

    const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::WriteLat,
            2 => Self::WriteBw,
            3 => Self::SendLat,
            4 => Self::SendBw,
            5 => Self::ReadLat,
            6 => Self::ReadBw,
            _ => return None,
        })
    }

    const fn is_latency(self) -> bool {
        matches!(self, Self::WriteLat | Self::SendLat | Self::ReadLat)
    }

    const fn title(self) -> &'static str {
        match self {
            Self::WriteLat => "RDMA_Write Latency Test",
            Self::WriteBw => "RDMA_Write BW Test",
            Self::SendLat => "Send Latency Test",
            Self::SendBw => "Send BW Test",
            Self::ReadLat => "RDMA_Read Latency Test",
            Self::ReadBw => "RDMA_Read BW Test",
        }
    }
}

/// Which provider carries the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProviderKind {
    /// Software RDMA through shared memory (one host).
    Shm,
    /// Real RDMA hardware through rdma-core (feature `verbs`).
    Verbs,
}

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

/// One size's latency result (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub size: usize,
    /// Iterations measured.
    pub iters: u64,
    /// Smallest sample.
    pub min_ns: f64,
    /// Largest sample.
    pub max_ns: f64,
    /// Median (`t_typical`).
    pub p50_ns: f64,
    /// Mean.
    pub mean_ns: f64,
    /// Standard deviation.
    pub stdev_ns: f64,
    /// 99th percentile.
    pub p99_ns: f64,
    /// 99.9th percentile.
    pub p999_ns: f64,
}

/// One size's bandwidth result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub size: usize,
    /// Requests completed.
    pub iters: u64,
    /// Best window, Gb/s.
    pub peak_gbps: f64,
    /// Average, Gb/s.
    pub gbps: f64,
    /// Messages per second, millions.
    pub mpps: f64,
}

/// Results of one fabric benchmark run.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricReport {
    /// The test.
    pub test: Test,
    /// Provider name.
    pub provider: &'static str,
    /// Latency rows (latency tests).
    pub lat: Vec<LatRow>,
    /// Bandwidth rows (bandwidth tests).
    pub bw: Vec<BwRow>,
    /// Set on the server side, which measures nothing.
    pub served: Option<u64>,
}

impl Report for FabricReport {
    fn to_json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self.rows_json();
        json!({ self.test.name(): rows })
    }

    fn write_json(&self, out: &mut dyn io::Write) -> io::Result<()> {
        // One object per size, one per line, as the perf lab documents for fabric tests.
        for r in self.rows_json() {
            writeln!(out, "{r}")?;
        }
        Ok(())
    }

    fn write_table(&self, out: &mut dyn io::Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(out, "{}: served {n} size(s)", self.test.name());
        }
        let rule = "-".repeat(87);
        writeln!(out, "{rule}")?;
        writeln!(
            out,
            "{:>40} (dp-perf, provider {})",
            self.test.title(),
            self.provider
        )?;
        writeln!(out, "{rule}")?;
        if self.test.is_latency() {
            let what = if self.test == Test::ReadLat {
                "round trip"
            } else {
                "one way (half RTT)"
            };
            writeln!(out, " latency: {what}")?;
            writeln!(
                out,
                " {:<7} {:<11} {:>12} {:>12} {:>16} {:>12} {:>14} {:>22} {:>24}",
                "#bytes",
                "#iterations",
                "t_min[usec]",
                "t_max[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_stdev[usec]",
                "99% percentile[usec]",
                "99.9% percentile[usec]"
            )?;
            for r in &self.lat {
                writeln!(
                    out,
                    " {:<7} {:<11} {:>12.2} {:>12.2} {:>16.2} {:>12.2} {:>14.2} {:>22.2} {:>24.2}",
                    r.size,
                    r.iters,
                    r.min_ns / 1e3,
                    r.max_ns / 1e3,
                    r.p50_ns / 1e3,
                    r.mean_ns / 1e3,
                    r.stdev_ns / 1e3,
                    r.p99_ns / 1e3,
                    r.p999_ns / 1e3
                )?;
            }
        } else {
            writeln!(
                out,
                " {:<10} {:<14} {:>16} {:>20} {:>14}",
                "#bytes", "#iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]"
            )?;
            for r in &self.bw {
                writeln!(
                    out,
                    " {:<10} {:<14} {:>16.2} {:>20.2} {:>14.6}",
                    r.size, r.iters, r.peak_gbps, r.gbps, r.mpps
                )?;
            }
        }
        writeln!(out, "{rule}")
    }
}

impl FabricReport {
    fn rows_json(&self) -> Vec<serde_json::Value> {
        if self.test.is_latency() {
            self.lat
                .iter()
                .map(|r| {
                    json!({"test": self.test.name(), "provider": self.provider, "size": r.size,
                           "iterations": r.iters, "p50_ns": r.p50_ns, "p99_ns": r.p99_ns,
                           "p999_ns": r.p999_ns, "mean_ns": r.mean_ns, "max_ns": r.max_ns,
                           "min_ns": r.min_ns, "stdev_ns": r.stdev_ns})
                })
                .collect()
        } else {
            self.bw
                .iter()
                .map(|r| {
                    json!({"test": self.test.name(), "provider": self.provider, "size": r.size,
                           "iterations": r.iters, "gbps": r.gbps, "peak_gbps": r.peak_gbps,
                           "mpps": r.mpps})
                })
                .collect()
        }
    }
}

// ------------------------------------------------------------------------------------------
// Session protocol in connection private data.
// ------------------------------------------------------------------------------------------

const MAGIC: u32 = u32::from_le_bytes(*b"DPPF");
const FLAG_LAST: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Req {
    test: Test,
    last: bool,
    size: u32,
    iters: u64,
    tx_depth: u32,
    inline_size: u32,
    buf: RemoteAddr,
}

impl Req {
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = 1;
        b[5] = self.test.code();
        b[6] = if self.last { FLAG_LAST } else { 0 };
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b[12..20].copy_from_slice(&self.iters.to_le_bytes());
        b[20..24].copy_from_slice(&self.tx_depth.to_le_bytes());
        b[24..32].copy_from_slice(&self.buf.addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.buf.rkey.to_le_bytes());
        b[36..40].copy_from_slice(&self.inline_size.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; 40] = b.get(..40)?.try_into().ok()?;
        if u32::from_le_bytes(b[0..4].try_into().ok()?) != MAGIC || b[4] != 1 {
            return None;
        }
        Some(Self {
            test: Test::from_code(b[5])?,
            last: b[6] & FLAG_LAST != 0,
            size: u32::from_le_bytes(b[8..12].try_into().ok()?),
            iters: u64::from_le_bytes(b[12..20].try_into().ok()?),
            tx_depth: u32::from_le_bytes(b[20..24].try_into().ok()?),
            buf: RemoteAddr {
                addr: u64::from_le_bytes(b[24..32].try_into().ok()?),
                rkey: u32::from_le_bytes(b[32..36].try_into().ok()?),
            },
            inline_size: u32::from_le_bytes(b[36..40].try_into().ok()?),
        })
    }
}

fn encode_buf(r: RemoteAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&r.addr.to_le_bytes());
    b[12..16].copy_from_slice(&r.rkey.to_le_bytes());
    b
}

fn decode_buf(b: &[u8]) -> Option<RemoteAddr> {
    if b.len() < 16 || b[0..4] != MAGIC.to_le_bytes() {
        return None;
    }
    Some(RemoteAddr {
        addr: u64::from_le_bytes(b[4..12].try_into().ok()?),
        rkey: u32::from_le_bytes(b[12..16].try_into().ok()?),
    })
}

fn fail(what: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(what.to_string())
}

// ------------------------------------------------------------------------------------------
// Endpoint: one side's resources for one size.
// ------------------------------------------------------------------------------------------

const RECV_DEPTH: u32 = 512;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Endpoint<P: Provider> {
    cq: P::Cq,
    qp: P::Qp,
    mem: Arc<Region>,
    mr: P::Mr,
    /// Offset of the receive half (latency tests) in `mem`.
    rx_off: usize,
    size: usize,
    /// A failed completion not yet reported (see [`Endpoint::poll`]).
    failed: Option<Completion>,
}

impl<P: Provider> Endpoint<P> {
    fn sge(&self, off: usize) -> [dataplane::fabric::Sge; 1] {
        [self.mr.sge(off, self.size as u32)]
    }

    /// Polls completions; a failed one is an error, but only after the successful ones
    /// polled with it have been returned: when the peer finishes and disconnects, the last
    /// messages and the flush of our spare receives can come in one batch, and the caller
    /// may need only the former.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, PerfError> {
        if let Some(c) = self.failed.take() {
            return Err(fail(format_args!(
                "completion failed: {} (wr_id {})",
                c.status, c.wr_id
            )));
        }
        let n = self.cq.poll(out);
        match out[..n].iter().position(|c| !c.is_ok()) {
            Some(i) => {
                self.failed = Some(out[i]);
                if i == 0 { self.poll(out) } else { Ok(i) }
            }
            None => Ok(n),
        }
    }
}

fn buffer<P: Provider>(pd: &P::Pd, size: usize) -> Result<(Arc<Region>, P::Mr, usize), PerfError> {
    let half = size.max(64).next_multiple_of(4096);
    let mem = Region::new(
        &RegionConfig::new("dp-perf", 2 * half)
            .shareable(true)
            .quiet(),
    )
    .map_err(|e| fail(format_args!("allocating the test buffer: {e}")))?;
    let mem = Arc::new(mem);
    let mr = pd
        .reg_region(&mem, 0, 2 * half, dataplane::fabric::Access::ALL)
        .map_err(|e| fail(format_args!("registering the test buffer: {e}")))?;
    Ok((mem, mr, half))
}

fn caps(test: Test, tx_depth: u32, inline_size: u32, max_inline: u32) -> QpCaps {
    QpCaps {
        max_send_wr: tx_depth.max(16),
        max_recv_wr: if matches!(test, Test::SendLat | Test::SendBw) {
            RECV_DEPTH
        } else {
            16
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: inline_size.min(max_inline),
    }
}

fn wait_event<P: Provider>(cm: &mut P::Cm, what: &str) -> Result<CmEvent<P>, PerfError> {
    cm.wait_event(Some(TIMEOUT)).ok_or_else(|| {
        fail(format_args!(
            "no connection event within {TIMEOUT:?} while waiting for {what}"
        ))
    })
}

// ------------------------------------------------------------------------------------------
// Client
// ------------------------------------------------------------------------------------------

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

/// A connected client: its CM channel, protection domain, endpoint and the server's buffer.
type Connected<P> = (
    <P as Provider>::Cm,
    <P as Provider>::Pd,
    Endpoint<P>,
    RemoteAddr,
);

fn connect_one<P: Provider>(
    dev: &P::Device,
    addr: SocketAddr,
    req: &mut Req,
) -> Result<Connected<P>, PerfError> {
    let pd = dev.alloc_pd().map_err(fail)?;
    let size = req.size as usize;
    let (mem, mr, half) = buffer::<P>(&pd, size)?;
    req.buf = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    let cq = dev
        .create_cq(RECV_DEPTH + req.tx_depth.max(16) + 64)
        .map_err(fail)?;
    let mut cm = dev.create_cm_channel().map_err(fail)?;
    let caps = caps(
        req.test,
        req.tx_depth,
        req.inline_size,
        dev.attr().max_inline_data,
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let init = QpInit {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        let (_conn, qp) = cm.connect(addr, &init, &req.encode()).map_err(fail)?;
        match wait_event::<P>(&mut cm, "the server's answer")? {
            CmEvent::Established { private_data, .. } => {
                let peer = decode_buf(private_data.as_bytes()).ok_or_else(|| {
                    fail("the server's accept did not carry a dp-perf buffer description")
                })?;
                let mut ep = Endpoint {
                    cq,
                    qp,
                    mem,
                    mr,
                    rx_off: half,
                    size,
                    failed: None,
                };
                post_initial_recvs(&mut ep, req.test)?;
                return Ok((cm, pd, ep, peer));
            }
            CmEvent::Unreachable { .. } | CmEvent::Rejected { .. } if Instant::now() < deadline => {
                // The server may not be listening yet (--pair start-up): retry.
                std::thread::sleep(Duration::from_millis(20));
            }
            e => return Err(fail(format_args!("connecting to {addr}: {e:?}"))),
        }
    }
}

fn post_initial_recvs<P: Provider>(ep: &mut Endpoint<P>, test: Test) -> Result<(), PerfError> {
    let s = ep.sge(ep.rx_off);
    post_recvs::<P>(&mut ep.qp, &s, test).map_err(|e| fail(format_args!("posting receives: {e}")))
}

/// The send tests' receives (all into the receive half).
fn post_recvs<P: Provider>(
    qp: &mut P::Qp,
    sgl: &[dataplane::fabric::Sge],
    test: Test,
) -> Result<(), FabricError> {
    if matches!(test, Test::SendLat | Test::SendBw) {
        for i in 0..u64::from(RECV_DEPTH) {
            qp.post_recv(&[RecvWr { wr_id: i, sgl }]).map_err(|e| {
                FabricError::InvalidArgument {
                    what: "receive work request",
                    why: e.to_string(),
                }
            })?;
        }
    }
    Ok(())
}

fn lat_row(size: usize, samples: &[u64], halve: bool) -> Result<LatRow, PerfError> {
    let div = if halve { 2.0 } else { 1.0 };
    let mut h = Histogram::<u64>::new(3).map_err(fail)?;
    for s in samples {
        // `record` resizes; `saturating_record` would clamp outliers (see harness::stats).
        h.record(if halve { s / 2 } else { *s }).map_err(fail)?;
    }
    // Extremes, mean and deviation exactly from the samples; percentiles from the histogram
    // (3 significant digits).
    let n = samples.len().max(1) as f64;
    let min = samples.iter().copied().min().unwrap_or(0) as f64 / div;
    let max = samples.iter().copied().max().unwrap_or(0) as f64 / div;
    let mean = samples.iter().map(|&s| s as f64 / div).sum::<f64>() / n;
    let var = samples
        .iter()
        .map(|&s| (s as f64 / div - mean).powi(2))
        .sum::<f64>()
        / n;
    let q = |p: f64| h.value_at_quantile(p) as f64;
    Ok(LatRow {
        size,
        iters: samples.len() as u64,
        min_ns: min,
        max_ns: max,
        p50_ns: q(0.5),
        mean_ns: mean,
        stdev_ns: var.sqrt(),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
    })
}

fn marker(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Client side of one size.
fn client_one<P: Provider>(
    dev: &P::Device,
    addr: SocketAddr,
    mut req: Req,
    timer: &Timer,
) -> Result<(Option<LatRow>, Option<BwRow>), PerfError> {
    let (mut cm, _pd, mut ep, peer) = connect_one::<P>(dev, addr, &mut req)?;
    let n = req.iters;
    let size = req.size as usize;
    let inline = size <= req.inline_size as usize && size <= dev.attr().max_inline_data as usize;
    let mut out = [Completion::default(); 64];
    let result = match req.test {
        Test::WriteLat | Test::SendLat => {
            let mut samples = Vec::with_capacity(n as usize);
            let mut tx_outstanding = 0u32;
            let mut posted_recv = u64::from(RECV_DEPTH);
            let mut buf = vec![0u8; size];
            for i in 0..n {
                let m = marker(i);
                let t0 = timer.now_ns();
                let signal = i % 16 == 15;
                let wr_op = if req.test == Test::WriteLat {
                    SendOp::Write(RemoteAddr {
                        addr: peer.addr + ep.rx_off as u64,
                        rkey: peer.rkey,
                    })
                } else {
                    SendOp::Send
                };
                let sge = ep.sge(0);
                let payload = if inline {
                    buf.iter_mut().for_each(|b| *b = 0);
                    buf[size - 1] = m;
                    Payload::Inline(&buf)
                } else {
                    ep.mem.store_u8(size - 1, m);
                    Payload::Sgl(&sge)
                };
                let wr = SendWr {
                    wr_id: i,
                    op: wr_op,
                    payload,
                    flags: if signal {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                };
                while ep.qp.post_send(&[wr]).is_err() {
                    let k = ep.poll(&mut out)?;
                    tx_outstanding = tx_outstanding.saturating_sub(k as u32);
                }
                if req.test == Test::WriteLat {
                    let guard = Instant::now();
                    while ep.mem.load_u8(ep.rx_off + size - 1) != m {
                        let _ = ep.poll(&mut out)?;
                        if guard.elapsed() > TIMEOUT {
                            return Err(fail("the server stopped answering (write-lat)"));
                        }
                    }
                } else {
                    let guard = Instant::now();
                    'wait: loop {
                        let k = ep.poll(&mut out)?;
                        for c in &out[..k] {
                            if c.opcode == WcOpcode::Recv {
                                let s = ep.sge(ep.rx_off);
                                ep.qp
                                    .post_recv(&[RecvWr {
                                        wr_id: posted_recv,
                                        sgl: &s,
                                    }])
                                    .map_err(fail)?;
                                posted_recv += 1;
                                break 'wait;
                            }
                        }
                        if guard.elapsed() > TIMEOUT {
                            return Err(fail("the server stopped answering (send-lat)"));
                        }
                    }
                }
                samples.push(timer.now_ns() - t0);
                let _ = signal;
            }
            (Some(lat_row(size, &samples, true)?), None)
        }
        Test::ReadLat => {
            let mut samples = Vec::with_capacity(n as usize);
            let sge = ep.sge(0);
            for i in 0..n {
                let t0 = timer.now_ns();
                ep.qp
                    .post_send(&[SendWr::signaled(i, SendOp::Read(peer), &sge)])
                    .map_err(fail)?;
                let guard = Instant::now();
                while ep.poll(&mut out[..1])? == 0 {
                    if guard.elapsed() > TIMEOUT {
                        return Err(fail("read did not complete"));
                    }
                }
                samples.push(timer.now_ns() - t0);
            }
            (Some(lat_row(size, &samples, false)?), None)
        }
        Test::WriteBw | Test::SendBw | Test::ReadBw => {
            (None, Some(stream(&mut ep, &req, peer, timer)?))
        }
    };
    cm.disconnect(ep.qp.conn_id()).map_err(fail)?;
    Ok(result)
}

/// The streaming loop of the bandwidth tests.
fn stream<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    peer: RemoteAddr,
    timer: &Timer,
) -> Result<BwRow, PerfError> {
    let n = req.iters;
    let size = req.size as usize;
    let depth = u64::from(req.tx_depth);
    let cq_mod = (depth / 2).clamp(1, 100);
    let sge = ep.sge(0);
    let op = match req.test {
        Test::WriteBw => SendOp::Write(peer),
        Test::ReadBw => SendOp::Read(peer),
        _ => SendOp::Send,
    };
    let mut out = [Completion::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    // For perftest's BW peak: when each batch of cq_mod requests started to be posted, and
    // when each signalled completion (the end of a batch) was polled.
    let batches = (n / cq_mod + 2) as usize;
    let mut posted_at: Vec<u64> = Vec::with_capacity(batches);
    let mut completed_at: Vec<(u64, u64)> = Vec::with_capacity(batches);
    let start = timer.now_ns();
    let guard = Instant::now();
    while completed < n {
        while posted < n && posted - completed < depth {
            let signal = (posted + 1) % cq_mod == 0 || posted + 1 == n;
            let wr = SendWr {
                wr_id: posted,
                op,
                payload: Payload::Sgl(&sge),
                flags: if signal {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            };
            if posted % cq_mod == 0 {
                posted_at.push(timer.now_ns());
            }
            if ep.qp.post_send(&[wr]).is_err() {
                if posted % cq_mod == 0 {
                    posted_at.pop();
                }
                break;
            }
            posted += 1;
        }
        let k = ep.poll(&mut out)?;
        for c in &out[..k] {
            if c.opcode == WcOpcode::Recv || c.opcode == WcOpcode::RecvRdmaWithImm {
                continue;
            }
            completed = (c.wr_id + 1).max(completed);
            completed_at.push((c.wr_id, timer.now_ns()));
        }
        if guard.elapsed() > TIMEOUT * 4 {
            return Err(fail(format_args!(
                "bandwidth run stalled at {completed}/{n}"
            )));
        }
    }
    let end = timer.now_ns();
    let secs = (end - start) as f64 / 1e9;
    let bits = |msgs: u64| msgs as f64 * size as f64 * 8.0;
    // perftest's peak: the smallest time per request from posting request i to polling the
    // completion of a later request j, over every batch start i and signalled j >= i.
    let mut best_per_msg = f64::INFINITY;
    for (b, &tp) in posted_at.iter().enumerate() {
        let i = b as u64 * cq_mod;
        for &(j, tc) in completed_at.iter().filter(|(j, _)| *j >= i) {
            let per = tc.saturating_sub(tp) as f64 / (j - i + 1) as f64;
            if per > 0.0 && per < best_per_msg {
                best_per_msg = per;
            }
        }
    }
    let peak = if best_per_msg.is_finite() {
        bits(1) / best_per_msg
    } else {
        0.0
    };
    let gbps = bits(n) / secs / 1e9;
    Ok(BwRow {
        size,
        iters: n,
        peak_gbps: peak.max(gbps),
        gbps,
        mpps: n as f64 / secs / 1e6,
    })
}

// ------------------------------------------------------------------------------------------
// Server
// ------------------------------------------------------------------------------------------

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
        let pd = dev.alloc_pd().map_err(fail)?;
        let size = req.size as usize;
        let (mem, mr, half) = buffer::<P>(&pd, size)?;
        let cq = dev
            .create_cq(RECV_DEPTH + req.tx_depth.max(16) + 64)
            .map_err(fail)?;
        let caps = caps(
            req.test,
            req.tx_depth,
            req.inline_size,
            dev.attr().max_inline_data,
        );
        let init = QpInit {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        let mine = RemoteAddr {
            addr: mr.addr(),
            rkey: mr.rkey(),
        };
        // Receives go in before the reply: the client may send the moment it has it.
        let rx = [mr.sge(half, size as u32)];
        let (conn, qp) = cm
            .accept_prepared(request, &init, &encode_buf(mine), &mut |qp| {
                post_recvs::<P>(qp, &rx, req.test)
            })
            .map_err(fail)?;
        let mut ep = Endpoint::<P> {
            cq,
            qp,
            mem,
            mr,
            rx_off: half,
            size,
            failed: None,
        };
        serve_one(&mut ep, &req, &mut cm)?;
        let _ = cm.disconnect(conn);
        served += 1;
        if req.last {
            return Ok(served);
        }
    }
}

fn serve_one<P: Provider>(
    ep: &mut Endpoint<P>,
    req: &Req,
    cm: &mut P::Cm,
) -> Result<(), PerfError> {
    let size = req.size as usize;
    let mut out = [Completion::default(); 64];
    let inline = size <= req.inline_size as usize;
    let mut buf = vec![0u8; size];
    match req.test {
        Test::WriteLat | Test::SendLat => {
            let mut posted_recv = u64::from(RECV_DEPTH);
            for i in 0..req.iters {
                let m = marker(i);
                let guard = Instant::now();
                if req.test == Test::WriteLat {
                    while ep.mem.load_u8(ep.rx_off + size - 1) != m {
                        let _ = ep.poll(&mut out)?;
                        if guard.elapsed() > TIMEOUT {
                            return Err(fail("the client stopped sending (write-lat)"));
                        }
                    }
                } else {
                    'wait: loop {
                        let k = ep.poll(&mut out)?;
                        for c in &out[..k] {
                            if c.opcode == WcOpcode::Recv {
                                let s = ep.sge(ep.rx_off);
                                ep.qp
                                    .post_recv(&[RecvWr {
                                        wr_id: posted_recv,
                                        sgl: &s,
                                    }])
                                    .map_err(fail)?;
                                posted_recv += 1;
                                break 'wait;
                            }
                        }
                        if guard.elapsed() > TIMEOUT {
                            return Err(fail("the client stopped sending (send-lat)"));
                        }
                    }
                }
                let op = if req.test == Test::WriteLat {
                    SendOp::Write(RemoteAddr {
                        addr: req.buf.addr + ep.rx_off as u64,
                        rkey: req.buf.rkey,
                    })
                } else {
                    SendOp::Send
                };
                let sge = ep.sge(0);
                let payload = if inline && size <= ep.qp.caps().max_inline_data as usize {
                    buf[size - 1] = m;
                    Payload::Inline(&buf)
                } else {
                    ep.mem.store_u8(size - 1, m);
                    Payload::Sgl(&sge)
                };
                let wr = SendWr {
                    wr_id: i,
                    op,
                    payload,
                    flags: if i % 16 == 15 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    },
                };
                while ep.qp.post_send(&[wr]).is_err() {
                    let _ = ep.poll(&mut out)?;
                }
            }
        }
        Test::SendBw => {
            let mut got = 0u64;
            let mut posted_recv = u64::from(RECV_DEPTH);
            let guard = Instant::now();
            while got < req.iters {
                let k = ep.poll(&mut out)?;
                for c in &out[..k] {
                    if c.opcode == WcOpcode::Recv {
                        got += 1;
                        let s = ep.sge(ep.rx_off);
                        ep.qp
                            .post_recv(&[RecvWr {
                                wr_id: posted_recv,
                                sgl: &s,
                            }])
                            .map_err(fail)?;
                        posted_recv += 1;
                    }
                }
                if guard.elapsed() > TIMEOUT * 4 {
                    return Err(fail(format_args!("send-bw server stalled at {got}")));
                }
            }
        }
        Test::ReadLat | Test::WriteBw | Test::ReadBw => {}
    }
    // Wait for the client to finish and disconnect, keeping our queue polled.
    let guard = Instant::now();
    loop {
        if let Some(CmEvent::Disconnected { .. }) = cm.poll_event() {
            return Ok(());
        }
        let _ = ep.cq.poll(&mut out);
        if guard.elapsed() > TIMEOUT * 4 {
            return Err(fail("the client did not disconnect"));
        }
        std::thread::yield_now();
    }
}

// ------------------------------------------------------------------------------------------
// Entry points
// ------------------------------------------------------------------------------------------

fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, PerfError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| {
            PerfError::Usage(format!(
                "--client {s:?} is not an address: use ip or ip:port (numeric)"
            ))
        })
}

fn spawn_server(
    args: &FabricArgs,
    test: Test,
    cpu: usize,
    bind: IpAddr,
    dir: Option<&PathBuf>,
) -> Result<Child, PerfError> {
    let exe = std::env::current_exe().map_err(|e| fail(format_args!("finding dp-perf: {e}")))?;
    let mut cmd = ProcCommand::new(exe);
    cmd.args([
        test.name(),
        "--server",
        "--port",
        &args.port.to_string(),
        "--bind",
        &bind.to_string(),
        "--pin",
        &cpu.to_string(),
        "--provider",
        args.provider.name(),
    ]);
    if let Some(d) = dir {
        cmd.arg("--shm-dir").arg(d);
    }
    if let Some(d) = &args.device {
        cmd.args(["--device", d]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fail(format_args!("starting the server process: {e}")))
}

impl ProviderKind {
    /// The `--provider` value.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Verbs => "verbs",
        }
    }
}

/// Maps a device-open failure: no device or a provider not built in is a usage problem
/// (status 2, the message says how to get one); anything else is a fabric failure.
pub(crate) fn open_err(e: FabricError) -> PerfError {
    use FabricError as F;
    match e {
        F::NoDevice { .. } | F::ProviderNotBuilt { .. } => PerfError::Unavailable(e.to_string()),
        e => fail(e),
    }
}

/// Opens the verbs device named by `--device` (or the first one).
#[cfg(feature = "verbs")]
pub(crate) fn open_verbs(
    device: Option<&str>,
) -> Result<dataplane::fabric::verbs::VerbsDevice, PerfError> {
    dataplane::fabric::verbs::VerbsDevice::open(device).map_err(open_err)
}

/// Without the `verbs` feature: the error that says how to get it.
#[cfg(not(feature = "verbs"))]
pub(crate) fn open_verbs(_device: Option<&str>) -> Result<std::convert::Infallible, PerfError> {
    Err(open_err(FabricError::ProviderNotBuilt {
        provider: "verbs",
        feature: "verbs",
    }))
}

/// A private shm rendezvous directory for `--pair`, so concurrent pair runs cannot collide.
pub(crate) fn pair_dir(given: Option<&PathBuf>, what: &str) -> PathBuf {
    given
        .cloned()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("{what}-{}", std::process::id())))
}

/// The address a verbs `--pair` server binds and the client connects to: the device's first
/// IPv4 address (RDMA CM cannot route loopback to a device).
#[cfg(feature = "verbs")]
pub(crate) fn verbs_pair_ip(
    dev: &dataplane::fabric::verbs::VerbsDevice,
) -> Result<IpAddr, PerfError> {
    dev.ip_addrs()
        .map_err(fail)?
        .into_iter()
        .find(IpAddr::is_ipv4)
        .ok_or_else(|| {
            PerfError::Unavailable(format!(
                "RDMA device {} has no IPv4 address: give its netdev one (ip addr add ...), \
                 or run --server and --client by hand",
                dev.name()
            ))
        })
}

/// The shm `--pair` address: loopback.
pub(crate) const SHM_PAIR_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

impl FabricArgs {
    /// Runs `test` with these options.
    ///
    /// # Errors
    ///
    /// Usage errors (status 2) for bad combinations or a missing device; fabric errors
    /// otherwise.
    pub fn run(&self, test: Test, common: &Common) -> Result<FabricReport, PerfError> {
        if !self.server && !self.pair && self.client.is_none() {
            return Err(PerfError::Usage(
                "say where to run: --server, --client ADDR, or --pair".into(),
            ));
        }
        if let Some(cpu) = self.pin {
            pin_current(cpu)?;
        }
        match self.provider {
            ProviderKind::Shm => {
                let dir = if self.pair {
                    Some(pair_dir(self.shm_dir.as_ref(), "dp-perf"))
                } else {
                    self.shm_dir.clone()
                };
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
            bw: Vec::new(),
            served: None,
        };
        if self.server {
            let served = serve::<P>(dev, SocketAddr::new(self.bind, self.port))?;
            report.served = Some(served);
            return Ok(report);
        }
        let (addr, mut child) = if self.pair {
            let [client_cpu, server_cpu] = common.cpus.as_array();
            let child = spawn_server(self, test, server_cpu, pair_ip, dir)?;
            pin_current(client_cpu)?;
            (SocketAddr::new(pair_ip, self.port), Some(child))
        } else {
            let c = self.client.as_deref().unwrap_or_default();
            (parse_addr(c, self.port)?, None)
        };
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
                report.lat.extend(lat);
                report.bw.extend(bw);
            }
            Ok(())
        })();
        if let Some(c) = child.as_mut() {
            if result.is_err() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        result.map(|()| report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_roundtrip_and_rejects_garbage() {
        let r = Req {
            test: Test::SendBw,
            last: true,
            size: 4096,
            iters: 77,
            tx_depth: 64,
            inline_size: 220,
            buf: RemoteAddr {
                addr: 0xABCD,
                rkey: 9,
            },
        };
        assert_eq!(Req::decode(&r.encode()), Some(r));
        assert_eq!(Req::decode(&[0u8; 40]), None);
        assert_eq!(Req::decode(&r.encode()[..39]), None);
        let mut bad = r.encode();
        bad[5] = 99;
        assert_eq!(Req::decode(&bad), None);
        assert_eq!(decode_buf(&encode_buf(r.buf)), Some(r.buf));
        assert_eq!(decode_buf(&[1, 2, 3]), None);
    }
}
