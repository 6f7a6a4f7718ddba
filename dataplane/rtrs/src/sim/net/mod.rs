//! The simulated fabric: links, reliable-connected queue-pair pairs, both sides' registered
//! memory with key tables, and the delivery of work requests in virtual time.
//!
//! What it enforces, as hardware does: a remote write lands only through a valid key of
//! the target path's registrations, inside the registered range, with the access right; a
//! SEND or a WRITE with immediate consumes a posted receive or waits for one (RNR, retried
//! for ever, as `rnr_retry_count = 7` asks); each direction of a queue pair is delivered in
//! order; a queue pair in error flushes what it is given. A local gather outside what was
//! registered fails the request with `LOC_PROT_ERR`.
//!
//! Here: the links, queue-pair pairs, connection management and faults; `data.rs`: posting
//! work requests and delivering them; `io.rs`: the drivers' views ([`ClientSide`],
//! [`ServerSide`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use dp_fabric::WcStatus;

use crate::srv::{CmToken, SessId};
use crate::timer::{Instant, Jitter};
use crate::work::{Conn, PathId, RecvBuf, Wc};

mod data;
mod io;

pub use io::{ClientSide, ServerSide};

/// Which end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The client.
    Client,
    /// The server.
    Server,
}

impl Side {
    fn other(self) -> Self {
        match self {
            Self::Client => Self::Server,
            Self::Server => Self::Client,
        }
    }
}

/// A network link: one path's wire.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    /// Up (a cut link delivers nothing; its senders' requests fail after the transport
    /// timeout).
    pub up: bool,
    /// One-way latency.
    pub latency: Duration,
    /// Probability that a delivery needs a retransmission (each costs `retrans_delay`; seven
    /// in a row exhaust the retry count).
    pub loss: f64,
}

/// A work request on its way, with its payload gathered.
#[derive(Clone, Debug)]
struct Flight {
    wr_id: u64,
    signaled: bool,
    op: FlightOp,
}

#[derive(Clone, Debug)]
enum FlightOp {
    Send {
        bytes: Vec<u8>,
        imm: Option<u32>,
        inv: Option<u32>,
    },
    WriteImm {
        addr: u64,
        rkey: u32,
        bytes: Vec<u8>,
        imm: u32,
    },
    Write {
        addr: u64,
        rkey: u32,
        bytes: Vec<u8>,
    },
}

