//! The RDS sender stage: every message of its input ring becomes one datagram to `dest`.
//!
//! A message is encoded into the stage's one send buffer (header, then the payload from its
//! pool object, which is given back, or synthesized from the pattern) and handed to
//! [`RdsEngine::send_to`](dataplane::rds::RdsEngine::send_to) with `MSG_DONTWAIT`. A full
//! socket buffer (`EAGAIN`), a congested destination (`ENOBUFS`) or a full node (`ENOMEM`)
//! keeps the encoded message for the next poll and counts back-pressure: nothing is dropped.
//! RDS connects on the first send and reconnects by itself, so a sender may start before its
//! receiver.
//!
//! Once the input has ended: the end-of-stream datagram, then the stage waits until every
//! byte it sent has been acknowledged (the socket's unacked bytes are zero) and finishes.
//! It keeps its node up 50 ms longer, so that the receiver sees its last acknowledgement
//! complete on an open connection. Acknowledgements missing 10 s after the end of the stream fail the stage (the receiver
//! stopped, or is unreachable).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::rds::node::RdsNode;
use dataplane::rds::{RdsError, RdsSocket, SendFlags};
use lcore::time::{Instant, duration_to_nanos};

use super::END_OF_STREAM;
use crate::config::RdsSenderDef;
use crate::error::RunError;
use crate::link::Rx;
use crate::msg::{self, HEADER_LEN, MAX_MSG_LEN, Msg};
use crate::payload::{self, Payloads};
use crate::stage::env::{Stage, StageIo};
use crate::stage::info::InfoSlot;
use crate::stats::StageStats;

/// How long the last acknowledgements may take before the stage gives up.
const ACK_WAIT: Duration = Duration::from_secs(10);

/// How long the node stays up after the last acknowledgement: finishing drops it (the
/// connection goes down), and the receiver should first see its last acknowledgement
/// complete, or it lingers itself (see the receiver).
const LINGER: Duration = Duration::from_millis(50);

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Sending the input.
    Data,
    /// The input ended; the end-of-stream datagram is not sent yet.
    Ending,
    /// Waiting for the last acknowledgements, since then.
    Acking(Instant),
    /// Everything acknowledged; the node stays up a moment, since then.
    Linger(Instant),
    /// Done (or failed).
    Done,
}

/// `kind = "rds_sender"`: sends the messages of a ring as RDS datagrams to one address.
pub struct RdsSender {
    stats: Arc<StageStats>,
    node: RdsNode,
    sock: RdsSocket,
    dest: SocketAddr,
    sndbuf: u32,
    configured: bool,
    input: Rx,
    payloads: Payloads,
    burst: usize,
    /// One encoded message; `held` bytes of it wait for room in the socket.
    buf: Box<[u8]>,
    held: usize,
    phase: Phase,
    info: Arc<InfoSlot>,
    finished: bool,
}

