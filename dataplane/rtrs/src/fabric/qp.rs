//! One connection on a real fabric: its completion queue and queue pair, the receive
//! buffers its receives are posted with, and the translation of the state machines' work
//! requests ([`Wr`]) into the provider's ([`SendWr`]). Shared by the client and the server
//! driver; what differs (where a request's header or a chunk lives) comes in through
//! [`LocalMem`].

use std::collections::VecDeque;
use std::sync::Arc;

use dp_fabric::{
    Access, CmChannel, Completion, CompletionQueue, ConnId, Device, MemoryRegion, Payload,
    PostError, PostErrorKind, ProtectionDomain, Provider, QpCaps, QpInit, RcQueuePair, RecvWr,
    RemoteAddr, SendFlags, SendOp, SendWr, Sge,
};
use mempool::memory::{Region, RegionConfig};

use crate::work::{Conn, QpSizes, RecvBuf, SrcRef, Wc, Wr};

/// The longest chain the state machines post at once (a request with its registration, a
/// response with its data write and re-registration): longer chains are refused.
pub const MAX_CHAIN: usize = 8;

/// Bytes of one small receive ([`RecvBuf::Small`], an `rkey_rsp`).
const SMALL: usize = 8;

/// Completions one [`QpRes::poll`] takes, and the reposts one batch holds.
const BATCH: usize = 32;

/// The `wr_id` of the requests a driver posts on its own ([`QpRes::post_private`]), which
/// no state machine makes (the kind `0xFF` is none of theirs): [`poll_conn`] keeps their
/// successful completions from the state machine, and hands it their failures.
pub(crate) const PRIVATE_WR_ID: u64 = u64::MAX;

/// The bind of a memory window under `rkey` granting remote write on `len` bytes at `addr`
/// of the `MW_BIND` region `lkey` names: a client's READ buffer (per-IO registration), a
/// server's chunk (`always_invalidate`).
pub(crate) const fn write_bind(rkey: u32, lkey: u32, addr: u64, len: u64) -> SendOp {
    SendOp::BindMw {
        rkey,
        lkey,
        access: Access::REMOTE_WRITE,
        addr,
        len,
    }
}

/// `n` unbound memory windows in `pd`, as a negative errno if the provider has none or the
/// domain no room for them.
pub(crate) fn alloc_windows<P: Provider>(pd: &P::Pd, n: usize) -> Result<Vec<P::Mw>, i32> {
    (0..n)
        .map(|_| pd.alloc_mw().map_err(|e| errno_of(&e)))
        .collect()
}

