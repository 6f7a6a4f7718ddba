//! The engine of reliable-connected queue pairs: posting, the in-order send engine, and
//! inbound processing. [`ShmQp`](crate::qp::ShmQp), above the completion queues, is the
//! application's handle on it.
//!
//! **Sending** is done by the initiator's CPU, as a NIC would do it: an RDMA WRITE or READ
//! is a copy between local registered memory and the peer's exported region, checked
//! against the peer's key table (a WRITE's final byte is stored once, last: see
//! [`place`](super::place)); a SEND copies the payload into the peer's bounce buffer.
//! Requests run strictly in order. A SEND or WRITE with immediate needs a receive posted at
//! the peer (a *credit*, read from the peer's segment); without one the request and every
//! later one wait (receiver not ready) and are retried each time the send completion queue
//! is polled. Nothing is ever dropped.
//!
//! **Receiving**: messages that consume a receive are published in the receiver's
//! inbound slots (the payload first, then the slot, with Release), and the receiver's
//! completion queue doorbell is rung. The receiver's `poll` matches each message with the
//! next posted receive, lands SEND payloads from the bounce buffer, and writes completions.
//!
//! **Memory windows**: a bind or local invalidation runs in order with the queue pair's
//! other requests (it writes the window's entry of our key table, module `pd`); a SEND
//! with invalidate travels as a SEND whose slot names the key, which the receiver checks
//! and revokes before it reports the receive.
//!
//! **Errors** follow RC hardware: a local key, range or rights violation completes the
//! request with a local protection error; a bad remote key completes it with a remote
//! access error and faults the peer's queue pair too; a SEND longer than the receive it
//! lands in fails both sides. A queue pair in the error state completes everything
//! outstanding, and everything posted later, with `WR_FLUSH_ERR`.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mempool::memory::Region;
use mempool::ring::{Consumer, Multi, Producer, Ring, Single};

use crate::MAX_SGE;
use crate::core::DevCore;
use crate::cq_shared::CqShared;
use crate::layout::Doorbell;
use crate::pd::{Bind, PdInner};
use crate::place::place;
use crate::qpseg::{Inbound, QpSegLayout, QpSegView, Reserve, SLOT_INLINE, inbound_kind};
use crate::remote::{PeerExport, PeerExports, RemoteKt};
use crate::seg::new_segment_handing_off;
use dp_fabric::error::{FabricError, PostError, PostErrorKind, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::traits::ConnId;
use dp_fabric::types::{
    Access, Completion, Payload, QpCaps, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};

/// What the owner of a queue pair's connection is told (implemented by the connection
/// manager, which sits above queue pairs).
pub(crate) trait ConnHook: Send + Sync {
    /// The application dropped the queue pair: end the connection without an event.
    fn qp_dropped(&self);
}

/// A posted receive, as the completion queue consumes it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub nsge: u32,
    pub total: u32,
    pub sge: [Sge; MAX_SGE],
}

impl RecvWqe {
    pub(crate) fn from_wr(wr: &RecvWr<'_>) -> Self {
        let mut w = Self {
            wr_id: wr.wr_id,
            nsge: wr.sgl.len() as u32,
            total: 0,
            sge: [Sge::default(); MAX_SGE],
        };
        let mut total = 0u64;
        for (d, s) in w.sge.iter_mut().zip(wr.sgl) {
            *d = *s;
            total += u64::from(s.length);
        }
        w.total = total.min(u64::from(u32::MAX)) as u32;
        w
    }
}

/// The peer's side of an established connection, as mapped here.
pub(crate) struct Peer {
    pub _seg: Arc<Region>,
    pub view: QpSegView,
    pub db_seg: Arc<Region>,
    pub db_slot: u32,
    /// The peer's key table.
    pub kt: RemoteKt,
}

impl Peer {
    #[inline]
    fn doorbell(&self) -> &Doorbell {
        // SAFETY: db_seg was validated as a Doorbell when mapped and lives as long as self.
        unsafe { &*self.db_seg.as_ptr().cast::<Doorbell>() }
    }
}

/// A send request that could not run at post time (or whose completion did not fit the
/// completion queue yet).
#[derive(Clone, Copy)]
struct Pending {
    seq: u64,
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    nsge: u8,
    sge: [Sge; MAX_SGE],
    /// Inline payload length (bytes live in the staging slot of `seq`).
    inline_len: Option<u32>,
    /// Set once executed; the completion is still to be reported.
    done: Option<(WcStatus, u32)>,
}

