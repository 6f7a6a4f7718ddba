//! The RDS receiver stage: one socket bound to `bind`; every datagram that is a whole frame
//! goes to the output ring as a message descriptor.
//!
//! Datagrams come from any peer and are checked before use: a frame whose header does not
//! decode, or whose length field differs from the datagram's length, is dropped and counted
//! (`dropped`). The payload is copied into an object of `pool` when one is given (and checked
//! against its pattern with `verify`); without a pool only the descriptor travels on.
//!
//! A receiver that is done (its senders ended their streams, or the run stops) finishes once
//! every message it received on an open connection has been acknowledged, with the ack's send
//! completed: once it finishes its node is polled no more, and a sender waits for those acks.
//! (A connection reset in the last moments can still leave a sender without its last acks; it
//! then fails after 10 s saying so, and no message is lost: the receiver had them all.)
//!
//! The socket is read only when the engine reports it readable and the output has room for a
//! burst, so a slow consumer holds messages in the socket's receive queue, where RDS's
//! congestion map tells senders to wait: back-pressure reaches the sender, nothing is lost.

use std::sync::Arc;

use dataplane::rds::node::RdsNode;
use dataplane::rds::{PathId, RdsError, RdsSocket, Received, RecvFlags};
use mempool::pool::ObjId;

use super::END_OF_STREAM;
use crate::config::RdsReceiverDef;
use crate::error::RunError;
use crate::link::Tx;
use crate::msg::{self, HEADER_LEN, MAX_MSG_LEN, Msg};
use crate::payload::{self, Payloads};
use crate::stage::env::{Stage, StageIo, push_pending};
use crate::stage::info::InfoSlot;
use crate::stats::StageStats;

/// `kind = "rds_receiver"`: receives RDS datagrams on one bound socket and forwards them.
pub struct RdsReceiver {
    stats: Arc<StageStats>,
    node: RdsNode,
    sock: RdsSocket,
    rcvbuf: u32,
    configured: bool,
    /// The engine said the socket may have data.
    readable: bool,
    out: Tx,
    outbuf: Vec<Msg>,
    pool: u8,
    payloads: Payloads,
    verify: bool,
    burst: usize,
    buf: Box<[u8]>,
    senders: Option<u32>,
    ended: u32,
    info: Arc<InfoSlot>,
    finished: bool,
}

impl std::fmt::Debug for RdsReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdsReceiver")
            .field("stage", &self.stats.name)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl RdsReceiver {
    /// A receiver on `node` (which owns `def.bind`'s address): binds its socket.
    ///
    /// # Errors
    ///
    /// [`RunError::Rds`] if the socket cannot be created or bound (the port is taken).
    pub fn new(
        mut node: RdsNode,
        def: &RdsReceiverDef,
        out: Tx,
        pool: u8,
        payloads: Payloads,
        stats: Arc<StageStats>,
        info: Arc<InfoSlot>,
    ) -> Result<Self, RunError> {
        let sock = super::bind_socket(&mut node, &stats.name, def.bind)?;
        Ok(Self {
            stats,
            node,
            sock,
            rcvbuf: def.rcvbuf,
            configured: false,
            readable: true,
            out,
            outbuf: Vec::with_capacity(def.burst),
            pool,
            payloads,
            verify: def.verify,
            burst: def.burst,
            buf: vec![0; MAX_MSG_LEN as usize].into_boxed_slice(),
            senders: def.senders,
            ended: 0,
            info,
            finished: false,
        })
    }

    fn fail(&mut self, what: String) {
        self.stats
            .fail(format!("stage `{}`: {what}", self.stats.name));
    }

    /// Turns one datagram of `len` bytes into a descriptor; `None` (counted as dropped) if
    /// it is not a whole frame.
    fn frame(&mut self, len: usize) -> Option<Msg> {
        let mut m = parse_datagram(&self.buf[..len])?;
        let body = &self.buf[HEADER_LEN..len];
        if self.verify && !payload::check(m.pattern, m.flow, m.seq, body) {
            self.stats.counters.verify_errors.add(1);
        }
        if self.pool != 0 {
            let mut id = [ObjId::default()];
            if self.payloads.alloc(self.pool, &mut id).is_err() {
                // Counted; the message goes on without its payload bytes (re-synthesized
                // from the pattern downstream) rather than being lost.
                self.stats.counters.pool_empty.add(1);
                return Some(m);
            }
            m.pool = self.pool;
            m.obj = id[0];
            // SAFETY: the object was just allocated and only `m` names it.
            let dst = unsafe { self.payloads.bytes_mut(&m) };
            let n = dst.len().min(body.len());
            dst[..n].copy_from_slice(&body[..n]);
        }
        Some(m)
    }

    /// Receives up to a burst; returns the datagrams taken.
    fn receive(&mut self, io: &StageIo) -> Result<usize, RdsError> {
        let mut taken = 0;
        while self.readable && self.outbuf.len() < self.burst {
            let r = self.node.engine_mut().recv_from(
                io.now,
                self.sock,
                &mut self.buf,
                RecvFlags::DONTWAIT,
            );
            match r {
                Ok(Received::Data { len, truncated, .. }) => {
                    taken += 1;
                    if !truncated && self.buf[..len] == END_OF_STREAM[..] {
                        self.ended += 1;
                        continue;
                    }
                    let m = if truncated { None } else { self.frame(len) };
                    match m {
                        Some(m) => {
                            let c = &self.stats.counters;
                            c.in_msgs.add(1);
                            c.in_bytes.add(u64::from(m.len));
                            self.outbuf.push(m);
                        }
                        None => self.stats.counters.dropped.add(1),
                    }
                }
                Ok(_) => taken += 1,
                Err(RdsError::WouldBlock) => self.readable = false,
                Err(e) => return Err(e),
            }
        }
        Ok(taken)
    }

    /// Pushes received messages to the output ring; true if all went.
    fn flush_out(&mut self) -> bool {
        if self.outbuf.is_empty() {
            return true;
        }
        let before: u64 = self.outbuf.iter().map(|m| u64::from(m.len)).sum();
        let n = push_pending(&mut self.out, &mut self.outbuf);
        let left: u64 = self.outbuf.iter().map(|m| u64::from(m.len)).sum();
        let c = &self.stats.counters;
        c.out_msgs.add(n as u64);
        c.out_bytes.add(before - left);
        if !self.outbuf.is_empty() {
            c.backpressure.add(1);
            return false;
        }
        true
    }

    /// Whether every message received on an up path has been acknowledged (the ack on the
    /// wire and every frame of the path completed). A path that is down has nobody to
    /// acknowledge to: its sender left (a sender leaves only once acknowledged) or
    /// reconnects and retransmits.
    fn acks_out(&self) -> bool {
        let e = self.node.engine();
        e.connections().all(|(conn, _, npaths)| {
            (0..npaths.max(1)).all(|index| {
                e.path(PathId { conn, index }).is_none_or(|p| {
                    let a = p.ack_state();
                    // Every frame completed, not only the ACK-only one: an ack can ride
                    // on a congestion update or a credit frame still in the send queue.
                    !p.is_up()
                        || (a.sent >= a.next
                            && !a.requested
                            && !a.in_flight
                            && p.frames_in_flight() == 0)
                })
            })
        })
    }

    fn finish(&mut self) {
        self.out.close();
        self.finished = true;
        self.stats.set_finished();
    }
}