/// The receives a connection's state machine posted while [`poll_conn`] handed it a batch
/// of completions, posted together as one `post_recv` list when the batch ends, or before
/// anything is sent on the connection (whichever comes first): every receive the state
/// machine posted before a send is posted before that send, as if posted at once, so what
/// the peer can observe (it sends into a receive only after something we sent allowed it:
/// a credit, a permit returned, a heartbeat's answer) does not change. One list instead of
/// a `post_recv` per consumed receive (two per IO on both sides: the request's and the
/// answer's).
/// Only receives without a buffer ([`RecvBuf::Empty`]: what the IO protocol consumes and
/// reposts) are collected; one with a buffer posts what was collected, then itself.
#[derive(Debug)]
struct Reposts {
    /// While set, [`QpRes::post_recv`] collects instead of posting.
    on: bool,
    n: usize,
    wrs: [RecvWr<'static>; BATCH],
}

impl Reposts {
    fn new() -> Self {
        Self {
            on: false,
            n: 0,
            wrs: [RecvWr { wr_id: 0, sgl: &[] }; BATCH],
        }
    }
}

/// Where the local memory of a request lives, on one side of one path.
pub(crate) trait LocalMem {
    /// The header buffer of permit `slot`, its first `len` bytes (client).
    fn iu_sge(&self, slot: u16, len: u32) -> Option<Sge>;
    /// The first `len` bytes of chunk `chunk` (server).
    fn chunk_sge(&self, chunk: u16, len: u32) -> Option<Sge>;
    /// The memory-window bind a registration request stands for: a client's
    /// [`Wr::Register`] (per-IO registration: the bind `map_data` prepared for its token),
    /// a server's [`Wr::RegChunk`] (`always_invalidate`: the chunk's window under the new
    /// key). `None`: another request, an unknown token or chunk, or no windows on this side.
    fn bind_of(&self, w: &Wr<'_>) -> Option<SendOp> {
        let _ = w;
        None
    }
    /// `len` bytes of a handler's source at its offset (server; none on a client).
    fn source_sge(&self, src: SrcRef, len: u32) -> Option<Sge> {
        let _ = (src, len);
        None
    }
}

/// A fabric failure while setting a connection up, as the negative errno the state
/// machines take.
pub(crate) fn errno_of(e: &dp_fabric::FabricError) -> i32 {
    use dp_fabric::FabricError as F;
    match e {
        F::Exhausted { .. } => -libc::ENOMEM,
        F::InvalidArgument { .. } | F::Registration { .. } => -libc::EINVAL,
        F::Io { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
        _ => -libc::EIO,
    }
}

/// The post error of a connection that is gone (its path or queue pair no longer exists).
pub(crate) fn gone() -> PostError {
    PostError {
        index: 0,
        kind: PostErrorKind::BadState(dp_fabric::QpState::Error),
    }
}

/// A registered buffer of this side (receive or send buffers of the control path).
struct Buf<P: Provider> {
    mem: Arc<Region>,
    mr: P::Mr,
}

impl<P: Provider> Buf<P> {
    fn new(pd: &P::Pd, len: usize, name: &str) -> Result<Self, i32> {
        let len = len.max(64).next_multiple_of(4096);
        let mem = Region::new(&RegionConfig::new(name, len).quiet())
            .map(Arc::new)
            .map_err(|_| -libc::ENOMEM)?;
        let mr = pd
            .reg_region(&mem, 0, len, Access::LOCAL_WRITE)
            .map_err(|e| errno_of(&e))?;
        Ok(Self { mem, mr })
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }
}

/// What a posted receive was posted with, in posting order (receives of a queue pair
/// complete in order, flushed ones too).
#[derive(Clone, Copy, Debug)]
enum Posted {
    Empty,
    /// A slot of the small ring.
    Small(usize),
    /// The big buffer, this many bytes.
    Big(u32),
}

/// One connection: completion queue, queue pair, receive buffers.
pub(crate) struct QpRes<P: Provider> {
    /// The state machine's handle.
    pub(crate) conn: Conn,
    /// The CM's name of it.
    pub(crate) conn_id: ConnId,
    qp: P::Qp,
    cq: P::Cq,
    max_inline: u32,
    /// Receives in posting order.
    posted: VecDeque<(u64, Posted)>,
    /// Small receives: `slots` of 8 bytes, then the big buffer's room.
    small: Option<Buf<P>>,
    small_slots: usize,
    small_next: usize,
    big: Option<Buf<P>>,
    send: Option<Buf<P>>,
    /// Buffers replaced while receives into them may still be outstanding.
    retired: Vec<Buf<P>>,
    /// Receives posted while a batch of completions is handled, not yet given to the queue
    /// pair.
    reposts: Reposts,
    wcs: [Completion; BATCH],
    /// Test kit: successful completions of [`post_private`](Self::post_private) requests
    /// that [`poll_conn`] kept from the state machine.
    #[cfg(feature = "testing")]
    pub(crate) private_done: u64,
}

impl<P: Provider> core::fmt::Debug for QpRes<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("QpRes")
            .field("conn", &self.conn)
            .field("conn_id", &self.conn_id)
            .field("posted", &self.posted.len())
            .finish()
    }
}

/// The queue pair and completion queue sizes for `sizes` on `dev`.
fn caps_for(dev: &impl Device, sizes: QpSizes) -> (QpCaps, u32) {
    let a = dev.attr();
    let max_wr = a.max_qp_wr.max(1);
    let caps = QpCaps {
        max_send_wr: sizes.max_send_wr.clamp(1, max_wr),
        max_recv_wr: sizes.max_recv_wr.clamp(1, max_wr),
        max_send_sge: sizes.max_send_sge.clamp(1, a.max_sge.max(1)),
        max_recv_sge: 1,
        max_inline_data: a.max_inline_data.min(256),
    };
    let cqe = (caps.max_send_wr + caps.max_recv_wr).min(a.max_cqe.max(1));
    (caps, cqe)
}

