//! `dp-perf rstream`: librdmacm's `rstream` benchmark, over rsockets on a fabric provider or
//! over kernel TCP (`--tcp`) for comparison.
//!
//! Same sizes, options, defaults and columns as `rstream` (rdma-core `librdmacm/examples`,
//! described in `shared/reference/rsocket.md` section 8.1):
//!
//! * the size table of 33 sizes from 64 B to 6 MiB; by default only 64 B, 4 KiB, 64 KiB and
//!   1 MiB run, `-S all` runs every size, `-S N` one custom size;
//! * a latency sweep on one connection (`<size>_lat`: one transfer per iteration,
//!   `size_to_count(size)` iterations, inline `-i`), then a new connection for the bandwidth
//!   sweep (`<size>_bw`: one iteration of `size_to_count(size)` transfers, inline 0);
//! * every iteration the client sends `xfers` messages and receives `xfers` back, the server
//!   mirrors; a 16-byte exchange brackets the timed part;
//! * `-B` sets SO_SNDBUF and SO_RCVBUF (default 512 KiB; rsockets double it);
//! * `-T b` blocks (MSG_WAITALL), the default spins with MSG_DONTWAIT, `-T v` verifies data;
//! * columns `name bytes xfers iters total time Gb/sec usec/xfer`, where total counts both
//!   directions, Gb/sec = total x 8 / elapsed, and usec/xfer = elapsed / iters / (2 x xfers),
//!   i.e. one-way time for latency runs.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command as ProcCommand, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use dataplane::fabric::Provider;
use dataplane::fabric::shm::{Shm, ShmConfig, ShmDevice};
use dataplane::rsocket::{
    RecvFlags, RsConfig, RsContext, RsError, RsListener, RsStream, SendFlagsRs, SockOpt,
};
use serde_json::json;

use crate::cli::Common;
#[cfg(feature = "verbs")]
use crate::fabric::verbs_pair_ip;
use crate::fabric::{ProviderKind, SHM_PAIR_IP, open_err, open_verbs, pair_dir};
use crate::harness::{Timer, pin_current};
use crate::{PerfError, Report};

/// rstream's size table: (size, runs by default).
pub const TEST_SIZES: [(usize, bool); 33] = [
    (64, true),
    (128, false),
    (192, false),
    (256, false),
    (384, false),
    (512, false),
    (768, false),
    (1 << 10, false),
    (3 << 9, false),
    (2 << 10, false),
    (3 << 10, false),
    (4 << 10, true),
    (6 << 10, false),
    (8 << 10, false),
    (12 << 10, false),
    (16 << 10, false),
    (24 << 10, false),
    (32 << 10, false),
    (48 << 10, false),
    (64 << 10, true),
    (96 << 10, false),
    (128 << 10, false),
    (192 << 10, false),
    (256 << 10, false),
    (384 << 10, false),
    (512 << 10, false),
    (768 << 10, false),
    (1 << 20, true),
    (3 << 19, false),
    (2 << 20, false),
    (3 << 20, false),
    (4 << 20, false),
    (6 << 20, false),
];

/// rstream's iteration count for a size.
pub const fn size_to_count(size: usize) -> u64 {
    if size >= 1 << 20 {
        100
    } else if size >= 1 << 16 {
        1000
    } else if size >= 1 << 10 {
        10000
    } else {
        100_000
    }
}

fn scaled(v: u64, bases: [(u64, char); 3]) -> String {
    let (base, mag) = bases
        .iter()
        .copied()
        .find(|(b, _)| v >= *b)
        .map_or((1, None), |(b, m)| (b, Some(m)));
    let whole = v / base;
    let fraction = if whole < 10 {
        (v % base) * 10 / base
    } else {
        0
    };
    let m = mag.map(String::from).unwrap_or_default();
    if fraction != 0 {
        format!("{whole}.{fraction}{m}")
    } else {
        format!("{whole}{m}")
    }
}

/// rstream's `size_str`: powers of 1024 with k/m/g, one decimal below 10 units.
pub fn size_str(v: u64) -> String {
    scaled(v, [(1 << 30, 'g'), (1 << 20, 'm'), (1 << 10, 'k')])
}

