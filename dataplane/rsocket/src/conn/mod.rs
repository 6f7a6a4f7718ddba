//! The rsocket stream protocol as a sans-IO state machine.
//!
//! [`StreamConn`] holds every counter of librdmacm's `struct rsocket` data path and applies
//! its rules (see `shared/reference/rsocket.md` section 3), but performs no I/O: memory
//! accesses and work requests go through an [`RsIo`] the caller supplies, completions come
//! in through [`StreamConn::handle_completion`], and time through
//! [`StreamConn::handle_timeout`]. The real socket layer implements `RsIo` over a fabric
//! queue pair and registered memory; the simulator (module `sim`, feature `testing`)
//! implements it over plain vectors with virtual time.
//!
//! # Method groups (quinn-proto's taxonomy)
//!
//! * getters: [`readiness`](StreamConn::readiness), [`is_connected`](StreamConn::is_connected), ...
//! * inputs: [`establish`](StreamConn::establish), [`handle_completion`](StreamConn::handle_completion),
//!   [`handle_timeout`](StreamConn::handle_timeout), [`peer_gone`](StreamConn::peer_gone);
//! * application commands: [`send`](StreamConn::send), [`recv`](StreamConn::recv),
//!   [`shutdown`](StreamConn::shutdown), [`iomap`](StreamConn::iomap), [`iowrite`](StreamConn::iowrite);
//! * outputs: after a batch of completions call [`after_completions`](StreamConn::after_completions)
//!   (re-posts receives and returns credits); [`poll_timeout`](StreamConn::poll_timeout) says
//!   when to call `handle_timeout`.
//!
//! Credits must flow as soon as the application frees half the receive buffer or half the
//! message ring, or senders stall: the socket layer calls `after_completions` on every
//! progress pass, including right after `recv`.
//!
//! # Differences from librdmacm (its known bugs, fixed)
//!
//! * Publishing an iomap entry does not consume a stream credit (librdmacm increments
//!   `sseq_no` but the receiver never counts it, leaking one credit per `riomap`).
//! * `riowrite` needs a send slot and send-buffer space, not a stream credit and a target
//!   SGE; a write that crosses into an adjacent mapping is looked up again instead of
//!   spinning on zero-byte chunks; a write whose first byte is unmapped fails with `EINVAL`
//!   instead of returning 0 with no error.
//! * A transport error reads as `ECONNRESET` once queued data is drained, not as end of
//!   file; `SO_ERROR` still reports `EIO`.
//! * The byte-swap decision is kept apart from the other options (librdmacm's
//!   `opts = RS_OPT_SWAP_SGL` clobbered them).
//! * A send that finds no credit (or no target space, or no send slot) but room in the
//!   send buffer is accepted there and written once a credit returns, coalesced with what
//!   follows it, as TCP's send buffer does; librdmacm instead refuses it (`EWOULDBLOCK`).
//!   Each side may then have its whole send buffer outstanding besides the messages its
//!   credits carry, where librdmacm stops at the credits. Two programs that both send many small messages before reading, which
//!   TCP's buffering absorbs, deadlocked on librdmacm's credits (rstream with different
//!   plans at its two ends, for one). See the `send` module.
//!
//! # Untrusted peers
//!
//! librdmacm trusts its peer: a data message's length is copied out of the receive buffer
//! as given, wrapping at its end. Here every value a peer supplies is checked against what
//! this side granted or what the peer announced (see [`grant`]): data lengths against the
//! buffer halves granted and not yet filled (and against the bytes the write carried),
//! message counts against the credits granted, credit updates against the peer's receive
//! queue, iomap indexes against our table, and operations and control codes against those
//! that exist on the wire. A violation is counted ([`ConnStats::protocol_errors`],
//! [`ConnStats::last_violation`]) and fails the connection with `EIO` (`ECONNRESET` to the
//! application), and nothing the peer sends after it is looked at. Every honest librdmacm
//! peer passes the checks: they are exactly the rules its sender follows.
//!
//! Every local access goes through [`RsIo`], which bounds it by the buffer it names; a
//! refused access fails the connection too ([`ConnStats::bounds_faults`]).

use std::collections::VecDeque;
use std::time::Duration;

use lcore::time::Instant;

