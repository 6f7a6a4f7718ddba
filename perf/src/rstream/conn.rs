//! Transport-neutral connections: what the test loop needs of a connection ([`Conn`]), where
//! connections come from ([`Transport`], [`Listener`]), and the helpers both transports use.

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::PerfError;

/// How connections are set up: rstream's `-B` and `-T b`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnOpts {
    /// SO_SNDBUF and SO_RCVBUF.
    pub buffer: u32,
    /// Blocking calls (`-T b`) instead of spinning on would-block.
    pub blocking: bool,
}

/// One connection's byte stream.
pub(super) trait Conn {
    /// Sends all of `b` (spinning on would-block unless blocking).
    fn send_all(&mut self, b: &[u8]) -> io::Result<()>;
    /// Receives exactly `b.len()` bytes.
    fn recv_all(&mut self, b: &mut [u8]) -> io::Result<()>;
    /// With `--sockets`: what opening the background connections cost (resident and
    /// virtual bytes per connection) and what they carried.
    fn background(&self) -> Option<BgReport> {
        None
    }
}

/// `--sockets N`: N-1 background connections beside the measured one.
#[derive(Debug, Clone, Copy)]
pub(super) struct BgSpec {
    /// Background connections (N-1).
    pub count: usize,
    /// Messages per second per background connection.
    pub rate: f64,
    /// Message size.
    pub size: usize,
}

/// What a side's background connections cost and carried.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BgReport {
    /// Background connections.
    pub count: usize,
    /// Resident bytes per connection, measured across opening them.
    pub rss_per_socket: Option<u64>,
    /// Virtual bytes per connection, measured across opening them.
    pub vm_per_socket: Option<u64>,
    /// Messages written on them.
    pub sent: u64,
    /// Bytes read from them.
    pub received: u64,
    /// Seconds they were driven (client), for the rate achieved.
    pub secs: f64,
}

impl BgReport {
    /// Messages per second per connection actually written.
    pub fn rate_achieved(&self) -> f64 {
        if self.secs > 0.0 && self.count > 0 {
            self.sent as f64 / self.secs / self.count as f64
        } else {
            0.0
        }
    }
}

const GUARD: Duration = Duration::from_secs(120);

/// A hang guard for the transfer loops that costs nothing on the timed path: the clock is
/// read only every [`HangGuard::EVERY`] fruitless spins (a clock read per spin would add
/// tens of nanoseconds to each wait and show up in the 64-byte latencies).
pub(super) struct HangGuard {
    spins: u32,
    since: Option<Instant>,
}

impl HangGuard {
    const EVERY: u32 = 4096;

    pub(super) fn new() -> Self {
        Self {
            spins: 0,
            since: None,
        }
    }

    /// One fruitless spin; an error once the peer has made no progress for [`GUARD`].
    #[inline]
    pub(super) fn spin(&mut self, what: &'static str) -> io::Result<()> {
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

/// Where connections come from: rsockets on a fabric provider, or kernel TCP.
pub(super) trait Transport {
    /// The report's `transport`: the provider's name, or "tcp".
    fn describe(&self) -> &'static str;
    /// Listens on `bind` (server side).
    fn listen(&self, bind: SocketAddr, opts: ConnOpts)
    -> Result<Box<dyn Listener + '_>, PerfError>;
    /// Connects to `addr` with `inline` as the inline size (none: the library's default)
    /// (client side), then the
    /// background connections of `bg`, if any.
    fn connect(
        &self,
        addr: SocketAddr,
        opts: ConnOpts,
        inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError>;
}

/// A listening endpoint of a [`Transport`].
pub(super) trait Listener {
    /// Accepts the next connection, set up like the client's, then the background
    /// connections of `bg`, if any.
    fn accept(
        &self,
        opts: ConnOpts,
        inline: Option<u32>,
        bg: Option<BgSpec>,
    ) -> Result<Box<dyn Conn>, PerfError>;
}

/// A connection or transfer failure, described.
pub(super) fn fabric_err(what: &str, e: impl std::fmt::Display) -> PerfError {
    PerfError::Fabric(format!("{what}: {e}"))
}

/// Connects, retrying while nothing listens yet (a `--pair` server is still starting).
pub(super) fn retry_refused<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
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
