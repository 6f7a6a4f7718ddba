//! The send side of a path: queueing (sequence numbers), picking the next message
//! (`rds_send_xmit`), fragmenting it into frames (`rds_ib_xmit`, `rds_tcp_xmit`), ACK-only
//! frames (`rds_ib_attempt_ack`), completions, acks from a stream transport, and cancels.

use lcore::time::Instant;

use super::config::Flavor;
use super::frame::{FrameKind, TxFrame, TxPayload};
use super::machine::{InFlight, Path, Xmit, finish_xmit};
use super::state::{ConnState, PathCtx, Timer};
use crate::store::{Lane, Msg, MsgId};
use crate::wire::{
    CONG_MAP_BYTES, FRAG_SIZE, Flags, HEADER_LEN, HeaderRepr, MAX_ADV_CREDIT, frag_count,
};

impl Path {
    /// Queues a message for transmission (the path's half of `rds_send_queue_rm` and
    /// `rds_send_probe`): it takes the next sequence number and goes to the back of the
    /// send queue. The caller has filled in its ports, length, payload and extensions.
    /// Returns the sequence number.
    pub fn queue(&mut self, id: MsgId, ctx: &mut PathCtx<'_>) -> u64 {
        let seq = self.next_tx_seq;
        self.next_tx_seq += 1;
        let m = ctx.store.msgs.get_mut(id);
        m.seq = seq;
        m.conn = self.id.conn;
        m.path = self.id.index;
        m.set(Msg::ON_CONN);
        m.clear(Msg::ON_RETRANS);
        ctx.store.msgs.push_back(&mut self.send_q, Lane::Conn, id);
        ctx.stats.send_queued += 1;
        seq
    }

    /// Takes a message off this path's queues (`RDS_CANCEL_SENT_TO`, socket close): it
    /// will not be sent (again). A message being transmitted is finished first, as in the
    /// kernel, but never retransmitted. The caller owns it afterwards.
    pub fn cancel(&mut self, id: MsgId, ctx: &mut PathCtx<'_>) {
        let m = ctx.store.msgs.get(id);
        if !m.has(Msg::ON_CONN) {
            return;
        }
        let list = if m.has(Msg::ON_RETRANS) {
            &mut self.retrans_q
        } else {
            &mut self.send_q
        };
        ctx.store.msgs.remove(list, Lane::Conn, id);
        ctx.store
            .msgs
            .get_mut(id)
            .clear(Msg::ON_CONN | Msg::ON_RETRANS);
    }

    /// True if [`poll_transmit`](Self::poll_transmit) could produce a frame now or once
    /// completions return (the engine keeps such paths on its transmit list).
    pub fn has_tx_work(&self, map_queued: bool) -> bool {
        self.state == ConnState::Up
            && ((!self.tx_hold && (self.xmit.is_some() || !self.send_q.is_empty() || map_queued))
                || (self.ack.requested && !self.ack.in_flight))
    }

    /// The next frame to hand the transport, if the path is Up and has one that the send
    /// ring and the credits allow: the next fragment of the current message, else a
    /// pending congestion-map update (between messages), else the next queued
    /// message; failing data, an ACK-only frame if an ack is owed.
    pub fn poll_transmit(&mut self, now: Instant, ctx: &mut PathCtx<'_>) -> Option<TxFrame> {
        if self.state != ConnState::Up {
            return None;
        }
        if let Some(f) = self.data_frame(now, ctx) {
            return Some(f);
        }
        self.ack_frame(ctx)
    }

