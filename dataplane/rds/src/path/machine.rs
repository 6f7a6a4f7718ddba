//! [`Path`]: the state of one connection path and its lifecycle inputs (connect, connected,
//! failed, dropped, torn down, timers). Transmit is in `tx.rs`, receive in `rx.rs`.

use std::collections::VecDeque;

use lcore::time::Instant;

use super::backoff::Backoff;
use super::config::{ConnectRule, Flavor, PathConfig};
use super::credit::{CREDIT_LIMIT, Credits};
use super::frame::{FrameKind, PathCmd, PathId};
use super::state::{AckState, ConnState, Partial, PathCtx, StreamRx, Timer, TimerTable};
use crate::addr::Addr;
use crate::stats::Stats;
use crate::store::{Lane, List, Msg, MsgId, RdmaOp, Store};

/// Why a path reset itself: the first protocol violation a peer committed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A frame shorter than a header.
    Truncated,
    /// A header checksum that does not verify.
    BadChecksum,
    /// `h_len` above 1 MiB.
    LenTooLarge,
    /// A fragment whose sequence, length or ports differ from its message's first.
    FragMismatch,
    /// A fragment of the wrong size.
    BadFragLen,
    /// An impossible sequence number.
    BadSeq,
    /// Credits beyond any receive ring.
    BadCredit,
    /// A malformed congestion update.
    BadCong,
}

impl Violation {
    /// A static description.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Truncated => "frame shorter than the 48-byte RDS header",
            Self::BadChecksum => "RDS header checksum does not verify",
            Self::LenTooLarge => "h_len above the 1 MiB message limit",
            Self::FragMismatch => "fragment header differs from its message's first fragment",
            Self::BadFragLen => "fragment payload of the wrong size",
            Self::BadSeq => "impossible sequence number",
            Self::BadCredit => "credit grant beyond any receive ring",
            Self::BadCong => "malformed congestion-map update",
        }
    }

    fn count(self, s: &mut Stats) {
        let c = match self {
            Self::Truncated => &mut s.recv_drop_truncated,
            Self::BadChecksum => &mut s.recv_drop_bad_checksum,
            Self::LenTooLarge => &mut s.recv_drop_bad_len,
            Self::FragMismatch => &mut s.recv_drop_frag_mismatch,
            Self::BadFragLen => &mut s.recv_drop_bad_frag_len,
            Self::BadSeq => &mut s.recv_drop_bad_seq,
            Self::BadCredit => &mut s.recv_drop_bad_credit,
            Self::BadCong => &mut s.recv_drop_bad_cong,
        };
        *c += 1;
        s.conn_violation += 1;
    }
}

/// What the peer's connection setup carried (RDS-IB private data; zeros on TCP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerParams {
    /// Initial credits the peer granted (`dp_credit`); non-zero enables flow control.
    pub credits: u32,
    /// The last sequence number the peer received from us (`dp_ack_seq`), applied as an
    /// ack.
    pub ack_seq: u64,
}

/// State changes the engine reacts to (drained by [`Path::take_events`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathEvents {
    /// The path came up.
    pub up: bool,
    /// The path went down (and its unacked messages were queued for retransmission).
    pub down: bool,
}

/// The message being transmitted (`cp_xmit_rm` and its cursor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Xmit {
    pub(super) msg: MsgId,
    /// Wire fragments already handed out.
    pub(super) sent: u32,
    /// Wire fragments in all.
    pub(super) total: u32,
}

/// A frame handed to the transport, not completed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InFlight {
    pub(super) token: u64,
    pub(super) msg: Option<MsgId>,
    pub(super) kind: FrameKind,
}