impl FlightOp {
    fn needs_recv(&self) -> bool {
        !matches!(self, Self::Write { .. })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpLife {
    Connecting,
    Up,
    Closed,
}

/// One end of a queue-pair pair.
#[derive(Debug, Default)]
struct End {
    conn: Option<Conn>,
    error: bool,
    recvs: VecDeque<(u64, RecvBuf)>,
    /// Outbound, in order; the head is scheduled.
    out: VecDeque<Flight>,
    head_scheduled: bool,
    last_due: Instant,
}

#[derive(Debug)]
struct QpPair {
    link: usize,
    life: QpLife,
    client: End,
    server: End,
    token: CmToken,
}

impl QpPair {
    fn end(&mut self, s: Side) -> &mut End {
        match s {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        }
    }
}

/// A pending event of the fabric.
#[derive(Clone, Debug)]
pub(crate) enum Ev {
    /// A connect request reaches the server.
    ConnReq { qp: usize, pdata: [u8; 56] },
    /// The server's answer reaches the client.
    ConnRsp {
        qp: usize,
        accept: bool,
        pdata: [u8; 56],
    },
    /// The server's connection is established (RTU).
    SrvEstablished { qp: usize },
    /// A CM event for one side's connection.
    Cm { side: Side, conn: Conn, ev: CmKind },
    /// The head of one side's outbound queue is due at the other side.
    Deliver { qp: usize, from: Side },
    /// A completion for one side.
    Wc {
        side: Side,
        conn: Conn,
        wc: Wc,
        payload: Vec<u8>,
    },
}

/// CM events the fabric produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmKind {
    Unreachable,
    Disconnected,
}

#[derive(Clone, Copy, Debug)]
struct CKey {
    addr: u64,
    len: u64,
    link: usize,
    remote: bool,
}

#[derive(Clone, Copy, Debug)]
struct SKey {
    path: PathId,
    addr: u64,
    len: u64,
}

/// Where the client's memory and the server's chunks live in the simulated address space.
const CLIENT_DATA_AT: u64 = 0x7000_0000_0000;
const SERVER_CHUNKS_AT: u64 = 0x5000_0000_0000;

/// The simulated fabric and both sides' memory.
#[derive(Debug)]
pub struct Net {
    /// The links, by index.
    pub links: Vec<Link>,
    qps: Vec<QpPair>,
    by_conn: HashMap<(Side, Conn), usize>,
    link_of: HashMap<PathId, usize>,
    /// The link the next client path without one gets (else the path's index).
    pub next_link: Option<usize>,
    events: BTreeMap<(Instant, u64), Ev>,
    seq: u64,
    pub(crate) now: Instant,
    rng: Jitter,
    /// Delay of a retransmission on a lossy link.
    pub retrans_delay: Duration,
    /// How long a sender retries on a cut link before its request fails.
    pub transport_timeout: Duration,
    /// How long a connect on a cut link waits before `UNREACHABLE`.
    pub connect_timeout: Duration,
    /// Retry interval of a request that met receiver-not-ready.
    pub rnr_delay: Duration,
    // Client memory.
    iu: Vec<u8>,
    iu_slot: usize,
    /// The client's data area (request buffers).
    pub data: Vec<u8>,
    ckeys: HashMap<u32, CKey>,
    /// The client registers each request's data under a one-shot key (per-IO registration).
    pub per_io_registration: bool,
    window_rot: HashMap<(usize, u16), u8>,
    /// Per-IO registration: the key each window (link, slot) was last bound under. As on
    /// verbs (type 2 windows), a window whose key is still valid cannot be bound again:
    /// the bind fails and errors its queue pair (`rebind_faults` counts those).
    window_key: HashMap<(usize, u16), u32>,
    /// Binds of a window whose previous key was never invalidated (see `window_key`).
    pub rebind_faults: u64,
    // Server memory.
    chunks: HashMap<SessId, Vec<u8>>,
    /// The handler's sources (`ServerIo::source_fits`, `Wr::WriteSource`), by number.
    pub sources: Vec<Vec<u8>>,
    path_sess: HashMap<PathId, SessId>,
    chunk_keys: HashMap<(PathId, u64), u32>,
    chunk_size: u32,
    skeys: HashMap<u32, SKey>,
    /// Accesses refused as out of bounds by `read_chunk`/`write_iu` (the state machines
    /// asked for something outside a buffer).
    pub bounds_faults: u64,
    /// Remote accesses refused (bad key, range or right): each errors its queue pair.
    pub access_errors: u64,
    /// Receivers that had no receive posted when a message arrived.
    pub rnr_waits: u64,
    /// Work requests posted, by side.
    pub posted: [u64; 2],
    /// Every chain posted by the server: (connection, work requests) with payloads
    /// summarised (for tests of the response chains).
    pub server_chains: Vec<(Conn, Vec<String>)>,
    /// Record server chains (off by default: a test turns it on).
    pub record_server_chains: bool,
}

fn mem_range(buf_at: u64, buf_len: usize, addr: u64, len: u64) -> Option<core::ops::Range<usize>> {
    let off = addr.checked_sub(buf_at)?;
    let end = off.checked_add(len)?;
    if end > buf_len as u64 {
        return None;
    }
    Some(off as usize..end as usize)
}

impl Net {
    pub(crate) fn new(
        links: Vec<Link>,
        queue_depth: u16,
        max_hdr: u32,
        data_per_slot: usize,
        chunk_size: u32,
        seed: u64,
    ) -> Self {
        let qd = usize::from(queue_depth);
        Self {
            links,
            qps: Vec::new(),
            by_conn: HashMap::new(),
            link_of: HashMap::new(),
            next_link: None,
            events: BTreeMap::new(),
            seq: 0,
            now: Instant::ZERO,
            rng: Jitter::new(seed ^ 0x5EED),
            retrans_delay: Duration::from_micros(100),
            transport_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(1),
            rnr_delay: Duration::from_micros(50),
            iu: vec![0; qd * max_hdr as usize],
            iu_slot: max_hdr as usize,
            data: vec![0; qd * data_per_slot],
            ckeys: HashMap::new(),
            per_io_registration: false,
            window_rot: HashMap::new(),
            window_key: HashMap::new(),
            rebind_faults: 0,
            chunks: HashMap::new(),
            sources: Vec::new(),
            path_sess: HashMap::new(),
            chunk_keys: HashMap::new(),
            chunk_size,
            skeys: HashMap::new(),
            bounds_faults: 0,
            access_errors: 0,
            rnr_waits: 0,
            posted: [0; 2],
            server_chains: Vec::new(),
            record_server_chains: false,
        }
    }

    /// The base address of the client's data area.
    pub const fn data_addr() -> u64 {
        CLIENT_DATA_AT
    }

    pub(crate) fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.events.insert((at, self.seq), ev);
    }

