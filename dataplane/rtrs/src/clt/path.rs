//! One client path (`rtrs_clt_path`): its connections, the info exchange, heartbeats, the
//! requests in flight on it, and the receive side of the IO protocol.
//!
//! The path owns what Linux keeps per path; what involves the session (failover to another
//! path, link events, the policy, what an establishment failure means) it reports as an
//! [`Outcome`] for the session to act on. Every value the server sends is checked here.

use std::collections::VecDeque;
use std::time::Duration;

use dp_fabric::{RemoteAddr, WcOpcode, WcStatus};

use crate::error::{IoError, PathError, Violation};
use crate::permit::ConType;
use crate::stats::ClientPathStats;
use crate::timer::{HbTick, Heartbeat, Instant, TimerTable};
use crate::wire::{
    ConnReqRepr, ConnRsp, ConnRspRepr, Geometry, Imm, ImmType, InfoReq, InfoReqRepr, InfoRsp,
    IoRsp, PathName, RkeyRsp, RkeyRspRepr, SERVICE_CON_QUEUE_DEPTH,
};
use crate::work::{Conn, PathId, QpSizes, RecvBuf, SendQueue, Wc, Wr, WrId};

use super::event::ClientEvent;
use super::io::ClientIo;
use super::policy::PathLoad;
use super::req::{self, Phase, Req};
use super::state::{ClientState, PathState};

/// `RTRS_CONNECT_TIMEOUT_MS`: per connection, and for the info exchange.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// `RTRS_RECONNECT_BACKOFF`: the pause before each reconnect attempt.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(1000);
/// `RTRS_RECONNECT_SEED`: the reconnect delay gets `0..8` ms of jitter (Linux's comment says
/// seconds; its code adds milliseconds, and so do we).
pub const RECONNECT_JITTER_MS: u64 = 8;

// wr_id kinds of a client path.
const K_RECV_IO: u8 = 1;
const K_RECV_INFO: u8 = 2;
const K_SEND_INFO: u8 = 3;
const K_HB: u8 = 4;
const K_HB_ACK: u8 = 5;
const K_IO: u8 = 6;
const K_REG: u8 = 7;
const K_LINV: u8 = 8;

// Timers.
const T_HB: usize = 0;
const T_CONNECT: usize = 1;
const T_RECONNECT: usize = 2;
const T_BACKOFF: usize = 3;

/// Why the path exists: it decides what a failed establishment means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// One of the paths of `rtrs_clt_open`: a failure fails the open.
    Open,
    /// Added at run time: a failure removes it.
    Added,
    /// Connected before: a failure schedules another reconnect.
    Running,
}

/// What the session must do after a path call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing.
    None,
    /// The path became CONNECTED.
    Up,
    /// CONNECTED -> RECONNECTING happened: recover (fail IO over, close, schedule).
    Failed(PathError),
    /// CONNECTING -> CONNECTING_ERR happened: the establishment failed.
    ConnectFailed(PathError),
    /// The reconnect delay passed (state RECONNECTING).
    ReconnectDue,
    /// The backoff after it passed: connect now.
    BackoffDue,
}

/// What the path needs to know of its session.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessCtx {
    /// The session's UUID (`paths_uuid` on the wire).
    pub(crate) sess_uuid: [u8; 16],
    /// The session's queue depth once known: every path must offer the same.
    pub(crate) queue_depth: Option<u16>,
    /// The session's name (sent in `info_req`).
    pub(crate) name: PathName,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Down,
    Connecting,
    Up,
}

#[derive(Clone, Copy, Debug)]
struct ConnSt {
    link: Link,
    sq: SendQueue,
    /// The key the last received SEND_WITH_INV invalidated on this connection.
    last_inv: Option<u32>,
}

impl ConnSt {
    const fn down() -> Self {
        Self {
            link: Link::Down,
            sq: SendQueue::new(0, 1),
            last_inv: None,
        }
    }
}