/// Where a request's bytes are.
enum Src<'a> {
    Sgl(&'a [Sge]),
    Bytes(&'a [u8]),
}

pub(crate) struct SendState {
    pending: VecDeque<Pending>,
    staging: Box<[u8]>,
    posted: u64,
    retired: u64,
    credits_used: u64,
    credit_cache: u64,
    bounce_head: u64,
    rnr_counted: bool,
    cq_tx: Producer<Completion, Multi>,
    progress_tx: Producer<u32, Multi>,
    /// What the peer exported to this connection, mapped here. Changed only under the send
    /// lock, so no request uses an export while it is being unmapped.
    exports: PeerExports,
}

pub(crate) struct QpCore {
    pub dev: Arc<DevCore>,
    pub qpn: u32,
    pub conn: ConnId,
    pub pd: Arc<PdInner>,
    pub seg: Arc<Region>,
    /// The segment's memfd until it is sent to the peer (a queue pair has one peer, once).
    pub seg_fd: Mutex<Option<OwnedFd>>,
    pub view: QpSegView,
    pub caps: QpCaps,
    pub send_cq: Arc<CqShared>,
    pub send_slot: u32,
    pub recv_cq: Arc<CqShared>,
    pub recv_slot: u32,
    pub peer: OnceLock<Peer>,
    /// The connection that owns this queue pair (told when the application drops it).
    pub conn_ref: OnceLock<Weak<dyn ConnHook>>,
    send: SpinLock<SendState>,
    /// Receives consumed by the completion queue, ever (for `max_recv_wr`).
    pub recv_consumed: AtomicU64,
    send_attn: AtomicBool,
    recv_attn: AtomicBool,
    /// The peer's posted receives as the last inbound message's slot said (widened to 64
    /// bits by the receive side): credits the send side may take without fetching the
    /// peer's `rq_posted` line (see [`QpCore::take_credit`]).
    credit_hint: AtomicU64,
}

enum Outcome {
    Done(WcStatus, u32),
    Blocked,
}

impl QpCore {
    /// Current state (from our segment, which the peer also reads).
    #[inline]
    pub(crate) fn state(&self) -> QpState {
        // Relaxed: state changes are hints; data is ordered by the slots and credits.
        QpState::from_raw(self.view.header().state.load(Ordering::Relaxed))
    }

    pub(crate) fn set_state(&self, s: QpState) {
        // Release: a peer that sees Rts also sees the segment fully set up.
        self.view
            .header()
            .state
            .store(s.to_raw(), Ordering::Release);
    }

    /// Moves to the error state: receives get flushed on the next poll of the receive
    /// queue's completion queue, pending sends on the next poll of the send queue's.
    pub(crate) fn set_error(&self) {
        if self.state() == QpState::Error {
            return;
        }
        self.set_state(QpState::Error);
        self.notify_recv();
        match self.send.try_lock() {
            Some(mut st) => self.queue_progress(&mut st),
            None => self.notify_send(),
        }
    }

    /// Asks the receive CQ to look at this queue pair (out of band; takes a lock).
    pub(crate) fn notify_recv(&self) {
        // Relaxed: deduplication only; the ring publishes the slot.
        if !self.recv_attn.swap(true, Ordering::Relaxed) {
            self.recv_cq.notify(self.recv_slot);
        }
    }

    /// Asks the send CQ to run this queue pair's pending sends (out of band).
    pub(crate) fn notify_send(&self) {
        // Relaxed: deduplication only.
        if !self.send_attn.swap(true, Ordering::Relaxed) {
            self.send_cq.notify(self.send_slot);
        }
    }

    /// Clears the attention flag of `role` before the CQ handles it.
    pub(crate) fn clear_attn(&self, send: bool) {
        let f = if send {
            &self.send_attn
        } else {
            &self.recv_attn
        };
        // Relaxed: a notification racing with this clear either sees false (and queues
        // again) or was queued before; either way the CQ looks once more.
        f.store(false, Ordering::Relaxed);
    }

    fn queue_progress(&self, st: &mut SendState) {
        // Relaxed: deduplication only; the ring's Release publishes the slot.
        if !self.send_attn.swap(true, Ordering::Relaxed)
            && st.progress_tx.enqueue(self.send_slot).is_err()
        {
            // Cannot happen: the ring has room for every slot once. Fall back to the
            // locked path rather than lose the wake-up.
            self.send_attn.store(false, Ordering::Relaxed);
            self.notify_send();
        }
    }

    /// Runs pending sends. Called by the send CQ's poll. Returns false if the lock was
    /// busy (the caller re-queues).
    pub(crate) fn progress(&self) -> bool {
        let Some(mut st) = self.send.try_lock() else {
            return false;
        };
        self.run_pending(&mut st);
        if !st.pending.is_empty() {
            self.queue_progress(&mut st);
        }
        true
    }

    fn run_pending(&self, st: &mut SendState) {
        while let Some(p) = st.pending.front().copied() {
            let (status, len) = match p.done {
                Some(d) => d,
                None => {
                    let out = if let Some(n) = p.inline_len {
                        let off = self.staging_off(p.seq);
                        // Temporarily take the staging buffer to satisfy the borrow checker.
                        let staging = std::mem::take(&mut st.staging);
                        let r = self.exec(
                            st,
                            p.op,
                            p.flags,
                            Src::Bytes(&staging[off..off + n as usize]),
                        );
                        st.staging = staging;
                        r
                    } else {
                        self.exec(st, p.op, p.flags, Src::Sgl(&p.sge[..usize::from(p.nsge)]))
                    };
                    match out {
                        Outcome::Blocked => return,
                        Outcome::Done(s, l) => (s, l),
                    }
                }
            };
            if !self.report(st, p.seq, p.wr_id, p.op, p.flags, status, len) {
                if let Some(f) = st.pending.front_mut() {
                    f.done = Some((status, len));
                }
                return;
            }
            st.pending.pop_front();
        }
    }

    #[inline]
    fn staging_off(&self, seq: u64) -> usize {
        (seq % u64::from(self.caps.max_send_wr.max(1))) as usize
            * self.caps.max_inline_data as usize
    }

    /// Reports a finished request; false if the completion queue is full (retry later).
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        st: &mut SendState,
        seq: u64,
        wr_id: u64,
        op: SendOp,
        flags: SendFlags,
        status: WcStatus,
        len: u32,
    ) -> bool {
        let signaled = flags.contains(SendFlags::SIGNALED);
        if signaled || !status.is_ok() {
            let c = Completion {
                wr_id,
                status,
                opcode: op.wc_opcode(),
                byte_len: if matches!(op, SendOp::Read(_)) {
                    len
                } else {
                    0
                },
                imm: None,
                qp_num: self.qpn,
                src_qp: 0,
                invalidated: None,
            };
            if st.cq_tx.enqueue(c).is_err() {
                return false;
            }
            st.retired = seq;
        }
        if !status.is_ok() {
            self.set_error();
        }
        true
    }

    /// Installs the peer (once, when the connection is established) with the exports it
    /// described.
    pub(crate) fn install_peer(&self, peer: Peer, exports: Vec<(u32, PeerExport)>) -> Result<()> {
        let mut st = self.send.lock();
        for (slot, e) in exports {
            st.exports.add(slot, e)?;
        }
        drop(st);
        self.peer
            .set(peer)
            .map_err(|_| FabricError::BadState("the peer of this queue pair is set already"))
    }

    /// The peer exported another registration to this connection.
    pub(crate) fn add_export(&self, slot: u32, e: PeerExport) -> Result<()> {
        self.send.lock().exports.add(slot, e)
    }

    /// The peer withdrew an export. Taking the send lock waits for a request that is using
    /// it; the peer revoked its key first, so later requests cannot translate into it.
    pub(crate) fn remove_export(&self, slot: u32) {
        let gone = {
            let mut st = self.send.lock();
            st.exports.remove(slot)
        };
        // Unmapped here, outside the lock.
        drop(gone);
    }

    /// Executes one request now, or says it must wait.
    fn exec(&self, st: &mut SendState, op: SendOp, flags: SendFlags, src: Src<'_>) -> Outcome {
        if self.state() == QpState::Error {
            return Outcome::Done(WcStatus::WrFlushErr, 0);
        }
        // Local operations: they need nothing of the peer.
        match op {
            SendOp::BindMw {
                rkey,
                lkey,
                access,
                addr,
                len,
            } => {
                let b = Bind {
                    rkey,
                    lkey,
                    access,
                    addr,
                    len,
                };
                let status = if self.pd.bind(&b) {
                    WcStatus::Success
                } else {
                    // The window or region went away since the post-time check.
                    WcStatus::MwBindErr
                };
                return Outcome::Done(status, 0);
            }
            SendOp::LocalInv(key) => {
                let status = if self.pd.invalidate(key) {
                    WcStatus::Success
                } else {
                    WcStatus::LocQpOpErr
                };
                return Outcome::Done(status, 0);
            }
            _ => {}
        }
        let Some(peer) = self.peer.get() else {
            return Outcome::Done(WcStatus::WrFlushErr, 0);
        };
        if QpState::from_raw(peer.view.header().state.load(Ordering::Relaxed)) == QpState::Error {
            // The peer's queue pair is gone: RC hardware retries, then gives up.
            return Outcome::Done(WcStatus::RetryExcErr, 0);
        }
        let is_read = matches!(op, SendOp::Read(_));
        // Validate every local entry first: no byte moves for a bad request.
        let mut len: u64 = 0;
        if let Src::Sgl(sgl) = &src {
            for s in *sgl {
                if self
                    .pd
                    .check_local(s.lkey, s.addr, s.length, is_read)
                    .is_none()
                {
                    return Outcome::Done(WcStatus::LocProtErr, 0);
                }
                len += u64::from(s.length);
            }
        } else if let Src::Bytes(b) = &src {
            len = b.len() as u64;
        }
        match op {
            SendOp::Write(r) => {
                match self.remote(st, peer, r.rkey, r.addr, len, Access::REMOTE_WRITE) {
                    Some(dst) => {
                        gather(&src, dst);
                        Outcome::Done(WcStatus::Success, len as u32)
                    }
                    None => Outcome::Done(WcStatus::RemAccessErr, 0),
                }
            }
            SendOp::Read(r) => {
                match self.remote(st, peer, r.rkey, r.addr, len, Access::REMOTE_READ) {
                    Some(from) => {
                        if let Src::Sgl(sgl) = src {
                            scatter(sgl, from, len);
                        }
                        Outcome::Done(WcStatus::Success, len as u32)
                    }
                    None => Outcome::Done(WcStatus::RemAccessErr, 0),
                }
            }
            SendOp::WriteImm(r, imm) => {
                if !self.take_credit(st, peer) {
                    return Outcome::Blocked;
                }
                // Placed by the peer when it polls (see `qpseg`): the slot carries it.
                let inline = flags.contains(SendFlags::PLACE_ON_POLL)
                    && len > 0
                    && len <= SLOT_INLINE as u64;
                if len > 0 {
                    match self.remote(st, peer, r.rkey, r.addr, len, Access::REMOTE_WRITE) {
                        Some(_) if inline => {
                            if let Some(to) = peer.view.inline_dst(st.credits_used, len as u32) {
                                copy_out(&src, to);
                            }
                        }
                        Some(dst) => gather(&src, dst),
                        None => return Outcome::Done(WcStatus::RemAccessErr, 0),
                    }
                }
                self.deliver(
                    st,
                    peer,
                    Inbound {
                        kind: if inline {
                            inbound_kind::WRITE_IMM_INLINE
                        } else {
                            inbound_kind::WRITE_IMM
                        },
                        imm: Some(imm),
                        len: len as u32,
                        key: r.rkey,
                        addr: r.addr,
                        ..Inbound::default()
                    },
                );
                Outcome::Done(WcStatus::Success, len as u32)
            }
            // Done above.
            SendOp::BindMw { .. } | SendOp::LocalInv(_) => Outcome::Done(WcStatus::LocQpOpErr, 0),
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => {
                if !self.take_credit(st, peer) {
                    return Outcome::Blocked;
                }
                let n = st.credits_used;
                if len > u64::from(peer.view.recv_len(n)) {
                    // The peer's receive is too short: it fails its receive (local length
                    // error) and we fail the send, and both queue pairs go to error.
                    self.deliver(
                        st,
                        peer,
                        Inbound {
                            kind: inbound_kind::LEN_ERR,
                            imm: None,
                            len: len as u32,
                            ..Inbound::default()
                        },
                    );
                    return Outcome::Done(WcStatus::RemInvReqErr, 0);
                }
                let start = match peer.view.bounce_reserve(st.bounce_head, len as u32) {
                    Reserve::At(s) => s,
                    Reserve::Full => return Outcome::Blocked,
                    // The peer claims to have released bytes we never sent: its segment is
                    // corrupt. Fail the request (and with it the connection).
                    Reserve::Bad => return Outcome::Done(WcStatus::RemOpErr, 0),
                };
                gather(&src, peer.view.bounce_ptr(start));
                st.bounce_head = start + len;
                let (kind, imm, key) = match op {
                    SendOp::SendImm(i) => (inbound_kind::SEND_IMM, Some(i), 0),
                    SendOp::SendInv(k) => (inbound_kind::SEND_INV, None, k),
                    _ => (inbound_kind::SEND, None, 0),
                };
                self.deliver(
                    st,
                    peer,
                    Inbound {
                        kind,
                        imm,
                        len: len as u32,
                        bounce_end: start + len,
                        key,
                        ..Inbound::default()
                    },
                );
                Outcome::Done(WcStatus::Success, len as u32)
            }
        }
    }

    /// True if the peer has a receive for our next message (does not consume it).
    ///
    /// When the credits known run out, the hint the peer's last message carried comes
    /// first (its slot was read anyway): in a request/response exchange the peer reposts
    /// a receive just before it answers, so fetching its `rq_posted` line would wait for
    /// the line it just wrote, once per message. The hint is the peer's word, as
    /// `rq_posted` is: a peer that lies about its receives fails its own queue pair (a
    /// message without a receive), and the slot index stays masked into its ring either
    /// way. It is bounded by the peer's ring besides, and taken only if it is ahead.
    #[inline]
    fn take_credit(&self, st: &mut SendState, peer: &Peer) -> bool {
        if st.credits_used < st.credit_cache {
            return true;
        }
        // H2: Acquire, pairs with H1 in `drain_recv`: the lengths of the receives the hint
        // counts (read for SENDs) are visible, through Q1 -> Q2' -> Q3 -> Q4 -> H1.
        let hint = self
            .credit_hint
            .load(Ordering::Acquire)
            .min(st.credits_used + u64::from(peer.view.layout.rq_cap));
        if st.credits_used < hint {
            st.credit_cache = hint;
            st.rnr_counted = false;
            return true;
        }
        st.credit_cache = peer.view.peer_credit();
        if st.credits_used < st.credit_cache {
            st.rnr_counted = false;
            return true;
        }
        if !st.rnr_counted {
            st.rnr_counted = true;
            // Relaxed: statistics.
            self.dev.stats.rnr_waits.fetch_add(1, Ordering::Relaxed);
        }
        false
    }

    /// Publishes `m` in the peer's next inbound slot, with our posted receives as its
    /// credit, and rings the peer's doorbell.
    #[inline(always)]
    fn deliver(&self, st: &mut SendState, peer: &Peer, mut m: Inbound) {
        m.credit = self.view.posted() as u32;
        peer.view.push(st.credits_used, &m);
        st.credits_used += 1;
        peer.doorbell().ring(peer.db_slot);
    }

    fn remote(
        &self,
        st: &SendState,
        peer: &Peer,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<*mut u8> {
        if len == 0 {
            // A zero-length access checks nothing on hardware either.
            return Some(ptr::null_mut());
        }
        let p = st.exports.translate(&peer.kt, rkey, addr, len, need);
        if p.is_none() {
            // The responder detects the violation and moves its queue pair to error too.
            // Release: pairs with the Acquire in the peer's fault check.
            peer.view
                .header()
                .fault
                .store(WcStatus::RemAccessErr.to_raw(), Ordering::Release);
            peer.doorbell().ring(peer.db_slot);
        }
        p
    }

    /// Counts one more consumed receive. The receive CQ's poll is the only writer (`poll`
    /// takes `&mut` of the queue), so a load and a store do what `fetch_add` would without
    /// a locked instruction.
    #[inline]
    fn bump_consumed(&self) {
        // Relaxed load: single writer. R-C1: Release store, pairs with the Acquire load in
        // post_recv: the receive's buffers were written before its slot counts as free.
        let v = self.recv_consumed.load(Ordering::Relaxed);
        self.recv_consumed.store(v + 1, Ordering::Release);
    }

    /// Receive side, called by the receive CQ's poll: completes inbound messages into
    /// `out`. Returns (completions written, more work left); the second is looked at only
    /// when `out` is full (the poller rings itself then), and is false otherwise.
    pub(crate) fn drain_recv(&self, rs: &mut RecvSide, out: &mut [Completion]) -> (usize, bool) {
        let mut n = 0;
        let credit = rs.peer_credit;
        // Acquire: pairs with the Release store of the fault by the peer.
        let fault = self.view.header().fault.load(Ordering::Acquire);
        if fault != 0 && self.state() != QpState::Error {
            self.set_error();
        }
        while n < out.len() {
            let Some(m) = self.view.pop(rs.next_in) else {
                break;
            };
            let Some(w) = rs.rq.dequeue() else {
                // A message without a posted receive: the peer broke the credit rule.
                // Relaxed: statistics.
                self.dev
                    .stats
                    .peer_violations
                    .fetch_add(1, Ordering::Relaxed);
                self.set_error();
                break;
            };
            out[n] = self.land(rs.next_in, &m, &w, &mut rs.bounce_tail);
            rs.next_in += 1;
            rs.peer_credit = widen_credit(rs.peer_credit, m.credit);
            if !out[n].is_ok() {
                self.set_error();
            }
            n += 1;
            // Release: the receive is consumed (its buffers written) before the poster may
            // reuse the slot count (pairs with the Acquire in post_recv).
            self.bump_consumed();
        }
        if n < out.len() && self.state() == QpState::Error && !self.view.has(rs.next_in) {
            while n < out.len() {
                let Some(w) = rs.rq.dequeue() else {
                    break;
                };
                out[n] = Completion {
                    wr_id: w.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.qpn,
                    ..Completion::default()
                };
                n += 1;
                self.bump_consumed();
            }
        }
        if rs.peer_credit != credit {
            // H1: Release, pairs with H2 in `take_credit`.
            self.credit_hint.store(rs.peer_credit, Ordering::Release);
        }
        let more = n == out.len()
            && (self.view.has(rs.next_in) || (self.state() == QpState::Error && !rs.rq.is_empty()));
        (n, more)
    }

    /// True if [`drain_recv`](Self::drain_recv) would have something to do now: a published
    /// inbound message, a fault the peer flagged, or the error state (receives to flush).
    #[inline]
    pub(crate) fn recv_pending(&self, rs: &RecvSide) -> bool {
        // Acquire: pairs with the Release store of the fault by the peer (as in drain_recv).
        self.view.header().fault.load(Ordering::Acquire) != 0
            || self.view.published(rs.next_in)
            || self.state() == QpState::Error
    }

    /// Lands inbound message `m` in receive `w`. Everything in `m` was written by the peer:
    /// a SEND's payload must lie in the bounce area, start at or after what we released last
    /// and end within one lap of it, or the message is a protocol violation (counted, and
    /// the queue pair goes to the error state), never a read outside our segment.
    fn land(&self, n: u64, m: &Inbound, w: &RecvWqe, bounce_tail: &mut u64) -> Completion {
        let mut c = Completion {
            wr_id: w.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: m.len,
            imm: m.imm,
            qp_num: self.qpn,
            src_qp: 0,
            invalidated: None,
        };
        match m.kind {
            inbound_kind::WRITE_IMM => c.opcode = WcOpcode::RecvRdmaWithImm,
            inbound_kind::WRITE_IMM_INLINE => {
                c.opcode = WcOpcode::RecvRdmaWithImm;
                // The length, key and address are the peer's: the payload must fit the slot
                // and its destination be a range our key table grants remote writes to.
                let Some(src) = self.view.inline_src(n, m.len) else {
                    return self.violation(c);
                };
                if m.len > 0 {
                    let Some(dst) = self.pd.check_remote_write(m.key, m.addr, m.len) else {
                        return self.violation(c);
                    };
                    // SAFETY: dst..dst+len is inside a live registration of ours with a
                    // remote write right (checked); src..src+len is inside the slot
                    // (len <= SLOT_INLINE), written before the slot's Release store, which
                    // `pop` acquired.
                    unsafe { ptr::copy_nonoverlapping(src, dst, m.len as usize) };
                }
            }
            inbound_kind::SEND | inbound_kind::SEND_IMM | inbound_kind::SEND_INV => {
                let Some(src) = self.view.bounce_payload(*bounce_tail, m.bounce_end, m.len) else {
                    return self.violation(c);
                };
                let mut left = m.len;
                let mut at = src;
                let mut ok = m.len <= w.total;
                for s in &w.sge[..(w.nsge as usize).min(MAX_SGE)] {
                    if left == 0 || !ok {
                        break;
                    }
                    let k = left.min(s.length);
                    if k == 0 {
                        continue;
                    }
                    match self.pd.check_local(s.lkey, s.addr, k, true) {
                        Some(dst) => {
                            // SAFETY: dst..dst+k is inside a live registration with local
                            // write rights (checked); at..at+k is inside the bounce area
                            // (the sender reserved len contiguous bytes) and was published
                            // by the slot's Release store, which `pop` acquired.
                            unsafe { ptr::copy_nonoverlapping(at, dst, k as usize) };
                            // SAFETY: stays within the reserved contiguous bounce range.
                            at = unsafe { at.add(k as usize) };
                            left -= k;
                        }
                        None => {
                            ok = false;
                            c.status = WcStatus::LocProtErr;
                        }
                    }
                }
                if m.len > w.total {
                    c.status = WcStatus::LocLenErr;
                }
                *bounce_tail = m.bounce_end;
                self.view.bounce_release(m.bounce_end);
                if m.kind == inbound_kind::SEND_INV && c.is_ok() {
                    self.remote_invalidate(m.key, &mut c);
                }
            }
            inbound_kind::LEN_ERR => c.status = WcStatus::LocLenErr,
            _ => return self.violation(c),
        }
        if !c.is_ok() {
            c.byte_len = 0;
            c.imm = None;
        }
        c
    }
}

impl QpCore {
    /// A peer's SEND with invalidate of `key`, landed in `c`: the key must be the current
    /// key of a bound window of this queue pair's protection domain. It is revoked before
    /// the receive is reported, and the completion names it. Any other key (the peer's
    /// word: unknown, a region's, another domain's, stale) fails the receive with a remote
    /// invalid request error, touching no key; the peer is told (its queue pair fails
    /// too, as the NAK does on RC hardware), and ours goes to error with the receive.
    fn remote_invalidate(&self, key: u32, c: &mut Completion) {
        if self.pd.invalidate(key) {
            c.invalidated = Some(key);
            return;
        }
        c.status = WcStatus::RemInvReqErr;
        if let Some(peer) = self.peer.get() {
            // Release: pairs with the Acquire in the peer's fault check (drain_recv).
            peer.view
                .header()
                .fault
                .store(WcStatus::RemInvReqErr.to_raw(), Ordering::Release);
            peer.doorbell().ring(peer.db_slot);
        }
    }

    /// The peer broke the protocol in an inbound message: count it and fail the receive
    /// (which moves the queue pair to the error state).
    #[cold]
    fn violation(&self, mut c: Completion) -> Completion {
        // Relaxed: statistics.
        self.dev
            .stats
            .peer_violations
            .fetch_add(1, Ordering::Relaxed);
        c.status = WcStatus::LocQpOpErr;
        c.byte_len = 0;
        c.imm = None;
        c
    }
}

impl Drop for QpCore {
    fn drop(&mut self) {
        self.dev.free_qpn(self.qpn);
    }
}

/// The peer's posted receives, widened from the low 32 bits a slot carries and the last
/// value: the count only grows, so a step of 2^31 or more (or back) is not taken. For an
/// honest peer the result never overshoots its true count (a step it cannot tell stays
/// short by multiples of 2^32); a lying peer moves it as it likes, and `take_credit`
/// bounds what it takes.
#[inline]
fn widen_credit(last: u64, low: u32) -> u64 {
    let step = low.wrapping_sub(last as u32);
    if step < 1 << 31 {
        last + u64::from(step)
    } else {
        last
    }
}

/// Copies the request's bytes to `dst`, the final byte last and only once (see
/// [`place`](super::place)): responders may poll it.
fn gather(src: &Src<'_>, dst: *mut u8) {
    match src {
        Src::Bytes(b) => {
            // SAFETY: dst was validated for b.len() bytes by the caller (remote translation
            // or a bounce reservation); b is a live slice.
            unsafe { place(dst, [(b.as_ptr(), b.len())]) };
        }
        Src::Sgl(sgl) => {
            // SAFETY: every entry was validated against its registration (check_local),
            // and dst covers the total length (validated by the caller).
            unsafe {
                place(
                    dst,
                    sgl.iter().map(|s| (s.addr as *const u8, s.length as usize)),
                );
            }
        }
    }
}

/// Copies the request's bytes to `dst` in order (an inbound slot's payload area, which
/// holds at least as many bytes: the caller checked the length against `SLOT_INLINE`).
fn copy_out(src: &Src<'_>, dst: *mut u8) {
    match src {
        Src::Bytes(b) => {
            // SAFETY: dst has room for b.len() bytes (caller); b is a live slice.
            unsafe { ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
        }
        Src::Sgl(sgl) => {
            let mut at = dst;
            for s in *sgl {
                // SAFETY: every entry was validated against its registration (check_local);
                // dst has room for their total length (caller).
                unsafe {
                    ptr::copy_nonoverlapping(s.addr as *const u8, at, s.length as usize);
                    at = at.add(s.length as usize);
                }
            }
        }
    }
}

/// Copies `len` bytes from `src` into the local entries.
fn scatter(sgl: &[Sge], src: *const u8, len: u64) {
    let mut at = src;
    let mut left = len;
    for s in sgl {
        let k = u64::from(s.length).min(left);
        if k == 0 {
            continue;
        }
        // SAFETY: entries were validated with local write rights; src covers len bytes
        // (validated remote translation).
        unsafe {
            ptr::copy_nonoverlapping(at, s.addr as *mut u8, k as usize);
            at = at.add(k as usize);
        }
        left -= k;
    }
}

/// The receive side state a completion queue owns for one queue pair.
pub(crate) struct RecvSide {
    pub rq: Consumer<RecvWqe, Single>,
    pub next_in: u64,
    /// Bounce bytes released so far: where the next SEND payload may start.
    pub bounce_tail: u64,
    /// The peer's posted receives as its messages said, widened (published to the send
    /// side as `QpCore::credit_hint`).
    pub peer_credit: u64,
}

/// Clamps requested capacities to what the device supports.
pub(crate) fn clamp_caps(c: QpCaps) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr.clamp(1, 16384),
        max_recv_wr: c.max_recv_wr.clamp(1, 16384),
        max_send_sge: c.max_send_sge.clamp(1, MAX_SGE as u32),
        max_recv_sge: c.max_recv_sge.clamp(1, MAX_SGE as u32),
        max_inline_data: c.max_inline_data.min(super::MAX_INLINE as u32),
    }
}