    pub(crate) fn next_event_at(&self) -> Option<Instant> {
        self.events.keys().next().map(|&(t, _)| t)
    }

    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Ev> {
        let (&k, _) = self.events.iter().next()?;
        if k.0 > now {
            return None;
        }
        self.events.remove(&k)
    }

    /// Events pending (for livelock checks).
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    fn link_for(&mut self, path: PathId) -> usize {
        if let Some(&l) = self.link_of.get(&path) {
            return l;
        }
        let l = self.next_link.take().unwrap_or(usize::from(path.idx));
        self.link_of.insert(path, l);
        l
    }

    /// The link a client path runs over.
    pub fn link_of(&self, path: PathId) -> Option<usize> {
        self.link_of.get(&path).copied()
    }

    fn latency(&mut self, link: usize) -> Result<Duration, ()> {
        let l = self.links[link];
        let mut d = l.latency;
        let mut tries = 0;
        while l.loss > 0.0 && (self.rng.below(1_000_000) as f64) < l.loss * 1e6 {
            tries += 1;
            if tries >= 7 {
                return Err(());
            }
            d += self.retrans_delay;
        }
        Ok(d)
    }

    fn static_key(link: usize) -> u32 {
        0x0000_1000 * (link as u32 + 1)
    }

    fn client_static_keys(&mut self, link: usize) {
        let k = Self::static_key(link);
        self.ckeys.entry(k).or_insert(CKey {
            addr: CLIENT_DATA_AT,
            len: self.data.len() as u64,
            link,
            remote: true,
        });
    }

    // ---------------------------------------------------------------------------------------
    // Connections
    // ---------------------------------------------------------------------------------------

    fn qp_of(&self, side: Side, conn: Conn) -> Option<usize> {
        self.by_conn.get(&(side, conn)).copied()
    }

    /// The client's connect: a new queue-pair pair on the path's link.
    pub(crate) fn client_connect(&mut self, conn: Conn, pdata: &[u8; 56]) {
        let link = self.link_for(conn.path);
        self.client_static_keys(link);
        let qp = self.qps.len();
        self.qps.push(QpPair {
            link,
            life: QpLife::Connecting,
            client: End {
                conn: Some(conn),
                ..End::default()
            },
            server: End::default(),
            token: qp as CmToken,
        });
        self.by_conn.insert((Side::Client, conn), qp);
        if self.links[link].up {
            let at = self.now.saturating_add(self.links[link].latency);
            self.push(at, Ev::ConnReq { qp, pdata: *pdata });
        } else {
            let at = self.now.saturating_add(self.connect_timeout);
            self.push(
                at,
                Ev::Cm {
                    side: Side::Client,
                    conn,
                    ev: CmKind::Unreachable,
                },
            );
        }
    }

    /// A queue-pair pair on `link` with no client behind it (a hostile client's raw
    /// connect).
    pub(crate) fn raw_qp(&mut self, link: usize) -> usize {
        let qp = self.qps.len();
        self.qps.push(QpPair {
            link,
            life: QpLife::Connecting,
            client: End::default(),
            server: End::default(),
            token: qp as CmToken,
        });
        qp
    }

    /// Completes the oldest receive posted on `side`'s `conn` with `wc` (its `wr_id`
    /// replaced) and `payload` cut to the receive's buffer. False if none is posted.
    pub(crate) fn inject_recv(
        &mut self,
        side: Side,
        conn: Conn,
        mut wc: Wc,
        payload: &[u8],
    ) -> bool {
        let Some(qp) = self.qp_of(side, conn) else {
            return false;
        };
        let Some((wr_id, buf)) = self.qps[qp].end(side).recvs.pop_front() else {
            return false;
        };
        wc.wr_id = wr_id;
        let n = payload.len().min(buf.len() as usize);
        let now = self.now;
        self.completion(side, conn, now, wc, payload[..n].to_vec());
        true
    }

    /// A client connection of `path`, `cid` in the current epoch, if one exists.
    pub fn client_conn(&self, path: PathId, cid: u16) -> Option<Conn> {
        self.qps
            .iter()
            .rev()
            .filter(|q| q.life == QpLife::Up)
            .filter_map(|q| q.client.conn)
            .find(|c| c.path == path && c.cid == cid)
    }

    /// The server connection paired with a client connection.
    pub fn server_conn_of(&self, client: Conn) -> Option<Conn> {
        let qp = self.qp_of(Side::Client, client)?;
        self.qps[qp].server.conn
    }