impl<P: Provider> QpRes<P> {
    /// Moves the queue pair to the error state: what it holds flushes (a path kill).
    pub(crate) fn move_to_error(&mut self) {
        self.qp.move_to_error();
    }

    /// Connects (client): a completion queue and a queue pair on `pd`, the request to `dst`.
    pub(crate) fn connect(
        dev: &P::Device,
        pd: &P::Pd,
        cm: &mut P::Cm,
        dst: std::net::SocketAddr,
        conn: Conn,
        sizes: QpSizes,
        private_data: &[u8],
    ) -> Result<Self, i32> {
        let (caps, cqe) = caps_for(dev, sizes);
        let cq = dev.create_cq(cqe).map_err(|e| errno_of(&e))?;
        let init = QpInit {
            pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        let (conn_id, qp) = cm
            .connect(dst, &init, private_data)
            .map_err(|e| errno_of(&e))?;
        Ok(Self::new(conn, conn_id, qp, cq, caps))
    }

    /// Accepts (server) `request` with a completion queue and a queue pair on `pd`.
    pub(crate) fn accept(
        dev: &P::Device,
        pd: &P::Pd,
        cm: &mut P::Cm,
        request: P::ConnRequest,
        conn: Conn,
        sizes: QpSizes,
        private_data: &[u8],
    ) -> Result<Self, i32> {
        let (caps, cqe) = caps_for(dev, sizes);
        let cq = dev.create_cq(cqe).map_err(|e| errno_of(&e))?;
        let init = QpInit {
            pd,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
        };
        let (conn_id, qp) = cm
            .accept(request, &init, private_data)
            .map_err(|e| errno_of(&e))?;
        Ok(Self::new(conn, conn_id, qp, cq, caps))
    }

    fn new(conn: Conn, conn_id: ConnId, qp: P::Qp, cq: P::Cq, caps: QpCaps) -> Self {
        // What the device granted, which may be less than asked.
        let max_inline = qp.caps().max_inline_data.min(caps.max_inline_data);
        Self {
            conn,
            conn_id,
            qp,
            cq,
            max_inline,
            posted: VecDeque::with_capacity(caps.max_recv_wr as usize + 1),
            small: None,
            small_slots: caps.max_recv_wr as usize,
            small_next: 0,
            big: None,
            send: None,
            retired: Vec::new(),
            reposts: Reposts::new(),
            wcs: [Completion::default(); BATCH],
            #[cfg(feature = "testing")]
            private_done: 0,
        }
    }

    /// Posts one receive of the kind asked; while a batch is handled
    /// ([`begin_batch`](Self::begin_batch)), collects it for [`flush_recv`](Self::flush_recv).
    pub(crate) fn post_recv(
        &mut self,
        pd: &P::Pd,
        wr_id: u64,
        buf: RecvBuf,
    ) -> Result<(), PostError> {
        let refused = |kind| PostError { index: 0, kind };
        let (sge, what) = match buf {
            RecvBuf::Empty => (None, Posted::Empty),
            RecvBuf::Small => {
                if self.small.is_none() {
                    // Once per connection (the first receive of a NEW_RKEY session).
                    let b = Buf::new(pd, self.small_slots * SMALL, "rtrs-small-rx")
                        .map_err(|_| refused(PostErrorKind::QueueFull))?;
                    self.small = Some(b);
                }
                let slot = self.small_next;
                self.small_next = (slot + 1) % self.small_slots.max(1);
                let b = self.small.as_ref().expect("made above");
                (Some(b.sge(slot * SMALL, SMALL as u32)), Posted::Small(slot))
            }
            RecvBuf::InfoRsp(0) => (None, Posted::Empty),
            RecvBuf::InfoRsp(_) | RecvBuf::InfoReq => {
                let n = buf.len();
                if self.big.as_ref().is_none_or(|b| b.mem.len() < n as usize) {
                    // Control path: the info exchange, once per connection attempt.
                    let b = Buf::new(pd, n as usize, "rtrs-info-rx")
                        .map_err(|_| refused(PostErrorKind::QueueFull))?;
                    if let Some(old) = self.big.replace(b) {
                        self.retired.push(old);
                    }
                }
                let b = self.big.as_ref().expect("made above");
                (Some(b.sge(0, n)), Posted::Big(n))
            }
        };
        if sge.is_none() && self.reposts.on {
            if self.reposts.n == BATCH {
                self.flush_recv();
            }
            let r = &mut self.reposts;
            r.wrs[r.n] = RecvWr { wr_id, sgl: &[] };
            r.n += 1;
            self.posted.push_back((wr_id, what));
            return Ok(());
        }
        // In posting order: what was collected first.
        self.flush_recv();
        let one;
        let sgl: &[Sge] = match &sge {
            Some(s) => {
                one = [*s];
                &one
            }
            None => &[],
        };
        self.qp.post_recv(&[RecvWr { wr_id, sgl }])?;
        self.posted.push_back((wr_id, what));
        Ok(())
    }

    /// From now until [`end_batch`](Self::end_batch), receives are collected and posted
    /// as one list ([`Reposts`]).
    fn begin_batch(&mut self) {
        self.reposts.on = true;
    }

    /// Posts what the batch collected and posts receives at once again.
    fn end_batch(&mut self) {
        self.flush_recv();
        self.reposts.on = false;
    }

    /// Posts the collected receives as one list. The state machine was told they were
    /// posted: if the queue pair refuses them (it is in the error state, or a provider's
    /// bug), the ones refused leave the FIFO and the queue pair is moved to the error
    /// state, so the state machine sees the flushes of what is outstanding and closes the
    /// path (as after a failed `post_recv`, one turn later).
    fn flush_recv(&mut self) {
        let n = core::mem::take(&mut self.reposts.n);
        if n == 0 {
            return;
        }
        if let Err(e) = self.qp.post_recv(&self.reposts.wrs[..n]) {
            let posted = e.index.min(n);
            let keep = self.posted.len() - (n - posted);
            self.posted.truncate(keep);
            self.qp.move_to_error();
        }
    }

    /// Posts `chain` as one `post_send`. A chain that posts as one work request (a client's
    /// request, a server's answer) is translated into one `SendWr` on the stack; longer
    /// ones into arrays of [`MAX_CHAIN`].
    pub(crate) fn post_send(
        &mut self,
        pd: &P::Pd,
        chain: &[Wr<'_>],
        mem: &impl LocalMem,
    ) -> Result<(), PostError> {
        let refuse = |index, kind| PostError { index, kind };
        // Receives the state machine posted before this send go first.
        self.flush_recv();
        if chain.len() > MAX_CHAIN {
            return Err(refuse(MAX_CHAIN, PostErrorKind::QueueFull));
        }
        // A SEND too long to go inline goes through the send buffer (the info exchange).
        let mut big_send = None;
        for (i, w) in chain.iter().enumerate() {
            if let Wr::SendMsg { bytes, .. } = w
                && bytes.len() > self.max_inline as usize
            {
                if big_send.is_some() {
                    return Err(refuse(i, PostErrorKind::QueueFull));
                }
                if self.send.as_ref().is_none_or(|b| b.mem.len() < bytes.len()) {
                    let b = Buf::new(pd, bytes.len(), "rtrs-info-tx")
                        .map_err(|_| refuse(i, PostErrorKind::QueueFull))?;
                    if let Some(old) = self.send.replace(b) {
                        self.retired.push(old);
                    }
                }
                let b = self.send.as_ref().expect("made above");
                b.mem.copy_in(0, bytes);
                big_send = Some(b.sge(0, bytes.len() as u32));
            }
        }
        match chain {
            [w] => {
                let (sges, n) = sgl_of(w, 0, mem, big_send)?;
                let wr = send_wr(w, &sges[..n], self.max_inline, mem);
                return self.qp.post_send(&[wr]);
            }
            [a, b] if folds(a, b) => {
                let (sges, n) = sgl_of(a, 0, mem, big_send)?;
                let wr = fold(a, b, &sges[..n]);
                return self.qp.post_send(&[wr]);
            }
            _ => {}
        }
        let mut sges = [[Sge::default(); 2]; MAX_CHAIN];
        let mut nsge = [0usize; MAX_CHAIN];
        for (i, w) in chain.iter().enumerate() {
            (sges[i], nsge[i]) = sgl_of(w, i, mem, big_send)?;
        }
        let empty = SendWr {
            wr_id: 0,
            op: SendOp::Send,
            payload: Payload::Sgl(&[]),
            flags: SendFlags::NONE,
        };
        let mut wrs = [empty; MAX_CHAIN];
        let mut n = 0;
        let mut i = 0;
        while i < chain.len() {
            let sgl = &sges[i][..nsge[i]];
            if let Some(b) = chain.get(i + 1)
                && folds(&chain[i], b)
            {
                wrs[n] = fold(&chain[i], b, sgl);
                i += 2;
            } else {
                wrs[n] = send_wr(&chain[i], sgl, self.max_inline, mem);
                i += 1;
            }
            n += 1;
        }
        self.qp.post_send(&wrs[..n])
    }

    /// Posts requests of the driver's own (control path), as one list after the receives
    /// collected so far: each `(op, gather list)` of `reqs` with [`PRIVATE_WR_ID`],
    /// unsignalled but the last (whose completion retires the list's room in the send
    /// queue; [`poll_conn`] drops it). A failure of any of them completes with an error,
    /// which [`poll_conn`] hands on: the path closes.
    pub(crate) fn post_private(&mut self, reqs: &[(SendOp, &[Sge])]) -> Result<(), PostError> {
        self.flush_recv();
        let wrs: Vec<SendWr<'_>> = reqs
            .iter()
            .enumerate()
            .map(|(i, &(op, sgl))| SendWr {
                wr_id: PRIVATE_WR_ID,
                op,
                payload: Payload::Sgl(sgl),
                flags: if i + 1 == reqs.len() {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                },
            })
            .collect();
        self.qp.post_send(&wrs)
    }

    /// Polls up to 32 completions into the connection's own array; returns how many.
    ///
    /// The service connection (cid 0: heartbeats, the info exchange, user messages) is
    /// idle on almost every turn of a busy loop: it is polled only when its queue's cheap
    /// look ([`CompletionQueue::may_have_work`], loads only) says a poll could find or run
    /// something, which a poll would not miss (a provider that cannot tell says `true`).
    /// An IO connection is polled without the look: under load it has work on most turns.
    pub(crate) fn poll(&mut self) -> usize {
        if self.conn.cid == 0 && !self.cq.may_have_work() {
            return 0;
        }
        self.cq.poll(&mut self.wcs)
    }

    /// Completion `i` of the last [`poll`](Self::poll) as the state machines read it, and
    /// the bytes its receive caught copied into `out` (emptied first; room for them is
    /// made once, on the control path, for the info exchange).
    pub(crate) fn take(&mut self, i: usize, out: &mut Vec<u8>) -> Wc {
        let c = self.wcs[i];
        out.clear();
        let wc = Wc::from_fabric(&c, c.invalidated);
        if !wc.is_recv() && c.status.is_ok() {
            return wc;
        }
        if c.status.is_ok() || self.is_recv_flush(&c) {
            let Some((_, what)) = self.posted.pop_front() else {
                return wc;
            };
            if !c.status.is_ok() {
                return wc;
            }
            let (buf, off, cap) = match what {
                Posted::Empty => return wc,
                Posted::Small(s) => (self.small.as_ref(), s * SMALL, SMALL as u32),
                Posted::Big(n) => (self.big.as_ref(), 0, n),
            };
            let n = c.byte_len.min(cap) as usize;
            if let Some(b) = buf {
                out.resize(n, 0);
                b.mem.copy_out(off, out);
            }
        }
        wc
    }

    /// A failed completion is a receive's if it names a posted receive's id at the head of
    /// the receive queue (failed completions carry no opcode to tell).
    fn is_recv_flush(&self, c: &Completion) -> bool {
        self.posted.front().is_some_and(|(id, _)| *id == c.wr_id)
    }
}

/// The local memory request `w` (at index `i` of its chain) gathers: at most two entries
/// and their count. `big_send` is where a SEND too long to go inline was staged.
fn sgl_of(
    w: &Wr<'_>,
    i: usize,
    mem: &impl LocalMem,
    big_send: Option<Sge>,
) -> Result<([Sge; 2], usize), PostError> {
    let refuse = |kind| PostError { index: i, kind };
    let mut sges = [Sge::default(); 2];
    let n = match *w {
        Wr::IoRequest {
            data, slot, iu_len, ..
        } => {
            let iu = mem
                .iu_sge(slot, iu_len)
                .ok_or(refuse(PostErrorKind::MessageTooLong))?;
            match data {
                Some(d) if d.length > 0 => {
                    sges = [d, iu];
                    2
                }
                _ => {
                    sges[0] = iu;
                    1
                }
            }
        }
        Wr::WriteChunk { chunk, len, .. } => {
            sges[0] = mem
                .chunk_sge(chunk, len)
                .ok_or(refuse(PostErrorKind::MessageTooLong))?;
            1
        }
        Wr::WriteSource { src, len, .. } => {
            sges[0] = mem
                .source_sge(src, len)
                .ok_or(refuse(PostErrorKind::MessageTooLong))?;
            1
        }
        Wr::SendMsg { .. } => match big_send {
            Some(b) => {
                sges[0] = b;
                1
            }
            None => 0,
        },
        Wr::Register { .. } | Wr::RegChunk { .. } => {
            // Per-IO registration (the bind map_data prepared) or always_invalidate (the
            // chunk's window): checked here. A side without windows refuses it.
            if mem.bind_of(w).is_none() {
                return Err(refuse(PostErrorKind::Unsupported));
            }
            0
        }
        Wr::LocalInv { .. } => 0,
        Wr::WriteImmEmpty { .. } | Wr::SendInv { .. } | Wr::SendImmMsg { .. } => 0,
    };
    Ok((sges, n))
}

/// The provider's request for `w`, gathering `sgl` (what [`sgl_of`] found for it).
fn send_wr<'a>(w: &'a Wr<'a>, sgl: &'a [Sge], max_inline: u32, mem: &impl LocalMem) -> SendWr<'a> {
    let mut flags = if w.signaled() {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    };
    let (op, payload) = match *w {
        Wr::SendMsg { bytes, .. } => {
            if bytes.len() > max_inline as usize {
                (SendOp::Send, Payload::Sgl(sgl))
            } else {
                (SendOp::Send, Payload::Inline(bytes))
            }
        }
        Wr::WriteImmEmpty { imm, .. } => (
            SendOp::WriteImm(RemoteAddr::default(), imm),
            Payload::Sgl(&[]),
        ),
        Wr::IoRequest { remote, imm, .. } => {
            // The server reads a request's chunk only after polling its completion: a small
            // request (a READ's header and user message) may ride in it.
            flags = flags | SendFlags::PLACE_ON_POLL;
            (SendOp::WriteImm(remote, imm), Payload::Sgl(sgl))
        }
        Wr::WriteChunk { remote, .. } | Wr::WriteSource { remote, .. } => {
            (SendOp::Write(remote), Payload::Sgl(sgl))
        }
        Wr::SendImmMsg { ref bytes, imm, .. } => (SendOp::SendImm(imm), Payload::Inline(bytes)),
        // The answer to a client's NEED_INVAL read (Linux's client always asks, its reads go
        // through fast-registered MRs); a zero-byte SEND_WITH_INV.
        Wr::SendInv { rkey, .. } => (SendOp::SendInv(rkey), Payload::Sgl(&[])),
        // A window bind: per-IO registration's (then, after the answer, when the server did
        // not invalidate the key, its local invalidation), or always_invalidate's chunk
        // under its new key (after the LOCAL_INV the request's arrival posted).
        Wr::Register { .. } | Wr::RegChunk { .. } => match mem.bind_of(w) {
            Some(op) => (op, Payload::Sgl(&[])),
            None => unreachable!("refused by sgl_of"),
        },
        Wr::LocalInv { key, .. } => (SendOp::LocalInv(key), Payload::Sgl(&[])),
    };
    SendWr {
        wr_id: w.wr_id(),
        op,
        payload,
        flags,
    }
}

