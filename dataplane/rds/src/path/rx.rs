//! The receive side of a path: frames of a message transport (`rds_ib_process_recv`),
//! bytes of a stream transport (`rds_tcp_data_recv`), and the sequence-number rules every
//! complete message goes through (`rds_recv_incoming`).
//!
//! Everything a peer sends is checked before it is used. What the kernel checks is
//! checked the same way (header checksum; fragment sequence, length and ports against the
//! message's first fragment); what it does not is checked too: `h_len` at most 1 MiB,
//! every fragment exactly `min(remaining, 4096)` bytes, sequence numbers possible, credit
//! grants bounded, acks not beyond what was sent. A violation resets the path (counted
//! per kind, see [`Violation`]); nothing the peer sends afterwards on it is looked at.

use lcore::time::Instant;

use super::config::Flavor;
use super::frame::RxRefused;
use super::machine::{Path, Violation};
use super::state::{Partial, PathCtx, StreamRx, Timer};
use crate::store::{Lane, Msg, MsgId, Store};
use crate::wire::{CONG_MAP_BYTES, FRAG_SIZE, Flags, HEADER_LEN, HeaderFault, HeaderRepr};

fn fault_violation(f: HeaderFault) -> Violation {
    match f {
        HeaderFault::Truncated => Violation::Truncated,
        HeaderFault::BadChecksum => Violation::BadChecksum,
        HeaderFault::LenTooLarge => Violation::LenTooLarge,
    }
}

/// A new record for a message starting with `hdr`.
fn start_record(store: &mut Store, hdr: &HeaderRepr) -> Option<MsgId> {
    if !store.msgs.can_take_data() {
        return None;
    }
    let id = store.msgs.alloc()?;
    let m = store.msgs.get_mut(id);
    m.seq = hdr.sequence;
    m.len = hdr.len;
    m.sport = hdr.sport;
    m.dport = hdr.dport;
    m.flags = hdr.flags;
    m.ext = hdr.ext;
    Some(id)
}

impl Path {
    /// The transport posted `n` receive buffers on this path's connection: with flow
    /// control they become credits to advertise (`rds_ib_advertise_credits`), the first
    /// ones in the connection's private data ([`initial_grant`](Self::initial_grant)).
    ///
    /// Returns true if that asked for an ack (a credit update): the only change a post
    /// makes to what the path has to do (no output, command or timer).
    pub fn handle_recv_posted(&mut self, n: u32, ctx: &mut PathCtx<'_>) -> bool {
        if self.cfg.flavor != Flavor::Message || !self.cfg.flow_control {
            return false;
        }
        self.credits.posted = self.credits.posted.saturating_add(n);
        if self.credits.on && self.credits.posted >= self.credits.update_at() {
            self.request_ack(ctx.stats);
            return true;
        }
        false
    }

    /// The credits to grant in our connection private data (`dp_credit`): every receive
    /// posted so far, if this side wants flow control; they are then advertised.
    pub fn initial_grant(&mut self) -> u32 {
        if self.cfg.flavor != Flavor::Message || !self.cfg.flow_control {
            return 0;
        }
        let granted = core::mem::take(&mut self.credits.posted);
        self.credits.granted = granted;
        granted
    }

    /// The ack to put in our connection private data (`dp_ack_seq`).
    pub fn private_ack(&mut self) -> u64 {
        self.ack.piggyback().0
    }