    fn accept(&mut self, token: CmToken, conn: Conn, pdata: &[u8; 56]) -> Result<(), i32> {
        let qp = token as usize;
        let Some(q) = self.qps.get_mut(qp) else {
            return Err(-libc::EINVAL);
        };
        if q.life != QpLife::Connecting {
            return Err(-libc::ECONNRESET);
        }
        q.server.conn = Some(conn);
        q.life = QpLife::Up;
        let link = q.link;
        self.by_conn.insert((Side::Server, conn), qp);
        let at = self.now.saturating_add(self.links[link].latency);
        self.push(
            at,
            Ev::ConnRsp {
                qp,
                accept: true,
                pdata: *pdata,
            },
        );
        self.push(at, Ev::SrvEstablished { qp });
        Ok(())
    }

    fn reject(&mut self, token: CmToken, pdata: &[u8; 56]) {
        let qp = token as usize;
        let Some(q) = self.qps.get_mut(qp) else {
            return;
        };
        if q.life != QpLife::Connecting {
            return;
        }
        q.life = QpLife::Closed;
        let link = q.link;
        let at = self.now.saturating_add(self.links[link].latency);
        self.push(
            at,
            Ev::ConnRsp {
                qp,
                accept: false,
                pdata: *pdata,
            },
        );
    }

    /// Closes every connection of `side`'s path `path`: that side's queue pairs are drained
    /// silently (the driver's `close_path`); the peer sees `DISCONNECTED` if the link is up
    /// and flushes its own.
    pub(crate) fn close_path(&mut self, side: Side, path: PathId) {
        if side == Side::Client
            && let Some(&link) = self.link_of.get(&path)
        {
            // The driver deallocates the path's windows: their keys die with them.
            let ckeys = &mut self.ckeys;
            self.window_key.retain(|&(l, _), k| {
                if l == link {
                    ckeys.remove(k);
                }
                l != link
            });
        }
        let qps: Vec<usize> = (0..self.qps.len())
            .filter(|&q| {
                let e = match side {
                    Side::Client => &self.qps[q].client,
                    Side::Server => &self.qps[q].server,
                };
                e.conn.is_some_and(|c| c.path == path) && self.qps[q].life != QpLife::Closed
            })
            .collect();
        for qp in qps {
            self.close_qp(qp, side);
        }
    }

    fn close_qp(&mut self, qp: usize, side: Side) {
        let link = self.qps[qp].link;
        let up = self.links[link].up;
        let lat = self.links[link].latency;
        let q = &mut self.qps[qp];
        let was_connecting = q.life == QpLife::Connecting;
        q.life = QpLife::Closed;
        let me = q.end(side);
        me.error = true;
        me.recvs.clear();
        me.out.clear();
        let peer_conn = q.end(side.other()).conn;
        if let Some(pc) = peer_conn
            && up
        {
            let at = self.now.saturating_add(lat);
            self.push(
                at,
                Ev::Cm {
                    side: side.other(),
                    conn: pc,
                    ev: CmKind::Disconnected,
                },
            );
            self.flush_end_at(qp, side.other(), at);
        } else if was_connecting && side == Side::Client {
            // A connect in flight: the server will find its token dead.
        }
    }

    /// Moves one end to the error state: everything it holds completes flushed.
    fn flush_end(&mut self, qp: usize, side: Side) {
        let now = self.now;
        self.flush_end_at(qp, side, now);
    }

    /// The same, with the flushes reported at `at` (when the error reaches that end).
    fn flush_end_at(&mut self, qp: usize, side: Side, at: Instant) {
        let now = at;
        let e = self.qps[qp].end(side);
        e.error = true;
        let Some(conn) = e.conn else { return };
        let recvs: Vec<u64> = e.recvs.drain(..).map(|(w, _)| w).collect();
        let sends: Vec<u64> = e.out.drain(..).map(|f| f.wr_id).collect();
        e.head_scheduled = false;
        for wr_id in sends.into_iter().chain(recvs) {
            self.status_wc(side, conn, now, wr_id, WcStatus::WrFlushErr);
        }
    }

    /// Cuts or restores a link.
    pub fn set_link(&mut self, link: usize, up: bool) {
        self.links[link].up = up;
        if up {
            return;
        }
        // Whatever is on the wire now fails at its sender after the transport timeout.
        let at = self.now.saturating_add(self.transport_timeout);
        for qp in 0..self.qps.len() {
            if self.qps[qp].link != link || self.qps[qp].life != QpLife::Up {
                continue;
            }
            for side in [Side::Client, Side::Server] {
                self.fail_head(qp, side, at, WcStatus::RetryExcErr);
            }
        }
    }