    fn data_frame(&mut self, _now: Instant, ctx: &mut PathCtx<'_>) -> Option<TxFrame> {
        if self.tx_hold {
            return None;
        }
        if self.data_in_flight >= self.cfg.send_depth {
            if self.has_tx_work(*ctx.map_queued) {
                ctx.stats.ib_tx_ring_full += 1;
            }
            return None;
        }
        if self.xmit.is_none() && !self.start_next(ctx) {
            return None;
        }
        let x = self.xmit?;
        let (got, mut adv) = self.credits.grab(1, false, MAX_ADV_CREDIT);
        if got == 0 {
            ctx.stats.ib_tx_throttle += 1;
            return None;
        }
        let store = &mut *ctx.store;
        let m = store.msgs.get(x.msg);
        let is_cong = m.has(Msg::CONG_MAP);
        let mut hdr = HeaderRepr {
            sequence: m.seq,
            ack: 0,
            len: m.len,
            sport: m.sport,
            dport: m.dport,
            flags: m.flags,
            credit: 0,
            ext: m.ext,
        };
        let payload = match self.cfg.flavor {
            Flavor::Message => {
                let done = x.sent as usize * FRAG_SIZE;
                let n = (m.len as usize).saturating_sub(done).min(FRAG_SIZE);
                match store.frags.nth(&m.frags, x.sent) {
                    Some(frag) if n > 0 => TxPayload::Frag {
                        frag,
                        len: n as u32,
                    },
                    _ => TxPayload::None,
                }
            }
            Flavor::Stream => {
                if m.len == 0 {
                    TxPayload::None
                } else {
                    TxPayload::Chain {
                        chain: m.frags,
                        len: m.len,
                    }
                }
            }
        };
        let seq = m.seq;
        // The RDMA operation goes out just before the message's first frame.
        let rdma = if x.sent == 0 && !is_cong {
            m.rdma
        } else {
            None
        };
        if let Some(op) = rdma {
            ctx.stats.send_rdma += 1;
            ctx.stats.send_rdma_bytes += u64::from(op.len);
        }
        match self.cfg.flavor {
            Flavor::Message => {
                let (ack, was_requested) = self.ack.piggyback();
                if was_requested {
                    ctx.stats.ib_ack_send_piggybacked += 1;
                }
                self.timers.stop(Timer::DelayedAck);
                hdr.ack = ack;
                let (_, more) = self.credits.grab(0, true, MAX_ADV_CREDIT - adv);
                adv += more;
                if adv > 0 {
                    ctx.stats.ib_tx_credit_updates += 1;
                }
                hdr.credit = adv as u8;
            }
            Flavor::Stream => {
                self.tx_stream_off += (HEADER_LEN + m.len as usize) as u64;
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        let kind = if is_cong {
            FrameKind::CongMap
        } else {
            FrameKind::Data
        };
        self.inflight.push_back(InFlight {
            token,
            msg: Some(x.msg),
            kind,
        });
        self.data_in_flight += 1;
        let stream_off = self.tx_stream_off;
        let m = store.msgs.get_mut(x.msg);
        m.in_flight += 1;
        if self.cfg.flavor == Flavor::Stream && !is_cong {
            m.ack_seq = stream_off;
            m.set(Msg::HAS_ACK_SEQ);
        }
        let sent = x.sent + 1;
        let last = sent >= x.total;
        if last {
            self.xmit = None;
            if !is_cong {
                self.max_sent_seq = self.max_sent_seq.max(seq);
            }
            finish_xmit(store, x.msg);
        } else {
            self.xmit = Some(Xmit { sent, ..x });
        }
        Some(TxFrame {
            token,
            header: hdr.to_bytes(self.cfg.checksum),
            payload,
            kind,
            last,
            rdma,
        })
    }

    /// Picks what to transmit next: a pending map update, else the head of the
    /// send queue, moved to the retransmit queue at once. Returns false if there is
    /// nothing.
    fn start_next(&mut self, ctx: &mut PathCtx<'_>) -> bool {
        if *ctx.map_queued && self.start_cong_update(ctx) {
            return true;
        }
        let store = &mut *ctx.store;
        while let Some(id) = store.msgs.pop_front(&mut self.send_q, Lane::Conn) {
            let m = store.msgs.get_mut(id);
            if m.has(Msg::FLUSH) || (m.has(Msg::RDMA) && m.has(Msg::RETRANSMITTED)) {
                m.clear(Msg::ON_CONN);
                store.msgs.push_back(&mut self.dropped, Lane::Conn, id);
                ctx.stats.send_drop_flushed += 1;
                continue;
            }
            m.set(Msg::ON_RETRANS | Msg::IN_XMIT);
            let len = m.len;
            if self.unacked_packets == 0 || self.unacked_bytes < len {
                m.set(Msg::ACK_REQUIRED);
                self.unacked_packets = self.cfg.max_unacked_packets;
                self.unacked_bytes = self.cfg.max_unacked_bytes;
                ctx.stats.send_ack_required += 1;
            } else {
                self.unacked_packets -= 1;
                self.unacked_bytes -= len;
            }
            if m.has(Msg::RETRANSMITTED) {
                ctx.stats.send_retransmitted += 1;
            }
            // Finalise the header flags (rds_ib_xmit / rds_tcp_xmit): only a message
            // transport puts ACK_REQUIRED on the wire.
            let mut flags = m.flags;
            if m.has(Msg::ACK_REQUIRED) && self.cfg.flavor == Flavor::Message {
                flags = flags.union(Flags::ACK_REQUIRED);
            }
            if m.has(Msg::RETRANSMITTED) {
                flags = flags.union(Flags::RETRANSMITTED);
            }
            m.flags = flags;
            m.clear(Msg::HAS_ACK_SEQ);
            let total = self.wire_frames(len);
            store.msgs.push_back(&mut self.retrans_q, Lane::Conn, id);
            self.xmit = Some(Xmit {
                msg: id,
                sent: 0,
                total,
            });
            return true;
        }
        false
    }

    fn wire_frames(&self, len: u32) -> u32 {
        match self.cfg.flavor {
            Flavor::Message => frag_count(len as usize) as u32,
            Flavor::Stream => 1,
        }
    }

    /// Builds a congestion-map update from the connection's local map (`rds_cong_update_alloc`).
    /// False if the store has no room now (the update stays queued).
    fn start_cong_update(&mut self, ctx: &mut PathCtx<'_>) -> bool {
        let store = &mut *ctx.store;
        let n = frag_count(CONG_MAP_BYTES) as u32;
        if store.frags.available() < n {
            return false;
        }
        let Some(id) = store.msgs.alloc() else {
            return false;
        };
        let Some(chain) = store.frags.alloc_chain(n) else {
            store.msgs.free(id);
            return false;
        };
        let mut bytes = [0u8; CONG_MAP_BYTES];
        ctx.local_map.emit(&mut bytes);
        store.frags.write_chain(&chain, &bytes);
        let m = store.msgs.get_mut(id);
        m.frags = chain;
        m.len = CONG_MAP_BYTES as u32;
        m.flags = Flags::CONG_BITMAP;
        m.conn = self.id.conn;
        m.path = self.id.index;
        m.set(Msg::CONG_MAP | Msg::IN_XMIT);
        *ctx.map_queued = false;
        self.xmit = Some(Xmit {
            msg: id,
            sent: 0,
            total: self.wire_frames(CONG_MAP_BYTES as u32),
        });
        true
    }

    /// An ACK-only frame, if an ack is requested, none is in flight and (with flow
    /// control) a credit allows it. It carries posted credits too.
    fn ack_frame(&mut self, ctx: &mut PathCtx<'_>) -> Option<TxFrame> {
        if self.cfg.flavor != Flavor::Message || !self.ack.requested || self.ack.in_flight {
            return None;
        }
        let (got, adv) = self.credits.grab(1, false, MAX_ADV_CREDIT);
        if got == 0 {
            ctx.stats.ib_tx_throttle += 1;
            return None;
        }
        let (ack, _) = self.ack.piggyback();
        self.timers.stop(Timer::DelayedAck);
        self.ack.in_flight = true;
        let hdr = HeaderRepr {
            ack,
            credit: adv as u8,
            ..HeaderRepr::default()
        };
        ctx.stats.ib_ack_sent += 1;
        if adv > 0 {
            ctx.stats.ib_tx_credit_updates += 1;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.inflight.push_back(InFlight {
            token,
            msg: None,
            kind: FrameKind::Ack,
        });
        Some(TxFrame {
            token,
            header: hdr.to_bytes(self.cfg.checksum),
            payload: TxPayload::None,
            kind: FrameKind::Ack,
            last: true,
            rdma: None,
        })
    }

    /// Frames up to and including `token` completed (in posting order, as reliable
    /// connections complete them; one completion may stand for several unsignalled
    /// frames). Their send-ring slots come back; an ACK-only frame's completion lets the
    /// next ack go; a message whose frames all completed and that was acked (or
    /// cancelled) is freed.
    pub fn handle_send_complete(&mut self, token: u64, ctx: &mut PathCtx<'_>) {
        while let Some(f) = self.inflight.front().copied() {
            if f.token > token {
                break;
            }
            self.inflight.pop_front();
            match f.kind {
                FrameKind::Ack => self.ack.in_flight = false,
                FrameKind::Data | FrameKind::CongMap => {
                    self.data_in_flight = self.data_in_flight.saturating_sub(1);
                }
            }
            if let Some(id) = f.msg {
                let m = ctx.store.msgs.get_mut(id);
                m.in_flight = m.in_flight.saturating_sub(1);
                // All frames out and completed: the RDMA operation posted before the
                // first one completed too (rds_ib_send_unmap_rdma, the kernel's approach 3).
                if m.in_flight == 0
                    && !m.has(Msg::IN_XMIT)
                    && m.has(Msg::ON_SOCK)
                    && let Some(op) = m.rdma.as_mut()
                    && !op.done
                    && op.failed.is_none()
                {
                    op.done = true;
                    let op = *op;
                    self.rdma_done.push((m.sock, op));
                }
                ctx.store.release_if_unused(id);
            }
        }
    }

    /// The message whose frame `token` is in flight (to pin a transport's report on an
    /// RDMA operation to its message).
    pub fn msg_in_flight(&self, token: u64) -> Option<MsgId> {
        self.inflight
            .iter()
            .find(|f| f.token == token)
            .and_then(|f| f.msg)
    }

    /// A stream transport's peer acknowledged every byte before stream offset `acked`
    /// (counted from the start of this connection): messages whose last byte is covered
    /// are released (`rds_tcp_is_acked` against `snd_una`).
    pub fn handle_stream_acked(&mut self, acked: u64, ctx: &mut PathCtx<'_>) {
        if self.cfg.flavor != Flavor::Stream || self.state != ConnState::Up {
            return;
        }
        let acked = acked.min(self.tx_stream_off);
        self.release_front(ctx, |m| m.has(Msg::HAS_ACK_SEQ) && m.ack_seq <= acked);
    }
}