/// One path of an RDS connection, as a sans-IO state machine (see the module doc of
/// [`crate::path`] for the inputs, the outputs and the order to call them in).
#[derive(Debug)]
pub struct Path {
    pub(super) id: PathId,
    pub(super) cfg: PathConfig,
    pub(super) laddr: Addr,
    pub(super) faddr: Addr,
    pub(super) state: ConnState,
    pub(super) instance: u64,
    // Sequence numbers.
    pub(super) next_tx_seq: u64,
    pub(super) next_rx_seq: u64,
    pub(super) max_sent_seq: u64,
    // Send side.
    pub(super) send_q: List,
    pub(super) retrans_q: List,
    pub(super) xmit: Option<Xmit>,
    pub(super) unacked_packets: u32,
    pub(super) unacked_bytes: u32,
    pub(super) inflight: VecDeque<InFlight>,
    pub(super) next_token: u64,
    pub(super) data_in_flight: u32,
    pub(super) tx_stream_off: u64,
    pub(super) tx_hold: bool,
    // Receive side.
    pub(super) rx: Option<Partial>,
    pub(super) stream_rx: StreamRx,
    pub(super) ack: AckState,
    pub(super) credits: Credits,
    // Lifecycle.
    pub(super) backoff: Backoff,
    pub(super) reconnect_pending: bool,
    pub(super) timers: TimerTable,
    pub(super) cmd_connect: bool,
    pub(super) cmd_disconnect: bool,
    pub(super) events: PathEvents,
    pub(super) violation: Option<Violation>,
    pub(super) pending_peer: PeerParams,
    // Hand-offs to the engine (Lane::Conn lists).
    pub(super) rx_done: List,
    pub(super) released: List,
    pub(super) dropped: List,
    /// RDMA operations done since the last call: (socket slot, the operation).
    pub(super) rdma_done: Vec<(u32, RdmaOp)>,
}

impl Path {
    /// A path in state Down. `laddr`/`faddr` decide who dials under
    /// [`ConnectRule::LowerAddress`].
    pub fn new(id: PathId, cfg: PathConfig, laddr: Addr, faddr: Addr) -> Self {
        let depth = cfg.send_depth.max(1);
        Self {
            id,
            cfg: PathConfig {
                send_depth: depth,
                ..cfg
            },
            laddr,
            faddr,
            state: ConnState::Down,
            instance: 0,
            next_tx_seq: 1,
            next_rx_seq: 0,
            max_sent_seq: 0,
            send_q: List::new(),
            retrans_q: List::new(),
            xmit: None,
            unacked_packets: 0,
            unacked_bytes: 0,
            inflight: VecDeque::with_capacity(depth as usize + 1),
            next_token: 1,
            data_in_flight: 0,
            tx_stream_off: 0,
            tx_hold: false,
            rx: None,
            stream_rx: StreamRx::default(),
            ack: AckState::default(),
            credits: Credits::default(),
            backoff: Backoff::default(),
            reconnect_pending: false,
            timers: TimerTable::default(),
            cmd_connect: false,
            cmd_disconnect: false,
            events: PathEvents::default(),
            violation: None,
            pending_peer: PeerParams::default(),
            rx_done: List::new(),
            released: List::new(),
            dropped: List::new(),
            rdma_done: Vec::with_capacity(cfg.send_depth as usize + 1),
        }
    }

    // ---- getters ----

    /// The path's id.
    pub fn id(&self) -> PathId {
        self.id
    }
    /// The configuration.
    pub fn config(&self) -> &PathConfig {
        &self.cfg
    }
    /// The connection state.
    pub fn state(&self) -> ConnState {
        self.state
    }
    /// True in state Up.
    pub fn is_up(&self) -> bool {
        self.state == ConnState::Up
    }
    /// The next sequence number a queued message gets (`cp_next_tx_seq`).
    pub fn next_tx_seq(&self) -> u64 {
        self.next_tx_seq
    }
    /// The sequence number after the last one received (`cp_next_rx_seq`).
    pub fn next_rx_seq(&self) -> u64 {
        self.next_rx_seq
    }
    /// Connections this path has made (each one a new "instance").
    pub fn instance(&self) -> u64 {
        self.instance
    }
    /// Messages waiting to be transmitted.
    pub fn send_queue_len(&self) -> u32 {
        self.send_q.len()
    }
    /// Messages transmitted and not acked.
    pub fn retrans_queue_len(&self) -> u32 {
        self.retrans_q.len()
    }
    /// The send queue (for `RDS_INFO_SEND_MESSAGES`-style listings).
    pub fn send_queue(&self) -> &List {
        &self.send_q
    }
    /// The retransmit queue.
    pub fn retrans_queue(&self) -> &List {
        &self.retrans_q
    }
    /// Frames handed to the transport and not completed.
    pub fn frames_in_flight(&self) -> usize {
        self.inflight.len()
    }
    /// Flow control state: (on, send credits, posted credits not advertised).
    pub fn credits(&self) -> (bool, u32, u32) {
        (self.credits.on, self.credits.send, self.credits.posted)
    }
    /// True while a message is being transmitted (fragments remain).
    pub fn is_sending(&self) -> bool {
        self.xmit.is_some()
    }
    /// The ack state (what was received, what was sent, what is requested).
    pub fn ack_state(&self) -> AckState {
        self.ack
    }
    /// Highest sequence number whose frames were all handed to the transport.
    pub fn max_sent_seq(&self) -> u64 {
        self.max_sent_seq
    }
    /// The violation that last reset this path, if any.
    pub fn last_violation(&self) -> Option<Violation> {
        self.violation
    }
    /// The current reconnect backoff window (zero when closed).
    pub fn backoff_window(&self) -> std::time::Duration {
        self.backoff.window()
    }