/// One path of a client session.
#[derive(Debug)]
pub(crate) struct ClientPath {
    pub(crate) id: PathId,
    pub(crate) uuid: [u8; 16],
    st: PathState,
    pub(crate) origin: Origin,
    cid_num: u16,
    conns: Vec<ConnSt>,
    epoch: u16,
    geom: Option<Geometry>,
    max_io_size: u32,
    max_hdr_size: u32,
    new_rkey: bool,
    signal_interval: u32,
    rbufs: Vec<(u64, u32)>,
    reqs: Vec<Option<Req>>,
    info_pending: bool,
    hb: Heartbeat,
    timers: TimerTable<4>,
    /// Reconnect attempts since the last success.
    pub(crate) attempts: u32,
    /// The queue depth changed on a reconnect: never reconnect again on our own.
    pub(crate) no_reconnect: bool,
    /// `for_new_clt`: send `first_conn`.
    pub(crate) for_new_clt: bool,
    /// Counted in the session's `paths_up`.
    pub(crate) established: bool,
    pub(crate) stats: ClientPathStats,
    pub(crate) last_error: Option<PathError>,
}

impl PathLoad for ClientPath {
    fn connected(&self) -> bool {
        self.st.get() == ClientState::Connected
    }
    fn inflight(&self) -> u32 {
        self.stats.inflight
    }
    fn latency(&self) -> Option<Duration> {
        self.hb.latency()
    }
}

impl ClientPath {
    pub(crate) fn new(
        id: PathId,
        uuid: [u8; 16],
        io_conns: u16,
        hb: Heartbeat,
        origin: Origin,
    ) -> Self {
        let cid_num = io_conns.saturating_add(1);
        Self {
            id,
            uuid,
            st: PathState::new(),
            origin,
            cid_num,
            conns: vec![ConnSt::down(); usize::from(cid_num)],
            epoch: 0,
            geom: None,
            max_io_size: 0,
            max_hdr_size: 0,
            new_rkey: false,
            signal_interval: SERVICE_CON_QUEUE_DEPTH,
            rbufs: Vec::new(),
            reqs: Vec::new(),
            info_pending: false,
            hb,
            timers: TimerTable::default(),
            attempts: 0,
            no_reconnect: false,
            for_new_clt: false,
            established: false,
            stats: ClientPathStats::default(),
            last_error: None,
        }
    }

    pub(crate) fn state(&self) -> ClientState {
        self.st.get()
    }

    pub(crate) fn change(&mut self, to: ClientState) -> bool {
        self.st.change(to)
    }

    pub(crate) fn geometry(&self) -> Option<Geometry> {
        self.geom
    }

    pub(crate) fn max_io_size(&self) -> u32 {
        self.max_io_size
    }

    pub(crate) fn max_hdr_size(&self) -> u32 {
        self.max_hdr_size
    }

    pub(crate) fn cur_latency(&self) -> Option<Duration> {
        self.hb.latency()
    }

    pub(crate) fn cid_num(&self) -> u16 {
        self.cid_num
    }

    fn conn(&self, cid: u16) -> Conn {
        Conn {
            path: self.id,
            cid,
            epoch: self.epoch,
        }
    }

    fn wr(&self, kind: u8, batch: u32, arg: u16) -> u64 {
        WrId::new(self.epoch, kind, batch, arg).0
    }

