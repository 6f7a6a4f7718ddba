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
//! Files: this one (the queue pair's state, the send engine, the copies), `rc/post.rs`
//! (creating the engine, `post_send` and `post_recv` with their checks) and `rc/recv.rs`
//! (the receive side the completion queue's poll runs).
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

use crate::MAX_SGE;
use crate::core::DevCore;
use crate::cq_shared::{CqShared, CqTx};
use crate::layout::Doorbell;
use crate::pd::{Bind, PdInner};
use crate::place::place;
use crate::qpseg::{Inbound, QpSegView, Reserve, SLOT_INLINE, inbound_kind};
use crate::remote::{PeerExport, PeerExports, RemoteKt};
use dp_fabric::error::{FabricError, Result};
use dp_fabric::sync::SpinLock;
use dp_fabric::traits::ConnId;
use dp_fabric::types::{
    Access, Completion, QpCaps, QpState, RecvWr, SendFlags, SendOp, Sge, WcStatus,
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
    pub(crate) fn doorbell(&self) -> &Doorbell {
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
    /// The owner's bounce release counter as last read (see `QpSegView::bounce_reserve`).
    bounce_tail: u64,
    rnr_counted: bool,
    /// Messages were published in the peer's inbound slots since its doorbell last rang:
    /// `deliver` leaves the ring to the end of the `post_send` or `progress` call, so a
    /// post list of N messages rings once (one locked read-modify-write on the peer's
    /// doorbell word, whose line the peer's poll takes back each time, instead of N).
    ring_due: bool,
    cq_tx: CqTx<Completion>,
    progress_tx: CqTx<u32>,
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
        self.ring_peer(&mut st);
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
        if let Some(b) = Bind::of(op) {
            let status = if self.pd.bind(&b) {
                WcStatus::Success
            } else {
                // The window or region went away since the post-time check.
                WcStatus::MwBindErr
            };
            return Outcome::Done(status, 0);
        }
        if let SendOp::LocalInv(key) = op {
            let status = if self.pd.invalidate(key) {
                WcStatus::Success
            } else {
                WcStatus::LocQpOpErr
            };
            return Outcome::Done(status, 0);
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
                // A payload that fits rides in the slot; a larger one in the bounce buffer.
                let inline = len <= SLOT_INLINE as u64;
                let bounce_end = if inline {
                    if let Some(to) = peer.view.inline_dst(st.credits_used, len as u32) {
                        copy_out(&src, to);
                    }
                    0
                } else {
                    let start = match peer.view.bounce_reserve(
                        st.bounce_head,
                        len as u32,
                        &mut st.bounce_tail,
                    ) {
                        Reserve::At(s) => s,
                        Reserve::Full => return Outcome::Blocked,
                        // The peer claims to have released bytes we never sent: its segment
                        // is corrupt. Fail the request (and with it the connection).
                        Reserve::Bad => return Outcome::Done(WcStatus::RemOpErr, 0),
                    };
                    gather(&src, peer.view.bounce_ptr(start));
                    st.bounce_head = start + len;
                    start + len
                };
                let (kind, imm, key) = match op {
                    SendOp::SendImm(i) => (inbound_kind::SEND_IMM, Some(i), 0),
                    SendOp::SendInv(k) => (inbound_kind::SEND_INV, None, k),
                    _ => (inbound_kind::SEND, None, 0),
                };
                let kind = if inline {
                    inbound_kind::in_slot(kind)
                } else {
                    kind
                };
                self.deliver(
                    st,
                    peer,
                    Inbound {
                        kind,
                        imm,
                        len: len as u32,
                        bounce_end,
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
    /// credit; the peer's doorbell rings when the call that runs the request ends
    /// ([`ring_peer`](Self::ring_peer)).
    #[inline(always)]
    fn deliver(&self, st: &mut SendState, peer: &Peer, mut m: Inbound) {
        m.credit = self.view.posted() as u32;
        peer.view.push(st.credits_used, &m);
        st.credits_used += 1;
        st.ring_due = true;
    }

    /// Rings the peer's doorbell once for the messages `deliver` published since it last
    /// rang (still under the send lock, before `post_send` or `progress` returns: the
    /// peer's poll finds every one of them).
    #[inline]
    fn ring_peer(&self, st: &mut SendState) {
        if st.ring_due {
            st.ring_due = false;
            if let Some(peer) = self.peer.get() {
                peer.doorbell().ring(peer.db_slot);
            }
        }
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
pub(crate) fn widen_credit(last: u64, low: u32) -> u64 {
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

mod post;
mod recv;

pub(crate) use post::clamp_caps;
pub(crate) use recv::RecvSide;

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
