//! One RDS-TCP connection: a connected, non-blocking socket carrying one path, with its
//! bounded receive buffer, its queue of frames being written, and the byte counts that
//! turn TCP's acknowledgements into RDS acks.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};

use lcore::time::Instant;

use super::config::TcpStats;
use super::sys;
use crate::engine::RdsEngine;
use crate::path::{ConnState, PathId, TxFrame, TxPayload};
use crate::store::FragId;
use crate::wire::{FRAG_SIZE, HEADER_LEN};

/// A frame queued on a connection, `off` bytes of it written.
#[derive(Clone, Copy, Debug)]
struct Pending {
    frame: TxFrame,
    off: usize,
}

/// Why a connection ended. Only the read side says so: a connection is over once it has
/// been read to its end (see [`TcpConn::send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lost {
    /// The peer closed (end of stream) or a read failed (reset, timeout), after every
    /// byte the socket held was read.
    Socket,
}

/// A live connection of one path.
#[derive(Debug)]
pub(super) struct TcpConn {
    pub(super) stream: TcpStream,
    pub(super) path: PathId,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    tx: VecDeque<Pending>,
    /// Bytes written since the connection was set up (the stream offset of the path).
    written: u64,
    /// The acknowledged offset last reported to the engine.
    acked: u64,
    /// Bytes read since the connection was set up.
    read: u64,
    /// A write failed: nothing more is written (the write side is shut), and the
    /// connection lives until its read side ends.
    tx_failed: bool,
}

impl TcpConn {
    /// A connection of `path` over `stream` (non-blocking, options set).
    pub(super) fn new(stream: TcpStream, path: PathId, rx_buffer: usize, depth: usize) -> Self {
        Self {
            stream,
            path,
            rx: vec![0u8; rx_buffer.max(HEADER_LEN)].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            tx: VecDeque::with_capacity(depth.max(1) + 1),
            written: 0,
            acked: 0,
            read: 0,
            tx_failed: false,
        }
    }

    /// Bytes written to and read from the socket since the connection was set up.
    pub(super) fn bytes(&self) -> (u64, u64) {
        (self.written, self.read)
    }

    /// Frames queued and not fully written.
    pub(super) fn queued(&self) -> usize {
        self.tx.len()
    }

    /// Queues a frame of the engine for writing.
    pub(super) fn push(&mut self, frame: TxFrame) {
        self.tx.push_back(Pending { frame, off: 0 });
    }

