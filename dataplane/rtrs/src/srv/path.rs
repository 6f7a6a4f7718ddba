//! One server path (`rtrs_srv_path`): its connections, the info exchange, heartbeats,
//! the requests it received (`ops_ids`), and its responses, with the send-queue room they
//! wait for (`sq_wr_avail`, `rsp_wr_wait_list`).
//!
//! Every value the client writes is checked before use: the immediate's chunk and offset
//! against the geometry, the RTRS header against the chunk's end, `usr_len` against the
//! offset, the read descriptor's count and length, a second request into a busy chunk.

use std::collections::VecDeque;

use dp_fabric::{RemoteAddr, WcOpcode};

use crate::error::{PathError, Violation};
use crate::stats::ServerPathStats;
use crate::timer::{HbTick, Heartbeat, Instant, TimerTable};
use crate::wire::io::data_len;
use crate::wire::{
    Bad, Geometry, Imm, ImmType, InfoReq, InfoReqRepr, InfoRsp, IoRsp, MsgType, PathName, RdmaRead,
    RdmaReadRepr, RdmaWrite, RdmaWriteRepr, RkeyRspRepr, SERVICE_CON_QUEUE_DEPTH, SgDesc,
};
use crate::work::{Conn, Dir, PathId, RecvBuf, SendQueue, SrcRef, Wc, Wr, WrId, inc_rkey};

use super::io::{OpId, ServerEvent, ServerIo, SessId};

// wr_id kinds of a server path.
const K_RECV_INFO: u8 = 1;
const K_RECV_IO: u8 = 2;
const K_SEND_INFO: u8 = 3;
const K_HB: u8 = 4;
const K_HB_ACK: u8 = 5;
const K_RSP: u8 = 6;
const K_CHUNK_INV: u8 = 7;

const T_HB: usize = 0;
const T_ESTABLISH: usize = 1;

/// How long a CONNECTING path may go without progress (a new connection, the info request)
/// before it is closed: Linux has no such limit, so a client that connects once and goes
/// away pins a session's chunks on a Linux server for ever.
pub const ESTABLISH_TIMEOUT: core::time::Duration = core::time::Duration::from_secs(30);

/// `enum rtrs_srv_state`, with Linux's transitions: CONNECTING -> CONNECTED (info exchange),
/// CONNECTING | CONNECTED -> CLOSING, CLOSING -> CLOSED.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerState {
    /// Connections are being accepted; the info request has not come.
    Connecting,
    /// Serving IO.
    Connected,
    /// Being closed: waiting for the handler to answer what it holds.
    Closing,
    /// Closed.
    Closed,
}