/// rstream's `cnt_str`: powers of 1000 with k/m/b.
pub fn cnt_str(v: u64) -> String {
    scaled(v, [(1_000_000_000, 'b'), (1_000_000, 'm'), (1_000, 'k')])
}

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
    /// Pin this process to CPU N (used by --pair).
    #[arg(long, value_name = "N", hide = true)]
    pub pin: Option<usize>,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// `64_lat`, `1m_bw`, ...
    pub name: String,
    /// Transfer size.
    pub bytes: usize,
    /// Transfers per iteration.
    pub xfers: u64,
    /// Iterations.
    pub iters: u64,
    /// Elapsed seconds.
    pub secs: f64,
}

impl Row {
    fn total(&self) -> u64 {
        self.iters * self.xfers * self.bytes as u64 * 2
    }
    fn usec(&self) -> f64 {
        self.secs * 1e6
    }
    /// Payload gigabits per second, both directions.
    pub fn gbps(&self) -> f64 {
        8.0 * self.total() as f64 / (1000.0 * self.usec())
    }
    /// Microseconds per transfer (one way for latency rows).
    pub fn usec_per_xfer(&self) -> f64 {
        self.usec() / self.iters as f64 / (self.xfers as f64 * 2.0)
    }
}

/// The results.
#[derive(Debug, Clone, PartialEq)]
pub struct RstreamReport {
    /// "rsocket (shm)" or "tcp".
    pub transport: &'static str,
    /// Rows in run order.
    pub rows: Vec<Row>,
    /// Set on the server, which measures nothing.
    pub served: Option<usize>,
}

