//! The rsocket server stage: accepts connections and serves each from its poll.
//!
//! * `mode = "echo"`: every complete frame is counted and its bytes are sent back as they are.
//! * `mode = "sink"`: frames are decoded; with an `output` ring they are forwarded as
//!   descriptors (payloads copied into `pool` objects when a pool is given, else dropped and
//!   re-synthesized from the pattern downstream); without one the server is the end of the
//!   pipeline and records sequence gaps, payload checks and end-to-end latency itself.
//!
//! A server stops accepting on quiesce or once `connections` connections were accepted, and
//! finishes when every connection has reached end of stream (the clients closed) and, with a
//! limit, the limit was reached. A reset connection or a malformed frame fails the stage.

use std::io::ErrorKind;
use std::sync::Arc;

use dataplane::fabric::Provider;
use dataplane::rsocket::{RecvFlags, RsContext, RsError, RsListener, RsStream, SendFlagsRs};
use mempool::pool::ObjId;

use super::bytes::{ByteBuf, next_frame};
use crate::config::{ServerDef, ServerMode};
use crate::error::RunError;
use crate::link::Tx;
use crate::msg::{MAX_MSG_LEN, Msg};
use crate::payload::{self, Payloads};
use crate::stage::env::{Stage, StageIo, Terminus, push_pending, stamp_now};
use crate::stats::StageStats;

const RX_BUF: usize = 256 << 10;
const DONTWAIT: SendFlagsRs = SendFlagsRs { dontwait: true };
const RECV_DONTWAIT: RecvFlags = RecvFlags {
    dontwait: true,
    peek: false,
    waitall: false,
};

struct Conn<P: Provider> {
    s: RsStream<P>,
    rx: ByteBuf,
    /// Echo mode: bytes at the front of `rx` that are whole frames, ready to go back.
    ready: usize,
    eof: bool,
}

/// `kind = "rsocket_server"`: accepts rsocket connections and echoes or consumes the framed
/// messages sent on them.
pub struct RsServer<P: Provider> {
    stats: Arc<StageStats>,
    ctx: RsContext<P>,
    listener: Option<RsListener<P>>,
    mode: ServerMode,
    conns: Vec<Conn<P>>,
    limit: Option<u32>,
    accepted: u32,
    closed: u32,
    out: Option<Tx>,
    outbuf: Vec<Msg>,
    pool: u8,
    payloads: Payloads,
    term: Option<Terminus>,
    verify: bool,
    burst: usize,
    finished: bool,
}