    fn recv_buf(&self) -> RecvBuf {
        if self.new_rkey {
            RecvBuf::Small
        } else {
            RecvBuf::Empty
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    pub(crate) fn schedule_reconnect(&mut self, at: Instant) {
        self.timers.set(T_RECONNECT, at);
    }

    pub(crate) fn schedule_backoff(&mut self, at: Instant) {
        self.timers.set(T_BACKOFF, at);
    }

    /// An error on a connected or connecting path (`rtrs_rdma_error_recovery`):
    /// CONNECTED -> RECONNECTING, else CONNECTING -> CONNECTING_ERR; otherwise (already
    /// recovering or closed) nothing.
    pub(crate) fn fail(&mut self, err: PathError) -> Outcome {
        if self
            .st
            .change_from(ClientState::Connected, ClientState::Reconnecting)
        {
            self.last_error = Some(err);
            self.timers.stop(T_HB);
            return Outcome::Failed(err);
        }
        if self
            .st
            .change_from(ClientState::Connecting, ClientState::ConnectingErr)
        {
            self.last_error = Some(err);
            self.timers.stop(T_CONNECT);
            self.info_pending = false;
            return Outcome::ConnectFailed(err);
        }
        Outcome::None
    }

    fn violation(&mut self, v: Violation) -> Outcome {
        self.stats.violation(v);
        self.fail(PathError::Violation(v))
    }

    // ---------------------------------------------------------------------------------------
    // Establishment
    // ---------------------------------------------------------------------------------------

    /// `init_conns`: a new epoch, and the connection of cid 0 (the others follow one by one).
    /// The state must already be CONNECTING.
    pub(crate) fn start(
        &mut self,
        now: Instant,
        io: &mut impl ClientIo,
        sess: &SessCtx,
    ) -> Outcome {
        self.epoch = self.epoch.wrapping_add(1);
        self.conns.fill(ConnSt::down());
        self.info_pending = false;
        self.hb.reset();
        self.connect_cid(0, now, io, sess)
    }

    fn qp_sizes(&self, cid: u16) -> QpSizes {
        if cid == 0 {
            let n = SERVICE_CON_QUEUE_DEPTH * 2 + 2;
            QpSizes {
                max_send_wr: n,
                max_recv_wr: n,
                max_send_sge: 1,
            }
        } else {
            let qd = self.geom.map_or(1, |g| u32::from(g.queue_depth()));
            QpSizes {
                max_send_wr: qd * 4 + 1,
                max_recv_wr: qd * 3 + 1,
                max_send_sge: 2,
            }
        }
    }

    /// The send queue of connection `cid`, `cap` requests deep. The service connection
    /// signals every `signal_interval`-th request (Linux's `min(queue_depth, 512)`). An IO
    /// connection's queue (`4 * queue_depth + 1`) carries one request per IO and its
    /// completions only give room back: it signals every `cap / 2`-th (at most 512), which
    /// leaves room for a whole interval after each signal and halves the send completions
    /// of a queue-depth-1 client, where Linux's interval signals every request.
    fn send_queue(&self, cid: u16, cap: u32) -> SendQueue {
        let interval = if cid == 0 {
            self.signal_interval
        } else {
            (cap / 2)
                .min(SERVICE_CON_QUEUE_DEPTH)
                .max(self.signal_interval)
        };
        SendQueue::new(cap, interval)
    }

    fn connect_cid(
        &mut self,
        cid: u16,
        now: Instant,
        io: &mut impl ClientIo,
        sess: &SessCtx,
    ) -> Outcome {
        let req = ConnReqRepr {
            version: crate::wire::PROTO_VER,
            cid,
            cid_num: self.cid_num,
            recon_cnt: self.epoch,
            path_uuid: self.uuid,
            sess_uuid: sess.sess_uuid,
            first_conn: self.for_new_clt,
        };
        let sizes = self.qp_sizes(cid);
        self.conns[usize::from(cid)] = ConnSt {
            link: Link::Connecting,
            sq: self.send_queue(cid, sizes.max_send_wr),
            last_inv: None,
        };
        self.timers
            .set(T_CONNECT, now.saturating_add(CONNECT_TIMEOUT));
        match io.connect(self.conn(cid), sizes, &req.to_bytes()) {
            Ok(()) => Outcome::None,
            Err(_) => {
                self.stats.cm_errors += 1;
                self.fail(PathError::AddrError)
            }
        }
    }

    /// A connection-manager event for one of the path's connections.
    pub(crate) fn handle_cm(
        &mut self,
        now: Instant,
        conn: Conn,
        ev: crate::work::CmEvent<'_>,
        io: &mut impl ClientIo,
        sess: &SessCtx,
    ) -> Outcome {
        use crate::work::CmEvent;
        if conn.epoch != self.epoch || conn.cid >= self.cid_num {
            return Outcome::None;
        }
        let link = self.conns[usize::from(conn.cid)].link;
        match ev {
            CmEvent::Established { private_data } => {
                if link != Link::Connecting || self.state() != ClientState::Connecting {
                    return Outcome::None;
                }
                self.established_cid(conn.cid, private_data, now, io, sess)
            }
            CmEvent::Rejected { private_data } => {
                if link == Link::Down {
                    return Outcome::None;
                }
                self.stats.cm_errors += 1;
                let errno = ConnRsp::new_checked(private_data)
                    .and_then(|p| ConnRspRepr::parse(&p))
                    .map_or(-(libc::ECONNRESET as i16), |r| r.errno);
                self.fail(PathError::Rejected(errno))
            }
            CmEvent::Unreachable
            | CmEvent::AddrError
            | CmEvent::Disconnected
            | CmEvent::DeviceRemoval => {
                if link == Link::Down {
                    return Outcome::None;
                }
                self.stats.cm_errors += 1;
                self.fail(match ev {
                    CmEvent::Unreachable => PathError::Unreachable,
                    CmEvent::AddrError => PathError::AddrError,
                    CmEvent::DeviceRemoval => PathError::DeviceRemoval,
                    _ => PathError::Disconnected,
                })
            }
        }
    }

    /// `rtrs_rdma_conn_established`: the server's accept data, checked; cid 0's configures
    /// the path. Then the next connection, or the info exchange.
    fn established_cid(
        &mut self,
        cid: u16,
        pdata: &[u8],
        now: Instant,
        io: &mut impl ClientIo,
        sess: &SessCtx,
    ) -> Outcome {
        let rsp = match ConnRsp::new_checked(pdata).and_then(|p| ConnRspRepr::parse(&p)) {
            Ok(r) => r,
            Err(b) => return self.violation(Violation::Wire(b)),
        };
        if rsp.errno != 0 {
            self.stats.cm_errors += 1;
            return self.fail(PathError::Rejected(rsp.errno));
        }
        if cid == 0 {
            let g = match rsp.check_accept() {
                Ok(g) => g,
                Err(b) => return self.violation(Violation::Wire(b)),
            };
            let known = self.geom.map(|g| g.queue_depth()).or(sess.queue_depth);
            if known.is_some_and(|q| q != g.queue_depth()) {
                // Linux disables automatic reconnects here: a manual reconnect is needed once
                // the server is fixed.
                self.no_reconnect = true;
                return self.violation(Violation::QueueDepthChanged);
            }
            self.geom = Some(g);
            self.max_io_size = rsp.max_io_size;
            self.max_hdr_size = rsp.max_hdr_size;
            self.new_rkey = rsp.new_rkey();
            self.signal_interval = u32::from(g.queue_depth()).min(SERVICE_CON_QUEUE_DEPTH);
            let qd = usize::from(g.queue_depth());
            if self.rbufs.len() != qd {
                self.rbufs = vec![(0, 0); qd];
            }
            if self.reqs.len() != qd {
                self.reqs = vec![None; qd];
            }
            // "to allow future reconnect on any path"
            self.for_new_clt = true;
        }
        self.conns[usize::from(cid)].link = Link::Up;
        if cid + 1 < self.cid_num {
            return self.connect_cid(cid + 1, now, io, sess);
        }
        self.send_info(now, io, sess)
    }

    /// `rtrs_send_path_info`: a receive for the `info_rsp`, then the `info_req`.
    fn send_info(&mut self, now: Instant, io: &mut impl ClientIo, sess: &SessCtx) -> Outcome {
        let Some(g) = self.geom else {
            return self.fail(PathError::Violation(Violation::InfoOutOfOrder));
        };
        let len = InfoRsp::<&[u8]>::len_for(usize::from(g.queue_depth())) as u32;
        if let Err(e) = io.post_recv(
            self.conn(0),
            self.wr(K_RECV_INFO, 0, 0),
            RecvBuf::InfoRsp(len),
        ) {
            return self.fail(PathError::Post(e.kind));
        }
        let mut msg = [0u8; InfoReq::<&[u8]>::LEN];
        InfoReqRepr {
            pathname: sess.name,
        }
        .emit(&mut InfoReq::new_unchecked(&mut msg[..]));
        let batch = match self.conns[0].sq.reserve(1, true) {
            Ok(b) => b.unwrap_or(1),
            Err(e) => return self.fail(PathError::Post(e.kind)),
        };
        let chain = [Wr::SendMsg {
            wr_id: self.wr(K_SEND_INFO, batch, 0),
            bytes: &msg,
            signaled: true,
        }];
        if let Err(e) = io.post_send(self.conn(0), &chain) {
            return self.fail(PathError::Post(e.kind));
        }
        self.info_pending = true;
        self.timers
            .set(T_CONNECT, now.saturating_add(CONNECT_TIMEOUT));
        Outcome::None
    }

    /// `rtrs_clt_info_rsp_done` + `process_info_rsp`: the chunk table, then every IO
    /// receive, then CONNECTED.
    fn info_rsp(
        &mut self,
        now: Instant,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ClientIo,
    ) -> Outcome {
        if !self.info_pending || self.state() != ClientState::Connecting {
            return self.violation(Violation::UnexpectedSend);
        }
        self.info_pending = false;
        let Some(g) = self.geom else {
            return self.violation(Violation::InfoOutOfOrder);
        };
        if wc.opcode != WcOpcode::Recv {
            return self.violation(Violation::UnexpectedSend);
        }
        let n = (wc.byte_len as usize).min(payload.len());
        let table =
            InfoRsp::new_checked(&payload[..n]).and_then(|v| v.chunk_table(&g, &mut self.rbufs));
        if let Err(b) = table {
            return self.violation(Violation::Wire(b));
        }
        let buf = self.recv_buf();
        for cid in 0..self.cid_num {
            let q = if cid == 0 {
                SERVICE_CON_QUEUE_DEPTH
            } else {
                u32::from(g.queue_depth())
            };
            if cid > 0 {
                let s = self.qp_sizes(cid);
                self.conns[usize::from(cid)].sq = self.send_queue(cid, s.max_send_wr);
            }
            for _ in 0..q * 2 {
                if let Err(e) = io.post_recv(self.conn(cid), self.wr(K_RECV_IO, 0, 0), buf) {
                    return self.fail(PathError::Post(e.kind));
                }
            }
        }
        if !self.st.change(ClientState::Connected) {
            return Outcome::None;
        }
        self.timers.stop(T_CONNECT);
        self.attempts = 0;
        self.stats.reconnects_ok += 1;
        self.hb.reset();
        self.timers
            .set(T_HB, now.saturating_add(self.hb.interval()));
        Outcome::Up
    }

    // ---------------------------------------------------------------------------------------
    // Completions
    // ---------------------------------------------------------------------------------------

    /// One completion of one of the path's connections; `payload` holds the bytes of a
    /// receive (what the driver's buffer caught).
    pub(crate) fn handle_wc(
        &mut self,
        now: Instant,
        conn: Conn,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ClientIo,
        events: &mut VecDeque<ClientEvent>,
    ) -> Outcome {
        let id = WrId(wc.wr_id);
        if conn.epoch != self.epoch || id.epoch() != self.epoch || conn.cid >= self.cid_num {
            return Outcome::None;
        }
        let live = matches!(
            self.state(),
            ClientState::Connected | ClientState::Connecting
        );
        if !wc.is_ok() {
            if !live {
                return Outcome::None; // a flush (or error) of connections we are closing
            }
            // Linux ignores every flush; a flush on a connection we did not close means its
            // queue pair went to the error state, which Linux would only notice through the
            // heartbeat.
            self.stats.wc_errors += 1;
            return self.fail(PathError::Completion(wc.status));
        }
        if !live {
            return Outcome::None;
        }
        if wc.is_recv() {
            self.hb.on_traffic();
            return match id.kind() {
                K_RECV_INFO if conn.cid == 0 => self.info_rsp(now, wc, payload, io),
                K_RECV_IO => self.recv_io(now, conn.cid, wc, payload, io, events),
                _ => self.violation(Violation::UnknownWrId),
            };
        }
        let cid = usize::from(conn.cid);
        match id.kind() {
            K_SEND_INFO | K_HB | K_HB_ACK | K_IO | K_REG => {
                self.conns[cid].sq.complete(id.batch());
                Outcome::None
            }
            K_LINV => {
                self.conns[cid].sq.complete(id.batch());
                self.finish_inval(id.arg(), events);
                Outcome::None
            }
            _ => self.violation(Violation::UnknownWrId),
        }
    }

    /// `rtrs_clt_rdma_done` for receives of the IO protocol.
    fn recv_io(
        &mut self,
        now: Instant,
        cid: u16,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ClientIo,
        events: &mut VecDeque<ClientEvent>,
    ) -> Outcome {
        if self.state() != ClientState::Connected {
            return self.violation(Violation::IoBeforeConnected);
        }
        // Every receive consumed is reposted at once, with the same kind of buffer.
        if let Err(e) = io.post_recv(self.conn(cid), self.wr(K_RECV_IO, 0, 0), self.recv_buf()) {
            return self.fail(PathError::Post(e.kind));
        }
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                let Some(imm) = wc.imm.map(Imm) else {
                    return self.violation(Violation::ImmType(0xFF));
                };
                match imm.ty() {
                    ImmType::IoRsp | ImmType::IoRspWInv => {
                        let r = IoRsp::decode(imm.payload());
                        self.io_rsp(cid, r, imm.ty() == ImmType::IoRspWInv, io, events)
                    }
                    ImmType::HbMsg => self.post_empty(K_HB_ACK, Imm::HB_ACK, io),
                    ImmType::HbAck => {
                        self.stats.cur_latency = self.hb.on_ack(now);
                        Outcome::None
                    }
                    _ => self.violation(Violation::ImmType(imm.raw_ty() as u8)),
                }
            }
            _ => {
                if let Some(k) = wc.invalidated {
                    // A SEND_WITH_INV: the response that follows on this connection says
                    // which request it was for.
                    self.conns[usize::from(cid)].last_inv = Some(k);
                    return Outcome::None;
                }
                match wc.imm.map(Imm) {
                    Some(imm) if self.new_rkey => self.rkey_rsp(cid, imm, wc, payload, io, events),
                    _ => self.violation(Violation::UnexpectedSend),
                }
            }
        }
    }

