//! The rsocket client stage: frames the messages of its input ring onto one stream.
//!
//! States: *idle* (waiting to retry a connect), *connecting* (non-blocking connect under
//! way), *up*, *failed* (discarding its input until end of stream, so upstream stages can
//! still drain) and *closed*. A refused connect is retried every 20 ms until
//! `connect_timeout`, so a client may start before its server.
//!
//! With `echo = true` the server sends every frame back: the client parses the echo, checks
//! it, records the round trip (now minus the generation stamp) and forwards the messages to
//! its output ring if it has one. It closes once its input has ended, every byte has been
//! sent and, with echo, every byte has come back: first a half-close, then, once the server
//! has seen the end of stream and closed its side, the close.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dataplane::fabric::Provider;
use dataplane::rsocket::{RecvFlags, RsContext, RsError, RsStream, SendFlagsRs, Shutdown};
use lcore::time::Instant;

use super::bytes::{ByteBuf, encode, next_frame};
use crate::config::ClientDef;
use crate::link::{Rx, Tx};
use crate::msg::{MAX_MSG_LEN, Msg};
use crate::payload::Payloads;
use crate::stage::env::{Stage, StageIo, StartGate, Terminus, push_pending, stamp_now};
use crate::stats::StageStats;

const TX_BUF: usize = 1 << 20;
const RX_BUF: usize = 1 << 20;
const RETRY: Duration = Duration::from_millis(20);
/// How long a half-closed client waits for the server to close.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
const DONTWAIT: SendFlagsRs = SendFlagsRs { dontwait: true };
const RECV_DONTWAIT: RecvFlags = RecvFlags {
    dontwait: true,
    peek: false,
    waitall: false,
};

enum State<P: Provider> {
    Idle {
        retry_at: Option<Instant>,
    },
    Connecting(RsStream<P>),
    Up(RsStream<P>),
    /// Half-closed: waiting for the server to close its side.
    Closing(RsStream<P>, Instant),
    Failed,
    Closed,
}

/// `kind = "rsocket_client"`: frames the messages of its input ring onto one rsocket stream,
/// optionally reading the echo back for round-trip latency.
pub struct RsClient<P: Provider> {
    stats: Arc<StageStats>,
    ctx: RsContext<P>,
    addr: SocketAddr,
    state: State<P>,
    input: Rx,
    out: Option<Tx>,
    outbuf: Vec<Msg>,
    echo: Option<Terminus>,
    verify: bool,
    payloads: Payloads,
    burst: usize,
    txbuf: ByteBuf,
    rxbuf: ByteBuf,
    sent: u64,
    echoed: u64,
    connect_timeout: Duration,
    first_attempt: Option<Instant>,
    /// Reported to once, when connected.
    gate: Option<StartGate>,
    finished: bool,
}