impl Report for RstreamReport {
    fn to_json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "bytes": r.bytes, "xfers": r.xfers, "iters": r.iters,
                       "usec_per_xfer": r.usec_per_xfer(), "gbps": r.gbps()})
            })
            .collect();
        json!({ "rstream": rows })
    }

    fn write_table(&self, out: &mut dyn Write) -> io::Result<()> {
        if let Some(n) = self.served {
            return writeln!(
                out,
                "rstream server ({}): served {n} connection(s)",
                self.transport
            );
        }
        writeln!(
            out,
            "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8} {:>10}{:>13}",
            "name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer"
        )?;
        for r in &self.rows {
            writeln!(
                out,
                "{:<10}{:<8}{:<8}{:<8}{:<8}{:>8.2}s{:>10.2}{:>11.2}",
                r.name,
                size_str(r.bytes as u64),
                cnt_str(r.xfers),
                cnt_str(r.iters),
                size_str(r.total()),
                r.secs,
                r.gbps(),
                r.usec_per_xfer()
            )?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Transport-neutral connection
// ------------------------------------------------------------------------------------------

trait Conn {
    /// Sends all of `b` (spinning on would-block unless blocking).
    fn send_all(&mut self, b: &[u8]) -> io::Result<()>;
    /// Receives exactly `b.len()` bytes.
    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()>;
}

const GUARD: Duration = Duration::from_secs(120);

/// A hang guard for the transfer loops that costs nothing on the timed path: the clock is
/// read only every [`HangGuard::EVERY`] fruitless spins (a clock read per spin would add
/// tens of nanoseconds to each wait and show up in the 64-byte latencies).
struct HangGuard {
    spins: u32,
    since: Option<Instant>,
}

impl HangGuard {
    const EVERY: u32 = 4096;

    fn new() -> Self {
        Self {
            spins: 0,
            since: None,
        }
    }

    /// One fruitless spin; an error once the peer has made no progress for [`GUARD`].
    #[inline]
    fn spin(&mut self, what: &'static str) -> io::Result<()> {
        self.spins += 1;
        if self.spins < Self::EVERY {
            return Ok(());
        }
        self.spins = 0;
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > GUARD {
            return Err(io::Error::new(ErrorKind::TimedOut, what));
        }
        Ok(())
    }
}

struct RsConn<P: Provider> {
    s: RsStream<P>,
    blocking: bool,
}

impl<P: Provider> Conn for RsConn<P> {
    fn send_all(&mut self, b: &[u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.send(
                &b[off..],
                SendFlagsRs {
                    dontwait: !self.blocking,
                },
            ) {
                Ok(n) => off += n,
                Err(RsError::WouldBlock) => {
                    guard.spin("peer stopped reading")?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        let flags = RecvFlags {
            dontwait: !self.blocking,
            waitall: self.blocking,
            peek: false,
        };
        while off < b.len() {
            match self.s.recv(&mut b[off..], flags) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => off += n,
                Err(RsError::WouldBlock) => {
                    guard.spin("peer stopped sending")?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

struct TcpConn {
    s: TcpStream,
}

impl Conn for TcpConn {
    fn send_all(&mut self, b: &[u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.write(&b[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    guard.spin("peer stopped reading")?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()> {
        let mut off = 0;
        let mut guard = HangGuard::new();
        while off < b.len() {
            match self.s.read(&mut b[off..]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    guard.spin("peer stopped sending")?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[allow(unsafe_code)]
mod sockopt {
    use std::os::fd::AsRawFd;

    /// Sets SO_SNDBUF and SO_RCVBUF on a kernel socket, as rstream `-B` does.
    pub(super) fn set_bufs(s: &impl AsRawFd, bytes: u32) -> std::io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: setsockopt on a live socket with a pointer to a c_int and its size.
            let r = unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const v).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// The test (rstream's run_test)
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Plan {
    size: usize,
    xfers: u64,
    iters: u64,
}

/// rstream's `-T v` data: each direction of the byte stream carries its running byte count
/// modulo 256, counted from the program's first transfer (sync messages included) and across
/// the latency and bandwidth connections, as rstream's `format_buf`/`verify_buf` do. So a
/// verifying run against librdmacm's own `rstream` checks every byte either way.
#[derive(Debug, Default)]
struct Verify {
    on: bool,
    tx: u8,
    rx: u8,
    rx_total: u64,
}

impl Verify {
    fn format(&mut self, buf: &mut [u8]) {
        if self.on {
            for b in buf {
                *b = self.tx;
                self.tx = self.tx.wrapping_add(1);
            }
        }
    }

    fn check(&mut self, buf: &[u8]) -> io::Result<()> {
        if !self.on {
            return Ok(());
        }
        for &b in buf {
            if b != self.rx {
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "data verification failed at byte {} of the received stream: \
                         got {b:#04x}, expected {:#04x}",
                        self.rx_total, self.rx
                    ),
                ));
            }
            self.rx = self.rx.wrapping_add(1);
            self.rx_total += 1;
        }
        Ok(())
    }
}

fn send_xfer(c: &mut dyn Conn, buf: &mut [u8], v: &mut Verify) -> io::Result<()> {
    v.format(buf);
    c.send_all(buf)
}

fn recv_xfer(c: &mut dyn Conn, buf: &mut [u8], v: &mut Verify) -> io::Result<()> {
    c.recv_all(buf)?;
    v.check(buf)
}

/// One test on an open connection (rstream's `run_test`): a 16-byte exchange, then
/// `iters` rounds of `xfers` transfers out and `xfers` back. Returns the client's elapsed
/// seconds (the server returns 0).
fn run_test(
    c: &mut dyn Conn,
    client: bool,
    p: Plan,
    buf: &mut [u8],
    v: &mut Verify,
    timer: &Timer,
) -> io::Result<f64> {
    let mut sync = [0u8; 16];
    if client {
        send_xfer(c, &mut sync, v)?;
        recv_xfer(c, &mut sync, v)?;
    } else {
        recv_xfer(c, &mut sync, v)?;
        send_xfer(c, &mut sync, v)?;
    }
    let buf = &mut buf[..p.size];
    let start = timer.now_ns();
    for _ in 0..p.iters {
        for _ in 0..p.xfers {
            if client {
                send_xfer(c, buf, v)?;
            } else {
                recv_xfer(c, buf, v)?;
            }
        }
        for _ in 0..p.xfers {
            if client {
                recv_xfer(c, buf, v)?;
            } else {
                send_xfer(c, buf, v)?;
            }
        }
    }
    Ok(timer.now_ns().saturating_sub(start) as f64 / 1e9)
}

/// The sequence of tests a run makes: the latency sweep (one connection) and the bandwidth
/// sweep (a second connection), or one custom test.
fn plans(a: &RstreamArgs, quick: bool) -> Result<(Vec<Plan>, Vec<Plan>), PerfError> {
    let custom_size = match a.size.as_deref() {
        None | Some("all") => None,
        Some(s) => Some(
            s.parse::<usize>()
                .ok()
                .filter(|n| *n > 0 && *n <= 1 << 30)
                .ok_or_else(|| {
                    PerfError::Usage(format!(
                        "-S {s:?}: give a size in bytes (1 to 2^30) or `all`"
                    ))
                })?,
        ),
    };
    if custom_size.is_some() || a.iterations.is_some() || a.count.is_some() {
        // rstream: any of -S N, -I, -C makes a custom test of one connection.
        let p = Plan {
            size: custom_size.unwrap_or(1000),
            xfers: a.count.unwrap_or(1000),
            iters: a.iterations.unwrap_or(1),
        };
        return Ok((vec![], vec![p]));
    }
    let all = a.size.as_deref() == Some("all");
    let sizes: Vec<usize> = TEST_SIZES
        .iter()
        .filter(|(_, d)| all || *d)
        .map(|(s, _)| *s)
        .collect();
    let shrink = |n: u64| if quick { (n / 100).max(2) } else { n };
    let lat = sizes
        .iter()
        .map(|&s| Plan {
            size: s,
            xfers: 1,
            iters: shrink(size_to_count(s)),
        })
        .collect();
    let bw = sizes
        .iter()
        .map(|&s| Plan {
            size: s,
            xfers: shrink(size_to_count(s)),
            iters: 1,
        })
        .collect();
    Ok((lat, bw))
}

fn name(p: &Plan, lat: bool, custom: bool) -> String {
    if custom {
        return "custom".into();
    }
    format!(
        "{}_{}",
        size_str(p.size as u64),
        if lat { "lat" } else { "bw" }
    )
}

/// Where connections come from: rsockets on a fabric provider, or kernel TCP.
trait Transport {
    fn describe(&self) -> &'static str;
    fn listen(
        &self,
        bind: SocketAddr,
        a: &RstreamArgs,
    ) -> Result<Box<dyn Listener + '_>, PerfError>;
    fn connect(
        &self,
        addr: SocketAddr,
        a: &RstreamArgs,
        inline: u32,
    ) -> Result<Box<dyn Conn>, PerfError>;
}

trait Listener {
    fn accept(&self, a: &RstreamArgs, inline: u32) -> Result<Box<dyn Conn>, PerfError>;
}

fn fabric_err(what: &str, e: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(format!("{what}: {e}"))
}

/// Connects, retrying while nothing listens yet (a `--pair` server is still starting).
fn retry_refused<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

struct Rs<P: Provider>(RsContext<P>);

fn rs_opts(a: &RstreamArgs, inline: u32) -> [SockOpt; 4] {
    [
        SockOpt::SndBuf(a.buffer),
        SockOpt::RcvBuf(a.buffer),
        SockOpt::Inline(inline),
        SockOpt::NoDelay(true),
    ]
}

impl<P: Provider> Transport for Rs<P> {
    fn describe(&self) -> &'static str {
        P::NAME
    }

    fn listen(
        &self,
        bind: SocketAddr,
        a: &RstreamArgs,
    ) -> Result<Box<dyn Listener + '_>, PerfError> {
        let l = RsListener::bind_with(
            &self.0,
            bind,
            &[SockOpt::SndBuf(a.buffer), SockOpt::RcvBuf(a.buffer)],
        )
        .map_err(|e| fabric_err(&format!("listening on {bind}"), e))?;
        Ok(Box::new(l))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        a: &RstreamArgs,
        inline: u32,
    ) -> Result<Box<dyn Conn>, PerfError> {
        let s = retry_refused(|| RsStream::connect_with(&self.0, addr, &rs_opts(a, inline)))
            .map_err(|e| fabric_err(&format!("connecting to {addr}"), e))?;
        Ok(Box::new(RsConn {
            s,
            blocking: a.blocking(),
        }))
    }
}

impl<P: Provider> Listener for RsListener<P> {
    fn accept(&self, a: &RstreamArgs, inline: u32) -> Result<Box<dyn Conn>, PerfError> {
        let (s, _) = Self::accept(self).map_err(|e| fabric_err("accepting", e))?;
        for o in rs_opts(a, inline) {
            // Buffer sizes only apply before connecting; the rest apply now.
            let _ = s.set_option(o);
        }
        Ok(Box::new(RsConn {
            s,
            blocking: a.blocking(),
        }))
    }
}

struct Tcp;

impl Transport for Tcp {
    fn describe(&self) -> &'static str {
        "tcp"
    }

    fn listen(
        &self,
        bind: SocketAddr,
        _a: &RstreamArgs,
    ) -> Result<Box<dyn Listener + '_>, PerfError> {
        let l =
            TcpListener::bind(bind).map_err(|e| fabric_err(&format!("listening on {bind}"), e))?;
        Ok(Box::new(l))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        a: &RstreamArgs,
        _inline: u32,
    ) -> Result<Box<dyn Conn>, PerfError> {
        let s = retry_refused(|| TcpStream::connect(addr))
            .map_err(|e| fabric_err(&format!("connecting to {addr}"), e))?;
        tcp_setup(&s, a.buffer, a.blocking())?;
        Ok(Box::new(TcpConn { s }))
    }
}

impl Listener for TcpListener {
    fn accept(&self, a: &RstreamArgs, _inline: u32) -> Result<Box<dyn Conn>, PerfError> {
        let (s, _) = Self::accept(self).map_err(|e| fabric_err("accepting", e))?;
        tcp_setup(&s, a.buffer, a.blocking())?;
        Ok(Box::new(TcpConn { s }))
    }
}

fn tcp_setup(s: &TcpStream, buffer: u32, blocking: bool) -> Result<(), PerfError> {
    let f = |e: io::Error| fabric_err("configuring a TCP socket", e);
    s.set_nodelay(true).map_err(f)?;
    s.set_nonblocking(!blocking).map_err(f)?;
    sockopt::set_bufs(s, buffer).map_err(f)
}

fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, PerfError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| {
            PerfError::Usage(format!(
                "--client {s:?} is not a numeric address: use ip or ip:port"
            ))
        })
}

fn spawn_server(
    a: &RstreamArgs,
    quick: bool,
    cpu: usize,
    bind: IpAddr,
    dir: Option<&PathBuf>,
) -> Result<Child, PerfError> {
    let exe = std::env::current_exe().map_err(|e| fabric_err("finding dp-perf", e))?;
    let mut cmd = ProcCommand::new(exe);
    cmd.args([
        "rstream",
        "--server",
        "--port",
        &a.port.to_string(),
        "--bind",
        &bind.to_string(),
    ])
    .args(["--pin", &cpu.to_string(), "--provider", a.provider.name()])
    .args(["-B", &a.buffer.to_string(), "-i", &a.inline.to_string()]);
    if !a.opts.is_empty() {
        cmd.args(["-T", &a.opts]);
    }
    if let Some(d) = dir {
        cmd.arg("--shm-dir").arg(d);
    }
    if let Some(d) = &a.device {
        cmd.args(["--device", d]);
    }
    if a.tcp {
        cmd.arg("--tcp");
    }
    // The server runs the same test sequence as the client, so it needs the same counts.
    if quick {
        cmd.arg("--quick");
    }
    if let Some(s) = &a.size {
        cmd.args(["-S", s]);
    }
    if let Some(n) = a.iterations {
        cmd.args(["-I", &n.to_string()]);
    }
    if let Some(n) = a.count {
        cmd.args(["-C", &n.to_string()]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fabric_err("starting the server process", e))
}

impl RstreamArgs {
    fn blocking(&self) -> bool {
        self.opts.contains('b')
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
        if !self.server && !self.pair && self.client.is_none() {
            return Err(PerfError::Usage(
                "say where to run: --server, --client ADDR, or --pair".into(),
            ));
        }
        if let Some(cpu) = self.pin {
            pin_current(cpu)?;
        }
        let tcp = self.tcp || self.opts.contains('s');
        if tcp {
            let ip = if self.pair { SHM_PAIR_IP } else { self.bind };
            return self.run_with(&Tcp, common, ip, None);
        }
        match self.provider {
            ProviderKind::Shm => {
                let dir = if self.pair {
                    Some(pair_dir(self.shm_dir.as_ref(), "dp-rstream"))
                } else {
                    self.shm_dir.clone()
                };
                let dev = ShmDevice::open(ShmConfig {
                    dir: dir.clone(),
                    bounce_bytes: 4096,
                    ..ShmConfig::default()
                })
                .map_err(open_err)?;
                let t = Rs(self.context::<Shm>(dev)?);
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
                let t = Rs(self.context::<dataplane::fabric::verbs::Verbs>(dev)?);
                self.run_with(&t, common, ip, None)
            }
            #[cfg(not(feature = "verbs"))]
            ProviderKind::Verbs => match open_verbs(self.device.as_deref())? {},
        }
    }

    fn context<P: Provider>(&self, dev: P::Device) -> Result<RsContext<P>, PerfError> {
        let mut ctx = RsContext::with_config(dev, RsConfig::from_system()).map_err(open_err)?;
        if !self.blocking() {
            // rstream spins (rpoll with timeout 0) in its default mode: poll just as long.
            ctx.set_polling_time(Duration::from_secs(1));
        }
        Ok(ctx)
    }

    fn run_with(
        &self,
        t: &dyn Transport,
        common: &Common,
        pair_ip: IpAddr,
        dir: Option<&PathBuf>,
    ) -> Result<RstreamReport, PerfError> {
        let (lat, bw) = plans(self, common.quick)?;
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
        let mut v = Verify {
            on: self.opts.contains('v'),
            ..Verify::default()
        };
        let timer = Timer::new();
        let data_err = |e: io::Error| fabric_err("transfer", e);
        if self.server {
            let bind = SocketAddr::new(self.bind, self.port);
            let l = t.listen(bind, self)?;
            let mut served = 0;
            for (plans, is_lat) in &groups {
                let inline = if *is_lat && !custom { self.inline } else { 0 };
                let mut c = l.accept(self, inline)?;
                for p in plans {
                    run_test(c.as_mut(), false, *p, &mut buf, &mut v, &timer).map_err(data_err)?;
                }
                served += 1;
            }
            return Ok(RstreamReport {
                transport: t.describe(),
                rows: vec![],
                served: Some(served),
            });
        }
        let (addr, mut child) = if self.pair {
            let [client_cpu, server_cpu] = common.cpus.as_array();
            let child = spawn_server(self, common.quick, server_cpu, pair_ip, dir)?;
            pin_current(client_cpu)?;
            (SocketAddr::new(pair_ip, self.port), Some(child))
        } else {
            (
                parse_addr(self.client.as_deref().unwrap_or_default(), self.port)?,
                None,
            )
        };
        let result = (|| -> Result<Vec<Row>, PerfError> {
            let mut rows = Vec::new();
            for (plans, is_lat) in &groups {
                let inline = if *is_lat && !custom { self.inline } else { 0 };
                let mut c = t.connect(addr, self, inline)?;
                for p in plans {
                    let secs = run_test(c.as_mut(), true, *p, &mut buf, &mut v, &timer)
                        .map_err(data_err)?;
                    rows.push(Row {
                        name: name(p, *is_lat, custom),
                        bytes: p.size,
                        xfers: p.xfers,
                        iters: p.iters,
                        secs,
                    });
                }
            }
            Ok(rows)
        })();
        if let Some(ch) = child.as_mut() {
            if result.is_err() {
                let _ = ch.kill();
            }
            let _ = ch.wait();
        }
        Ok(RstreamReport {
            transport: t.describe(),
            rows: result?,
            served: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_count_strings_match_rstream() {
        assert_eq!(size_str(64), "64");
        assert_eq!(size_str(4096), "4k");
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(1 << 20), "1m");
        assert_eq!(size_str(3 << 19), "1.5m");
        assert_eq!(size_str(12_800_000), "12m");
        assert_eq!(cnt_str(100_000), "100k");
        assert_eq!(cnt_str(1), "1");
        assert_eq!(cnt_str(1500), "1.5k");
        assert_eq!(size_to_count(64), 100_000);
        assert_eq!(size_to_count(4096), 10_000);
        assert_eq!(size_to_count(65536), 1000);
        assert_eq!(size_to_count(1 << 20), 100);
        assert_eq!(TEST_SIZES.iter().filter(|(_, d)| *d).count(), 4);
    }

    #[test]
    fn verification_is_one_running_count_per_direction() {
        let mut tx = Verify {
            on: true,
            ..Verify::default()
        };
        let mut rx = Verify {
            on: true,
            ..Verify::default()
        };
        // Transfers of odd sizes: the count runs on across them and wraps at 256.
        for size in [16, 300, 7, 1000] {
            let mut b = vec![0u8; size];
            tx.format(&mut b);
            rx.check(&b).unwrap();
        }
        assert_eq!(tx.tx, ((16 + 300 + 7 + 1000) % 256) as u8);
        let mut b = vec![0u8; 64];
        tx.format(&mut b);
        b[40] ^= 1;
        let e = rx.check(&b).unwrap_err();
        assert!(e.to_string().contains("byte 1363"), "{e}");
    }

    #[test]
    fn row_math_matches_rstream() {
        // 64_lat of the TCP baseline: 100k iterations of one 64 B transfer in 2.73 s.
        let r = Row {
            name: "64_lat".into(),
            bytes: 64,
            xfers: 1,
            iters: 100_000,
            secs: 2.732,
        };
        assert!((r.usec_per_xfer() - 13.66).abs() < 0.01);
        assert_eq!(size_str(r.total()), "12m");
        assert!((r.gbps() - 0.0375).abs() < 0.001);
    }
}
