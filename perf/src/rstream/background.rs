//! `--sockets N`: the other N-1 connections of a run, which carry traffic at a fixed rate
//! while the test measures one connection, all driven from the one thread (one lcore) of
//! each side.
//!
//! The client writes one message of the test's size on the background connections in turn,
//! paced to `--rate` messages per second per connection (a token count against the clock,
//! read once every [`CLOCK_EVERY`] calls); the server reads each and writes it back; the
//! client reads the echoes. Each call of [`Background::service`] visits one connection
//! (round robin) for reading, so the cost per call does not grow with N: what grows is what
//! N open connections cost the one being measured (memory, caches, the context's tables),
//! which is what the run shows. The measured connection's waits call `service` on every
//! fruitless spin, as a run-to-completion loop serving many connections would.
//!
//! What grows with N (measured on shm, `-B 16384 -S 64 -C 1 -I 50000`): with `--rate 0`
//! (the background connections visited, none carrying anything) 1023 connections already
//! took the measured p50 from 0.61 to 1.04-1.28 us in one run, against 0.58-0.70 us with
//! one background connection: a visit of a cold connection (its socket, stream state,
//! completion queue, queue-pair state and inbound slot: each a cache miss) on every
//! `BG_STRIDE`th spin costs the measured connection, not the traffic. callgrind's cache
//! model (`--cache-sim=yes`, client of `--sockets 256 --rate 0 -I 20000`): a background
//! visit (`RsContext::recv` from `idle`) is 372 instructions and 20.9 first-level data
//! misses (61,957 over 2,970 visits), against 0.58 per spin of the measured connection
//! (66,922 over 115,041); every one is a wait for L2, L3 or memory. Resident memory per
//! idle connection (client process, 830 connections open): 388 KiB for the shm completion
//! queue's table of 4096 queue-pair slots (one completion queue per rsocket), 144 KiB for
//! the two queue-pair segments (ours and the peer's, 512 inbound slots of 128 bytes
//! each), 72 KiB in two of dp-shm's memfds of remotely accessible memory, 43 KiB of the
//! rsocket arena, 40 KiB of the two protection domains' key tables (one per socket),
//! 88 KiB of heap.

use std::io;

use dataplane::fabric::Provider;
use dataplane::rsocket::{RecvFlags, RsError, RsStream, SendFlagsRs};

use crate::harness::Timer;

/// The clock is read once every this many calls.
const CLOCK_EVERY: u32 = 16;
/// At most this many paced writes per clock read (a burst after a long wait is cut).
const BURST: u64 = 16;

/// The background connections of one side.
pub(super) struct Background<P: Provider> {
    socks: Vec<RsStream<P>>,
    /// Client: writes at the rate; server: echoes.
    client: bool,
    /// Messages per second, all background connections together (client).
    rate: f64,
    msg: Vec<u8>,
    scratch: Vec<u8>,
    /// Bytes a server still owes each connection (an echo the send buffer did not take).
    owed: Vec<usize>,
    next_rx: usize,
    next_tx: usize,
    calls: u32,
    start_ns: Option<u64>,
    sent: u64,
    timer: Timer,
    /// Messages written and read back (client) or echoed (server).
    pub(super) stats: BgStats,
}

/// What the background connections carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BgStats {
    /// Messages written.
    pub(super) sent: u64,
    /// Bytes read.
    pub(super) received: u64,
}

impl<P: Provider> Background<P> {
    /// Background traffic over `socks`: `rate` messages per second per connection of
    /// `size` bytes (the client's side), or echoes (the server's).
    pub(super) fn new(socks: Vec<RsStream<P>>, client: bool, rate: f64, size: usize) -> Self {
        let n = socks.len();
        Self {
            socks,
            client,
            rate: rate * n as f64,
            msg: vec![0x5a; size.max(1)],
            scratch: vec![0; size.max(1) * 4],
            owed: vec![0; n],
            next_rx: 0,
            next_tx: 0,
            calls: 0,
            start_ns: None,
            sent: 0,
            timer: Timer::new(),
            stats: BgStats::default(),
        }
    }

    /// How many connections.
    pub(super) fn len(&self) -> usize {
        self.socks.len()
    }

    /// One step of background work: paced writes when due (client), and one connection
    /// visited for reading (and echoing, on the server).
    ///
    /// # Errors
    /// A background connection failed.
    pub(super) fn service(&mut self) -> io::Result<()> {
        if self.socks.is_empty() {
            return Ok(());
        }
        self.calls = self.calls.wrapping_add(1);
        if self.client && self.calls.is_multiple_of(CLOCK_EVERY) {
            self.pace()?;
        }
        let i = self.next_rx;
        self.next_rx = (i + 1) % self.socks.len();
        let flags = RecvFlags {
            dontwait: true,
            waitall: false,
            peek: false,
        };
        match self.socks[i].recv(&mut self.scratch, flags) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a background connection closed",
                ));
            }
            Ok(n) => {
                self.stats.received += n as u64;
                if !self.client {
                    self.owed[i] += n;
                }
            }
            Err(RsError::WouldBlock) => {}
            Err(e) => return Err(e.into()),
        }
        if self.owed[i] > 0 {
            let n = self.owed[i].min(self.scratch.len());
            match self.socks[i].send(&self.scratch[..n], SendFlagsRs { dontwait: true }) {
                Ok(k) => {
                    self.owed[i] -= k;
                    self.stats.sent += 1;
                }
                Err(RsError::WouldBlock) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Seconds since the first paced write (client), for the rate achieved.
    pub(super) fn elapsed_secs(&self) -> f64 {
        self.start_ns
            .map_or(0.0, |s| self.timer.now_ns().saturating_sub(s) as f64 * 1e-9)
    }

    /// Client: the writes due by now, on the connections in turn.
    fn pace(&mut self) -> io::Result<()> {
        let now = self.timer.now_ns();
        let start = *self.start_ns.get_or_insert(now);
        let due = ((now - start) as f64 * 1e-9 * self.rate) as u64;
        let mut burst = 0;
        while self.sent < due && burst < BURST {
            let i = self.next_tx;
            self.next_tx = (i + 1) % self.socks.len();
            match self.socks[i].send(&self.msg, SendFlagsRs { dontwait: true }) {
                Ok(_) => {
                    self.stats.sent += 1;
                    self.sent += 1;
                }
                // A full send buffer: this one is skipped, the pace goes on.
                Err(RsError::WouldBlock) => self.sent += 1,
                Err(e) => return Err(e.into()),
            }
            burst += 1;
        }
        Ok(())
    }
}

/// Resident and virtual memory of this process, in bytes (`VmRSS`, `VmSize` of
/// `/proc/self/status`), if readable.
pub(super) fn memory() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let l = s.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmSize:")?))
}