impl<P: Provider> std::fmt::Debug for RsServer<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsServer")
            .field("stage", &self.stats.name)
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl<P: Provider> RsServer<P> {
    /// Binds `def.listen` on `ctx` (non-blocking).
    ///
    /// # Errors
    ///
    /// [`RunError::Listen`] if the address is taken or the listener cannot be set up.
    pub fn new(
        ctx: RsContext<P>,
        def: &ServerDef,
        out: Option<Tx>,
        pool: u8,
        payloads: Payloads,
        stats: Arc<StageStats>,
    ) -> Result<Self, RunError> {
        let listen_err = |source| RunError::Listen {
            stage: stats.name.clone(),
            addr: def.listen,
            source,
        };
        let l = RsListener::bind(&ctx, def.listen).map_err(listen_err)?;
        l.set_nonblocking(true).map_err(listen_err)?;
        let terminal = def.mode == ServerMode::Sink && out.is_none();
        Ok(Self {
            term: terminal.then(|| Terminus::new(Arc::clone(&stats), def.verify)),
            stats,
            ctx,
            listener: Some(l),
            mode: def.mode,
            conns: Vec::new(),
            limit: def.connections,
            accepted: 0,
            closed: 0,
            out,
            outbuf: Vec::with_capacity(def.burst),
            pool,
            payloads,
            verify: def.verify,
            burst: def.burst,
            finished: false,
        })
    }

    fn fail(&mut self, what: String) {
        self.stats
            .fail(format!("stage `{}`: {what}", self.stats.name));
    }

    fn accept(&mut self) -> usize {
        let Some(l) = &self.listener else { return 0 };
        let mut work = 0;
        loop {
            match l.accept() {
                Ok((s, _peer)) => {
                    self.conns.push(Conn {
                        s,
                        rx: ByteBuf::new(RX_BUF),
                        ready: 0,
                        eof: false,
                    });
                    self.accepted += 1;
                    self.stats.counters.conns_opened.add(1);
                    work += 1;
                    if self.limit.is_some_and(|n| self.accepted >= n) {
                        self.listener = None;
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.fail(format!("accepting a connection: {e}"));
                    self.listener = None;
                    break;
                }
            }
        }
        work
    }

    /// Serves connection `i`; returns work done, or an error text (the connection is then
    /// closed).
    fn serve(&mut self, i: usize, now: u64) -> Result<usize, String> {
        let mut work = 0;
        let c = &mut self.conns[i];
        // A full buffer (output held back) reads nothing: a zero-length receive would look
        // like end of stream.
        if !c.eof && c.rx.free() > 0 {
            match c.s.recv(c.rx.spare(), RECV_DONTWAIT) {
                Ok(0) => c.eof = true,
                Ok(n) => {
                    c.rx.commit(n);
                    self.stats.counters.in_bytes.add(n as u64);
                    work += 1;
                }
                Err(RsError::WouldBlock) => {}
                Err(e) => return Err(format!("receiving: {e}")),
            }
        }
        match self.mode {
            ServerMode::Echo => work += self.echo(i)?,
            ServerMode::Sink => work += self.consume(i, now)?,
        }
        let c = &self.conns[i];
        if c.eof && c.ready == 0 && !c.rx.is_empty() && matches!(next_frame(c.rx.data()), Ok(None))
        {
            return Err(format!(
                "the stream ended inside a frame ({} bytes of it arrived)",
                c.rx.len()
            ));
        }
        Ok(work)
    }

    fn echo(&mut self, i: usize) -> Result<usize, String> {
        let c = &mut self.conns[i];
        let mut frames = 0u64;
        while let Some((m, _)) = next_frame(&c.rx.data()[c.ready..]).map_err(|e| e.to_string())? {
            c.ready += m.len as usize;
            frames += 1;
        }
        let cs = &self.stats.counters;
        cs.in_msgs.add(frames);
        cs.out_msgs.add(frames);
        if c.ready == 0 {
            return Ok(frames as usize);
        }
        match c.s.send(&c.rx.data()[..c.ready], DONTWAIT) {
            Ok(n) => {
                c.rx.consume(n);
                c.ready -= n;
                cs.out_bytes.add(n as u64);
                Ok(frames as usize + 1)
            }
            Err(RsError::WouldBlock) => {
                cs.backpressure.add(1);
                Ok(frames as usize)
            }
            Err(e) => Err(format!("echoing: {e}")),
        }
    }

    fn consume(&mut self, i: usize, now: u64) -> Result<usize, String> {
        let mut msgs = 0u64;
        let mut bad = 0u64;
        loop {
            if self.out.is_some() && self.outbuf.len() == self.burst {
                break;
            }
            let c = &mut self.conns[i];
            let Some((mut m, body)) = next_frame(c.rx.data()).map_err(|e| e.to_string())? else {
                break;
            };
            if let Some(t) = &mut self.term {
                t.see(&m, now, Some(body));
            } else {
                if self.verify && !payload::check(m.pattern, m.flow, m.seq, body) {
                    bad += 1;
                }
                if self.pool != 0 {
                    let mut id = [ObjId::default()];
                    if self.payloads.alloc(self.pool, &mut id).is_err() {
                        self.stats.counters.pool_empty.add(1);
                        break;
                    }
                    m.pool = self.pool;
                    m.obj = id[0];
                    // SAFETY: the object was just allocated and only `m` names it.
                    let dst = unsafe { self.payloads.bytes_mut(&m) };
                    let n = dst.len().min(body.len());
                    dst[..n].copy_from_slice(&body[..n]);
                }
                self.outbuf.push(m);
            }
            c.rx.consume(m.len as usize);
            msgs += 1;
        }
        let cs = &self.stats.counters;
        cs.in_msgs.add(msgs);
        if bad > 0 {
            cs.verify_errors.add(bad);
        }
        if let Some(t) = &mut self.term {
            t.publish(now);
        } else {
            self.flush_out();
        }
        Ok(msgs as usize)
    }

    /// Pushes forwarded messages to the output ring; true if all went.
    fn flush_out(&mut self) -> bool {
        let Some(tx) = &mut self.out else { return true };
        let bytes_before: u64 = self.outbuf.iter().map(|m| u64::from(m.len)).sum();
        let n = push_pending(tx, &mut self.outbuf);
        let left: u64 = self.outbuf.iter().map(|m| u64::from(m.len)).sum();
        let cs = &self.stats.counters;
        cs.out_msgs.add(n as u64);
        cs.out_bytes.add(bytes_before - left);
        if !self.outbuf.is_empty() {
            cs.backpressure.add(1);
            return false;
        }
        true
    }

    fn finish(&mut self) {
        if let Some(tx) = &mut self.out {
            tx.close();
        }
        self.finished = true;
        self.stats.set_finished();
    }
}

impl<P: Provider> Stage for RsServer<P> {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let mut work = self.ctx.progress();
        if io.quiesce {
            self.listener = None;
        }
        work += self.accept();
        if !self.flush_out() {
            return work;
        }
        let now = stamp_now();
        let mut i = 0;
        while i < self.conns.len() {
            let served = self.serve(i, now);
            let c = &self.conns[i];
            let done = match served {
                Ok(w) => {
                    work += w;
                    c.eof && c.rx.is_empty()
                }
                Err(e) => {
                    let peer =
                        c.s.peer_addr()
                            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
                    self.fail(format!("connection from {peer}: {e}"));
                    true
                }
            };
            if done {
                // The peer has closed: dropping the stream completes the close.
                drop(self.conns.swap_remove(i));
                self.closed += 1;
                self.stats.counters.conns_closed.add(1);
                work += 1;
            } else {
                i += 1;
            }
        }
        let limit_reached = self.limit.is_some_and(|n| self.closed >= n);
        if self.conns.is_empty() && self.outbuf.is_empty() && (io.quiesce || limit_reached) {
            self.finish();
            work += 1;
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}

const _: () = assert!(RX_BUF >= 2 * MAX_MSG_LEN as usize);