pub mod grant;
mod io;
mod iomap;
mod send;

pub use grant::Violation;
pub use io::*;

use grant::{MAX_CREDIT_DATA, RxGrant, check_credit_update, next_half};

use crate::error::RsError;
use crate::wire::{
    ConnDataRepr, HOST_BIG_ENDIAN, RS_SGL_SIZE, RsCtrl, RsIomap, RsMsg, RsOp, RsSge,
};
use dp_fabric::{Completion, PostError, RemoteAddr};

/// One queued received message: where in the receive buffer its unread bytes are.
#[derive(Clone, Copy, Debug)]
struct RMsg {
    off: u32,
    len: u32,
}

/// A published iomap entry waiting to be sent.
#[derive(Clone, Copy, Debug)]
struct PendingIomap {
    index: u32,
    map: RsIomap,
}

/// The state of one rsocket stream connection.
///
/// `repr(C)`, line-aligned, with what a visit of an idle connection reads first: a loop
/// serving many connections looks at each with a receive that finds nothing (`recv`) and
/// the check that nothing is due (`is_settled`), and those fields fill the first two
/// lines (the queued messages and iomap entries, then the counters and flags), instead of
/// the four or five lines the compiler's own order spread them over.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct StreamConn {
    // Line 0.
    rmsg: VecDeque<RMsg>,
    // Iomap.
    iomap_pending: VecDeque<PendingIomap>,
    // Line 1.
    cfg: StreamConfig,
    to_repost: u32,
    /// Bytes at the end of the send ring (just before `sbuf_off`) accepted from the
    /// application but not yet posted: written when credits and target space return.
    unposted: u32,
    rbuf_bytes_avail: u32,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    pending_ctrl: Option<RsCtrl>,
    rseq_no: u16,
    rseq_comp: u16,
    // Connection state.
    connected: bool,
    readable: bool,
    writable: bool,
    disconnected: bool,
    error: Option<RsError>,
    so_error: Option<RsError>,
    // The rest.
    keys: LocalKeys,
    // Peer.
    peer_be: bool,
    /// The peer's receive-queue size (credits in its connection data); 0 until established.
    peer_credits: u16,
    remote_sgl: RsSge,
    remote_sge: u32,
    remote_iomap: RsSge,
    // Sender.
    sseq_no: u16,
    sseq_comp: u16,
    got_credit_update: bool,
    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    sbuf_off: u32,
    target_sge: u32,
    /// Entry `target_sge` as we are consuming it, once read from the target list (length
    /// 0: not read yet, read it). The peer rewrites an entry only after we used all of it,
    /// so while we consume it the copy here is the entry; only the exhausted entry is
    /// written back (see `post_data`). Reading and rewriting the list's entry for every
    /// message cost about 115 of 2,130 instructions per 64-byte rsocket hop over shm
    /// (callgrind, one thread playing both ends).
    cur_target: RsSge,
    // Receiver.
    rbuf_free_offset: u32,
    /// What the peer may still send: bytes, messages.
    rx: RxGrant,
    next_recv_id: u64,
    remote_iomap_used: Vec<bool>,
    // Keepalive.
    keepalive: Option<Duration>,
    keepalive_at: Option<Instant>,
    stats: ConnStats,
}
// The idle visit's fields stay within the first two lines.
const _: () = assert!(
    core::mem::offset_of!(StreamConn, iomap_pending) + size_of::<VecDeque<PendingIomap>>() <= 64
);
const _: () =
    assert!(core::mem::offset_of!(StreamConn, so_error) + size_of::<Option<RsError>>() <= 128);

const fn wr_id(op: RsOp, data: u32) -> u64 {
    let op = match op {
        RsOp::Data => 0,
        RsOp::RsvdDataMore => 1,
        RsOp::Write => 2,
        RsOp::RsvdDraMore => 3,
        RsOp::Sgl => 4,
        RsOp::Rsvd => 5,
        RsOp::IomapSgl => 6,
        RsOp::Ctrl => 7,
        RsOp::Unknown(v) => v,
    };
    ((op as u64) << 32) | data as u64
}

/// The credits our connection data grants: our receive-queue size.
fn initial_credits(cfg: &StreamConfig) -> u16 {
    cfg.rq_size.min(u32::from(u16::MAX)) as u16
}

