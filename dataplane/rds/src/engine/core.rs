//! [`RdsEngine`]: the node. Its state, its construction, and its transport-facing side:
//! commands, received frames, completions, timers, transmit scheduling. The socket calls
//! are in `send.rs`, `recv.rs` and `sockopt.rs`; routing of received messages in
//! `route.rs`.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use lcore::time::Instant;
use lcore::{TimerId, Timers};
use mempool::memory::MemError;

use super::config::{RdsConfig, TransportKind, TransportSpec};
use super::cong::{CongTable, MapIdx};
use super::conn::{Conn, ConnKey};
use super::mr::MrTable;
use super::socket::{RdmaNotify, RdsSocket, Ready, SocketTable};
use crate::addr::Addr;
use crate::idmap::IdMap;
use crate::path::{ConnState, Path, PathCmd, PathCtx, PathId, PeerParams, RxRefused, TxFrame};
use crate::rng::Rng;
use crate::stats::Stats;
use crate::store::{FragPool, Lane, List, Msg, RdmaOp, Store};
use crate::uapi::{RDS_RDMA_DROPPED, RDS_RDMA_SUCCESS};
use crate::wire::CongMap;
use crate::wire::ib::{self, IbConnPrivRepr, IbVersion, IncompatibleVersion, SUPPORTED_MINOR_MASK};

/// Paths per connection slot in the engine's per-path tables.
pub(crate) const SLOTS_PER_CONN: u32 = 8;

/// A request to the transport driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportCmd {
    /// Dial `faddr` from `laddr` for this path. Report the outcome with
    /// [`RdsEngine::handle_connected`] or [`RdsEngine::handle_connect_failed`].
    Connect {
        /// The path.
        path: PathId,
        /// Which transport.
        transport: TransportKind,
        /// Our address.
        laddr: IpAddr,
        /// The peer's.
        faddr: IpAddr,
        /// Type of service.
        tos: u8,
    },
    /// Tear this path's connection down; report [`RdsEngine::handle_transport_down`] when
    /// nothing it was given can complete any more.
    Disconnect {
        /// The path.
        path: PathId,
    },
}

/// A peer's connect request, as the transport driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<'a> {
    /// Which transport it arrived on.
    pub transport: TransportKind,
    /// Our address (the one it was sent to).
    pub laddr: IpAddr,
    /// The peer's.
    pub faddr: IpAddr,
    /// Type of service (RDS-IB carries it in the private data).
    pub tos: u8,
    /// Path index (multipath stream transports derive it from the source port).
    pub path_index: u8,
    /// The request's private data (message transports), as received.
    pub private: &'a [u8],
}

impl Incoming<'_> {
    /// The connection the request is for (`rds_conn_create`'s lookup key): our address,
    /// the peer's, the transport it arrived on and its type of service.
    pub fn conn_key(&self) -> ConnKey {
        ConnKey {
            laddr: Addr::new(self.laddr),
            faddr: Addr::new(self.faddr),
            transport: self.transport,
            tos: self.tos,
        }
    }
}

/// The answer to an [`Incoming`] request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// Accept it for `path`: set the connection up (post its receives), take the reply's
    /// private data from [`RdsEngine::accept_private`] (message transports), and report
    /// [`RdsEngine::handle_connected`] when it is established.
    Yes {
        /// The path it serves.
        path: PathId,
        /// The protocol version negotiated (message transports).
        version: IbVersion,
    },
    /// Refuse it (RDS-IB: reject; the reason's private data is [`ib::REJ_INCOMPAT`] for a
    /// version mismatch).
    No(Reject),
}

/// Why an incoming connect was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// The address is not ours, or the transport is not registered.
    NotLocal,
    /// Protocol version mismatch (`RDS_RDMA_REJ_INCOMPAT`).
    Incompatible(IncompatibleVersion),
    /// Racing connects: we are connecting ourselves, or the path was up and has been
    /// dropped as stale; the peer retries after its backoff.
    Busy,
    /// The connection table is full.
    NoMemory,
}

/// An edge-triggered readiness change of a socket, for poll sets and lcore pollers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketEvent {
    /// The socket.
    pub sock: RdsSocket,
    /// Its readiness now (as [`RdsEngine::readiness`] reports it).
    pub ready: Ready,
}