/// True if `a` then `b` post as one request (see [`fold`]).
fn folds(a: &Wr<'_>, b: &Wr<'_>) -> bool {
    matches!(
        (a, b),
        (
            Wr::WriteChunk {
                signaled: false,
                ..
            } | Wr::WriteSource {
                signaled: false,
                ..
            },
            Wr::WriteImmEmpty { .. }
        )
    )
}

/// A READ's answer (its data, then the empty WRITE with immediate that completes it) as one
/// WRITE with immediate carrying the data, `sgl` (the chunk, or the handler's source): what the client sees is the
/// same (the data in place before the immediate's completion, which consumes the same empty
/// receive), and it is one request less to post and run. PLACE_ON_POLL: the client reads
/// its buffer only after that completion, so a small answer may ride in the completion
/// itself (over shm, in the inbound slot the client polls, instead of a line of its buffer
/// first and the slot's after it). Only for pairs [`folds`] accepts.
fn fold<'a>(a: &Wr<'a>, b: &Wr<'a>, sgl: &'a [Sge]) -> SendWr<'a> {
    let (
        Wr::WriteChunk { remote, .. } | Wr::WriteSource { remote, .. },
        Wr::WriteImmEmpty {
            wr_id,
            imm,
            signaled,
        },
    ) = (*a, *b)
    else {
        unreachable!("checked by folds")
    };
    SendWr {
        wr_id,
        op: SendOp::WriteImm(remote, imm),
        payload: Payload::Sgl(sgl),
        flags: if signaled {
            SendFlags::SIGNALED | SendFlags::PLACE_ON_POLL
        } else {
            SendFlags::PLACE_ON_POLL
        },
    }
}