/// What the server must do after a path call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    None,
    /// CONNECTED now: count it up in its session.
    Up,
    /// Close the path (error, violation, heartbeat, disconnect).
    Close(PathError),
    /// A valid `info_req` with this name: the server checks the name is not another
    /// session's, then calls [`ServerPath::accept_info`].
    Info(Box<PathName>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpState {
    Free,
    /// Waiting for our LOCAL_INV of the chunk (always_invalidate) before reading it.
    Inval {
        off: u32,
        cid: u16,
    },
    /// With the handler.
    Handler {
        dir: Dir,
        cid: u16,
        read: Option<RdmaReadRepr>,
    },
    /// Answered; waiting for send-queue room.
    Queued {
        dir: Dir,
        cid: u16,
        read: Option<RdmaReadRepr>,
        status: i32,
        /// The READ's data comes from handler memory, not the chunk.
        src: Option<SrcRef>,
    },
}

#[derive(Clone, Copy, Debug)]
struct Op {
    st: OpState,
    generation: u32,
}

#[derive(Debug)]
struct SConn {
    present: bool,
    sq: SendQueue,
    waitq: VecDeque<u16>,
}

/// One server path.
#[derive(Debug)]
pub(crate) struct ServerPath {
    pub(crate) id: PathId,
    pub(crate) sess: SessId,
    pub(crate) uuid: [u8; 16],
    pub(crate) addr: u128,
    pub(crate) recon_cnt: u16,
    pub(crate) cid_num: u16,
    conns: Vec<SConn>,
    pub(crate) state: ServerState,
    pub(crate) name: Option<PathName>,
    geom: Geometry,
    per_chunk: bool,
    info_rsp: Vec<u8>,
    keys: Vec<u32>,
    ops: Vec<Op>,
    busy: u32,
    hb: Heartbeat,
    timers: TimerTable<2>,
    signal_interval: u32,
    pub(crate) established: bool,
    pub(crate) stats: ServerPathStats,
    pub(crate) last_error: Option<PathError>,
}

/// The queue sizes of a server connection (`create_con`).
pub(crate) const fn qp_sizes(cid: u16, qd: u16, always_inv: bool) -> crate::work::QpSizes {
    let qd = qd as u32;
    if cid == 0 {
        let n = SERVICE_CON_QUEUE_DEPTH * 2 + 2;
        crate::work::QpSizes {
            max_send_wr: n,
            max_recv_wr: n,
            max_send_sge: 1,
        }
    } else {
        crate::work::QpSizes {
            max_send_wr: if always_inv { qd * 5 + 1 } else { qd * 3 + 1 },
            max_recv_wr: qd + 1,
            max_send_sge: 1,
        }
    }
}

impl ServerPath {
    /// A path in CONNECTING with its chunk table checked. `table` comes from the driver.
    ///
    /// # Errors
    /// The table's flaw: the driver broke its contract.
    #[allow(clippy::too_many_arguments, reason = "a constructor of plain fields")]
    pub(crate) fn new(
        id: PathId,
        sess: SessId,
        uuid: [u8; 16],
        addr: u128,
        recon_cnt: u16,
        cid_num: u16,
        geom: Geometry,
        per_chunk: bool,
        table: &[SgDesc],
        hb: Heartbeat,
    ) -> Result<Self, Bad> {
        let qd = usize::from(geom.queue_depth());
        let n = u16::try_from(table.len()).map_err(|_| Bad::SgCount)?;
        if per_chunk && table.len() != qd {
            return Err(Bad::SgCount);
        }
        let mut info_rsp = vec![0u8; InfoRsp::<&[u8]>::len_for(usize::from(n))];
        InfoRsp::new_unchecked(&mut info_rsp[..]).emit(table);
        let mut rbufs = vec![(0u64, 0u32); qd];
        InfoRsp::new_checked(&info_rsp[..])?.chunk_table(&geom, &mut rbufs)?;
        let conns = (0..cid_num)
            .map(|_| SConn {
                present: false,
                sq: SendQueue::new(0, 1),
                waitq: VecDeque::new(),
            })
            .collect();
        Ok(Self {
            id,
            sess,
            uuid,
            addr,
            recon_cnt,
            cid_num,
            conns,
            state: ServerState::Connecting,
            name: None,
            geom,
            per_chunk,
            info_rsp,
            keys: rbufs.iter().map(|&(_, k)| k).collect(),
            ops: vec![
                Op {
                    st: OpState::Free,
                    generation: 0
                };
                qd
            ],
            busy: 0,
            hb,
            timers: TimerTable::default(),
            signal_interval: u32::from(geom.queue_depth()).min(SERVICE_CON_QUEUE_DEPTH),
            established: false,
            stats: ServerPathStats::default(),
            last_error: None,
        })
    }

    fn conn(&self, cid: u16) -> Conn {
        Conn {
            path: self.id,
            cid,
            epoch: 0,
        }
    }

    fn wr(kind: u8, batch: u32, arg: u16) -> u64 {
        WrId::new(0, kind, batch, arg).0
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Requests the handler holds.
    pub(crate) fn busy(&self) -> u32 {
        self.busy
    }

    pub(crate) fn has_conn(&self, cid: u16) -> bool {
        self.conns.get(usize::from(cid)).is_some_and(|c| c.present)
    }

    fn violation(&mut self, v: Violation) -> Outcome {
        self.stats.violation(v);
        Outcome::Close(PathError::Violation(v))
    }

    /// Records connection `cid` as accepted, with its send queue; on cid 0 posts the
    /// receive for the info request.
    pub(crate) fn add_conn(
        &mut self,
        now: Instant,
        cid: u16,
        always_inv: bool,
        io: &mut impl ServerIo,
    ) -> Result<(), PathError> {
        self.timers
            .set(T_ESTABLISH, now.saturating_add(ESTABLISH_TIMEOUT));
        let s = qp_sizes(cid, self.geom.queue_depth(), always_inv);
        let c = &mut self.conns[usize::from(cid)];
        c.present = true;
        c.sq = SendQueue::new(s.max_send_wr, self.signal_interval);
        if cid == 0 {
            io.post_recv(self.conn(0), Self::wr(K_RECV_INFO, 0, 0), RecvBuf::InfoReq)
                .map_err(|e| PathError::Post(e.kind))?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Completions
    // ---------------------------------------------------------------------------------------

    /// One completion of one of the path's connections.
    pub(crate) fn handle_wc(
        &mut self,
        cid: u16,
        wc: &Wc,
        payload: &[u8],
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        if cid >= self.cid_num || !self.conns[usize::from(cid)].present {
            return Outcome::None;
        }
        let live = matches!(self.state, ServerState::Connecting | ServerState::Connected);
        if !wc.is_ok() {
            if !live {
                return Outcome::None;
            }
            self.stats.wc_errors += 1;
            return Outcome::Close(PathError::Completion(wc.status));
        }
        if !live {
            return Outcome::None;
        }
        let id = WrId(wc.wr_id);
        if wc.is_recv() {
            self.hb.on_traffic();
            return match id.kind() {
                K_RECV_INFO if cid == 0 => self.info_req(wc, payload),
                K_RECV_IO => self.recv_io(cid, wc, io, events),
                _ => self.violation(Violation::UnknownWrId),
            };
        }
        let c = usize::from(cid);
        match id.kind() {
            K_SEND_INFO | K_HB | K_HB_ACK | K_RSP => {
                self.conns[c].sq.complete(id.batch());
                self.drain_waitq(cid, io)
            }
            K_CHUNK_INV => {
                self.conns[c].sq.complete(id.batch());
                let out = self.chunk_invalidated(id.arg(), io, events);
                if out != Outcome::None {
                    return out;
                }
                self.drain_waitq(cid, io)
            }
            _ => self.violation(Violation::UnknownWrId),
        }
    }

    /// `rtrs_srv_info_req_done`: the `info_req` is checked; every connection must be up.
    fn info_req(&mut self, wc: &Wc, payload: &[u8]) -> Outcome {
        if self.state != ServerState::Connecting || self.conns.iter().any(|c| !c.present) {
            return self.violation(Violation::InfoOutOfOrder);
        }
        if wc.opcode != WcOpcode::Recv {
            return self.violation(Violation::UnexpectedSend);
        }
        let n = (wc.byte_len as usize).min(payload.len());
        match InfoReq::new_checked(&payload[..n]).and_then(|p| InfoReqRepr::parse(&p)) {
            Ok(r) => Outcome::Info(Box::new(r.pathname)),
            Err(b) => self.violation(Violation::Wire(b)),
        }
    }

    /// `process_info_req` once the name is known to be free: the IO receives, CONNECTED,
    /// heartbeats, then the `info_rsp`.
    pub(crate) fn accept_info(
        &mut self,
        now: Instant,
        name: PathName,
        io: &mut impl ServerIo,
    ) -> Outcome {
        if self.state != ServerState::Connecting {
            return Outcome::None;
        }
        for cid in 0..self.cid_num {
            let q = if cid == 0 {
                SERVICE_CON_QUEUE_DEPTH
            } else {
                u32::from(self.geom.queue_depth())
            };
            for _ in 0..q {
                if let Err(e) =
                    io.post_recv(self.conn(cid), Self::wr(K_RECV_IO, 0, 0), RecvBuf::Empty)
                {
                    return Outcome::Close(PathError::Post(e.kind));
                }
            }
        }
        self.name = Some(name);
        self.state = ServerState::Connected;
        self.timers.stop(T_ESTABLISH);
        self.hb.reset();
        self.timers
            .set(T_HB, now.saturating_add(self.hb.interval()));
        let batch = match self.conns[0].sq.reserve(1, true) {
            Ok(b) => b.unwrap_or(1),
            Err(e) => return Outcome::Close(PathError::Post(e.kind)),
        };
        let chain = [Wr::SendMsg {
            wr_id: Self::wr(K_SEND_INFO, batch, 0),
            bytes: &self.info_rsp,
            signaled: true,
        }];
        if let Err(e) = io.post_send(self.conn(0), &chain) {
            return Outcome::Close(PathError::Post(e.kind));
        }
        Outcome::Up
    }

    /// `rtrs_srv_rdma_done` for receives of the IO protocol.
    fn recv_io(
        &mut self,
        cid: u16,
        wc: &Wc,
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        if let Err(e) = io.post_recv(self.conn(cid), Self::wr(K_RECV_IO, 0, 0), RecvBuf::Empty) {
            return Outcome::Close(PathError::Post(e.kind));
        }
        if wc.opcode != WcOpcode::RecvRdmaWithImm {
            return self.violation(Violation::UnexpectedSend);
        }
        let Some(imm) = wc.imm.map(Imm) else {
            return self.violation(Violation::ImmType(0xFF));
        };
        match imm.ty() {
            ImmType::IoReq => self.io_req(cid, imm.payload(), io, events),
            ImmType::HbMsg => self.post_empty(K_HB_ACK, Imm::HB_ACK, io),
            ImmType::HbAck => Outcome::None,
            _ => self.violation(Violation::ImmType(imm.raw_ty() as u8)),
        }
    }

    /// An IO request immediate: chunk and offset checked, the chunk claimed, then (with
    /// always_invalidate) the chunk's key invalidated before its bytes are read.
    fn io_req(
        &mut self,
        cid: u16,
        payload: u32,
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        if self.state != ServerState::Connected {
            return self.violation(Violation::IoBeforeConnected);
        }
        let Some((chunk, off)) = self.geom.split(payload) else {
            return self.violation(Violation::ChunkOutOfRange);
        };
        let op = &mut self.ops[usize::from(chunk)];
        if op.st != OpState::Free {
            return self.violation(Violation::ChunkBusy);
        }
        if self.per_chunk {
            op.st = OpState::Inval { off, cid };
            self.busy += 1;
            let key = self.keys[usize::from(chunk)];
            let batch = match self.conns[usize::from(cid)].sq.reserve(1, true) {
                Ok(b) => b.unwrap_or(1),
                Err(e) => return Outcome::Close(PathError::Post(e.kind)),
            };
            let chain = [Wr::LocalInv {
                wr_id: Self::wr(K_CHUNK_INV, batch, chunk),
                key,
            }];
            if let Err(e) = io.post_send(self.conn(cid), &chain) {
                return Outcome::Close(PathError::Post(e.kind));
            }
            return Outcome::None;
        }
        self.process_io(chunk, off, cid, io, events)
    }

    fn chunk_invalidated(
        &mut self,
        chunk: u16,
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        match self.ops.get(usize::from(chunk)).map(|o| o.st) {
            Some(OpState::Inval { off, cid }) => self.process_io(chunk, off, cid, io, events),
            _ => Outcome::None,
        }
    }

    /// `process_io_req`: the RTRS header at `off`, checked, then the request to the handler.
    /// A violation frees the chunk's slot (it may hold the invalidation state).
    fn process_io(
        &mut self,
        chunk: u16,
        off: u32,
        cid: u16,
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        let out = self.process_io_inner(chunk, off, cid, io, events);
        if out != Outcome::None {
            self.release(chunk);
        }
        out
    }

    fn process_io_inner(
        &mut self,
        chunk: u16,
        off: u32,
        cid: u16,
        io: &mut impl ServerIo,
        events: &mut VecDeque<ServerEvent>,
    ) -> Outcome {
        let room = (self.geom.chunk_size() - off) as usize;
        let mut hdr = [0u8; RdmaRead::<&[u8]>::FIXED_LEN + SgDesc::LEN];
        let n = room.min(hdr.len());
        if n < RdmaWrite::<&[u8]>::LEN {
            return self.violation(Violation::HdrOutsideChunk);
        }
        if io.read_chunk(self.sess, chunk, off, &mut hdr[..n]).is_err() {
            return self.violation(Violation::HdrOutsideChunk);
        }
        let (dir, usr_len, read) = match MsgType::from(u16::from_le_bytes([hdr[0], hdr[1]])) {
            MsgType::Write => match RdmaWriteRepr::parse(&RdmaWrite::new_unchecked(&hdr[..n])) {
                Ok(w) => (Dir::Write, w.usr_len, None),
                Err(b) => return self.violation(Violation::Wire(b)),
            },
            MsgType::Read => {
                match RdmaReadRepr::parse(
                    &RdmaRead::new_unchecked(&hdr[..n]),
                    self.geom.chunk_size(),
                ) {
                    Ok(r) => (Dir::Read, r.usr_len, Some(r)),
                    Err(Bad::Truncated) => return self.violation(Violation::HdrOutsideChunk),
                    Err(b) => return self.violation(Violation::Wire(b)),
                }
            }
            _ => return self.violation(Violation::Wire(Bad::MsgType)),
        };
        let data = match data_len(off, usr_len) {
            Ok(d) => d,
            Err(b) => return self.violation(Violation::Wire(b)),
        };
        let op = &mut self.ops[usize::from(chunk)];
        if op.st == OpState::Free {
            self.busy += 1;
        }
        op.st = OpState::Handler { dir, cid, read };
        self.stats.rdma.add(dir == Dir::Read, u64::from(off));
        events.push_back(ServerEvent::Request {
            op: OpId {
                path: self.id,
                chunk,
                generation: op.generation,
            },
            sess: self.sess,
            chunk,
            dir,
            data_len: data,
            usr_len,
            read_len: read.and_then(|r| r.desc).map_or(0, |d| d.len),
        });
        Outcome::None
    }

    /// A zero-length RDMA WRITE with immediate on connection 0.
    fn post_empty(&mut self, kind: u8, imm: Imm, io: &mut impl ServerIo) -> Outcome {
        let batch = match self.conns[0].sq.reserve(1, false) {
            Ok(b) => b,
            Err(e) => return Outcome::Close(PathError::Post(e.kind)),
        };
        let chain = [Wr::WriteImmEmpty {
            wr_id: Self::wr(kind, batch.unwrap_or(0), 0),
            imm: imm.0,
            signaled: batch.is_some(),
        }];
        match io.post_send(self.conn(0), &chain) {
            Ok(()) => Outcome::None,
            Err(e) => Outcome::Close(PathError::Post(e.kind)),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Responses
    // ---------------------------------------------------------------------------------------

    /// True if `op` is waiting for the handler's answer.
    pub(crate) fn op_waits(&self, op: OpId) -> bool {
        matches!(
            self.ops.get(usize::from(op.chunk)),
            Some(o) if o.generation == op.generation && matches!(o.st, OpState::Handler { .. })
        )
    }

    /// The bytes a READ waiting for its answer asked for (its descriptor's length): `None`
    /// for a WRITE, a READ that moves no data, or an op that is not waiting.
    pub(crate) fn read_len(&self, op: OpId) -> Option<u32> {
        match self.ops.get(usize::from(op.chunk)) {
            Some(Op {
                st:
                    OpState::Handler {
                        dir: Dir::Read,
                        read: Some(r),
                        ..
                    },
                generation,
            }) if *generation == op.generation => r.desc.map(|d| d.len),
            _ => None,
        }
    }

    /// Frees an operation slot (answered, dropped or abandoned).
    fn release(&mut self, chunk: u16) {
        let o = &mut self.ops[usize::from(chunk)];
        if o.st != OpState::Free {
            o.st = OpState::Free;
            o.generation = o.generation.wrapping_add(1);
            self.busy = self.busy.saturating_sub(1);
        }
    }

    /// Drops the answer of `op` (the path is not connected).
    pub(crate) fn drop_op(&mut self, op: OpId) {
        self.release(op.chunk);
    }

    /// `rtrs_srv_resp_rdma` on a connected path: the response now, or queued for room.
    /// With `src`, a successful READ's data is written from that handler memory (checked by
    /// the caller) instead of the chunk.
    pub(crate) fn respond(
        &mut self,
        op: OpId,
        status: i32,
        src: Option<SrcRef>,
        io: &mut impl ServerIo,
    ) -> Result<bool, PathError> {
        let OpState::Handler { dir, cid, read } = self.ops[usize::from(op.chunk)].st else {
            return Ok(true);
        };
        let c = &mut self.conns[usize::from(cid)];
        if !c.waitq.is_empty() || !c.sq.fits(4) {
            c.waitq.push_back(op.chunk);
            self.ops[usize::from(op.chunk)].st = OpState::Queued {
                dir,
                cid,
                read,
                status,
                src,
            };
            self.stats.queued_responses += 1;
            return Ok(false);
        }
        self.send_rsp(op.chunk, dir, cid, read, status, src, io)?;
        Ok(true)
    }

    /// Posts queued responses while the queue has room.
    fn drain_waitq(&mut self, cid: u16, io: &mut impl ServerIo) -> Outcome {
        while self.conns[usize::from(cid)].sq.fits(4) {
            let Some(chunk) = self.conns[usize::from(cid)].waitq.pop_front() else {
                break;
            };
            if let OpState::Queued {
                dir,
                cid,
                read,
                status,
                src,
            } = self.ops[usize::from(chunk)].st
                && let Err(e) = self.send_rsp(chunk, dir, cid, read, status, src, io)
            {
                return Outcome::Close(e);
            }
        }
        Outcome::None
    }

    /// `send_io_resp_imm` or `rdma_write_sg`: the chain of a response, then the slot free.
    #[allow(clippy::too_many_arguments, reason = "the fields of one answered op")]
    fn send_rsp(
        &mut self,
        chunk: u16,
        dir: Dir,
        cid: u16,
        read: Option<RdmaReadRepr>,
        status: i32,
        src: Option<SrcRef>,
        io: &mut impl ServerIo,
    ) -> Result<(), PathError> {
        let desc = read.and_then(|r| r.desc);
        let need_inval = read.is_some_and(|r| r.need_inval) && desc.is_some();
        let write_data = status == 0 && dir == Dir::Read && desc.is_some();
        // Built in place, in posting order (one copy of the chain, the one posted).
        let mut chain: [Wr<'_>; 4] = [Wr::LocalInv { wr_id: 0, key: 0 }; 4];
        let mut n = 0usize;
        let new_key = if self.per_chunk {
            let k = inc_rkey(self.keys[usize::from(chunk)]);
            self.keys[usize::from(chunk)] = k;
            Some(k)
        } else {
            None
        };
        let rsp = IoRsp {
            msg_id: u32::from(chunk),
            errno: if status == 0 {
                0
            } else {
                -(status.unsigned_abs() as i32)
            },
        };
        let imm = rsp.imm(need_inval).0;
        let count =
            1 + u32::from(write_data) + u32::from(new_key.is_some()) + u32::from(need_inval);
        let batch = self.conns[usize::from(cid)]
            .sq
            .reserve(count, false)
            .map_err(|e| PathError::Post(e.kind))?;
        let (wid, sig) = (Self::wr(K_RSP, batch.unwrap_or(0), chunk), batch.is_some());
        let inv = desc.filter(|_| need_inval).map(|d| Wr::SendInv {
            wr_id: Self::wr(K_RSP, 0, chunk),
            rkey: d.key,
            signaled: false,
        });
        let reg = new_key.map(|key| Wr::RegChunk {
            wr_id: Self::wr(K_RSP, 0, chunk),
            chunk,
            key,
            signaled: false,
        });
        if write_data && let Some(d) = desc {
            let remote = RemoteAddr {
                addr: d.addr,
                rkey: d.key,
            };
            let wr_id = Self::wr(K_RSP, 0, chunk);
            chain[n] = match src {
                Some(src) => Wr::WriteSource {
                    wr_id,
                    src,
                    len: d.len,
                    remote,
                    signaled: false,
                },
                None => Wr::WriteChunk {
                    wr_id,
                    chunk,
                    len: d.len,
                    remote,
                    signaled: false,
                },
            };
            n += 1;
            // rdma_write_sg: data, [REG_MR], [SEND_WITH_INV], final.
            for w in [reg, inv].into_iter().flatten() {
                chain[n] = w;
                n += 1;
            }
        } else {
            // send_io_resp_imm: [SEND_WITH_INV], [REG_MR], final.
            for w in [inv, reg].into_iter().flatten() {
                chain[n] = w;
                n += 1;
            }
        }
        chain[n] = match new_key {
            Some(rkey) => Wr::SendImmMsg {
                wr_id: wid,
                bytes: RkeyRspRepr {
                    buf_id: chunk,
                    rkey,
                }
                .to_bytes(),
                imm,
                signaled: sig,
            },
            None => Wr::WriteImmEmpty {
                wr_id: wid,
                imm,
                signaled: sig,
            },
        };
        n += 1;
        self.release(chunk);
        io.post_send(self.conn(cid), &chain[..n])
            .map_err(|e| PathError::Post(e.kind))
    }

    // ---------------------------------------------------------------------------------------
    // Timers and teardown
    // ---------------------------------------------------------------------------------------

    /// The heartbeat tick, and the establishment timeout.
    pub(crate) fn handle_timeout(&mut self, now: Instant, io: &mut impl ServerIo) -> Outcome {
        if self.timers.take_due(T_ESTABLISH, now) && self.state == ServerState::Connecting {
            return Outcome::Close(PathError::Timeout);
        }
        if self.timers.take_due(T_HB, now) && self.state == ServerState::Connected {
            match self.hb.tick(now) {
                HbTick::Dead => return Outcome::Close(PathError::Heartbeat),
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
        Outcome::None
    }

    /// The first half of `close_path`/`rtrs_srv_close_work`: CLOSING, heartbeat stopped,
    /// connections closed by the driver, queued and pending-invalidation requests dropped.
    /// Requests with the handler stay until it answers (and its answer is dropped).
    pub(crate) fn start_close(&mut self, io: &mut impl ServerIo) -> bool {
        if !matches!(self.state, ServerState::Connecting | ServerState::Connected) {
            return false;
        }
        self.state = ServerState::Closing;
        self.timers.stop_all();
        self.hb.reset();
        io.close_path(self.id);
        for c in &mut self.conns {
            c.present = false;
            c.waitq.clear();
            c.sq.reset();
        }
        for k in 0..self.ops.len() {
            if matches!(
                self.ops[k].st,
                OpState::Inval { .. } | OpState::Queued { .. }
            ) {
                self.release(k as u16);
            }
        }
        true
    }

    /// The chunk keys of this path (tests of always_invalidate).
    #[cfg(feature = "testing")]
    pub(crate) fn key(&self, chunk: u16) -> Option<u32> {
        self.keys.get(usize::from(chunk)).copied()
    }
}