    // ---- outputs ----

    /// The next request for the transport, if any.
    pub fn poll_cmd(&mut self) -> Option<PathCmd> {
        if self.cmd_disconnect {
            self.cmd_disconnect = false;
            if self.state == ConnState::Error {
                self.state = ConnState::Disconnecting;
            }
            return Some(PathCmd::Disconnect);
        }
        if self.cmd_connect {
            self.cmd_connect = false;
            return Some(PathCmd::Connect);
        }
        None
    }

    /// True if [`poll_cmd`](Self::poll_cmd) has something.
    pub fn has_cmd(&self) -> bool {
        self.cmd_connect || self.cmd_disconnect
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// State changes since the last call.
    pub fn take_events(&mut self) -> PathEvents {
        core::mem::take(&mut self.events)
    }

    /// True if a `take_*` call has something to hand over (received, released, dropped
    /// messages, finished RDMA operations, state changes): the engine's cheap look after
    /// every input, which finds nothing after most of them.
    pub fn has_output(&self) -> bool {
        !self.rx_done.is_empty()
            || !self.released.is_empty()
            || !self.dropped.is_empty()
            || !self.rdma_done.is_empty()
            || self.events.up
            || self.events.down
    }

    /// Messages received whole since the last call, in order (`Lane::Conn` list): data,
    /// pings, pongs, probes and congestion maps ([`Msg::CONG_MAP`]). The caller now owns
    /// them.
    pub fn take_received(&mut self) -> List {
        core::mem::take(&mut self.rx_done)
    }

    /// Sent messages the peer acked since the last call (`Lane::Conn` list). The caller
    /// releases them from their sockets ([`Msg::ON_CONN`] is already clear).
    pub fn take_released(&mut self) -> List {
        core::mem::take(&mut self.released)
    }

    /// RDMA operations whose message's frames all completed since the last call (the
    /// operation completed before them): (socket slot, operation), for
    /// `RDS_CMSG_RDMA_STATUS` at completion as the kernel reports it. Drained into `out`.
    pub fn take_rdma_done(&mut self, out: &mut Vec<(u32, RdmaOp)>) {
        if self.rdma_done.is_empty() {
            return;
        }
        out.append(&mut self.rdma_done);
    }

    /// Sent messages dropped without an ack since the last call: flushed because the peer
    /// restarted, or RDMA operations that may not be retransmitted (`RDS_RDMA_DROPPED`).
    pub fn take_dropped(&mut self) -> List {
        core::mem::take(&mut self.dropped)
    }

    // ---- lifecycle inputs ----

    /// `rds_conn_path_connect_if_down`: something wants this path up. Queues a dial at once
    /// unless one is pending.
    pub fn connect_if_down(&mut self, now: Instant) {
        if self.state == ConnState::Down && !self.reconnect_pending {
            self.reconnect_pending = true;
            self.timers.set(Timer::Reconnect, now);
        }
    }

    /// `rds_queue_reconnect`: after a failure or a drop, dial again after a randomised,
    /// growing delay (not at all on the higher address of a lower-address transport).
    fn queue_reconnect(&mut self, now: Instant, ctx: &mut PathCtx<'_>) {
        if self.cfg.connect_rule == ConnectRule::LowerAddress && self.laddr >= self.faddr {
            return;
        }
        self.reconnect_pending = true;
        let at = self
            .backoff
            .next(now, self.cfg.reconnect_min, self.cfg.reconnect_max, ctx.rng);
        self.timers.set(Timer::Reconnect, at);
    }

    /// Entering Connecting on a message transport: the connection must be established
    /// before [`PathConfig::connect_timeout`] passes.
    fn arm_connect_timeout(&mut self, now: Instant) {
        if self.cfg.flavor == Flavor::Message
            && let Some(d) = self.cfg.connect_timeout
        {
            self.timers.set(Timer::Connect, now.saturating_add(d));
        }
    }

    /// Timers due at `now` fire; spurious calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant, ctx: &mut PathCtx<'_>) {
        if self.timers.is_due(Timer::Reconnect, now) {
            self.timers.stop(Timer::Reconnect);
            // rds_connect_worker: paths above 0 are only dialled by the lower address.
            if self.id.index > 0 && self.laddr >= self.faddr {
                return;
            }
            self.reconnect_pending = false;
            if self.state == ConnState::Down {
                self.state = ConnState::Connecting;
                self.cmd_connect = true;
                self.arm_connect_timeout(now);
            }
        }
        if self.timers.is_due(Timer::Connect, now) {
            self.timers.stop(Timer::Connect);
            if self.state == ConnState::Connecting {
                ctx.stats.conn_connect_timeout += 1;
                self.drop_path(ctx.stats);
            }
        }
        if self.timers.is_due(Timer::DelayedAck, now) {
            self.timers.stop(Timer::DelayedAck);
            if self.ack.owed() && self.state == ConnState::Up {
                ctx.stats.delayed_ack_fired += 1;
                self.request_ack(ctx.stats);
            }
        }
    }