/// A path of a driver, client's or server's: its connections by cid.
pub(super) trait PathConns<P: Provider> {
    /// The connections, by cid (`None`: never opened, or closed).
    fn conns(&mut self) -> &mut [Option<QpRes<P>>];
}

/// A driver's table of connections, by path slot and cid: what [`poll_conn`] needs of the
/// client's and the server's driver alike. A driver only names its pieces
/// ([`parts`](Self::parts)); the lookups over them are the same for both.
pub(super) trait ConnTable<P: Provider> {
    /// The driver's path (a slot of the table).
    type Path: PathConns<P>;

    /// The path slots (`None`: free), the buffer a completion's payload is copied into,
    /// and the count of completions handed to the state machine.
    fn parts(&mut self) -> (&mut [Option<Self::Path>], &mut Vec<u8>, &mut u64);

    /// The live connection `cid` of path slot `p`.
    fn qp_at(&mut self, p: usize, cid: usize) -> Option<&mut QpRes<P>> {
        self.parts()
            .0
            .get_mut(p)?
            .as_mut()?
            .conns()
            .get_mut(cid)?
            .as_mut()
    }

    /// The buffer a completion's payload is copied into.
    fn scratch(&mut self) -> &mut Vec<u8> {
        self.parts().1
    }

    /// One completion was handed to the state machine (a statistic).
    fn count_completion(&mut self) {
        *self.parts().2 += 1;
    }
}