    /// `rtrs_clt_rkey_rsp_done`: a chunk's new key, then the response it carries.
    fn rkey_rsp(
        &mut self,
        cid: u16,
        imm: Imm,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ClientIo,
        events: &mut VecDeque<ClientEvent>,
    ) -> Outcome {
        let n = (wc.byte_len as usize).min(payload.len());
        let msg = match RkeyRsp::new_checked(&payload[..n]).and_then(|p| RkeyRspRepr::parse(&p)) {
            Ok(m) => m,
            Err(b) => return self.violation(Violation::Wire(b)),
        };
        if !matches!(imm.ty(), ImmType::IoRsp | ImmType::IoRspWInv) {
            return self.violation(Violation::ImmType(imm.raw_ty() as u8));
        }
        let r = IoRsp::decode(imm.payload());
        if usize::from(msg.buf_id) >= self.rbufs.len() || u32::from(msg.buf_id) != r.msg_id {
            return self.violation(Violation::Wire(crate::wire::Bad::BufId));
        }
        let w_inv = imm.ty() == ImmType::IoRspWInv;
        let out = self.io_rsp(cid, r, w_inv, io, events);
        if out == Outcome::None {
            self.rbufs[usize::from(msg.buf_id)].1 = msg.rkey;
        }
        out
    }