/// The message a datagram carries, if it is exactly one whole frame: a header that decodes
/// and a length field equal to the datagram's length. Anything else is a peer's garbage.
fn parse_datagram(d: &[u8]) -> Option<Msg> {
    let hdr: &[u8; HEADER_LEN] = d.get(..HEADER_LEN)?.try_into().ok()?;
    let m = msg::decode_header(hdr).ok()?;
    (m.len as usize == d.len()).then_some(m)
}

impl Stage for RdsReceiver {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let mut work = self.node.poll(io.now);
        if !self.configured {
            self.configured = true;
            let b = self.rcvbuf;
            if let Err(e) = self.node.engine_mut().set_rcvbuf(io.now, self.sock, b) {
                self.fail(format!("setting SO_RCVBUF to {b}: {e}"));
            }
        }
        if self.info.wanted() {
            self.info
                .answer_rds(&mut self.node, self.sock, "receiver", None);
        }
        while let Some(ev) = self.node.engine_mut().poll_event() {
            if ev.sock == self.sock && ev.ready.readable() {
                self.readable = true;
            }
        }
        if self.flush_out() {
            match self.receive(io) {
                Ok(n) => work += n,
                Err(e) => {
                    self.fail(format!("receiving: {e}"));
                    self.readable = false;
                }
            }
            self.flush_out();
        }
        // Receiving frees socket buffer space: the acks and congestion updates go now.
        work += self.node.flush(io.now);
        let all_ended = self.senders.is_some_and(|n| self.ended >= n);
        let stop = all_ended || (io.quiesce && self.senders.is_none());
        if stop && self.outbuf.is_empty() && self.acks_out() {
            self.finish();
            work += 1;
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Pattern;

    fn frame(len: u32) -> Vec<u8> {
        let m = Msg {
            seq: 7,
            len,
            pattern: Pattern::Counter,
            flow: 3,
            ..Msg::default()
        };
        let mut b = vec![0u8; len as usize];
        msg::encode_header(&m, (&mut b[..HEADER_LEN]).try_into().unwrap());
        payload::fill(m.pattern, m.flow, m.seq, &mut b[HEADER_LEN..]);
        b
    }

    #[test]
    fn whole_frames_pass_and_everything_else_is_refused() {
        let good = frame(100);
        let m = parse_datagram(&good).expect("a whole frame");
        assert_eq!((m.seq, m.len, m.flow), (7, 100, 3));
        // Shorter or longer than its length field says.
        assert!(parse_datagram(&good[..99]).is_none());
        let mut long = good.clone();
        long.push(0);
        assert!(parse_datagram(&long).is_none());
        // Shorter than a header, the end-of-stream marker, empty, garbage, a bad magic.
        assert!(parse_datagram(&good[..HEADER_LEN - 1]).is_none());
        assert!(parse_datagram(END_OF_STREAM).is_none());
        assert!(parse_datagram(&[]).is_none());
        assert!(parse_datagram(&[0xA5; 300]).is_none());
        let mut bad = good;
        bad[0] ^= 0xFF;
        assert!(parse_datagram(&bad).is_none());
        // Every truncation of a frame, and every single-byte change of its header, is either
        // refused or still a frame of the datagram's own length: never a panic.
        let f = frame(64);
        for cut in 0..f.len() {
            assert!(parse_datagram(&f[..cut]).is_none());
        }
        for i in 0..HEADER_LEN {
            for x in [1u8, 0x80, 0xFF] {
                let mut g = f.clone();
                g[i] ^= x;
                if let Some(m) = parse_datagram(&g) {
                    assert_eq!(m.len as usize, g.len());
                }
            }
        }
    }
}