    /// One received frame of a message transport: `header` is the frame's first 48 bytes
    /// (its header buffer), `payload` the rest (at most 4096 bytes).
    ///
    /// # Errors
    ///
    /// [`RxRefused`] if the message store has no room for it: nothing of the frame was
    /// used; offer it again later.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        header: &[u8],
        payload: &[u8],
        ctx: &mut PathCtx<'_>,
    ) -> Result<(), RxRefused> {
        if !self.state.receives() || self.cfg.flavor != Flavor::Message {
            ctx.stats.recv_ignored_down += 1;
            return Ok(());
        }
        let hdr = match HeaderRepr::parse_bytes(header) {
            Ok(h) => h,
            Err(f) => {
                self.violate(fault_violation(f), ctx);
                return Ok(());
            }
        };
        if payload.len() > FRAG_SIZE {
            self.violate(Violation::BadFragLen, ctx);
            return Ok(());
        }
        let ack_only = hdr.is_ack_only(payload.len());
        if !ack_only {
            let need_record = self.rx.is_none();
            let need_frag = !payload.is_empty();
            if (need_record && !ctx.store.msgs.can_take_data())
                || (need_frag && !ctx.store.frags.can_append())
            {
                ctx.stats.recv_delayed_retry += 1;
                return Err(RxRefused);
            }
        }
        if hdr.flags.unknown() != 0 {
            ctx.stats.recv_unknown_flags += 1;
        }
        // Every frame carries the peer's cumulative ack and may grant credits.
        self.apply_ack(hdr.ack, ctx);
        if hdr.credit != 0 && self.credits.on {
            if self.credits.add(u32::from(hdr.credit)).is_err() {
                self.violate(Violation::BadCredit, ctx);
                return Ok(());
            }
            ctx.stats.ib_rx_credit_updates += 1;
        }
        if ack_only {
            ctx.stats.ib_ack_received += 1;
            return Ok(());
        }
        let mut p = match self.rx {
            None => {
                if payload.len() != (hdr.len as usize).min(FRAG_SIZE) {
                    self.violate(Violation::BadFragLen, ctx);
                    return Ok(());
                }
                let Some(msg) = start_record(ctx.store, &hdr) else {
                    return Err(RxRefused);
                };
                Partial {
                    msg,
                    hdr,
                    rem: hdr.len,
                    filled: 0,
                }
            }
            Some(p) => {
                let h = &p.hdr;
                if hdr.sequence != h.sequence
                    || hdr.len != h.len
                    || hdr.sport != h.sport
                    || hdr.dport != h.dport
                {
                    self.violate(Violation::FragMismatch, ctx);
                    return Ok(());
                }
                if payload.len() != (p.rem as usize).min(FRAG_SIZE) {
                    self.violate(Violation::BadFragLen, ctx);
                    return Ok(());
                }
                p
            }
        };
        if !payload.is_empty() {
            let m = ctx.store.msgs.get_mut(p.msg);
            let mut chain = m.frags;
            let f = ctx.store.frags.append_one(&mut chain).ok_or(RxRefused)?;
            ctx.store.msgs.get_mut(p.msg).frags = chain;
            ctx.store.frags.write(f, 0, payload);
            p.filled += payload.len() as u32;
            p.rem -= payload.len() as u32;
        }
        if p.rem == 0 {
            self.rx = None;
            self.complete(now, p, ctx);
        } else {
            self.rx = Some(p);
        }
        Ok(())
    }

    /// Bytes received on a stream transport, in order. Returns how many were taken: fewer
    /// than given only when the message store is full (offer the rest again later) or the
    /// bytes broke the protocol (the path is then dropped and the rest is of no use).
    pub fn handle_stream_bytes(
        &mut self,
        now: Instant,
        bytes: &[u8],
        ctx: &mut PathCtx<'_>,
    ) -> usize {
        if !self.state.receives() || self.cfg.flavor != Flavor::Stream {
            if !bytes.is_empty() {
                ctx.stats.recv_ignored_down += 1;
            }
            return bytes.len();
        }
        let mut rest = bytes;
        loop {
            match self.stream_rx {
                StreamRx::Header { mut buf, mut have } => {
                    if rest.is_empty() {
                        break;
                    }
                    let n = (HEADER_LEN - have).min(rest.len());
                    buf[have..have + n].copy_from_slice(&rest[..n]);
                    have += n;
                    rest = &rest[n..];
                    if have < HEADER_LEN {
                        self.stream_rx = StreamRx::Header { buf, have };
                        continue;
                    }
                    match HeaderRepr::parse_bytes(&buf) {
                        Ok(h) => {
                            if h.flags.unknown() != 0 {
                                ctx.stats.recv_unknown_flags += 1;
                            }
                            self.stream_rx = StreamRx::NeedRecord(h);
                        }
                        Err(f) => {
                            self.stream_rx = StreamRx::default();
                            self.violate(fault_violation(f), ctx);
                            return bytes.len() - rest.len();
                        }
                    }
                }
                StreamRx::NeedRecord(h) => {
                    let Some(msg) = start_record(ctx.store, &h) else {
                        ctx.stats.recv_delayed_retry += 1;
                        break;
                    };
                    self.stream_rx = StreamRx::Data(Partial {
                        msg,
                        hdr: h,
                        rem: h.len,
                        filled: 0,
                    });
                }
                StreamRx::Data(mut p) => {
                    if p.rem == 0 {
                        self.stream_rx = StreamRx::default();
                        self.complete(now, p, ctx);
                        if !self.state.receives() {
                            return bytes.len() - rest.len();
                        }
                        continue;
                    }
                    if rest.is_empty() {
                        break;
                    }
                    let off = p.filled as usize % FRAG_SIZE;
                    let mut chain = ctx.store.msgs.get(p.msg).frags;
                    let f = if off == 0 {
                        match ctx.store.frags.append_one(&mut chain) {
                            Some(f) => {
                                ctx.store.msgs.get_mut(p.msg).frags = chain;
                                f
                            }
                            None => {
                                ctx.stats.recv_delayed_retry += 1;
                                break;
                            }
                        }
                    } else {
                        chain.last().expect("a partly filled fragment exists")
                    };
                    let n = (FRAG_SIZE - off).min(p.rem as usize).min(rest.len());
                    ctx.store.frags.write(f, off, &rest[..n]);
                    p.filled += n as u32;
                    p.rem -= n as u32;
                    rest = &rest[n..];
                    self.stream_rx = StreamRx::Data(p);
                }
            }
        }
        bytes.len() - rest.len()
    }

    /// A message arrived whole: congestion maps are handed over as they are; everything
    /// else goes through the sequence rules, then to the engine; acks are requested or
    /// scheduled.
    fn complete(&mut self, now: Instant, p: Partial, ctx: &mut PathCtx<'_>) {
        let hdr = p.hdr;
        let store = &mut *ctx.store;
        if hdr.flags.is_cong_map() {
            if hdr.len as usize != CONG_MAP_BYTES {
                if self.cfg.flavor == Flavor::Stream {
                    store.free_now(p.msg);
                    self.violate(Violation::BadCong, ctx);
                    return;
                }
                // rds_ib_cong_recv: "catch completely corrupt packets", ignored.
                ctx.stats.recv_cong_bad_len += 1;
                store.free_now(p.msg);
            } else {
                let m = store.msgs.get_mut(p.msg);
                m.set(Msg::CONG_MAP);
                m.conn = self.id.conn;
                m.path = self.id.index;
                store.msgs.push_back(&mut self.rx_done, Lane::Conn, p.msg);
            }
        } else if hdr.flags.contains(Flags::CONG_BITMAP) {
            // A congestion bit with other flags: the kernel would take it for a ping from
            // port 0 and rewind its sequence to 1. No sender makes one.
            store.free_now(p.msg);
            self.violate(Violation::BadCong, ctx);
            return;
        } else {
            let seq = hdr.sequence;
            let retransmitted = hdr.flags.contains(Flags::RETRANSMITTED);
            if seq == 0 || seq == u64::MAX {
                store.free_now(p.msg);
                self.violate(Violation::BadSeq, ctx);
                return;
            }
            if seq < self.next_rx_seq && retransmitted {
                ctx.stats.recv_drop_old_seq += 1;
                store.free_now(p.msg);
            } else {
                if seq < self.next_rx_seq {
                    // Backwards without RETRANSMITTED: a restarted peer starting over; taken
                    // as the kernel takes it (refusing it would make later honest messages
                    // look old after a reset), and counted.
                    ctx.stats.recv_seq_rewind += 1;
                }
                self.next_rx_seq = seq + 1;
                let m = store.msgs.get_mut(p.msg);
                m.conn = self.id.conn;
                m.path = self.id.index;
                store.msgs.push_back(&mut self.rx_done, Lane::Conn, p.msg);
            }
            self.ack.next = seq;
        }
        if hdr.flags.contains(Flags::ACK_REQUIRED) {
            ctx.stats.recv_ack_required += 1;
            self.request_ack(ctx.stats);
        } else if self.cfg.flavor == Flavor::Message
            && self.ack.owed()
            && self.timers.get(Timer::DelayedAck).is_none()
            && let Some(d) = self.cfg.delayed_ack
        {
            self.timers.set(Timer::DelayedAck, now.saturating_add(d));
        }
        // A whole, valid message from the peer's RDS on this stream (its congestion map
        // comes first on a new connection): the connection is its, and the reconnect
        // backoff closes (see `handle_connected`).
        if self.cfg.flavor == Flavor::Stream {
            self.backoff.reset();
        }
    }
}
