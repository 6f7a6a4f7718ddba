//! A deterministic simulator (feature `testing`, a test kit): a client session and a server
//! over simulated paths in virtual time.
//!
//! [`Sim`] owns both state machines, the simulated fabric ([`Net`]: links with latency and
//! loss, queue-pair pairs, both sides' registered memory with key checks), a client
//! workload that verifies every byte ([`App`]) and a server handler that is a small disk
//! ([`Handler`]). [`Sim::step`] advances virtual time to the next thing that happens (a
//! delivery, a timer, a handler answer), feeds every side what its driver would poll, and
//! lets the applications react; [`Sim::run_for`] and [`Sim::run_until`] repeat it, and
//! stop on livelock (too many steps without time moving).
//!
//! Faults: [`Net::set_link`] cuts or restores a path's wire (senders fail after the
//! transport timeout), [`Net::kill_qps`] moves a path's queue pairs to the error state,
//! [`Net::cm_disconnect`] disconnects them through the CM, [`Link::loss`] makes deliveries
//! need retransmissions, and [`Sim::client_polling`] / [`Sim::server_polling`] make a side
//! stop polling (a hung peer: no completions, no CM events, no timers).
//!
//! [`Recorder`] is the other harness: a driver with no network that records every call, for
//! tests that play one side's peer by hand.
//!
//! Hostile peers: [`Sim::inject_client_recv`] and [`Sim::inject_server_recv`] complete a
//! posted receive with anything a peer (or its NIC) could make appear there,
//! [`Sim::server_chunk_write`] is a client scribbling into its chunks, and
//! [`Sim::raw_connect`] sends the server any connect private data.

use std::collections::VecDeque;
use std::time::Duration;

use crate::clt::{ClientConfig, ClientEvent, ClientSession};
use crate::srv::{Server, ServerConfig, ServerEvent, SessId};
use crate::timer::Instant;
use crate::work::{CmEvent, Conn, PathId, Wc};

mod app;
mod net;
mod record;

pub use app::{App, BASE_LEN, Handler, USR_LEN, check_pattern, fill_pattern, pattern};
pub use net::{ClientSide, Link, Net, ServerSide, Side};
pub use record::{Call, Posted, Recorder};

use net::{CmKind, Ev};

/// What a simulation is built from.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// The client.
    pub client: ClientConfig,
    /// The server.
    pub server: ServerConfig,
    /// Paths (and links) at open.
    pub paths: usize,
    /// Links in the network (at least `paths`; extra ones are for paths added later).
    pub links: usize,
    /// One-way latency of every link.
    pub latency: Duration,
    /// Client data bytes per permit.
    pub data_per_slot: usize,
    /// The client registers each request's data under a one-shot key.
    pub per_io_registration: bool,
    /// Seed of every random choice.
    pub seed: u64,
}

impl SimConfig {
    /// Two paths, 64 chunks of 16 KiB, 10 µs latency, 1 s reconnect delay, Linux's
    /// heartbeat, always_invalidate on.
    pub fn new(seed: u64) -> Self {
        let mut client = ClientConfig::new(b"simsess", [7; 16]).expect("valid name");
        client.reconnect_delay = Duration::from_secs(1);
        client.io_connections = 2;
        client.seed = seed;
        let server = ServerConfig {
            queue_depth: 64,
            chunk_size: 16 << 10,
            ..ServerConfig::default()
        };
        Self {
            client,
            server,
            paths: 2,
            links: 3,
            latency: Duration::from_micros(10),
            data_per_slot: 16 << 10,
            per_io_registration: false,
            seed,
        }
    }
}

/// A non-IO event, with when it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged<E> {
    /// When.
    pub at: Instant,
    /// What.
    pub ev: E,
}

/// A client and a server over simulated paths (see the module doc).
#[derive(Debug)]
pub struct Sim {
    /// Virtual time.
    pub now: Instant,
    /// The client session.
    pub client: ClientSession,
    /// The server.
    pub server: Server,
    /// The fabric and both sides' memory.
    pub net: Net,
    /// The client workload.
    pub app: App,
    /// The server handler.
    pub handler: Handler,
    /// The client polls its completion queues, CM channel and timers.
    pub client_polling: bool,
    /// The server polls its completion queues, CM channel and timers.
    pub server_polling: bool,
    /// The client's events other than completions.
    pub client_log: Vec<Logged<ClientEvent>>,
    /// The server's events other than requests.
    pub server_log: Vec<Logged<ServerEvent>>,
    /// The paths opened.
    pub paths: Vec<PathId>,
    client_q: VecDeque<Ev>,
    server_q: VecDeque<Ev>,
    steps: u64,
}