    /// The passive side: the peer dials this path. Returns true to accept.
    ///
    /// Message transports (`rds_ib_cm_handle_connect`): accepted only from Down (then
    /// Connecting); while Connecting it is refused ("wait and see", `ib_connect_raced`),
    /// while Up the existing connection is dropped as stale and the request refused
    /// (`ib_listen_closed_stale`), so the peer's backoff retries against a clean path.
    /// Stream transports accept over a live or connecting path by resetting it
    /// (Resetting, `rds_tcp_reset_callbacks`): the transport replaces its socket.
    pub fn handle_incoming(&mut self, now: Instant, ctx: &mut PathCtx<'_>) -> bool {
        match (self.cfg.flavor, self.state) {
            (_, ConnState::Down) => {
                self.state = ConnState::Connecting;
                self.timers.stop(Timer::Reconnect);
                self.reconnect_pending = false;
                self.arm_connect_timeout(now);
                true
            }
            (Flavor::Message, ConnState::Connecting) => {
                ctx.stats.ib_connect_raced += 1;
                false
            }
            (Flavor::Message, ConnState::Up) => {
                ctx.stats.ib_listen_closed_stale += 1;
                self.drop_path(ctx.stats);
                false
            }
            (Flavor::Stream, ConnState::Up | ConnState::Connecting) => {
                self.reset(ctx);
                ctx.stats.conn_reset += 1;
                self.state = ConnState::Resetting;
                let _ = now;
                true
            }
            _ => false,
        }
    }

    /// The connection is established (`rds_connect_path_complete`): Up, with the peer's
    /// setup parameters applied. A congestion-map update is queued so the peer learns the
    /// full map first. From any state but Connecting or Resetting this is a transport bug
    /// and drops the path.
    pub fn handle_connected(&mut self, now: Instant, peer: PeerParams, ctx: &mut PathCtx<'_>) {
        if !matches!(self.state, ConnState::Connecting | ConnState::Resetting) {
            self.drop_path(ctx.stats);
            return;
        }
        let _ = now;
        self.state = ConnState::Up;
        self.instance += 1;
        // A message transport's connection is the peer's RDS accepting it (its CM
        // answer), so the backoff closes now. A stream transport's is only the peer's
        // TCP: a kernel whose path is still going down accepts the TCP connection and
        // resets it at once (`rds_tcp_accept_one`), so closing the backoff here made
        // every such redial go out at once (the kernel lab saw 164 connections lost for
        // 2 kills). On a stream the backoff closes when the peer's first message arrives
        // (`complete`): its RDS took the connection.
        if self.cfg.flavor == Flavor::Message {
            self.backoff.reset();
        }
        self.timers.stop(Timer::Reconnect);
        self.timers.stop(Timer::Connect);
        self.reconnect_pending = false;
        self.tx_stream_off = 0;
        self.stream_rx = StreamRx::default();
        self.ack.in_flight = false;
        *ctx.map_queued = true;
        self.credits.on =
            self.cfg.flavor == Flavor::Message && self.cfg.flow_control && peer.credits != 0;
        self.credits.send = 0;
        self.credits.send_full = false;
        if !self.credits.on {
            self.credits.posted = 0;
        }
        if self.credits.on {
            if peer.credits > CREDIT_LIMIT {
                self.violate(Violation::BadCredit, ctx);
                return;
            }
            self.credits.send = peer.credits;
        }
        if peer.ack_seq != 0 {
            self.apply_ack(peer.ack_seq, ctx);
        }
        self.events.up = true;
    }