impl QpCore {
    /// Creates the engine of a queue pair (state Init) for connection `conn`: the core,
    /// the producer side of its receive queue, and the receive side its completion queue
    /// will own.
    pub(crate) fn create(
        dev: &Arc<DevCore>,
        pd: &Arc<PdInner>,
        send_cq: &Arc<CqShared>,
        recv_cq: &Arc<CqShared>,
        caps: QpCaps,
        conn: ConnId,
    ) -> Result<(Arc<Self>, Producer<RecvWqe, Single>, RecvSide)> {
        let caps = clamp_caps(caps);
        let qpn = dev.alloc_qpn()?;
        let rq_cap = caps.max_recv_wr.next_power_of_two();
        let layout = QpSegLayout::new(rq_cap, dev.cfg.bounce_bytes);
        let (seg, seg_fd) =
            match new_segment_handing_off(dev.ctx_id, &format!("qp{qpn:x}"), layout.total) {
                Ok(s) => s,
                Err(e) => {
                    dev.free_qpn(qpn);
                    return Err(e);
                }
            };
        // SAFETY: the fresh segment is zeroed, page aligned, layout.total bytes long, and
        // kept alive by QpCore alongside every view.
        let view = unsafe { QpSegView::init(seg.as_ptr(), layout, qpn, dev.ctx_id) };
        let (rq_tx, rq_rx) =
            Ring::<RecvWqe>::spsc(rq_cap as usize).map_err(|e| FabricError::InvalidArgument {
                what: "max_recv_wr",
                why: e.to_string(),
            })?;
        let same = Arc::ptr_eq(send_cq, recv_cq);
        let (cq_tx, progress_tx) = send_cq.producers();
        let send_slot = send_cq.reserve_slot()?;
        let recv_slot = if same {
            send_slot
        } else {
            match recv_cq.reserve_slot() {
                Ok(s) => s,
                Err(e) => {
                    send_cq.release_slot(send_slot);
                    return Err(e);
                }
            }
        };
        let staging =
            vec![0u8; caps.max_send_wr as usize * caps.max_inline_data as usize].into_boxed_slice();
        let core = Arc::new(Self {
            dev: dev.clone(),
            qpn,
            conn,
            pd: pd.clone(),
            seg,
            seg_fd: Mutex::new(Some(seg_fd)),
            view,
            caps,
            send_cq: send_cq.clone(),
            send_slot,
            recv_cq: recv_cq.clone(),
            recv_slot,
            peer: OnceLock::new(),
            conn_ref: OnceLock::new(),
            send: SpinLock::new(SendState {
                pending: VecDeque::with_capacity(caps.max_send_wr as usize),
                staging,
                posted: 0,
                retired: 0,
                credits_used: 0,
                credit_cache: 0,
                bounce_head: 0,
                rnr_counted: false,
                cq_tx,
                progress_tx,
                exports: PeerExports::new(),
            }),
            recv_consumed: AtomicU64::new(0),
            send_attn: AtomicBool::new(false),
            recv_attn: AtomicBool::new(false),
            credit_hint: AtomicU64::new(0),
        });
        core.set_state(QpState::Init);
        let recv = RecvSide {
            rq: rq_rx,
            next_in: 0,
            bounce_tail: 0,
            peer_credit: 0,
        };
        Ok((core, rq_tx, recv))
    }
}