impl StreamConn {
    /// A connection that is not established yet.
    pub fn new(cfg: StreamConfig, keys: LocalKeys) -> Self {
        let rq = cfg.rq_size as usize;
        Self {
            cfg,
            keys,
            connected: false,
            readable: false,
            writable: false,
            disconnected: false,
            error: None,
            so_error: None,
            peer_be: HOST_BIG_ENDIAN,
            peer_credits: 0,
            remote_sgl: RsSge::default(),
            remote_sge: 0,
            remote_iomap: RsSge::default(),
            sseq_no: 0,
            sseq_comp: 0,
            got_credit_update: false,
            sqe_avail: cfg.sq_size.saturating_sub(RS_QP_CTRL_SIZE),
            sbuf_bytes_avail: cfg.sbuf_size,
            sbuf_off: 0,
            unposted: 0,
            target_sge: 0,
            cur_target: RsSge::default(),
            ctrl_seqno: 0,
            ctrl_max_seqno: RS_QP_CTRL_SIZE,
            pending_ctrl: None,
            rseq_no: 0,
            rseq_comp: (cfg.rq_size / 2) as u16,
            rbuf_bytes_avail: cfg.rbuf_size / 2,
            rbuf_free_offset: cfg.rbuf_size / 2,
            rx: RxGrant::new(cfg.rbuf_size, initial_credits(&cfg)),
            rmsg: VecDeque::with_capacity(rq + 1),
            to_repost: 0,
            next_recv_id: 0,
            iomap_pending: VecDeque::new(),
            remote_iomap_used: Vec::new(),
            keepalive: None,
            keepalive_at: None,
            stats: ConnStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    /// Lowers the inline limit to what the queue pair granted.
    pub fn clamp_inline(&mut self, max: u32) {
        self.cfg.sq_inline = self.cfg.sq_inline.min(max);
    }

    /// Counters.
    pub fn stats(&self) -> ConnStats {
        self.stats
    }

    /// The connection data we send in our connect request or accept.
    pub fn conn_data(&self) -> ConnDataRepr {
        ConnDataRepr {
            big_endian: HOST_BIG_ENDIAN,
            iomap: true,
            credits: initial_credits(&self.cfg),
            iomap_size: self.cfg.target_iomap_size,
            target_sgl: RsSge {
                addr: self.keys.target_addr,
                key: self.keys.target_rkey,
                length: RS_SGL_SIZE,
            },
            data_buf: RsSge {
                addr: self.keys.rbuf_addr,
                key: self.keys.rbuf_rkey,
                length: self.cfg.rbuf_size / 2,
            },
        }
    }

    /// Posts the initial `rq_size` receives (before connecting, as `rs_create_ep` does).
    ///
    /// # Errors
    /// [`RsError::NoMemory`] if the provider refuses them.
    pub fn post_initial_recvs(&mut self, io: &mut impl RsIo) -> Result<(), RsError> {
        for _ in 0..self.cfg.rq_size {
            self.post_one_recv(io).map_err(|_| RsError::NoMemory)?;
        }
        Ok(())
    }

    fn post_one_recv(&mut self, io: &mut impl RsIo) -> Result<(), PostError> {
        let id = WR_RECV | (self.next_recv_id & 0xFFFF_FFFF);
        self.next_recv_id += 1;
        io.post_recv(id)
    }

    /// The connection is established; `peer` is the peer's connection data
    /// (`rs_save_conn_data`).
    ///
    /// # Errors
    /// [`RsError::Invalid`] if the peer's description is unusable
    /// ([`ConnDataRepr::validate`]), or if a credit update that arrived before it grants
    /// other than the credits it announces; the connection is then failed and the
    /// violation counted.
    pub fn establish(
        &mut self,
        peer: &ConnDataRepr,
        io: &mut impl RsIo,
        now: Instant,
    ) -> Result<(), RsError> {
        if self.error.is_some() {
            return Err(RsError::Invalid);
        }
        if let Err(bad) = peer.validate() {
            self.violation(Violation::ConnData(bad));
            return Err(RsError::Invalid);
        }
        if self.got_credit_update {
            // The peer's first credit update overtook the connection event: it must be a
            // limit the peer could grant with nothing sent yet (librdmacm: exactly its
            // credits, `0 + rq_size`).
            if let Err(v) = check_credit_update(0, peer.credits, self.sseq_comp, peer.credits) {
                self.violation(v);
                return Err(RsError::Invalid);
            }
        } else {
            self.sseq_comp = peer.credits;
        }
        self.peer_credits = peer.credits;
        self.peer_be = peer.big_endian;
        self.remote_sgl = peer.target_sgl;
        self.remote_sge = 1;
        if peer.iomap {
            self.remote_iomap = RsSge {
                addr: peer
                    .target_sgl
                    .addr
                    .wrapping_add(RsSge::LEN as u64 * u64::from(peer.target_sgl.length)),
                key: peer.target_sgl.key,
                length: peer.iomap_size,
            };
            self.remote_iomap_used = vec![false; peer.iomap_size as usize];
        }
        // Our first target entry is the peer's first receive half; the peer fills entry 1
        // (possibly already: its first credit update may arrive before we process the
        // connection event, so entry 1 is left as it is).
        let first = peer.data_buf.to_bytes(HOST_BIG_ENDIAN);
        if io.write(Buf::Target, 0, &first).is_err() {
            self.bounds_fault();
            return Err(RsError::Invalid);
        }
        self.connected = true;
        self.readable = true;
        self.writable = true;
        self.keepalive_at = self.keepalive.map(|d| now.saturating_add(d));
        Ok(())
    }

    /// True while connected (possibly half-closed).
    pub fn is_connected(&self) -> bool {
        self.connected && !self.disconnected && self.error.is_none()
    }

    /// True once the connection is fully closed (either way).
    pub fn is_disconnected(&self) -> bool {
        self.disconnected
    }

    /// Takes the pending socket error (`SO_ERROR` semantics: read once).
    pub fn take_so_error(&mut self) -> Option<RsError> {
        self.so_error.take()
    }

    /// Records a transport failure (error completion, CM error).
    pub fn fail(&mut self, e: RsError) {
        if self.error.is_none() && !self.disconnected {
            self.error = Some(e);
            self.so_error = Some(e);
        }
        self.readable = false;
        self.writable = false;
    }

    /// The peer broke rule `v`: count it and fail the connection (`ECONNRESET` to the
    /// application once queued data is read), as librdmacm's peers reset.
    fn violation(&mut self, v: Violation) {
        self.stats.protocol_errors += 1;
        self.stats.last_violation = Some(v);
        self.fail(RsError::Io);
    }

    /// The I/O layer refused a local access as outside our buffers: fail the connection
    /// rather than touch anything else.
    fn bounds_fault(&mut self) {
        self.stats.bounds_faults += 1;
        self.stats.last_violation = Some(Violation::LocalBounds);
        self.fail(RsError::Io);
    }

    /// The peer's connection went away without a disconnect message (CM disconnect event,
    /// peer death): seen as a reset.
    pub fn peer_gone(&mut self) {
        if !self.disconnected {
            self.fail(RsError::ConnReset);
        }
    }

    /// Target entry `idx` (0 or 1); empty if the I/O layer refuses the read (which cannot
    /// happen: the target list always holds both entries).
    fn read_target(&self, io: &impl RsIo, idx: u32) -> RsSge {
        let mut b = [0u8; 16];
        match io.read(Buf::Target, idx * RsSge::LEN as u32, &mut b) {
            Ok(()) => RsSge::read(&b, HOST_BIG_ENDIAN).unwrap_or_default(),
            Err(OutOfBounds) => RsSge::default(),
        }
    }

    /// `rs_can_send`: a send slot, send-buffer space, a credit and target space.
    pub fn can_send(&self, io: &impl RsIo) -> bool {
        self.send_target(io).is_some()
    }

    /// [`can_send`](Self::can_send), returning the current target entry (read once) when
    /// a send may go.
    fn send_target(&self, io: &impl RsIo) -> Option<RsSge> {
        if !(self.writable
            && self.is_connected()
            && self.sqe_avail >= 1
            && self.sbuf_bytes_avail >= RS_SNDLOWAT.min(self.cfg.sbuf_size)
            && self.sseq_no != self.sseq_comp)
        {
            return None;
        }
        let t = self.current_target(io);
        (t.length != 0).then_some(t)
    }

    /// The target entry we send into next: our copy while we consume it, else what the
    /// target list holds (possibly empty: no space granted yet).
    #[inline]
    fn current_target(&self, io: &impl RsIo) -> RsSge {
        if self.cur_target.length != 0 {
            self.cur_target
        } else {
            self.read_target(io, self.target_sge)
        }
    }

    /// Readiness for `poll`: writable when a send would accept bytes, posted at once or
    /// buffered until credits return (see [`send`](Self::send)).
    pub fn readiness(&self, io: &impl RsIo) -> Ready {
        Ready {
            readable: !self.rmsg.is_empty()
                || !self.readable
                || self.disconnected
                || self.error.is_some(),
            writable: self.can_send(io) || self.can_buffer() || !self.writable,
            hup: self.disconnected,
            err: self.error.is_some(),
        }
    }

    /// Bytes queued for the application.
    pub fn readable_bytes(&self) -> usize {
        self.rmsg.iter().map(|m| m.len as usize).sum()
    }

    /// True if every send (data and control) has been posted and has completed.
    pub fn sends_done(&self) -> bool {
        self.unposted == 0
            && (self.ctrl_max_seqno - self.ctrl_seqno) + self.sqe_avail == self.cfg.sq_size
    }

    fn post(&mut self, io: &mut impl RsIo, wr: &RsWr<'_>) {
        if io.post_send(wr).is_err() {
            // The counters guarantee room; a refusal means the queue pair failed.
            self.fail(RsError::Io);
        }
    }

    /// Copies queued data into `buf` (`rrecv`); with `peek`, leaves it queued.
    ///
    /// Returns `Ok(0)` at end of stream (the peer shut down or disconnected and everything
    /// queued has been read).
    ///
    /// # Errors
    /// [`RsError::WouldBlock`] if nothing is queued yet; [`RsError::ConnReset`] after a
    /// transport error, once queued data is drained.
    pub fn recv(&mut self, buf: &mut [u8], peek: bool, io: &impl RsIo) -> Result<usize, RsError> {
        if self.rmsg.is_empty() {
            if let Some(e) = self.error {
                return Err(if e == RsError::Io {
                    RsError::ConnReset
                } else {
                    e
                });
            }
            if !self.connected {
                return Err(RsError::NotConnected);
            }
            if !self.readable || self.disconnected {
                return Ok(0);
            }
            return Err(RsError::WouldBlock);
        }
        let mut copied = 0usize;
        let mut idx = 0usize;
        while copied < buf.len() {
            let Some(&m) = self.rmsg.get(idx) else {
                break;
            };
            // A message lies inside one granted half (checked on arrival): no wrap.
            let n = (buf.len() - copied).min(m.len as usize);
            if io
                .read(Buf::Rbuf, m.off, &mut buf[copied..copied + n])
                .is_err()
            {
                self.bounds_fault();
                return Err(RsError::ConnReset);
            }
            copied += n;
            if peek {
                idx += 1;
                continue;
            }
            let n = n as u32;
            let head = &mut self.rmsg[0];
            head.off += n;
            head.len -= n;
            if head.len == 0 {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
            self.rbuf_bytes_avail += n;
        }
        self.debug_check_window();
        Ok(copied)
    }

    /// The receive window's invariant (see [`grant`]): granted-unfilled, queued and
    /// consumed-not-regranted bytes make up both halves.
    fn debug_check_window(&self) {
        debug_assert_eq!(
            u64::from(self.rx.unfilled())
                + self.readable_bytes() as u64
                + u64::from(self.rbuf_bytes_avail),
            u64::from(self.cfg.rbuf_size / 2) * 2,
            "receive window accounting"
        );
    }

    /// Handles one completion of this connection's queue pair (`rs_poll_cq`).
    pub fn handle_completion(&mut self, c: &Completion, _io: &mut impl RsIo) {
        if c.wr_id & WR_RECV != 0 {
            self.handle_recv(c);
        } else {
            self.handle_send(c);
        }
    }

    fn handle_recv(&mut self, c: &Completion) {
        if !c.is_ok() {
            // Flushed or failed receives are not re-posted.
            return;
        }
        if self.error.is_some() {
            // After a failure (a protocol violation above all) nothing the peer sends is
            // looked at.
            return;
        }
        let Some(imm) = c.imm else {
            // rsocket peers only send immediates; a receive without one is a broken peer.
            self.violation(Violation::NoImmediate);
            return;
        };
        if let Err(v) = self.accept_msg(RsMsg(imm), c.byte_len) {
            self.violation(v);
            return;
        }
        if self.disconnected {
            // A disconnect (or a shutdown after ours): nothing is re-posted.
            return;
        }
        self.to_repost += 1;
    }

    /// Checks one message from the peer, whose write carried `byte_len` bytes, against
    /// what we granted and what exists on the wire, and applies it (`rs_poll_cq`).
    fn accept_msg(&mut self, msg: RsMsg, byte_len: u32) -> Result<(), Violation> {
        let data = msg.data();
        match msg.op() {
            RsOp::Data => {
                if data == 0 {
                    return Err(Violation::EmptyData);
                }
                if byte_len != data {
                    return Err(Violation::DataLenMismatch);
                }
                let off = self.rx.accept_data(data)?;
                self.stats.data_msgs_received += 1;
                debug_assert!(
                    self.rmsg.len() < self.rmsg.capacity(),
                    "credits bound the queue"
                );
                self.rmsg.push_back(RMsg { off, len: data });
            }
            RsOp::Sgl => {
                // One SGE written into our target list, or nothing (a pure credit update).
                if byte_len != 0 && byte_len != RsSge::LEN as u32 {
                    return Err(Violation::CreditLen);
                }
                // librdmacm sends `rseq_no + rq_size` untruncated; the limit is its low 16
                // bits.
                if data > MAX_CREDIT_DATA {
                    return Err(Violation::CreditBeyondPeerQueue);
                }
                let limit = data as u16;
                if self.connected {
                    check_credit_update(self.sseq_no, self.sseq_comp, limit, self.peer_credits)?;
                } else if self.got_credit_update && (limit.wrapping_sub(self.sseq_comp) as i16) < 0
                {
                    // Before the connection data: checked against it in `establish`.
                    return Err(Violation::CreditBackwards);
                }
                self.sseq_comp = limit;
                self.got_credit_update = true;
            }
            RsOp::IomapSgl => {
                // One iomap entry written into our table; librdmacm ignores the message,
                // but the index must be one we advertised.
                if byte_len != RsIomap::LEN as u32 {
                    return Err(Violation::IomapLen);
                }
                if data >= self.cfg.target_iomap_size {
                    return Err(Violation::IomapIndex);
                }
            }
            RsOp::Ctrl => {
                if byte_len != 0 {
                    return Err(Violation::CtrlLen);
                }
                match RsCtrl::from(data) {
                    RsCtrl::Disconnect => {
                        self.disconnected = true;
                        self.readable = false;
                        self.writable = false;
                    }
                    RsCtrl::Shutdown => {
                        if self.writable {
                            self.readable = false;
                        } else {
                            self.disconnected = true;
                        }
                    }
                    // Keepalives are writes without an immediate: the code is a local tag.
                    RsCtrl::Keepalive | RsCtrl::Unknown(_) => return Err(Violation::UnknownCtrl),
                }
            }
            // `riowrite` is a plain RDMA WRITE: `Write` is a local tag, never an immediate.
            RsOp::Write => return Err(Violation::WriteImm),
            RsOp::RsvdDataMore | RsOp::RsvdDraMore | RsOp::Rsvd | RsOp::Unknown(_) => {
                return Err(Violation::ReservedOp);
            }
        }
        Ok(())
    }

    fn handle_send(&mut self, c: &Completion) {
        let op = RsOp::from((c.wr_id >> 32) as u32);
        let data = c.wr_id as u32;
        match op {
            RsOp::Sgl => self.ctrl_max_seqno += 1,
            RsOp::Ctrl => {
                self.ctrl_max_seqno += 1;
                if RsCtrl::from(data) == RsCtrl::Disconnect {
                    self.disconnected = true;
                    self.readable = false;
                    self.writable = false;
                }
            }
            RsOp::IomapSgl => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += RsIomap::LEN as u32;
            }
            _ => {
                self.sqe_avail += 1;
                self.sbuf_bytes_avail += data;
            }
        }
        if !c.is_ok() && self.is_connected() {
            self.fail(RsError::Io);
        }
    }

    /// After a batch of completions (and after `recv`): re-posts consumed receives, sends a
    /// pending control message, and returns credits (`rs_update_credits`).
    pub fn after_completions(&mut self, io: &mut impl RsIo) {
        if self.is_settled() {
            return;
        }
        self.service(io);
    }

    /// [`after_completions`](Self::after_completions) for the latency-critical moments
    /// (a message just polled, or just read): does the work only if some is due now, that
    /// is credits to return, buffered bytes, a control message or an iomap entry to send,
    /// or at least [`REPOST_BATCH`] receives to re-post. Otherwise the re-posts wait for
    /// the next `after_completions` (the socket layer calls it when a poll finds nothing,
    /// which in a request-response exchange is while the peer works on the answer).
    ///
    /// Waiting is safe: receives are re-posted before any credit update goes out (both
    /// happen in `service`, re-posts first), and the peer may send only within the credits
    /// granted, every one of which had its receive posted when it was granted.
    pub fn after_data(&mut self, io: &mut impl RsIo) {
        if self.to_repost < REPOST_BATCH && !self.output_due() {
            return;
        }
        self.service(io);
    }

    /// True if [`after_completions`](Self::after_completions) has nothing to do: no receive
    /// to re-post, no credit to return, nothing buffered or queued to send. Until a
    /// completion or an application call changes that, a progress pass that finds no
    /// completion does nothing either.
    pub fn is_settled(&self) -> bool {
        self.to_repost == 0 && !self.output_due()
    }

    /// Something besides re-posting is due: credits, buffered bytes, a control message or
    /// an iomap publication.
    #[inline]
    fn output_due(&self) -> bool {
        self.unposted > 0
            || self.pending_ctrl.is_some()
            || !self.iomap_pending.is_empty()
            || self.give_credits()
    }

    fn service(&mut self, io: &mut impl RsIo) {
        if self.is_connected() {
            while self.to_repost > 0 {
                if self.post_one_recv(io).is_err() {
                    self.fail(RsError::Io);
                    break;
                }
                self.to_repost -= 1;
            }
        }
        self.flush_unposted(io);
        self.try_post_ctrl(io);
        if self.give_credits() {
            self.send_credits(io);
        }
    }

    fn ctrl_slot_free(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.cfg.rbuf_size / 2
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_slot_free()
            && self.connected
            && !self.disconnected
            && self.error.is_none()
    }

    fn send_credits(&mut self, io: &mut impl RsIo) {
        self.ctrl_seqno += 1;
        self.rseq_comp = self.rseq_no.wrapping_add((self.cfg.rq_size / 2) as u16);
        let limit = u32::from(self.rseq_no) + self.cfg.rq_size;
        let imm = RsMsg::with(RsOp::Sgl, limit).0;
        self.rx.grant_credits(limit as u16);
        let half = self.cfg.rbuf_size / 2;
        self.stats.credit_msgs_sent += 1;
        if self.rbuf_bytes_avail >= half {
            let sge = RsSge {
                addr: self.keys.rbuf_addr + u64::from(self.rbuf_free_offset),
                key: self.keys.rbuf_rkey,
                length: half,
            };
            let bytes = sge.to_bytes(self.peer_be);
            let local = if self.cfg.sq_inline >= RsSge::LEN as u32 {
                Local::Inline(&bytes)
            } else {
                let off = self.cfg.sbuf_size
                    + RS_MAX_CTRL_MSG * (self.ctrl_seqno & (RS_QP_CTRL_SIZE - 1));
                if io.write(Buf::Sbuf, off, &bytes).is_err() {
                    self.bounds_fault();
                    return;
                }
                Local::Segs(
                    Seg {
                        buf: Buf::Sbuf,
                        off,
                        len: RsSge::LEN as u32,
                    },
                    None,
                )
            };
            let remote = RemoteAddr {
                addr: self
                    .remote_sgl
                    .addr
                    .wrapping_add(RsSge::LEN as u64 * u64::from(self.remote_sge)),
                rkey: self.remote_sgl.key,
            };
            let wr = RsWr {
                wr_id: wr_id(RsOp::Sgl, self.ctrl_seqno),
                imm: Some(imm),
                remote,
                local,
            };
            if io.post_send(&wr).is_err() {
                self.fail(RsError::Io);
            }
            self.rbuf_bytes_avail -= half;
            self.rx.grant_half();
            self.rbuf_free_offset = next_half(self.rbuf_free_offset, half, self.cfg.rbuf_size);
            self.remote_sge = (self.remote_sge + 1) % self.remote_sgl.length.max(1);
        } else {
            let wr = RsWr {
                wr_id: wr_id(RsOp::Sgl, self.ctrl_seqno),
                imm: Some(imm),
                remote: RemoteAddr::default(),
                local: Local::Empty,
            };
            self.post(io, &wr);
        }
    }

    /// Starts a shutdown (`rshutdown`): updates the direction flags and queues the control
    /// message the reference sends. Keep calling [`after_completions`](Self::after_completions)
    /// and polling until [`shutdown_done`](Self::shutdown_done).
    pub fn shutdown(&mut self, how: Shutdown, io: &mut impl RsIo) {
        if !self.is_connected() {
            return;
        }
        self.keepalive_at = None;
        let ctrl = match how {
            Shutdown::Both => {
                self.readable = false;
                self.writable = false;
                Some(RsCtrl::Disconnect)
            }
            Shutdown::Write => {
                self.writable = false;
                Some(if self.readable {
                    RsCtrl::Shutdown
                } else {
                    RsCtrl::Disconnect
                })
            }
            Shutdown::Read => {
                self.readable = false;
                (!self.writable).then_some(RsCtrl::Disconnect)
            }
        };
        if let Some(c) = ctrl {
            self.pending_ctrl = Some(c);
            self.try_post_ctrl(io);
        }
    }

    fn try_post_ctrl(&mut self, io: &mut impl RsIo) {
        let Some(code) = self.pending_ctrl else {
            return;
        };
        // A shutdown or disconnect goes after every byte accepted before it.
        if !self.ctrl_slot_free() || !self.connected || self.error.is_some() || self.unposted > 0 {
            return;
        }
        self.pending_ctrl = None;
        self.ctrl_seqno += 1;
        let wr = RsWr {
            wr_id: wr_id(RsOp::Ctrl, u32::from(code)),
            imm: Some(RsMsg::with(RsOp::Ctrl, u32::from(code)).0),
            remote: RemoteAddr::default(),
            local: Local::Empty,
        };
        self.post(io, &wr);
    }

    /// True once a shutdown's control message went out and every send completed (or the
    /// connection failed, so nothing more will complete).
    pub fn shutdown_done(&self) -> bool {
        self.error.is_some() || (self.pending_ctrl.is_none() && self.sends_done())
    }

    /// Enables keepalive with `period` (`SO_KEEPALIVE` + `TCP_KEEPIDLE`), or disables it.
    pub fn set_keepalive(&mut self, period: Option<Duration>, now: Instant) {
        self.keepalive = period;
        self.keepalive_at = if self.is_connected() {
            period.map(|d| now.saturating_add(d))
        } else {
            None
        };
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.keepalive_at
    }

    /// Sends a keepalive if one is due: a zero-byte RDMA WRITE without immediate, which the
    /// peer never sees but which fails (and fails the connection) if the peer is gone.
    /// Spurious calls are no-ops.
    pub fn handle_timeout(&mut self, now: Instant, io: &mut impl RsIo) {
        let (Some(at), Some(period)) = (self.keepalive_at, self.keepalive) else {
            return;
        };
        if now < at {
            return;
        }
        self.keepalive_at = Some(now.saturating_add(period));
        if self.ctrl_slot_free() && self.is_connected() {
            self.ctrl_seqno += 1;
            let wr = RsWr {
                wr_id: wr_id(RsOp::Ctrl, u32::from(RsCtrl::Keepalive)),
                imm: None,
                remote: RemoteAddr::default(),
                local: Local::Empty,
            };
            self.post(io, &wr);
        }
    }

    // -------------------------------------------------------------------------------------
    // Zero-copy iomap
    // -------------------------------------------------------------------------------------
}
