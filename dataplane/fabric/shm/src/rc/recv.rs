//! The receive side of a reliable-connected queue pair: the completion queue's poll matches
//! inbound messages with posted receives, lands SEND payloads from the bounce buffer, places
//! payloads that ride in the slot, checks a peer's SEND with invalidate and reports
//! completions. Everything in an inbound slot is the peer's word.

use std::ptr;
use std::sync::atomic::Ordering;

use mempool::ring::{Consumer, Single};

use super::{QpCore, RecvWqe, widen_credit};
use crate::MAX_SGE;
use crate::qpseg::{Inbound, inbound_kind};
use dp_fabric::types::{Completion, QpState, WcOpcode, WcStatus};

impl QpCore {
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
        let mut released = rs.bounce_tail;
        // Landed bounce bytes released at once, without waiting for the end of the poll:
        // large SENDs give their room back while the poll goes on; small ones, once per
        // poll.
        let release_every = u64::from(self.view.layout.bounce_len / 8).max(1);
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
            if rs.bounce_tail - released >= release_every {
                // Large SENDs: the sender may be waiting for this room (a lap of the
                // buffer is a few of them), so it goes back before the poll ends.
                self.view.bounce_release(rs.bounce_tail);
                released = rs.bounce_tail;
            }
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
        if rs.bounce_tail != released {
            // One store for the SENDs landed in this poll since the last release: the
            // sender reads the line only when its copy of the counter shows too little
            // room.
            self.view.bounce_release(rs.bounce_tail);
        }
        if rs.peer_credit != credit {
            // H1: Release, pairs with H2 in `take_credit`.
            self.credit_hint.store(rs.peer_credit, Ordering::Release);
        }
        let more = n == out.len()
            && (self.view.has(rs.next_in) || (self.state() == QpState::Error && !rs.rq.is_empty()));
        (n, more)
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
            inbound_kind::SEND
            | inbound_kind::SEND_IMM
            | inbound_kind::SEND_INV
            | inbound_kind::SEND_INLINE
            | inbound_kind::SEND_IMM_INLINE
            | inbound_kind::SEND_INV_INLINE => {
                // The length and bounce position are the peer's: a payload in the slot must
                // fit it, one in the bounce buffer must lie in what is unreleased of it.
                let inline = inbound_kind::is_inline_send(m.kind);
                let src = if inline {
                    self.view.inline_src(n, m.len)
                } else {
                    self.view.bounce_payload(*bounce_tail, m.bounce_end, m.len)
                };
                let Some(src) = src else {
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
                            // write rights (checked); at..at+k is inside the slot (len <=
                            // SLOT_INLINE) or the bounce area (the sender reserved len
                            // contiguous bytes, checked against the area) and was published
                            // by the slot's Release store, which `pop` acquired.
                            unsafe { ptr::copy_nonoverlapping(at, dst, k as usize) };
                            // SAFETY: stays within the payload's contiguous range.
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
                if !inline {
                    // Released to the sender by `drain_recv`, before its poll ends.
                    *bounce_tail = m.bounce_end;
                }
                if matches!(
                    m.kind,
                    inbound_kind::SEND_INV | inbound_kind::SEND_INV_INLINE
                ) && c.is_ok()
                {
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

/// The receive side state a completion queue owns for one queue pair.
pub(crate) struct RecvSide {
    pub rq: Consumer<RecvWqe, Single>,
    pub next_in: u64,
    /// Bounce bytes landed so far: where the next SEND payload may start. `drain_recv`
    /// releases them to the sender by the end of each poll.
    pub bounce_tail: u64,
    /// The peer's posted receives as its messages said, widened (published to the send
    /// side as `QpCore::credit_hint`).
    pub peer_credit: u64,
}