impl QpCore {
    /// Posts send requests (the body of `RcQueuePair::post_send`).
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> core::result::Result<(), PostError> {
        let core = self;
        let state = core.state();
        let mut st = core.send.lock();
        let err = |index, kind| PostError { index, kind };
        for (i, wr) in wrs.iter().enumerate() {
            if !matches!(state, QpState::Rts | QpState::Error) {
                return Err(err(i, PostErrorKind::BadState(state)));
            }
            let (nsge, inline_len) = match wr.payload {
                Payload::Sgl(s) => {
                    if s.len() > core.caps.max_send_sge as usize {
                        return Err(err(i, PostErrorKind::TooManySge));
                    }
                    (s.len(), None)
                }
                Payload::Inline(b) => {
                    if matches!(wr.op, SendOp::Read(_)) {
                        return Err(err(i, PostErrorKind::Unsupported));
                    }
                    if b.len() > core.caps.max_inline_data as usize {
                        return Err(err(i, PostErrorKind::InlineTooLong));
                    }
                    (0, Some(b.len() as u32))
                }
            };
            // No remote invalidation here (shm keys are not fast-registered MRs).
            match wr.op {
                SendOp::BindMw {
                    rkey,
                    lkey,
                    access,
                    addr,
                    len,
                } => {
                    let b = Bind {
                        rkey,
                        lkey,
                        access,
                        addr,
                        len,
                    };
                    if !wr.is_empty() || !core.pd.bind_is_valid(&b) {
                        return Err(err(i, PostErrorKind::BadBind));
                    }
                }
                SendOp::LocalInv(_) if !wr.is_empty() => {
                    return Err(err(i, PostErrorKind::Unsupported));
                }
                _ => {}
            }
            if matches!(
                wr.op,
                SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_)
            ) && wr.len() > u64::from(core.dev.cfg.bounce_bytes)
            {
                return Err(err(i, PostErrorKind::MessageTooLong));
            }
            if wr.len() > 1 << 31 {
                return Err(err(i, PostErrorKind::MessageTooLong));
            }
            if st.posted - st.retired >= u64::from(core.caps.max_send_wr) {
                return Err(err(i, PostErrorKind::QueueFull));
            }
            st.posted += 1;
            let seq = st.posted;
            if st.pending.is_empty() {
                let src = match wr.payload {
                    Payload::Sgl(s) => Src::Sgl(s),
                    Payload::Inline(b) => Src::Bytes(b),
                };
                if let Outcome::Done(status, len) = core.exec(&mut st, wr.op, wr.flags, src) {
                    if core.report(&mut st, seq, wr.wr_id, wr.op, wr.flags, status, len) {
                        continue;
                    }
                    let mut p = to_pending(seq, wr, nsge, None);
                    p.done = Some((status, len));
                    st.pending.push_back(p);
                    core.queue_progress(&mut st);
                    continue;
                }
            }
            if let (Payload::Inline(b), Some(_)) = (wr.payload, inline_len) {
                let off = core.staging_off(seq);
                st.staging[off..off + b.len()].copy_from_slice(b);
            }
            st.pending.push_back(to_pending(seq, wr, nsge, inline_len));
            core.queue_progress(&mut st);
        }
        Ok(())
    }

    /// Posts receives into `rq` (the body of `RcQueuePair::post_recv`; the queue pair's
    /// owner holds the producer side and the count of receives it posted).
    pub(crate) fn post_recv(
        &self,
        rq: &mut Producer<RecvWqe, Single>,
        recv_posted: &mut u64,
        wrs: &[RecvWr<'_>],
    ) -> core::result::Result<(), PostError> {
        let core = self;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sgl.len() > core.caps.max_recv_sge as usize {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::TooManySge,
                });
            }
            // Acquire: pairs with the Release increment in drain_recv.
            let consumed = core.recv_consumed.load(Ordering::Acquire);
            if *recv_posted - consumed >= u64::from(core.caps.max_recv_wr) {
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
            }
            let w = RecvWqe::from_wr(wr);
            if rq.enqueue(w).is_err() {
                // rq capacity >= max_recv_wr and the check above bounds occupancy.
                return Err(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
            }
            core.view.publish_recv(*recv_posted, w.total);
            *recv_posted += 1;
        }
        if core.state() == QpState::Error {
            // Flush what was just posted.
            core.notify_recv();
        }
        Ok(())
    }
}