impl std::fmt::Debug for RdsSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdsSender")
            .field("stage", &self.stats.name)
            .field("dest", &self.dest)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl RdsSender {
    /// A sender on `node` (which owns `def.bind`'s address): binds its socket.
    ///
    /// # Errors
    ///
    /// [`RunError::Rds`] if the socket cannot be created or bound.
    pub fn new(
        mut node: RdsNode,
        def: &RdsSenderDef,
        input: Rx,
        payloads: Payloads,
        stats: Arc<StageStats>,
        info: Arc<InfoSlot>,
    ) -> Result<Self, RunError> {
        let sock = super::bind_socket(&mut node, &stats.name, def.bind)?;
        Ok(Self {
            stats,
            node,
            sock,
            dest: def.dest,
            sndbuf: def.sndbuf,
            configured: false,
            input,
            payloads,
            burst: def.burst,
            buf: vec![0; MAX_MSG_LEN as usize].into_boxed_slice(),
            held: 0,
            phase: Phase::Data,
            info,
            finished: false,
        })
    }

    fn fail(&mut self, what: String) {
        self.stats
            .fail(format!("stage `{}`: {what}", self.stats.name));
        self.phase = Phase::Done;
    }

    /// Tries to send the held message; true if it went (or there was none).
    fn push_held(&mut self, io: &StageIo) -> Result<bool, RdsError> {
        if self.held == 0 {
            return Ok(true);
        }
        let r = self.node.engine_mut().send_to(
            io.now,
            self.sock,
            Some(self.dest),
            &self.buf[..self.held],
            SendFlags::DONTWAIT,
        );
        match r {
            Ok(_) => {
                let c = &self.stats.counters;
                c.out_msgs.add(1);
                c.out_bytes.add(self.held as u64);
                self.held = 0;
                Ok(true)
            }
            Err(e) if held_back(e) => {
                self.stats.counters.backpressure.add(1);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes one message off the input and encodes it into the send buffer.
    fn take_one(&mut self) -> bool {
        let mut one = [Msg::default()];
        if self.input.recv_burst(&mut one) == 0 {
            return false;
        }
        let m = one[0];
        let len = m.len as usize;
        let (hdr, body) = self.buf[..len].split_at_mut(HEADER_LEN);
        let hdr: &mut [u8; HEADER_LEN] = hdr.try_into().expect("split at HEADER_LEN");
        msg::encode_header(&m, hdr);
        if m.pool != 0 {
            // SAFETY: `m` was just dequeued by this stage, which owns its payload object;
            // the bytes are copied out and the object is given back once.
            unsafe {
                let src = self.payloads.bytes(&m);
                let n = src.len().min(body.len());
                body[..n].copy_from_slice(&src[..n]);
                body[n..].fill(0);
                self.payloads.free(&m);
            }
        } else {
            payload::fill(m.pattern, m.flow, m.seq, body);
        }
        self.held = len;
        let c = &self.stats.counters;
        c.in_msgs.add(1);
        c.in_bytes.add(len as u64);
        true
    }

    fn pump(&mut self, io: &StageIo) -> Result<usize, RdsError> {
        let mut work = 0;
        match self.phase {
            Phase::Data => {
                for _ in 0..self.burst {
                    if !self.push_held(io)? {
                        break;
                    }
                    if !self.take_one() {
                        if self.input.at_eof() {
                            self.phase = Phase::Ending;
                        }
                        break;
                    }
                    work += 1;
                }
                // The last message taken goes now if it can.
                if self.held != 0 && self.push_held(io)? {
                    work += 1;
                }
            }
            Phase::Ending => {
                if self.push_held(io)? {
                    // The marker is not a message: it is not counted as one.
                    let r = self.node.engine_mut().send_to(
                        io.now,
                        self.sock,
                        Some(self.dest),
                        END_OF_STREAM,
                        SendFlags::DONTWAIT,
                    );
                    match r {
                        Ok(_) => {
                            self.phase = Phase::Acking(io.now);
                            work += 1;
                        }
                        Err(e) if held_back(e) => self.stats.counters.backpressure.add(1),
                        Err(e) => return Err(e),
                    }
                }
            }
            Phase::Acking(since) => {
                let (unacked, _) = self.node.engine().queued_bytes(self.sock)?;
                if unacked == 0 {
                    self.phase = Phase::Linger(io.now);
                    work += 1;
                } else if io.now.nanos_since(since) > duration_to_nanos(ACK_WAIT) {
                    self.fail(format!(
                        "{unacked} bytes sent to {} were not acknowledged within {ACK_WAIT:?} \
                         after the end of the stream; did the receiver stop early (its \
                         `senders` count), or is it unreachable?",
                        self.dest
                    ));
                }
            }
            Phase::Linger(since) => {
                if io.now.nanos_since(since) > duration_to_nanos(LINGER) {
                    self.phase = Phase::Done;
                    work += 1;
                }
            }
            Phase::Done => {}
        }
        Ok(work)
    }

    fn finish(&mut self) {
        self.finished = true;
        self.stats.set_finished();
    }
}

/// Errors that mean "not now": the message is kept and sent later.
fn held_back(e: RdsError) -> bool {
    matches!(
        e,
        RdsError::WouldBlock
            | RdsError::Blocked(_)
            | RdsError::Congested { .. }
            | RdsError::NoMemory(_)
    )
}

impl Stage for RdsSender {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let mut work = self.node.poll(io.now);
        if !self.configured {
            self.configured = true;
            let b = self.sndbuf;
            if let Err(e) = self.node.engine_mut().set_sndbuf(io.now, self.sock, b) {
                self.fail(format!("setting SO_SNDBUF to {b}: {e}"));
            }
        }
        if self.info.wanted() {
            self.info
                .answer_rds(&mut self.node, self.sock, "sender", Some(self.dest));
        }
        // Readiness events are not needed (the sender retries each poll); drain them so the
        // queue stays short.
        while self.node.engine_mut().poll_event().is_some() {}
        if self.phase != Phase::Done {
            match self.pump(io) {
                Ok(w) => work += w,
                Err(e) => self.fail(format!("sending to {}: {e}", self.dest)),
            }
        }
        work += self.node.flush(io.now);
        if self.phase == Phase::Done && self.input.at_eof() {
            self.finish();
            work += 1;
        } else if self.phase == Phase::Done {
            // Failed: discard the input so upstream stages can drain.
            let mut buf = [Msg::default(); 32];
            let n = self.input.recv_burst(&mut buf);
            for m in &buf[..n] {
                // SAFETY: dequeued by this stage, which owns the payload and drops it.
                unsafe { self.payloads.free(m) };
            }
            self.stats.counters.dropped.add(n as u64);
            work += n;
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}

const _: () = assert!(END_OF_STREAM.len() < HEADER_LEN);