    /// The transport could not start or complete a dial: back to Down, and dial again
    /// after the backoff.
    pub fn handle_connect_failed(&mut self, now: Instant, ctx: &mut PathCtx<'_>) {
        if matches!(self.state, ConnState::Connecting | ConnState::Resetting) {
            self.state = ConnState::Down;
            self.timers.stop(Timer::Connect);
            self.queue_reconnect(now, ctx);
        }
    }

    /// The transport failed (error completion, disconnect event, peer gone): the path is
    /// dropped (`rds_conn_path_drop`) and a [`PathCmd::Disconnect`] follows.
    ///
    /// Ignored while Resetting: the connection being replaced is the driver's to discard
    /// (`rds_tcp_reset_callbacks` detaches the old socket before closing it), and the new
    /// one reports through `handle_connected` or `handle_connect_failed`.
    pub fn handle_transport_error(&mut self, ctx: &mut PathCtx<'_>) {
        if !matches!(
            self.state,
            ConnState::Down | ConnState::Disconnecting | ConnState::Resetting
        ) {
            self.drop_path(ctx.stats);
        }
    }

    /// Drops the path from the protocol side (as the transport's error would).
    pub fn drop_path(&mut self, stats: &mut Stats) {
        if self.state != ConnState::Error {
            self.state = ConnState::Error;
            self.timers.stop(Timer::Connect);
            self.cmd_disconnect = true;
            self.cmd_connect = false;
            stats.conn_reset += 1;
        }
    }

    pub(super) fn violate(&mut self, v: Violation, ctx: &mut PathCtx<'_>) {
        v.count(ctx.stats);
        self.violation = Some(v);
        self.drop_path(ctx.stats);
    }

    /// The transport finished tearing down (nothing it was given will complete any more):
    /// the shutdown worker's second half. Frames in flight are forgotten, unacked messages
    /// go back to the front of the send queue marked RETRANSMITTED, the path goes Down and
    /// a reconnect is queued.
    pub fn handle_transport_down(&mut self, now: Instant, ctx: &mut PathCtx<'_>) {
        if self.state == ConnState::Down {
            return;
        }
        if !matches!(self.state, ConnState::Error | ConnState::Disconnecting) {
            ctx.stats.conn_reset += 1;
        }
        self.cmd_disconnect = false;
        self.reset(ctx);
        self.timers.stop(Timer::Connect);
        self.state = ConnState::Down;
        self.events.down = true;
        self.queue_reconnect(now, ctx);
    }

    /// `rds_send_path_reset` and the transport's ring teardown: forget frames in flight,
    /// stop the current message, move every unacked message back in front of the send
    /// queue (ACK_REQUIRED + RETRANSMITTED), drop partial receives, and clear the credit,
    /// ack and map-update state of the dead connection.
    pub(super) fn reset(&mut self, ctx: &mut PathCtx<'_>) {
        let store = &mut *ctx.store;
        while let Some(f) = self.inflight.pop_front() {
            if let Some(id) = f.msg {
                let m = store.msgs.get_mut(id);
                m.in_flight = m.in_flight.saturating_sub(1);
                store.release_if_unused(id);
            }
        }
        self.data_in_flight = 0;
        if let Some(x) = self.xmit.take() {
            finish_xmit(store, x.msg);
        }
        *ctx.map_queued = false;
        self.unacked_packets = self.cfg.max_unacked_packets;
        self.unacked_bytes = self.cfg.max_unacked_bytes;
        let mut at = self.retrans_q.front();
        while let Some(id) = at {
            at = store.msgs.next(Lane::Conn, id);
            let m = store.msgs.get_mut(id);
            m.set(Msg::ACK_REQUIRED | Msg::RETRANSMITTED);
            m.clear(Msg::ON_RETRANS | Msg::HAS_ACK_SEQ);
        }
        store
            .msgs
            .splice_front(&mut self.send_q, &mut self.retrans_q, Lane::Conn);
        if let Some(p) = self.rx.take() {
            store.free_now(p.msg);
        }
        if let StreamRx::Data(p) = self.stream_rx {
            store.free_now(p.msg);
        }
        self.stream_rx = StreamRx::default();
        self.credits = Credits::default();
        // As rds_ib_conn_path_shutdown: the new connection acks only what arrives on it
        // (retransmitted duplicates included), and the peer's acks start from 0.
        self.ack = AckState::default();
        self.timers.stop(Timer::DelayedAck);
        self.tx_stream_off = 0;
    }