impl<P: Provider> std::fmt::Debug for RsClient<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsClient")
            .field("stage", &self.stats.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> RsClient<P> {
    /// A client on `ctx` for `def`, reading `input`.
    pub fn new(
        ctx: RsContext<P>,
        def: &ClientDef,
        input: Rx,
        out: Option<Tx>,
        payloads: Payloads,
        gate: StartGate,
        stats: Arc<StageStats>,
    ) -> Self {
        Self {
            gate: Some(gate),
            echo: def
                .echo
                .then(|| Terminus::new(Arc::clone(&stats), def.verify)),
            stats,
            ctx,
            addr: def.connect,
            state: State::Idle { retry_at: None },
            input,
            out,
            outbuf: Vec::with_capacity(def.burst),
            verify: def.verify,
            payloads,
            burst: def.burst,
            txbuf: ByteBuf::new(TX_BUF),
            rxbuf: ByteBuf::new(if def.echo { RX_BUF } else { 0 }),
            sent: 0,
            echoed: 0,
            connect_timeout: def.connect_timeout,
            first_attempt: None,
            finished: false,
        }
    }

    fn fail(&mut self, what: String) {
        self.stats
            .fail(format!("stage `{}`: {what}", self.stats.name));
        self.state = State::Failed;
    }

    /// Opens this client's share of the start gate. Only a connection does: a client that
    /// fails keeps the gate shut, so sources never produce what could not be delivered (the
    /// failure stops the run).
    fn arrive(&mut self) {
        if let Some(g) = self.gate.take() {
            g.arrive();
        }
    }

    fn connect(&mut self, io: &StageIo, quiesce: bool) -> usize {
        if quiesce {
            // Stopped before the connection was up: nothing can be delivered.
            self.state = State::Failed;
            return 1;
        }
        let first = *self.first_attempt.get_or_insert(io.now);
        let timed_out =
            io.now.nanos_since(first) > lcore::time::duration_to_nanos(self.connect_timeout);
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Idle { retry_at } => {
                if retry_at.is_some_and(|t| io.now < t) {
                    self.state = State::Idle { retry_at };
                    return 0;
                }
                match RsStream::connect_nonblocking(&self.ctx, self.addr) {
                    Ok(s) => self.state = State::Connecting(s),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused && !timed_out => {
                        self.state = State::Idle {
                            retry_at: Some(io.now + RETRY),
                        };
                    }
                    Err(e) => self.fail(self.connect_error(&e.to_string())),
                }
                1
            }
            State::Connecting(s) => {
                let ready = match s.readiness() {
                    Ok(r) => r,
                    Err(e) => {
                        self.fail(self.connect_error(&e.to_string()));
                        return 1;
                    }
                };
                if !(ready.writable || ready.err || ready.hup) {
                    if timed_out {
                        self.fail(self.connect_error("no answer"));
                    } else {
                        self.state = State::Connecting(s);
                    }
                    return 0;
                }
                match s.take_error() {
                    Ok(None) if ready.writable && !ready.err => {
                        self.stats.counters.conns_opened.add(1);
                        self.state = State::Up(s);
                        self.arrive();
                    }
                    Ok(Some(e)) if e.kind() == ErrorKind::ConnectionRefused && !timed_out => {
                        self.state = State::Idle {
                            retry_at: Some(io.now + RETRY),
                        };
                    }
                    Ok(Some(e)) | Err(e) => self.fail(self.connect_error(&e.to_string())),
                    Ok(None) => self.fail(self.connect_error("connection closed while opening")),
                }
                1
            }
            other => {
                self.state = other;
                0
            }
        }
    }

    fn connect_error(&self, why: &str) -> String {
        format!(
            "cannot connect to {} ({why}) within {:?}; is the server pipeline running, on the \
             same fabric (rendezvous directory for shm)?",
            self.addr, self.connect_timeout
        )
    }

    /// Moves input messages into the send buffer; returns how many.
    fn encode_input(&mut self) -> usize {
        let mut n = 0;
        let mut bytes = 0u64;
        while n < self.burst {
            let Some(&m) = self.input.peek() else { break };
            if self.txbuf.free() < m.len as usize {
                self.stats.counters.backpressure.add(1);
                break;
            }
            let mut one = [Msg::default()];
            self.input.recv_burst(&mut one);
            // SAFETY: `m` was just dequeued by this stage, which now owns its payload; `encode`
            // frees it after copying.
            let fits = unsafe { encode(&m, &mut self.payloads, &mut self.txbuf) };
            debug_assert!(fits, "free space checked above");
            n += 1;
            bytes += u64::from(m.len);
        }
        if n > 0 {
            let c = &self.stats.counters;
            c.in_msgs.add(n as u64);
            c.in_bytes.add(bytes);
            c.out_msgs.add(n as u64);
            self.sent += bytes;
        }
        n
    }

    /// Reads and accounts the echo; returns work done, or an error text.
    fn read_echo(&mut self, s: &RsStream<P>) -> Result<usize, String> {
        let mut work = 0;
        if let Some(tx) = &mut self.out {
            let before = self.outbuf.len();
            let n = push_pending(tx, &mut self.outbuf);
            work += n;
            if n < before {
                self.stats.counters.backpressure.add(1);
                return Ok(work);
            }
        }
        // A full buffer (output held back) reads nothing: a zero-length receive would look
        // like end of stream.
        let spare = self.rxbuf.spare();
        let got = if spare.is_empty() {
            Err(RsError::WouldBlock)
        } else {
            s.recv(spare, RECV_DONTWAIT)
        };
        match got {
            Ok(0) => {
                if self.echoed < self.sent {
                    return Err(format!(
                        "the server closed after echoing {} of {} bytes",
                        self.echoed, self.sent
                    ));
                }
            }
            Ok(n) => {
                self.rxbuf.commit(n);
                work += 1;
            }
            Err(RsError::WouldBlock) => {}
            Err(e) => return Err(format!("receiving the echo from {}: {e}", self.addr)),
        }
        let now = stamp_now();
        let mut msgs = 0u64;
        loop {
            if self.out.is_some() && self.outbuf.len() == self.burst {
                break;
            }
            let frame = next_frame(self.rxbuf.data())
                .map_err(|e| format!("echo from {}: {e}", self.addr))?;
            let Some((m, body)) = frame else { break };
            let len = m.len as usize;
            if let Some(t) = &mut self.echo {
                t.see(&m, now, self.verify.then_some(body));
            }
            if self.out.is_some() {
                self.outbuf.push(m);
            }
            self.rxbuf.consume(len);
            self.echoed += len as u64;
            msgs += 1;
        }
        if let Some(t) = &mut self.echo {
            t.publish(now);
        }
        if let Some(tx) = &mut self.out {
            push_pending(tx, &mut self.outbuf);
        }
        Ok(work + msgs as usize)
    }

    fn pump(&mut self, s: RsStream<P>, io: &StageIo) -> usize {
        let mut work = self.encode_input();
        if !self.txbuf.is_empty() {
            match s.send(self.txbuf.data(), DONTWAIT) {
                Ok(n) => {
                    self.txbuf.consume(n);
                    self.stats.counters.out_bytes.add(n as u64);
                    work += 1;
                }
                Err(RsError::WouldBlock) => self.stats.counters.backpressure.add(1),
                Err(e) => {
                    self.fail(format!("sending to {}: {e}", self.addr));
                    return work + 1;
                }
            }
        }
        if self.echo.is_some() {
            match self.read_echo(&s) {
                Ok(w) => work += w,
                Err(e) => {
                    self.fail(e);
                    return work + 1;
                }
            }
        }
        let echoed_all =
            self.echo.is_none() || (self.echoed == self.sent && self.outbuf.is_empty());
        // Bytes the stream buffered for want of credits must reach the server before the
        // half-close: `shutdown` would otherwise wait for them while this thread (which may
        // also poll the server) is blocked in it.
        if self.input.at_eof() && self.txbuf.is_empty() && echoed_all && !s.send_pending() {
            // Orderly close, as with TCP: half-close (this waits, bounded, for the last
            // sends to complete), then wait for the server to see end of stream and close
            // its side, and only then close. Closing at once could let the connection
            // manager's disconnect overtake the end-of-stream message.
            if let Err(e) = s.shutdown(Shutdown::Write) {
                self.fail(format!("closing the stream to {}: {e}", self.addr));
                return work + 1;
            }
            self.state = State::Closing(s, io.now);
            return work + 1;
        }
        self.state = State::Up(s);
        work
    }

    /// Waits for the server's end of stream after the half-close.
    fn closing(&mut self, s: RsStream<P>, since: Instant, io: &StageIo) -> usize {
        let mut scratch = [0u8; 256];
        let done = match s.recv(&mut scratch, RECV_DONTWAIT) {
            Ok(0) => true,
            Ok(_) | Err(RsError::WouldBlock) => {
                io.now.nanos_since(since) > lcore::time::duration_to_nanos(CLOSE_WAIT)
            }
            Err(_) => true,
        };
        if done {
            drop(s);
            self.stats.counters.conns_closed.add(1);
            self.state = State::Closed;
            1
        } else {
            self.state = State::Closing(s, since);
            0
        }
    }

    /// After a failure: discard the input so upstream can drain.
    fn discard(&mut self) -> usize {
        let mut buf = [Msg::default(); 32];
        let n = self.input.recv_burst(&mut buf);
        for m in &buf[..n] {
            // SAFETY: dequeued by this stage, which owns the payload and drops it.
            unsafe { self.payloads.free(m) };
        }
        self.stats.counters.dropped.add(n as u64);
        n
    }

    fn finish(&mut self) {
        if let Some(tx) = &mut self.out {
            tx.close();
        }
        self.finished = true;
        self.stats.set_finished();
    }
}

impl<P: Provider> Stage for RsClient<P> {
    fn poll(&mut self, io: &StageIo) -> usize {
        if self.finished {
            return 0;
        }
        let mut work = self.ctx.progress();
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Up(s) => work += self.pump(s, io),
            State::Closing(s, since) => work += self.closing(s, since, io),
            State::Failed => {
                self.state = State::Failed;
                work += self.discard();
                if self.input.at_eof() {
                    self.finish();
                    work += 1;
                }
            }
            State::Closed => {
                self.finish();
                work += 1;
            }
            other => {
                self.state = other;
                work += self.connect(io, io.quiesce);
            }
        }
        work
    }

    fn is_finished(&self) -> bool {
        self.finished
    }
}

const _: () = assert!(TX_BUF >= 2 * MAX_MSG_LEN as usize && RX_BUF >= 2 * MAX_MSG_LEN as usize);