fn to_pending(seq: u64, wr: &SendWr<'_>, nsge: usize, inline_len: Option<u32>) -> Pending {
    let mut sge = [Sge::default(); MAX_SGE];
    if let Payload::Sgl(s) = wr.payload {
        sge[..nsge].copy_from_slice(&s[..nsge]);
    }
    Pending {
        seq,
        wr_id: wr.wr_id,
        op: wr.op,
        flags: wr.flags,
        nsge: nsge as u8,
        sge,
        inline_len,
        done: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::place::tests::StoreCounter;

    /// The credit a slot carries only moves forward, across the 32-bit wrap too.
    #[test]
    fn credit_hint_widens_forward_only() {
        assert_eq!(widen_credit(0, 0), 0);
        assert_eq!(widen_credit(0, 1026), 1026);
        assert_eq!(widen_credit(1026, 1027), 1027);
        // Back (an old slot, or a lie): kept.
        assert_eq!(widen_credit(1027, 1026), 1027);
        // Across the wrap of the low 32 bits.
        let near = (7u64 << 32) | 0xFFFF_FFF0;
        assert_eq!(widen_credit(near, 0x10), (8u64 << 32) | 0x10);
        // A step of 2^31 or more is not taken.
        assert_eq!(widen_credit(5, 5 + (1 << 31)), 5);
        assert_eq!(widen_credit(5, 4 + (1 << 31)), 4 + (1 << 31));
    }

    /// Issue 6, on the path every RDMA WRITE takes: the final destination byte is stored
    /// once, whether the payload is inline bytes or a gather list.
    #[test]
    fn gather_stores_the_final_byte_once() {
        let src: Vec<u8> = (0..256u32).map(|i| (i * 5 + 1) as u8).collect();
        let mut dst = vec![0u8; 8192];
        let base = dst
            .as_mut_ptr()
            .wrapping_add(dst.as_ptr().align_offset(4096));
        let sge = |o: usize, l: u32| Sge {
            addr: src[o..].as_ptr() as u64,
            length: l,
            lkey: 0,
        };
        for n in [8usize, 16, 32, 64] {
            let last = base.wrapping_add(n - 1);
            let counter = match StoreCounter::new(last) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("gather_stores_the_final_byte_once: no hardware watchpoint ({e})");
                    return;
                }
            };
            let half = (n / 2) as u32;
            let sgl = [sge(0, half), sge(n / 2, n as u32 - half)];
            for src_of in [Src::Bytes(&src[..n]), Src::Sgl(&sgl)] {
                let before = counter.count();
                gather(&src_of, base);
                let stores = counter.count() - before;
                assert_eq!(
                    stores, 1,
                    "{n} bytes: the final byte was stored {stores} times"
                );
                // SAFETY: inside dst, which nothing else references now.
                assert_eq!(unsafe { *last }, src[n - 1]);
            }
        }
    }
}