    /// `process_io_rsp` + `complete_rdma_req`.
    fn io_rsp(
        &mut self,
        cid: u16,
        r: IoRsp,
        w_inv: bool,
        io: &mut impl ClientIo,
        events: &mut VecDeque<ClientEvent>,
    ) -> Outcome {
        let Ok(slot) = u16::try_from(r.msg_id) else {
            return self.violation(Violation::RspOutOfRange);
        };
        if usize::from(slot) >= self.reqs.len() {
            return self.violation(Violation::RspOutOfRange);
        }
        let Some(mut q) = self.reqs[usize::from(slot)] else {
            return self.violation(Violation::RspIdle);
        };
        if q.phase != Phase::Posted || q.cid != cid {
            return self.violation(Violation::RspIdle);
        }
        let result = if r.errno == 0 {
            Ok(())
        } else {
            Err(IoError::Remote(-r.errno))
        };
        if w_inv {
            // The server says it invalidated our key with the SEND_WITH_INV before this
            // response; it must be the key of this request.
            let inv = self.conns[usize::from(cid)].last_inv.take();
            if q.key.is_none() || inv != q.key {
                return self.violation(Violation::UnexpectedSend);
            }
            q.key = None;
        }
        match q.key {
            None => {
                self.complete(slot, result, events);
                Outcome::None
            }
            Some(key) => {
                // The server did not invalidate our one-shot key: do it ourselves before the
                // caller may reuse the buffer.
                let batch = match self.conns[usize::from(cid)].sq.reserve(1, true) {
                    Ok(b) => b.unwrap_or(1),
                    Err(e) => return self.fail(PathError::Post(e.kind)),
                };
                let chain = [Wr::LocalInv {
                    wr_id: self.wr(K_LINV, batch, slot),
                    key,
                }];
                if let Err(e) = io.post_send(self.conn(cid), &chain) {
                    self.conns[usize::from(cid)].sq.unreserve(1, Some(batch));
                    return self.fail(PathError::Post(e.kind));
                }
                q.phase = Phase::Invalidating(result);
                self.reqs[usize::from(slot)] = Some(q);
                Outcome::None
            }
        }
    }