/// Polls connection `cid` of path slot `p` and hands each completion, with the payload a
/// receive caught, to `handle` (the state machine, given the driver back as its I/O).
/// Returns the completions polled.
pub(crate) fn poll_conn<P: Provider, D: ConnTable<P>>(
    d: &mut D,
    p: usize,
    cid: usize,
    mut handle: impl FnMut(&mut D, Conn, &Wc, &[u8]),
) -> usize {
    let Some(q) = d.qp_at(p, cid) else {
        return 0;
    };
    let n = q.poll();
    if n == 0 {
        return 0;
    }
    let conn = q.conn;
    q.begin_batch();
    let mut out = core::mem::take(d.scratch());
    for i in 0..n {
        let Some(q) = d.qp_at(p, cid).filter(|q| q.conn == conn) else {
            // The state machine closed the connection while handling the batch: the rest
            // belongs to a connection it no longer has.
            break;
        };
        let wc = q.take(i, &mut out);
        if wc.wr_id == PRIVATE_WR_ID {
            // The driver's own request (`post_private`): its success is nobody else's
            // business. Its failure closes the path: the state machine gets it (a server
            // closes on any failed completion), and the queue pair goes to the error state
            // (where the failure left it anyway), so its receives flush under the state
            // machine's own ids (a client ignores completions of ids it did not make).
            if wc.is_ok() {
                #[cfg(feature = "testing")]
                {
                    q.private_done += 1;
                }
                continue;
            }
            q.move_to_error();
        }
        d.count_completion();
        handle(d, conn, &wc, &out);
    }
    *d.scratch() = out;
    if let Some(q) = d.qp_at(p, cid).filter(|q| q.conn == conn) {
        q.end_batch();
    }
    n
}
