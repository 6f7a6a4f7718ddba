//! The state a path is made of: its connection state, its timers, its ack state, its
//! reassembly state, and what it borrows from its engine for a call ([`PathCtx`]).
//!
//! # Connection states (`enum rds_conn_state`, with the kernel's values)
//!
//! | from | to | when |
//! |---|---|---|
//! | Down | Connecting | the reconnect timer fires (we dial), or a peer's connect is accepted |
//! | Connecting | Up | the transport reports the connection established |
//! | Resetting | Up | a stream transport's accept replaced the connection |
//! | Connecting | Down | the transport could not start the connect (then a reconnect is queued) |
//! | Connecting | Error | a message transport's connection was not established within `connect_timeout` |
//! | any | Error | a drop: transport failure, protocol violation, stale connection |
//! | Error | Disconnecting | the transport was told to tear the connection down |
//! | Disconnecting | Down | the transport finished: queues reset for retransmit, reconnect queued |
//!
//! Data is transmitted only in Up; received frames are processed in Connecting and Up (a
//! receive can complete before the connection-established event).

use lcore::time::Instant;

use crate::rng::Rng;
use crate::stats::Stats;
use crate::store::{MsgId, Store};
use crate::wire::{CongMap, HEADER_LEN, HeaderRepr};

/// A path's connection state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Not connected (`RDS_CONN_DOWN`).
    Down = 0,
    /// Connecting (`RDS_CONN_CONNECTING`).
    Connecting = 1,
    /// Being torn down (`RDS_CONN_DISCONNECTING`).
    Disconnecting = 2,
    /// Connected (`RDS_CONN_UP`).
    Up = 3,
    /// A stream transport is replacing the connection (`RDS_CONN_RESETTING`).
    Resetting = 4,
    /// Dropped, waiting for teardown (`RDS_CONN_ERROR`).
    Error = 5,
}

impl ConnState {
    /// The state's name as the kernel spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Down => "DOWN",
            Self::Connecting => "CONNECTING",
            Self::Disconnecting => "DISCONNECTING",
            Self::Up => "UP",
            Self::Resetting => "RESETTING",
            Self::Error => "ERROR",
        }
    }

    /// True if received frames are processed.
    pub const fn receives(self) -> bool {
        matches!(self, Self::Connecting | Self::Up)
    }
}

// --------------------------------------------------------------------------------------
// A path's timers: a table indexed by [`Timer`] (house style: timers are data).
// --------------------------------------------------------------------------------------

/// The timers of a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// Dial (again): the connect worker (`cp_conn_w`).
    Reconnect = 0,
    /// Send the ack of received messages that did not ask for one.
    DelayedAck = 1,
    /// A Connecting path gives up on its connection ([`PathConfig::connect_timeout`](super::PathConfig)).
    Connect = 2,
}

impl Timer {
    /// Every timer, in table order.
    pub const ALL: [Self; 3] = [Self::Reconnect, Self::DelayedAck, Self::Connect];
}

/// Deadlines by timer; `None` = not armed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerTable([Option<Instant>; 3]);

impl TimerTable {
    /// Arms `t` at `at` (replacing an earlier deadline).
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.0[t as usize] = Some(at);
    }
    /// Disarms `t`.
    pub fn stop(&mut self, t: Timer) {
        self.0[t as usize] = None;
    }
    /// The deadline of `t`.
    pub fn get(&self, t: Timer) -> Option<Instant> {
        self.0[t as usize]
    }
    /// True if `t` is armed and due at `now`.
    pub fn is_due(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|at| at <= now)
    }
    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
}

// --------------------------------------------------------------------------------------
// The receive side's ack state (`i_ack_next`, `IB_ACK_REQUESTED`, `IB_ACK_IN_FLIGHT`) and
// --------------------------------------------------------------------------------------

/// Ack state of a path (message flavour; a stream transport acks through its own bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckState {
    /// Sequence number of the last message received whole (`i_ack_next`), dropped
    /// duplicates included: a retransmission must be acked again.
    pub next: u64,
    /// The ack value last put on the wire (piggybacked or ACK-only).
    pub sent: u64,
    /// An ack must go out (`IB_ACK_REQUESTED`).
    pub requested: bool,
    /// The ACK-only frame is in flight (`IB_ACK_IN_FLIGHT`): never more than one.
    pub in_flight: bool,
    /// The highest ack the peer sent that was applied (`i_ack_recv`).
    pub recv: u64,
}

impl AckState {
    /// The value to piggyback on an outgoing frame (`rds_ib_piggyb_ack`): clears the
    /// request. Returns (value, true if a request was pending).
    pub fn piggyback(&mut self) -> (u64, bool) {
        let was = self.requested;
        self.requested = false;
        self.sent = self.next;
        (self.next, was)
    }

    /// True if the peer has not been told about the last received message yet.
    pub fn owed(&self) -> bool {
        self.next != self.sent
    }
}

// --------------------------------------------------------------------------------------
// Receive reassembly state: one message at a time per path, as RDS sends them.
// --------------------------------------------------------------------------------------

/// A message being received (message flavour: fragment by fragment; stream flavour: byte
/// run by byte run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    /// Its record (payload fragments are appended to it).
    pub msg: MsgId,
    /// The first fragment's header: later fragments must match its sequence, length and
    /// ports.
    pub hdr: HeaderRepr,
    /// Payload bytes still to come.
    pub rem: u32,
    /// Payload bytes stored.
    pub filled: u32,
}

/// The byte-stream receiver (`t_tinc_hdr_rem`, `t_tinc_data_rem` of RDS-TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamRx {
    /// Collecting a header.
    Header {
        /// Bytes so far.
        buf: [u8; HEADER_LEN],
        /// How many.
        have: usize,
    },
    /// A header is complete but no record could be taken for it yet (store full).
    NeedRecord(HeaderRepr),
    /// Collecting a message's payload.
    Data(Partial),
}

impl Default for StreamRx {
    fn default() -> Self {
        Self::Header {
            buf: [0; HEADER_LEN],
            have: 0,
        }
    }
}

// --------------------------------------------------------------------------------------
// What a path borrows from its engine for one call.
// --------------------------------------------------------------------------------------

/// The engine's shared state a path works on: message memory, counters, randomness, and
/// its connection's congestion state.
#[derive(Debug)]
pub struct PathCtx<'a> {
    /// Message memory.
    pub store: &'a mut Store,
    /// Counters.
    pub stats: &'a mut Stats,
    /// Randomness (reconnect backoff).
    pub rng: &'a mut Rng,
    /// The connection's local congestion map (what a map update sends).
    pub local_map: &'a CongMap,
    /// The connection's pending map update (`c_map_queued`): set when the local map
    /// changed or a path came up; the first path to transmit between messages sends the map
    /// and clears it.
    pub map_queued: &'a mut bool,
}