    fn finish_inval(&mut self, slot: u16, events: &mut VecDeque<ClientEvent>) {
        if let Some(Some(q)) = self.reqs.get(usize::from(slot))
            && let Phase::Invalidating(result) = q.phase
        {
            self.complete(slot, result, events);
        }
    }

    fn complete(
        &mut self,
        slot: u16,
        result: Result<(), IoError>,
        events: &mut VecDeque<ClientEvent>,
    ) {
        if let Some(q) = self.reqs[usize::from(slot)].take() {
            self.stats.inflight = self.stats.inflight.saturating_sub(1);
            events.push_back(ClientEvent::Completed {
                id: slot,
                ctx: q.ctx,
                result,
            });
        }
    }

    /// A zero-length RDMA WRITE with immediate on connection 0 (heartbeat or its answer).
    fn post_empty(&mut self, kind: u8, imm: Imm, io: &mut impl ClientIo) -> Outcome {
        let batch = match self.conns[0].sq.reserve(1, false) {
            Ok(b) => b,
            Err(e) => return self.fail(PathError::Post(e.kind)),
        };
        let chain = [Wr::WriteImmEmpty {
            wr_id: self.wr(kind, batch.unwrap_or(0), 0),
            imm: imm.0,
            signaled: batch.is_some(),
        }];
        match io.post_send(self.conn(0), &chain) {
            Ok(()) => Outcome::None,
            Err(e) => {
                self.conns[0].sq.unreserve(1, batch);
                self.fail(PathError::Post(e.kind))
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// Runs the path's due timers; returns at the first outcome the session must act on.
    pub(crate) fn handle_timeout(&mut self, now: Instant, io: &mut impl ClientIo) -> Outcome {
        if self.timers.take_due(T_CONNECT, now) && self.state() == ClientState::Connecting {
            self.stats.cm_errors += 1;
            return self.fail(PathError::Timeout);
        }
        if self.timers.take_due(T_HB, now) && self.state() == ClientState::Connected {
            match self.hb.tick(now) {
                HbTick::Dead => return self.fail(PathError::Heartbeat),
                HbTick::Wait => {}
                HbTick::Send => {
                    self.stats.hb_sent += 1;
                    let out = self.post_empty(K_HB, Imm::HB_MSG, io);
                    if out != Outcome::None {
                        return out;
                    }
                }
            }
            self.timers
                .set(T_HB, now.saturating_add(self.hb.interval()));
        }
        if self.timers.take_due(T_RECONNECT, now) && self.state() == ClientState::Reconnecting {
            return Outcome::ReconnectDue;
        }
        if self.timers.take_due(T_BACKOFF, now) && self.state() == ClientState::Reconnecting {
            return Outcome::BackoffDue;
        }
        Outcome::None
    }

    // ---------------------------------------------------------------------------------------
    // Requests
    // ---------------------------------------------------------------------------------------

    /// True if permit `slot` has a request on this path.
    pub(crate) fn has_req(&self, slot: u16) -> bool {
        self.reqs
            .get(usize::from(slot))
            .is_some_and(Option::is_some)
    }

    /// Removes the request of permit `slot` (for failover or on close).
    pub(crate) fn take_req(&mut self, slot: u16) -> Option<Req> {
        let q = self.reqs.get_mut(usize::from(slot))?.take()?;
        self.stats.inflight = self.stats.inflight.saturating_sub(1);
        Some(q)
    }

    /// Slots with a request in flight (`queue_depth` or 0 before the first connect).
    pub(crate) fn slots(&self) -> u16 {
        self.reqs.len() as u16
    }

    /// The connection an IO of this permit goes on (`rtrs_permit_to_clt_con`).
    fn cid_for(&self, con: ConType, lane: u16) -> u16 {
        match con {
            ConType::Admin => 0,
            // One IO connection (the default): no division on every request.
            ConType::Io if self.cid_num == 2 => 1,
            ConType::Io if self.cid_num > 1 => lane % (self.cid_num - 1) + 1,
            ConType::Io => 0,
        }
    }

    /// `rtrs_clt_write_req` / `rtrs_clt_read_req`: maps the data, writes the RTRS header
    /// behind the user message (already in the permit's header buffer), and posts the
    /// request into chunk `slot`. The path must be CONNECTED.
    ///
    /// # Errors
    /// The reason this path cannot take it (the session then tries the next path).
    pub(crate) fn post_req(
        &mut self,
        io: &mut impl ClientIo,
        slot: u16,
        mut q: Req,
    ) -> Result<(), IoError> {
        let g = self.geom.ok_or(IoError::Aborted)?;
        if self.state() != ClientState::Connected || usize::from(slot) >= self.reqs.len() {
            return Err(IoError::Aborted);
        }
        if self.reqs[usize::from(slot)].is_some() {
            return Err(IoError::Busy);
        }
        let data_len = q.data.map_or(0, |d| d.len);
        req::check_hdr_room(q.dir, q.usr_len, data_len != 0, self.max_hdr_size)?;
        let off = req::chunk_offset(&g, q.dir, q.usr_len, data_len)?;
        let imm = g.encode(slot, off).ok_or(IoError::MsgSize)?;
        let cid = self.cid_for(q.con, q.lane);
        let conn = self.conn(cid);
        let mapped = match q.data {
            Some(d) if d.len != 0 => {
                Some(io.map_data(conn, slot, &d, q.dir).map_err(IoError::Map)?)
            }
            _ => None,
        };
        let (hdr, hdr_n) = req::header(q.dir, q.usr_len, data_len, mapped.as_ref());
        io.write_iu(slot, u32::from(q.usr_len), &hdr[..hdr_n])
            .map_err(|_| IoError::Map(libc::EFAULT))?;
        let (raddr, rkey) = self.rbufs[usize::from(slot)];
        let (remote_addr, gather) = match q.dir {
            crate::work::Dir::Write => (
                raddr,
                mapped.map(|m| dp_fabric::Sge {
                    addr: m.addr,
                    length: data_len,
                    lkey: m.lkey,
                }),
            ),
            crate::work::Dir::Read => (raddr.wrapping_add(u64::from(data_len)), None),
        };
        let reg = mapped.and_then(|m| m.register);
        let n = 1 + u32::from(reg.is_some());
        let batch = self.conns[usize::from(cid)]
            .sq
            .reserve(n, false)
            .map_err(|_| IoError::Aborted)?;
        let io_wr = Wr::IoRequest {
            wr_id: self.wr(K_IO, batch.unwrap_or(0), slot),
            remote: RemoteAddr {
                addr: remote_addr,
                rkey,
            },
            data: gather,
            slot,
            iu_len: u32::from(q.usr_len) + hdr_n as u32,
            imm: Imm::io_req(imm).0,
            signaled: batch.is_some(),
        };
        let posted = match reg {
            Some(token) => io.post_send(
                conn,
                &[
                    Wr::Register {
                        wr_id: self.wr(K_REG, 0, slot),
                        token,
                        signaled: false,
                    },
                    io_wr,
                ],
            ),
            None => io.post_send(conn, &[io_wr]),
        };
        if posted.is_err() {
            self.conns[usize::from(cid)].sq.unreserve(n, batch);
            return Err(IoError::Aborted);
        }
        q.cid = cid;
        q.key = reg.and(mapped.map(|m| {
            if q.dir == crate::work::Dir::Read {
                m.rkey
            } else {
                m.lkey
            }
        }));
        q.phase = Phase::Posted;
        self.reqs[usize::from(slot)] = Some(q);
        self.stats.rdma.add(
            q.dir == crate::work::Dir::Read,
            u64::from(q.usr_len) + u64::from(data_len),
        );
        self.stats.inflight += 1;
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Teardown
    // ---------------------------------------------------------------------------------------

    /// The connection part of `rtrs_clt_stop_and_destroy_conns`: heartbeat stopped, every
    /// connection disconnected, drained and destroyed by the driver. Requests stay for the
    /// session to fail over.
    pub(crate) fn destroy_conns(&mut self, io: &mut impl ClientIo) {
        self.hb.reset();
        self.timers.stop(T_HB);
        self.timers.stop(T_CONNECT);
        self.info_pending = false;
        if self.conns.iter().any(|c| c.link != Link::Down) {
            io.close_path(self.id);
        }
        self.conns.fill(ConnSt::down());
    }

    /// Disarms every timer (close, remove).
    pub(crate) fn stop_timers(&mut self) {
        self.timers.stop_all();
    }

    /// True if a completion of our own work requests (not the peer's) could still be
    /// waiting for this request: used by tests of the invariants.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn req(&self, slot: u16) -> Option<&Req> {
        self.reqs.get(usize::from(slot))?.as_ref()
    }

    /// The rkey of chunk `slot` as the path knows it (tests of `NEW_RKEY`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn rbuf(&self, slot: u16) -> Option<(u64, u32)> {
        self.rbufs.get(usize::from(slot)).copied()
    }

    /// The path's connection epoch.
    pub(crate) fn epoch(&self) -> u16 {
        self.epoch
    }

    /// True if the completion status is a flush.
    #[allow(dead_code, reason = "kept for drivers' diagnostics")]
    pub(crate) const fn is_flush(s: WcStatus) -> bool {
        matches!(s, WcStatus::WrFlushErr)
    }
}