/// An RDS node: a set of local addresses, their sockets and connections, over transports a
/// driver provides. See the crate documentation for the model and the call order.
#[derive(Debug)]
pub struct RdsEngine {
    pub(crate) cfg: RdsConfig,
    pub(crate) store: Store,
    pub(crate) stats: Stats,
    pub(crate) rng: Rng,
    pub(crate) socks: SocketTable,
    pub(crate) conns: Vec<Conn>,
    pub(crate) conn_by_key: HashMap<ConnKey, u32>,
    pub(crate) cong: CongTable,
    pub(crate) local: IdMap<Addr, MapIdx>,
    pub(crate) monitors: Vec<u32>,
    pub(crate) seen_cong: Vec<u32>,
    pub(crate) gen_num: u32,
    pub(crate) hash_initval: u32,
    timers: Timers,
    /// Per path slot: its timer and whether it is on `tx_active` / `cmd_q` (one entry,
    /// so that [`touch`](Self::touch), ~3 times per message, indexes one table).
    sched: Vec<Sched>,
    tx_active: VecDeque<u32>,
    cmd_q: VecDeque<u32>,
    pub(crate) events: VecDeque<u32>,
    /// Memory regions for RDMA, once a transport plugged in its window.
    pub(crate) mr: Option<MrTable>,
    /// RDMA operations reported done by a path, being notified (kept: no allocation).
    rdma_done: Vec<(u32, RdmaOp)>,
}

/// Why an engine could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The message memory region could not be created.
    #[error("RDS engine '{name}': message memory: {source}")]
    Memory {
        /// The engine's name.
        name: String,
        /// Why.
        #[source]
        source: MemError,
    },
    /// The configuration is unusable.
    #[error("RDS engine configuration: {0}")]
    Config(&'static str),
}

impl RdsEngine {
    /// An engine with no local address yet. All tables are allocated here.
    ///
    /// # Errors
    ///
    /// [`EngineError::Memory`] if the fragment region cannot be made;
    /// [`EngineError::Config`] for a configuration that cannot work.
    pub fn new(cfg: RdsConfig) -> Result<Self, EngineError> {
        if cfg.transports.iter().any(|t| t.kind == TransportKind::Loop) {
            return Err(EngineError::Config(
                "the loopback transport is built in; list only Ib and Tcp transports",
            ));
        }
        if cfg.max_conns == 0 || cfg.max_sockets == 0 || cfg.msgs == 0 {
            return Err(EngineError::Config(
                "max_conns, max_sockets and msgs must be at least 1",
            ));
        }
        let store =
            Store::new(&cfg.name, &cfg.frags, cfg.msgs).map_err(|source| EngineError::Memory {
                name: cfg.name.clone(),
                source,
            })?;
        let mut rng = Rng::new(cfg.seed);
        let gen_num = loop {
            let g = rng.next_u32();
            if g != 0 {
                break g;
            }
        };
        let hash_initval = rng.next_u32();
        let slots = (cfg.max_conns * SLOTS_PER_CONN) as usize;
        Ok(Self {
            socks: SocketTable::new(cfg.max_sockets),
            conns: Vec::new(),
            conn_by_key: HashMap::with_capacity(cfg.max_conns as usize),
            cong: CongTable::default(),
            local: IdMap::default(),
            monitors: Vec::with_capacity(cfg.max_sockets as usize),
            seen_cong: Vec::with_capacity(cfg.max_sockets as usize),
            gen_num,
            hash_initval,
            timers: Timers::with_capacity(slots),
            sched: vec![Sched::default(); slots],
            tx_active: VecDeque::with_capacity(slots),
            cmd_q: VecDeque::with_capacity(slots),
            events: VecDeque::with_capacity(cfg.max_sockets as usize),
            mr: None,
            rdma_done: Vec::new(),
            store,
            stats: Stats::default(),
            rng,
            cfg,
        })
    }

    /// Makes `ip` one of this node's addresses: sockets may bind it, and messages to it
    /// from this engine are delivered locally.
    pub fn add_local_addr(&mut self, ip: IpAddr) {
        let a = Addr::new(ip);
        let m = self.cong.map_for(a);
        self.local.insert(a, m);
    }