    /// `rds_conn_peer_gen_update` for this path: the peer restarted, so sequence numbers
    /// start over (tx from 1, rx from 0) and what it had not acked is dropped rather than
    /// resent (`RDS_MSG_FLUSH`).
    pub fn peer_restarted(&mut self, ctx: &mut PathCtx<'_>) {
        self.next_tx_seq = 1;
        self.next_rx_seq = 0;
        self.max_sent_seq = 0;
        self.ack = AckState {
            in_flight: self.ack.in_flight,
            ..AckState::default()
        };
        let mut at = self.retrans_q.front();
        while let Some(id) = at {
            at = ctx.store.msgs.next(Lane::Conn, id);
            ctx.store.msgs.get_mut(id).set(Msg::FLUSH);
        }
    }

    /// Keeps what the peer's connect request carried (passive side of a message
    /// transport) until the connection is established.
    pub fn set_pending_peer(&mut self, peer: PeerParams) {
        self.pending_peer = peer;
    }

    /// The initial credits the peer's request granted (0 before one arrived).
    pub fn pending_peer_credits(&self) -> u32 {
        self.pending_peer.credits
    }

    /// Takes what [`set_pending_peer`](Self::set_pending_peer) kept.
    pub fn take_pending_peer(&mut self) -> PeerParams {
        core::mem::take(&mut self.pending_peer)
    }

    /// Holds (or releases) transmission on this path: the multipath catch-up rule keeps
    /// paths above 0 quiet until path 0 has sent what was queued before the fan-out.
    pub fn set_tx_hold(&mut self, hold: bool) {
        self.tx_hold = hold;
    }

    /// True while transmission is held.
    pub fn tx_held(&self) -> bool {
        self.tx_hold
    }

    /// Asks for an ack to go out (counting a postponement if one is in flight).
    pub(super) fn request_ack(&mut self, stats: &mut Stats) {
        if self.cfg.flavor != Flavor::Message {
            return;
        }
        if self.ack.in_flight && !self.ack.requested {
            stats.ib_ack_send_delayed += 1;
        }
        self.ack.requested = true;
    }

    /// Applies a cumulative ack from the peer (`rds_send_drop_acked`): every message at the
    /// front of the retransmit queue with a sequence number at or below `ack` is released.
    /// An ack beyond anything this path has transmitted is a stale or hostile value: it is
    /// counted and ignored (it must not release messages never sent).
    pub(super) fn apply_ack(&mut self, ack: u64, ctx: &mut PathCtx<'_>) {
        if ack > self.max_sent_seq {
            ctx.stats.recv_drop_bad_ack += 1;
            return;
        }
        if ack <= self.ack.recv {
            return;
        }
        self.ack.recv = ack;
        self.release_front(ctx, |m| m.seq <= ack);
    }

    /// Releases messages from the front of the retransmit queue while `acked` says so.
    pub(super) fn release_front(&mut self, ctx: &mut PathCtx<'_>, acked: impl Fn(&Msg) -> bool) {
        let store = &mut *ctx.store;
        while let Some(id) = self.retrans_q.front() {
            if !acked(store.msgs.get(id)) {
                break;
            }
            store.msgs.remove(&mut self.retrans_q, Lane::Conn, id);
            let m = store.msgs.get_mut(id);
            m.clear(Msg::ON_CONN | Msg::ON_RETRANS);
            store.msgs.push_back(&mut self.released, Lane::Conn, id);
            ctx.stats.send_drop_acked += 1;
        }
    }
}

/// The transmit cursor lets go of a message: one that is on no queue any more (a
/// congestion update, or a send cancelled while being transmitted) is freed once its
/// frames complete; a data message stays on whatever queue holds it.
pub(super) fn finish_xmit(store: &mut Store, id: MsgId) {
    store.msgs.get_mut(id).clear(Msg::IN_XMIT);
    store.release_if_unused(id);
}