impl Sim {
    /// Builds both sides and opens the session (`cfg.paths` paths on links `0..paths`).
    ///
    /// # Panics
    /// If a configuration is invalid (a test's mistake).
    pub fn new(cfg: SimConfig) -> Self {
        let client = ClientSession::new(cfg.client).expect("client config");
        let server = Server::new(cfg.server).expect("server config");
        let links = (0..cfg.links.max(cfg.paths))
            .map(|_| Link {
                up: true,
                latency: cfg.latency,
                loss: 0.0,
            })
            .collect();
        let mut net = Net::new(
            links,
            cfg.server.queue_depth,
            cfg.server.max_hdr_size,
            cfg.data_per_slot,
            cfg.server.chunk_size,
            cfg.seed,
        );
        net.per_io_registration = cfg.per_io_registration;
        let mut s = Self {
            now: Instant::ZERO,
            client,
            server,
            net,
            app: App::new(cfg.seed, cfg.data_per_slot),
            handler: Handler::default(),
            client_polling: true,
            server_polling: true,
            client_log: Vec::new(),
            server_log: Vec::new(),
            paths: Vec::new(),
            client_q: VecDeque::new(),
            server_q: VecDeque::new(),
            steps: 0,
        };
        let uuids: Vec<[u8; 16]> = (0..cfg.paths).map(|k| [0x40 + k as u8; 16]).collect();
        s.paths = s
            .client
            .open(s.now, &uuids, &mut ClientSide(&mut s.net))
            .expect("open");
        s
    }

    /// Advances to the next thing that happens and processes everything due then. Returns
    /// false if nothing is left to happen at or before `limit`.
    pub fn step(&mut self, limit: Instant) -> bool {
        let mut next = self.net.next_event_at();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        if self.client_polling {
            consider(self.client.poll_timeout());
            consider(self.app.next_due(&self.client));
            if !self.client_q.is_empty() {
                consider(Some(self.now));
            }
        }
        if self.server_polling {
            consider(self.server.poll_timeout());
            consider(self.handler.next_due());
            if !self.server_q.is_empty() {
                consider(Some(self.now));
            }
        }
        let Some(t) = next else { return false };
        if t > limit {
            self.now = limit;
            self.net.now = limit;
            return false;
        }
        self.now = self.now.max(t);
        self.net.now = self.now;
        self.steps += 1;
        for _ in 0..1000 {
            let mut busy = false;
            while let Some(ev) = self.net.pop_due(self.now) {
                busy = true;
                self.fabric(ev);
            }
            busy |= self.poll_client();
            busy |= self.poll_server();
            if !busy {
                break;
            }
        }
        true
    }