    /// The head of `side`'s outbound queue fails with `status` at `at`; the rest flush; the
    /// end is in error.
    fn fail_head(&mut self, qp: usize, side: Side, at: Instant, status: WcStatus) {
        let e = self.qps[qp].end(side);
        let Some(conn) = e.conn else { return };
        if e.out.is_empty() || e.error {
            return;
        }
        e.error = true;
        e.head_scheduled = false;
        let flights: Vec<u64> = e.out.drain(..).map(|f| f.wr_id).collect();
        let recvs: Vec<u64> = e.recvs.drain(..).map(|(w, _)| w).collect();
        for (k, wr_id) in flights.into_iter().enumerate() {
            let st = if k == 0 { status } else { WcStatus::WrFlushErr };
            self.status_wc(side, conn, at, wr_id, st);
        }
        for wr_id in recvs {
            self.status_wc(side, conn, at, wr_id, WcStatus::WrFlushErr);
        }
    }

    /// Moves both ends of every queue pair of `link` to the error state (a fatal error on
    /// both hosts): each end's first outstanding request fails, the rest flush.
    pub fn kill_qps(&mut self, link: usize) {
        for qp in 0..self.qps.len() {
            if self.qps[qp].link != link || self.qps[qp].life != QpLife::Up {
                continue;
            }
            for side in [Side::Client, Side::Server] {
                let now = self.now;
                if self.qps[qp].end(side).out.is_empty() {
                    self.flush_end(qp, side);
                } else {
                    self.fail_head(qp, side, now, WcStatus::GeneralErr);
                }
            }
        }
    }

    /// A CM disconnect of every connection of `link`, initiated by the server's host: both
    /// sides get `DISCONNECTED` (the client after the latency) and flush.
    pub fn cm_disconnect(&mut self, link: usize) {
        for qp in 0..self.qps.len() {
            if self.qps[qp].link != link || self.qps[qp].life != QpLife::Up {
                continue;
            }
            let lat = self.links[link].latency;
            self.qps[qp].life = QpLife::Closed;
            for (side, at) in [
                (Side::Server, self.now),
                (Side::Client, self.now.saturating_add(lat)),
            ] {
                if let Some(conn) = self.qps[qp].end(side).conn {
                    self.push(
                        at,
                        Ev::Cm {
                            side,
                            conn,
                            ev: CmKind::Disconnected,
                        },
                    );
                }
                self.flush_end_at(qp, side, at);
            }
        }
    }

    /// The connections, token and link of queue-pair pair `qp`.
    pub(crate) fn qp_conns(&self, qp: usize) -> (Option<Conn>, Option<Conn>, CmToken, usize) {
        let q = &self.qps[qp];
        (q.client.conn, q.server.conn, q.token, q.link)
    }

    /// True if the pair can still be established (neither end closed it).
    pub(crate) fn qp_open(&self, qp: usize) -> bool {
        self.qps[qp].life != QpLife::Closed
    }
    /// Chunk `chunk` of `sess`, read-only (the handler's view; tests).
    pub fn chunk(&self, sess: SessId, chunk: u16) -> Option<&[u8]> {
        let cs = self.chunk_size as usize;
        self.chunks
            .get(&sess)?
            .get(usize::from(chunk) * cs..(usize::from(chunk) + 1) * cs)
    }

    /// Chunk `chunk` of `sess`, writable (the handler fills READ answers).
    pub fn chunk_mut(&mut self, sess: SessId, chunk: u16) -> Option<&mut [u8]> {
        let cs = self.chunk_size as usize;
        self.chunks
            .get_mut(&sess)?
            .get_mut(usize::from(chunk) * cs..(usize::from(chunk) + 1) * cs)
    }

    /// The sessions whose chunks exist.
    pub fn sessions(&self) -> Vec<SessId> {
        self.chunks.keys().copied().collect()
    }

    /// True if a server key is valid (tests of always_invalidate).
    pub fn server_key_valid(&self, key: u32) -> bool {
        self.skeys.contains_key(&key)
    }

    /// True if a client key is valid (tests of NEED_INVAL).
    pub fn client_key_valid(&self, key: u32) -> bool {
        self.ckeys.contains_key(&key)
    }

    /// Receives posted on one side's connection.
    pub fn recvs_posted(&self, side: Side, conn: Conn) -> usize {
        self.qp_of(side, conn)
            .map_or(0, |q| self.qps[q].clone_end_len(side))
    }
}

impl QpPair {
    fn clone_end_len(&self, side: Side) -> usize {
        match side {
            Side::Client => self.client.recvs.len(),
            Side::Server => self.server.recvs.len(),
        }
    }
}