    /// This node's addresses.
    pub fn local_addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.local.keys().map(|a| a.ip())
    }

    /// The transport that carries `path` (the node's dispatch of commands and frames).
    pub fn path_transport(&self, path: PathId) -> Option<TransportKind> {
        self.conns.get(path.conn as usize).map(|c| c.key.transport)
    }

    /// True if `ip` is one of this node's addresses.
    pub fn is_local(&self, ip: IpAddr) -> bool {
        self.local.contains_key(&Addr::new(ip))
    }

    /// The engine's configuration.
    pub fn config(&self) -> &RdsConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// This node's generation number (sent in multipath probes; a change tells peers it
    /// restarted).
    pub fn gen_num(&self) -> u32 {
        self.gen_num
    }

    /// The fragment pool: payloads of transmitted frames are read from it
    /// ([`crate::path::TxPayload::segments`]).
    pub fn frags(&self) -> &FragPool {
        &self.store.frags
    }

    /// Message records free now, and the fewest ever free.
    pub fn msgs_available(&self) -> (u32, u32) {
        (self.store.msgs.available(), self.store.msgs.low_water())
    }

    /// The path `id`, for inspection.
    pub fn path(&self, id: PathId) -> Option<&Path> {
        self.conns
            .get(id.conn as usize)
            .and_then(|c| c.paths.get(id.index as usize))
    }

    /// The connection with this key, if made.
    pub fn conn_id(&self, key: &ConnKey) -> Option<u32> {
        self.conn_by_key.get(key).copied()
    }

    /// The negotiated path count of connection `conn` (0 until a multipath connection's
    /// probe is answered), or `None` if there is no such connection.
    pub fn conn_npaths(&self, conn: u32) -> Option<u8> {
        self.conns.get(conn as usize).map(|c| c.npaths)
    }

    /// True if the peer of connection `conn` said in its last probe that its dialler's
    /// source ports name their path (SPORT_IDX); false for an unknown connection.
    pub fn conn_peer_sport_idx(&self, conn: u32) -> bool {
        self.conns
            .get(conn as usize)
            .is_some_and(|c| c.peer_sport_idx)
    }

    /// Every connection's key and negotiated path count.
    pub fn connections(&self) -> impl Iterator<Item = (u32, ConnKey, u8)> + '_ {
        self.conns
            .iter()
            .enumerate()
            .map(|(i, c)| (i as u32, c.key, c.npaths))
    }

    /// Every congestion map the node keeps (`rds-info`'s congestion state): each address it
    /// has met, local or a peer's, whether it is one of this node's, and its bitmap of
    /// congested ports (for a peer: what the peer last sent).
    pub fn congestion_maps(&self) -> impl Iterator<Item = (IpAddr, bool, &CongMap)> + '_ {
        self.cong
            .iter()
            .map(|(a, m)| (a.ip(), self.local.contains_key(&a), m))
    }

    pub(crate) fn spec(&self, kind: TransportKind) -> Option<TransportSpec> {
        self.cfg.transports.iter().copied().find(|t| t.kind == kind)
    }

    // ---------------------------------------------------------------------------------
    // Connections and paths
    // ---------------------------------------------------------------------------------

    /// The connection for `key`, made if needed (`rds_conn_create`).
    pub(crate) fn conn_for(&mut self, key: ConnKey) -> Option<u32> {
        if let Some(&c) = self.conn_by_key.get(&key) {
            return Some(c);
        }
        if self.conns.len() as u32 >= self.cfg.max_conns {
            return None;
        }
        let spec = self.spec(key.transport)?;
        let idx = self.conns.len() as u32;
        let lcong = self.cong.map_for(key.laddr);
        let fcong = self.cong.map_for(key.faddr);
        self.cong.add_conn(lcong, idx);
        self.conns.push(Conn::new(idx, key, spec, lcong, fcong));
        self.conn_by_key.insert(key, idx);
        Some(idx)
    }

    pub(crate) fn slot(id: PathId) -> u32 {
        id.conn * SLOTS_PER_CONN + u32::from(id.index)
    }

    fn slot_id(slot: u32) -> PathId {
        PathId {
            conn: slot / SLOTS_PER_CONN,
            index: (slot % SLOTS_PER_CONN) as u8,
        }
    }

    fn valid(&self, id: PathId) -> bool {
        self.path(id).is_some()
    }

    /// Runs `f` on a path with its context.
    pub(crate) fn with_path<R>(
        &mut self,
        id: PathId,
        f: impl FnOnce(&mut Path, &mut PathCtx<'_>) -> R,
    ) -> R {
        let conn = &mut self.conns[id.conn as usize];
        let mut ctx = PathCtx {
            store: &mut self.store,
            stats: &mut self.stats,
            rng: &mut self.rng,
            local_map: self.cong.map(conn.lcong),
            map_queued: &mut conn.map_queued,
        };
        f(&mut conn.paths[id.index as usize], &mut ctx)
    }

    /// After any input to a path: route what it produced, then schedule its commands,
    /// transmits and timer.
    ///
    /// Called ~3 times per message (the send, its frame, its completion; the frame, its
    /// credit at the receiver), and most inputs (a data frame taken whole, a completion, a
    /// credit) leave nothing to route: the look at the path's outputs is inlined into the
    /// callers, and only a path with something to route pays for the routing's call.
    #[inline]
    pub(crate) fn after_path(&mut self, now: Instant, id: PathId) {
        let conn = &self.conns[id.conn as usize];
        if conn.paths[id.index as usize].has_output()
            || (id.index == 0 && conn.catchup_seq.is_some())
        {
            self.route_outputs(now, id);
        }
        self.touch(now, id);
    }

    /// The slow half of [`after_path`](Self::after_path): what the path produced goes to
    /// its sockets, its acked sends are released, and the multipath catch-up is checked.
    #[inline(never)]
    fn route_outputs(&mut self, now: Instant, id: PathId) {
        while self.conns[id.conn as usize].paths[id.index as usize].has_output() {
            let p = &mut self.conns[id.conn as usize].paths[id.index as usize];
            p.take_rdma_done(&mut self.rdma_done);
            if !self.rdma_done.is_empty() {
                let mut done = core::mem::take(&mut self.rdma_done);
                for &(sidx, op) in &done {
                    self.rdma_notify(sidx, &op, RDS_RDMA_SUCCESS);
                }
                done.clear();
                self.rdma_done = done;
            }
            let p = &mut self.conns[id.conn as usize].paths[id.index as usize];
            let (rx, rel, dropped, ev) = (
                p.take_received(),
                p.take_released(),
                p.take_dropped(),
                p.take_events(),
            );
            // A data frame's routing has nothing to release: no calls for empty lists.
            if !rel.is_empty() {
                self.release_sends(rel, None);
            }
            if !dropped.is_empty() {
                self.release_sends(dropped, Some(RDS_RDMA_DROPPED));
            }
            if ev.up {
                self.path_up(now, id);
            }
            self.route_received(now, id, rx);
        }
        if id.index == 0 && self.conns[id.conn as usize].catchup_seq.is_some() {
            self.catch_up(id.conn);
        }
    }

    /// Reschedules a path: its command, its place on the transmit list, its timer.
    #[inline]
    pub(crate) fn touch(&mut self, _now: Instant, id: PathId) {
        let slot = Self::slot(id) as usize;
        let conn = &self.conns[id.conn as usize];
        let p = &conn.paths[id.index as usize];
        let sched = &mut self.sched[slot];
        if p.has_cmd() && !sched.in_cmd {
            sched.in_cmd = true;
            self.cmd_q.push_back(slot as u32);
        }
        if p.has_tx_work(conn.map_queued) && !sched.in_tx {
            sched.in_tx = true;
            self.tx_active.push_back(slot as u32);
        }
        // The path's timer: an engine timer armed no later than the path's earliest
        // deadline. One that is earlier (the deadline moved out or went away) is kept: it
        // fires, the path finds nothing due (spurious calls do nothing) and is touched
        // again, which arms the deadline it has then. A ping/pong arms the delayed ack on
        // every frame received and stops it with the next frame sent; re-arming and
        // cancelling the engine timer each time was ~400 instructions per round trip.
        let want = p.poll_timeout();
        let have = sched.timer;
        let keep = match (have, want) {
            (Some((_, at)), Some(w)) => at <= w,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        if !keep {
            if let Some((tid, _)) = have {
                self.timers.cancel(tid);
            }
            self.sched[slot].timer =
                want.and_then(|at| self.timers.arm(at, slot as u64).ok().map(|tid| (tid, at)));
        }
    }

    /// Touches every path of a connection (its map-update state changed).
    pub(crate) fn touch_conn(&mut self, now: Instant, c: u32) {
        for i in 0..self.conns[c as usize].paths.len() {
            self.touch(
                now,
                PathId {
                    conn: c,
                    index: i as u8,
                },
            );
        }
    }

    /// Acked (or dropped) sends leave their sockets: send-buffer space comes back.
    fn release_sends(&mut self, mut list: List, status: Option<i32>) {
        while let Some(id) = self.store.msgs.pop_front(&mut list, Lane::Conn) {
            let m = self.store.msgs.get(id);
            let (len, sidx) = (u64::from(m.len), m.sock);
            if m.has(Msg::ON_SOCK) {
                let s = &mut self.socks.slots[sidx as usize];
                let before = s.base_ready();
                self.store.msgs.remove(&mut s.send_list, Lane::Sock, id);
                s.snd_bytes = s.snd_bytes.saturating_sub(len);
                if s.snd_bytes == 0 {
                    self.stats.send_queue_empty += 1;
                }
                // rds_rdma_send_complete: the operation's outcome, to the sender, unless
                // its completion reported it already.
                if let Some(op) = self.store.msgs.get(id).rdma
                    && !op.done
                {
                    let st = op.failed.unwrap_or(status.unwrap_or(RDS_RDMA_SUCCESS));
                    self.rdma_notify(sidx, &op, st);
                }
                let s = &mut self.socks.slots[sidx as usize];
                let now_ready = s.base_ready();
                self.store.msgs.get_mut(id).clear(Msg::ON_SOCK);
                if now_ready & Ready::WRITE != before & Ready::WRITE {
                    self.notify_sock(sidx);
                }
            }
            self.store.release_if_unused(id);
        }
    }

    /// Queues `RDS_CMSG_RDMA_STATUS` for an operation of socket slot `sidx` if it asked
    /// (`RDS_RDMA_NOTIFY_ME`) or failed on a socket with `RDS_RECVERR`.
    fn rdma_notify(&mut self, sidx: u32, op: &RdmaOp, status: i32) {
        if !(op.notify || (op.recverr && status != RDS_RDMA_SUCCESS)) {
            return;
        }
        let s = &mut self.socks.slots[sidx as usize];
        if !s.live {
            return;
        }
        s.notify.push_back(RdmaNotify {
            user_token: op.user_token,
            status,
        });
        self.notify_sock(sidx);
    }

    /// Queues a readiness event for a socket (once until taken).
    pub(crate) fn notify_sock(&mut self, idx: u32) {
        let s = &mut self.socks.slots[idx as usize];
        if s.live && !s.event_pending {
            s.event_pending = true;
            self.events.push_back(idx);
        }
    }

    // ---------------------------------------------------------------------------------
    // Transport-facing inputs
    // ---------------------------------------------------------------------------------

    /// The next request for the transport driver.
    #[inline]
    pub fn poll_transport(&mut self) -> Option<TransportCmd> {
        // Called twice per loop turn and empty on nearly all: no call for nothing.
        if self.cmd_q.is_empty() {
            return None;
        }
        self.next_transport_cmd()
    }

    fn next_transport_cmd(&mut self) -> Option<TransportCmd> {
        while let Some(slot) = self.cmd_q.pop_front() {
            self.sched[slot as usize].in_cmd = false;
            let id = Self::slot_id(slot);
            let Some(cmd) = self.conns[id.conn as usize].paths[id.index as usize].poll_cmd() else {
                continue;
            };
            let conn = &self.conns[id.conn as usize];
            let key = conn.key;
            let out = match cmd {
                PathCmd::Disconnect => TransportCmd::Disconnect { path: id },
                PathCmd::Connect => TransportCmd::Connect {
                    path: id,
                    transport: key.transport,
                    laddr: key.laddr.ip(),
                    faddr: key.faddr.ip(),
                    tos: key.tos,
                },
            };
            // The path may have more (a disconnect then a connect).
            let p = &self.conns[id.conn as usize].paths[id.index as usize];
            if p.has_cmd() {
                self.sched[slot as usize].in_cmd = true;
                self.cmd_q.push_back(slot);
            }
            return Some(out);
        }
        None
    }

    /// The private data of our connect request on a message transport: RDS-IB's
    /// `rds_ib_connect_private` proposing 3.1, with our ack and, with flow control, every
    /// receive posted so far as initial credits. Call it after posting the connection's
    /// receives ([`handle_recv_posted`](Self::handle_recv_posted)).
    pub fn connect_private(&mut self, path: PathId) -> Option<IbConnPrivRepr> {
        self.valid(path)
            .then(|| self.private_data(path, IbVersion::PROPOSED, true))
    }

    /// The private data of our reply to an accepted request ([`Accept::Yes`]): the
    /// negotiated version, our ack, and initial credits if the peer offered flow control.
    pub fn accept_private(&mut self, path: PathId, version: IbVersion) -> Option<IbConnPrivRepr> {
        if !self.valid(path) {
            return None;
        }
        let p = &self.conns[path.conn as usize].paths[path.index as usize];
        let grant = p.pending_peer_credits() != 0;
        Some(self.private_data(path, version, grant))
    }

    /// RDS-IB private data for a path: our addresses, the version, our ack, and (with flow
    /// control) our initial credits.
    fn private_data(&mut self, id: PathId, version: IbVersion, grant: bool) -> IbConnPrivRepr {
        let key = self.conns[id.conn as usize].key;
        let p = &mut self.conns[id.conn as usize].paths[id.index as usize];
        let credit = if grant { p.initial_grant() } else { 0 };
        IbConnPrivRepr {
            saddr: key.laddr.ip(),
            daddr: key.faddr.ip(),
            version,
            minor_mask: SUPPORTED_MINOR_MASK,
            tos: key.tos,
            ack_seq: p.private_ack(),
            credit,
        }
    }

    /// A peer dials us (`rds_ib_cm_handle_connect`, `rds_tcp_accept_one`).
    pub fn handle_incoming(&mut self, now: Instant, req: Incoming<'_>) -> Accept {
        let key = req.conn_key();
        if !self.local.contains_key(&key.laddr) || self.spec(req.transport).is_none() {
            return Accept::No(Reject::NotLocal);
        }
        let spec = self.spec(req.transport).expect("checked");
        let message = spec.path.flavor == crate::path::Flavor::Message;
        let v6 = !key.laddr.is_v4();
        let (version, peer) = if message {
            let version = match ib::negotiate_passive(req.private, v6) {
                Ok(v) => v,
                Err(e) => return Accept::No(Reject::Incompatible(e)),
            };
            let peer = IbConnPrivRepr::parse(req.private, v6)
                .map(|r| PeerParams {
                    credits: r.credit,
                    ack_seq: r.ack_seq,
                })
                .unwrap_or_default();
            (version, peer)
        } else {
            (IbVersion::V3_1, PeerParams::default())
        };
        let Some(c) = self.conn_for(key) else {
            return Accept::No(Reject::NoMemory);
        };
        let index = req
            .path_index
            .min(self.conns[c as usize].paths.len() as u8 - 1);
        let id = PathId { conn: c, index };
        let ok = self.with_path(id, |p, ctx| p.handle_incoming(now, ctx));
        if ok && message {
            // The request's ack and credits apply when the connection is established.
            self.conns[c as usize].paths[index as usize].set_pending_peer(peer);
        }
        self.after_path(now, id);
        if ok {
            Accept::Yes { path: id, version }
        } else {
            Accept::No(Reject::Busy)
        }
    }

    /// A peer with the numerically larger address dialled us on a transport where only the
    /// smaller address dials (RDS-TCP, [`ConnectRule::LowerAddress`](crate::path::ConnectRule)):
    /// the transport refuses that connection (closes it), and this dials path 0 back from
    /// our side if it is down (`rds_tcp_accept_one` resetting a socket from the larger
    /// address, which then finds our connection). Returns false if the address is not
    /// ours, the transport is not registered or the connection table is full.
    pub fn handle_knock(&mut self, now: Instant, req: Incoming<'_>) -> bool {
        let key = req.conn_key();
        if !self.local.contains_key(&key.laddr) || self.spec(req.transport).is_none() {
            return false;
        }
        let Some(c) = self.conn_for(key) else {
            return false;
        };
        let id = PathId { conn: c, index: 0 };
        self.with_path(id, |p, _| p.connect_if_down(now));
        self.after_path(now, id);
        true
    }

    /// The connection of `path` is established. `reply` is the connect reply's private data
    /// on the active side of a message transport (empty otherwise).
    pub fn handle_connected(&mut self, now: Instant, path: PathId, reply: &[u8]) {
        if !self.valid(path) {
            return;
        }
        let conn = &self.conns[path.conn as usize];
        let message = conn.spec.path.flavor == crate::path::Flavor::Message;
        let v6 = !conn.key.laddr.is_v4();
        let mut peer =
            self.conns[path.conn as usize].paths[path.index as usize].take_pending_peer();
        if message && !reply.is_empty() {
            match ib::check_reply(reply, v6, IbVersion::V4_1) {
                Ok(_) => {
                    if let Ok(r) = IbConnPrivRepr::parse(reply, v6) {
                        peer = PeerParams {
                            credits: r.credit,
                            ack_seq: r.ack_seq,
                        };
                    }
                }
                Err(_) => {
                    self.with_path(path, |p, ctx| p.drop_path(ctx.stats));
                    self.after_path(now, path);
                    return;
                }
            }
        }
        self.with_path(path, |p, ctx| p.handle_connected(now, peer, ctx));
        self.after_path(now, path);
    }

    /// The dial of `path` failed.
    pub fn handle_connect_failed(&mut self, now: Instant, path: PathId) {
        if self.valid(path) {
            self.with_path(path, |p, ctx| p.handle_connect_failed(now, ctx));
            self.after_path(now, path);
        }
    }

    /// The transport of `path` failed (error completion, disconnect, peer gone).
    pub fn handle_transport_error(&mut self, now: Instant, path: PathId) {
        if self.valid(path) {
            self.with_path(path, |p, ctx| p.handle_transport_error(ctx));
            self.after_path(now, path);
        }
    }

    /// The transport of `path` finished tearing down.
    pub fn handle_transport_down(&mut self, now: Instant, path: PathId) {
        if self.valid(path) {
            self.with_path(path, |p, ctx| p.handle_transport_down(now, ctx));
            self.after_path(now, path);
        }
    }

    /// One frame received on a message transport.
    ///
    /// # Errors
    ///
    /// [`RxRefused`]: the message store is full; keep the frame and offer it again.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        path: PathId,
        header: &[u8],
        payload: &[u8],
    ) -> Result<(), RxRefused> {
        if !self.valid(path) {
            return Ok(());
        }
        let r = self.with_path(path, |p, ctx| p.handle_frame(now, header, payload, ctx));
        self.after_path(now, path);
        r
    }

    /// Bytes received on a stream transport; returns how many were taken.
    pub fn handle_stream_bytes(&mut self, now: Instant, path: PathId, bytes: &[u8]) -> usize {
        if !self.valid(path) {
            return bytes.len();
        }
        let n = self.with_path(path, |p, ctx| p.handle_stream_bytes(now, bytes, ctx));
        self.after_path(now, path);
        n
    }

    /// Frames of `path` up to `token` completed.
    pub fn handle_send_complete(&mut self, now: Instant, path: PathId, token: u64) {
        if self.valid(path) {
            self.with_path(path, |p, ctx| p.handle_send_complete(token, ctx));
            self.after_path(now, path);
        }
    }

    /// The RDMA operation posted before frame `token` of `path` failed with `status`
    /// (`RDS_RDMA_REMOTE_ERROR` for a key, range or right the peer's memory refused,
    /// `RDS_RDMA_OTHER_ERROR` otherwise): the message's notification will say so. The
    /// transport then fails the connection (an RC queue pair is in error after it); the
    /// message is not retransmitted, as no RDMA message is. Flushed operations are not
    /// reported (`RDS_RDMA_DROPPED` when the path resets).
    pub fn handle_rdma_failed(&mut self, _now: Instant, path: PathId, token: u64, status: i32) {
        if !self.valid(path) {
            return;
        }
        let p = &self.conns[path.conn as usize].paths[path.index as usize];
        if let Some(mid) = p.msg_in_flight(token)
            && let Some(op) = self.store.msgs.get_mut(mid).rdma.as_mut()
        {
            op.failed.get_or_insert(status);
            self.stats.send_rdma_failed += 1;
        }
    }

    /// A stream transport's peer acknowledged `acked` bytes of this connection.
    pub fn handle_stream_acked(&mut self, now: Instant, path: PathId, acked: u64) {
        if self.valid(path) {
            self.with_path(path, |p, ctx| p.handle_stream_acked(acked, ctx));
            self.after_path(now, path);
        }
    }

    /// The transport posted `n` receive buffers for `path` (credits).
    pub fn handle_recv_posted(&mut self, now: Instant, path: PathId, n: u32) {
        if !self.valid(path) {
            return;
        }
        // Every receive repost lands here (once per batch a transport takes), and most
        // only add credits below the update threshold: nothing to route or schedule then
        // (has_tx_work does not look at posted credits), so no after_path.
        let asked = self.with_path(path, |p, ctx| p.handle_recv_posted(n, ctx));
        if asked || (path.index == 0 && self.conns[path.conn as usize].catchup_seq.is_some()) {
            self.after_path(now, path);
        }
    }

    /// The next frame to transmit, from any path with work, round robin.
    ///
    /// A path that has work but cannot send now (ring full, no credits, held) leaves the
    /// list until an input (a completion, a credit, an ack) changes that.
    #[inline]
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(PathId, TxFrame)> {
        // As poll_transport: a turn that finds no path with work makes no call.
        if self.tx_active.is_empty() {
            return None;
        }
        self.next_frame(now)
    }

    /// True if [`poll_transmit`](Self::poll_transmit) may have another frame now (a path
    /// is listed as having work). A transport that stages the frames of a turn posts them
    /// as soon as this is false, without waiting for
    /// [`Transport::flush_transmit`](crate::transport::Transport::flush_transmit).
    #[inline]
    pub fn may_transmit(&self) -> bool {
        !self.tx_active.is_empty()
    }

    fn next_frame(&mut self, now: Instant) -> Option<(PathId, TxFrame)> {
        while let Some(slot) = self.tx_active.pop_front() {
            let id = Self::slot_id(slot);
            if self.conns[id.conn as usize].catchup_seq.is_some() {
                self.catch_up(id.conn);
            }
            let f = self.with_path(id, |p, ctx| p.poll_transmit(now, ctx));
            if let Some(f) = f {
                self.sched[slot as usize].in_tx = false;
                self.after_path(now, id);
                return Some((id, f));
            }
            // Still marked: after_path must not put it back for nothing.
            self.after_path(now, id);
            self.sched[slot as usize].in_tx = false;
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(ev) = self.timers.pop_expired(now) {
            let slot = ev.token as u32;
            self.sched[slot as usize].timer = None;
            let id = Self::slot_id(slot);
            self.with_path(id, |p, ctx| p.handle_timeout(now, ctx));
            self.after_path(now, id);
        }
    }

    /// The next socket readiness change.
    pub fn poll_event(&mut self) -> Option<SocketEvent> {
        while let Some(idx) = self.events.pop_front() {
            let s = &mut self.socks.slots[idx as usize];
            if !s.live {
                continue;
            }
            s.event_pending = false;
            let sock = self.socks.handle(idx);
            return Some(SocketEvent {
                sock,
                ready: self.readiness(sock),
            });
        }
        None
    }

    /// The multipath catch-up rule: paths above 0 of connection `c` stay held until path 0
    /// holds no unacked message from before the fan-out.
    fn catch_up(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        let Some(seq) = conn.catchup_seq else {
            return;
        };
        let p0 = &conn.paths[0];
        let oldest = [p0.retrans_queue().front(), p0.send_queue().front()]
            .into_iter()
            .flatten()
            .map(|id| self.store.msgs.get(id).seq)
            .min();
        if oldest.is_none_or(|s| s >= seq) {
            conn.catchup_seq = None;
            for p in conn.paths.iter_mut().skip(1) {
                p.set_tx_hold(false);
            }
            let n = conn.paths.len();
            for i in 1..n {
                self.touch(
                    Instant::ZERO,
                    PathId {
                        conn: c,
                        index: i as u8,
                    },
                );
            }
        } else {
            self.stats.mprds_catchup_tx0_retries += 1;
        }
    }

    /// True if the path is up.
    pub fn path_state(&self, id: PathId) -> Option<ConnState> {
        self.path(id).map(|p| p.state())
    }
}

/// The scheduling state of one path slot.
#[derive(Clone, Copy, Debug, Default)]
struct Sched {
    /// The engine timer armed for the path and its deadline: no later than the path's
    /// earliest deadline, possibly earlier or with none left (see `touch`).
    timer: Option<(TimerId, Instant)>,
    /// On `tx_active`.
    in_tx: bool,
    /// On `cmd_q`.
    in_cmd: bool,
}