    /// Both directions shut: the peer sees the connection end.
    pub(super) fn kill(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Reads what the socket has and hands it to the engine, until the socket is empty,
    /// the engine's store is full (the rest waits here and in the socket), or the path
    /// stops receiving (reset by a violation: the rest is of no use). Returns the work
    /// done, or how the connection was lost.
    pub(super) fn receive(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        stats: &mut TcpStats,
    ) -> Result<usize, Lost> {
        let mut work = 0;
        loop {
            if self.rx_pending() {
                work += self.hand_over(engine, now, stats);
                if self.rx_pending() || engine.path_state(self.path) != Some(ConnState::Up) {
                    return Ok(work);
                }
            }
            if !self.read_once(stats)? {
                return Ok(work);
            }
        }
    }

    /// True if bytes of the peer wait here or in the socket (an error counts as none).
    pub(super) fn holds_bytes(&self) -> bool {
        self.rx_pending() || sys::unread(&self.stream).is_ok_and(|n| n > 0)
    }

    /// True if bytes read from the socket wait here for the engine.
    pub(super) fn rx_pending(&self) -> bool {
        self.rx_start < self.rx_end
    }

    /// One read into the receive buffer if it is empty, without handing anything over;
    /// true if bytes were read.
    pub(super) fn read_once(&mut self, stats: &mut TcpStats) -> Result<bool, Lost> {
        if self.rx_pending() {
            return Ok(false);
        }
        self.rx_start = 0;
        self.rx_end = 0;
        loop {
            match self.stream.read(&mut self.rx) {
                Ok(0) => return Err(Lost::Socket),
                Ok(n) => {
                    stats.tcp_reads += 1;
                    stats.tcp_rx_bytes += n as u64;
                    self.read += n as u64;
                    self.rx_end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(Lost::Socket),
            }
        }
    }

    /// Hands the bytes already read to the engine (no read); the work done.
    pub(super) fn hand_over(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        stats: &mut TcpStats,
    ) -> usize {
        if !self.rx_pending() {
            return 0;
        }
        let took = engine.handle_stream_bytes(now, self.path, &self.rx[self.rx_start..self.rx_end]);
        self.rx_start += took;
        if engine.path_state(self.path) != Some(ConnState::Up) {
            // A violation reset the path; its Disconnect command closes us.
            self.rx_start = self.rx_end;
        } else if self.rx_pending() {
            stats.tcp_rx_store_full += 1;
        }
        1
    }

    /// Writes queued frames, gathered into `scratch` (many small frames per `write`), until
    /// the queue is empty or the socket is full. Every frame written completely is
    /// completed to the engine (its token), which lets the path hand over more. Returns
    /// the work done.
    ///
    /// A failed write does not end the connection: the socket may still hold bytes of the
    /// peer that our TCP acknowledged, so the peer's RDS released those messages, and
    /// closing it now would drop them (`EPIPE` after our own shutdown, or `ECONNRESET`,
    /// while the receive queue is still full: Linux keeps it readable). The connection
    /// stops writing (its queued frames are retransmitted after the reset, as unacked) and
    /// is reported lost by [`receive`](Self::receive) once read to its end.
    pub(super) fn send(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        scratch: &mut [u8],
        stats: &mut TcpStats,
    ) -> usize {
        let mut work = 0;
        while !self.tx.is_empty() && !self.tx_failed {
            let n = self.gather(engine, scratch);
            let w = match self.stream.write(&scratch[..n]) {
                Ok(w) => w,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return work,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Our write side is shut too, so that the peer ends the connection
                    // whatever the error was (after our shutdown or a reset it already is).
                    let _ = self.stream.shutdown(Shutdown::Write);
                    self.tx_failed = true;
                    stats.tcp_tx_failed += 1;
                    return work + 1;
                }
            };
            stats.tcp_writes += 1;
            stats.tcp_tx_bytes += w as u64;
            self.written += w as u64;
            work += 1;
            let mut left = w;
            while left > 0 {
                let Some(p) = self.tx.front_mut() else { break };
                let rest = p.frame.wire_len() - p.off;
                if left >= rest {
                    left -= rest;
                    let token = p.frame.token;
                    self.tx.pop_front();
                    engine.handle_send_complete(now, self.path, token);
                } else {
                    p.off += left;
                    left = 0;
                }
            }
            // Zero-length frames cannot exist (a header is 48 bytes), so a short write
            // means the socket buffer is full.
            if w < n {
                return work;
            }
        }
        work
    }

    /// Copies the unwritten bytes of the queued frames into `scratch`, in order, as many
    /// as fit. Returns the bytes gathered.
    fn gather(&self, engine: &RdsEngine, scratch: &mut [u8]) -> usize {
        let frags = engine.frags();
        let mut at = 0;
        for p in &self.tx {
            if at == scratch.len() {
                break;
            }
            let mut off = p.off;
            if off < HEADER_LEN {
                let n = (HEADER_LEN - off).min(scratch.len() - at);
                scratch[at..at + n].copy_from_slice(&p.frame.header[off..off + n]);
                at += n;
                off += n;
            }
            let skip = off - HEADER_LEN;
            let n =
                (p.frame.payload.len() - skip.min(p.frame.payload.len())).min(scratch.len() - at);
            if n == 0 {
                continue;
            }
            match p.frame.payload {
                TxPayload::None => {}
                TxPayload::Chain { chain, .. } => {
                    frags.read_chain(&chain, skip, &mut scratch[at..at + n]);
                }
                TxPayload::Frag { frag, .. } => {
                    copy_frag(engine, frag, skip, &mut scratch[at..at + n]);
                }
            }
            at += n;
        }
        at
    }

    /// Reports the peer's acknowledged bytes to the engine: `written - SIOCOUTQ`. Queried
    /// only while something written is unacknowledged. Still valid after a failed write
    /// or a reset (Linux keeps `write_seq` and `snd_una`); a failed query (not a
    /// connected TCP socket any more) reports nothing, and the read side ends the
    /// connection.
    pub(super) fn update_acked(
        &mut self,
        engine: &mut RdsEngine,
        now: Instant,
        stats: &mut TcpStats,
    ) -> usize {
        if self.acked >= self.written {
            return 0;
        }
        stats.tcp_ack_queries += 1;
        let Ok(unacked) = sys::unacked(&self.stream) else {
            return 0;
        };
        let acked = self.written.saturating_sub(u64::from(unacked));
        if acked > self.acked {
            self.acked = acked;
            engine.handle_stream_acked(now, self.path, acked);
            return 1;
        }
        0
    }
}

/// Copies part of one fragment (message-flavour payloads; a stream path sends chains).
fn copy_frag(engine: &RdsEngine, frag: FragId, skip: usize, dst: &mut [u8]) {
    let n = dst.len().min(FRAG_SIZE.saturating_sub(skip));
    if n > 0 {
        engine.frags().read(frag, skip, &mut dst[..n]);
    }
}