    fn fabric(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { qp, from } => self.net.deliver(qp, from),
            Ev::ConnReq { .. } | Ev::SrvEstablished { .. } => self.server_q.push_back(ev),
            Ev::ConnRsp { .. } => self.client_q.push_back(ev),
            Ev::Cm { side, .. } | Ev::Wc { side, .. } => match side {
                Side::Client => self.client_q.push_back(ev),
                Side::Server => self.server_q.push_back(ev),
            },
        }
    }

    fn poll_client(&mut self) -> bool {
        if !self.client_polling {
            return false;
        }
        let mut busy = false;
        let now = self.now;
        while let Some(ev) = self.client_q.pop_front() {
            busy = true;
            let io = &mut ClientSide(&mut self.net);
            match ev {
                Ev::ConnRsp { qp, accept, pdata } => {
                    let (Some(conn), ..) = io.0.qp_conns(qp) else {
                        continue;
                    };
                    let cm = if accept {
                        CmEvent::Established {
                            private_data: &pdata,
                        }
                    } else {
                        CmEvent::Rejected {
                            private_data: &pdata,
                        }
                    };
                    self.client.handle_cm(now, conn, cm, io);
                }
                Ev::Cm { conn, ev, .. } => {
                    let cm = match ev {
                        CmKind::Unreachable => CmEvent::Unreachable,
                        CmKind::Disconnected => CmEvent::Disconnected,
                    };
                    self.client.handle_cm(now, conn, cm, io);
                }
                Ev::Wc {
                    conn, wc, payload, ..
                } => self.client.handle_completion(now, conn, &wc, &payload, io),
                _ => {}
            }
        }
        self.client
            .handle_timeout(now, &mut ClientSide(&mut self.net));
        while let Some(ev) = self.client.poll_event() {
            busy = true;
            match ev {
                ClientEvent::Completed { id, ctx, result } => {
                    self.app
                        .completed(now, id, ctx, result, &self.client, &self.net);
                }
                ev => self.client_log.push(Logged { at: now, ev }),
            }
        }
        let before = self.app.issued + self.app.submit_errors;
        self.app.submit(now, &mut self.client, &mut self.net);
        busy |= self.app.issued + self.app.submit_errors != before;
        busy
    }

    fn poll_server(&mut self) -> bool {
        if !self.server_polling {
            return false;
        }
        let mut busy = false;
        let now = self.now;
        while let Some(ev) = self.server_q.pop_front() {
            busy = true;
            let io = &mut ServerSide(&mut self.net);
            match ev {
                Ev::ConnReq { qp, pdata } => {
                    if !io.0.qp_open(qp) {
                        continue;
                    }
                    let (_, _, token, link) = io.0.qp_conns(qp);
                    self.server
                        .handle_connect_request(now, token, link as u128, &pdata, io);
                }
                Ev::SrvEstablished { qp } => {
                    let (_, Some(conn), ..) = io.0.qp_conns(qp) else {
                        continue;
                    };
                    self.server.handle_cm(
                        now,
                        conn,
                        CmEvent::Established { private_data: &[] },
                        io,
                    );
                }
                Ev::Cm { conn, ev, .. } => {
                    let cm = match ev {
                        CmKind::Unreachable => CmEvent::Unreachable,
                        CmKind::Disconnected => CmEvent::Disconnected,
                    };
                    self.server.handle_cm(now, conn, cm, io);
                }
                Ev::Wc {
                    conn, wc, payload, ..
                } => self.server.handle_completion(now, conn, &wc, &payload, io),
                _ => {}
            }
        }
        self.server
            .handle_timeout(now, &mut ServerSide(&mut self.net));
        while let Some(ev) = self.server.poll_event() {
            busy = true;
            match ev {
                ServerEvent::Request {
                    op,
                    sess,
                    chunk,
                    dir,
                    data_len,
                    usr_len,
                    read_len,
                } => self.handler.request(
                    now, op, sess, chunk, dir, data_len, usr_len, read_len, &self.net,
                ),
                ev => self.server_log.push(Logged { at: now, ev }),
            }
        }
        let before = self.handler.pending();
        self.handler
            .answer_due(now, &mut self.server, &mut self.net);
        busy |= self.handler.pending() != before;
        busy
    }

    /// Runs until virtual time `t` (or until nothing is left to happen).
    ///
    /// # Panics
    /// On livelock: more than 50 million steps in one call.
    pub fn run_until(&mut self, t: Instant) {
        let mut n = 0u64;
        while self.step(t) {
            n += 1;
            assert!(
                n < 50_000_000,
                "livelock: 50M steps before {t:?} (now {:?})",
                self.now
            );
        }
        if self.now < t {
            self.now = t;
            self.net.now = t;
        }
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let t = self.now.saturating_add(d);
        self.run_until(t);
    }

    /// Runs until `f` holds, or `deadline` passes; returns whether `f` held.
    pub fn run_until_cond(&mut self, deadline: Duration, mut f: impl FnMut(&Self) -> bool) -> bool {
        let end = self.now.saturating_add(deadline);
        while !f(self) {
            if !self.step(end) {
                return f(self);
            }
        }
        true
    }

    /// Runs until the session is open (every initial path connected).
    ///
    /// # Panics
    /// If it does not open within 10 s of virtual time.
    pub fn open(&mut self) {
        let ok = self.run_until_cond(Duration::from_secs(10), |s| {
            s.client_log
                .iter()
                .any(|l| matches!(l.ev, ClientEvent::Opened { .. }))
        });
        assert!(ok, "the session did not open: {:?}", self.client_log);
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    // ---------------------------------------------------------------------------------------
    // Hostile peers
    // ---------------------------------------------------------------------------------------

    /// Completes the oldest receive posted on client connection `conn` with `wc` (its
    /// `wr_id` replaced by the receive's) and `payload`, as a hostile server could. Returns
    /// false if no receive is posted there.
    pub fn inject_client_recv(&mut self, conn: Conn, wc: Wc, payload: &[u8]) -> bool {
        self.net.inject_recv(Side::Client, conn, wc, payload)
    }

    /// The same at the server.
    pub fn inject_server_recv(&mut self, conn: Conn, wc: Wc, payload: &[u8]) -> bool {
        self.net.inject_recv(Side::Server, conn, wc, payload)
    }

    /// A hostile client writes `bytes` at `off` of chunk `chunk` of `sess` (with a valid
    /// key: what the key allows). False if out of the chunk.
    pub fn server_chunk_write(
        &mut self,
        sess: SessId,
        chunk: u16,
        off: usize,
        bytes: &[u8],
    ) -> bool {
        match self.net.chunk_mut(sess, chunk) {
            Some(c) if off.checked_add(bytes.len()).is_some_and(|e| e <= c.len()) => {
                c[off..off + bytes.len()].copy_from_slice(bytes);
                true
            }
            _ => false,
        }
    }

    /// A hostile client sends a connect request with `pdata` over `link`; the server's answer
    /// is dropped. Returns the server connection if it accepted.
    pub fn raw_connect(&mut self, link: usize, pdata: &[u8]) -> Option<Conn> {
        let qp = self.net.raw_qp(link);
        let now = self.now;
        let (_, _, token, _) = self.net.qp_conns(qp);
        self.server.handle_connect_request(
            now,
            token,
            link as u128,
            pdata,
            &mut ServerSide(&mut self.net),
        );
        self.net.qp_conns(qp).1
    }
}
