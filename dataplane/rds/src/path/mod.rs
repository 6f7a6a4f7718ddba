//! One path of an RDS connection as a sans-IO state machine ([`Path`]).
//!
//! A connection between two addresses has one path, or up to eight on a multipath stream
//! transport; each path is one transport connection with its own sequence spaces, send
//! and retransmit queues, acks and credits (`struct rds_conn_path`). The path performs no
//! I/O and reads no clock: the engine (or a test) drives it.
//!
//! # Inputs
//!
//! * lifecycle: [`Path::connect_if_down`], [`Path::handle_connected`],
//!   [`Path::handle_connect_failed`], [`Path::handle_incoming`] (the peer dials),
//!   [`Path::handle_transport_error`], [`Path::handle_transport_down`],
//!   [`Path::handle_timeout`];
//! * received data: [`Path::handle_frame`] (message transports: one frame = header +
//!   at most 4 KiB), [`Path::handle_stream_bytes`] (stream transports);
//! * transmit progress: [`Path::handle_send_complete`] (frames done, cumulative),
//!   [`Path::handle_stream_acked`] (stream bytes acknowledged by the peer),
//!   [`Path::handle_recv_posted`] (receive buffers posted: credits);
//! * messages: [`Path::queue`], [`Path::cancel`].
//!
//! # Outputs, in the order to take them after a batch of inputs
//!
//! 1. [`Path::take_received`], [`Path::take_released`], [`Path::take_dropped`],
//!    [`Path::take_events`]: what the engine must route (deliveries, acked sends, dropped
//!    sends, up/down);
//! 2. [`Path::poll_cmd`]: connect or disconnect the transport;
//! 3. [`Path::poll_transmit`] until `None`: frames for the transport;
//! 4. [`Path::poll_timeout`]: when to call [`Path::handle_timeout`].
//!
//! # The two flavours
//!
//! [`Flavor::Message`] is RDS-IB's protocol: every fragment carries a header with a
//! piggybacked ack and credits, an ACK-only frame acks when no data flows (one in flight
//! at a time), credits bound what may be sent, and headers are checksummed.
//! [`Flavor::Stream`] is RDS-TCP's: a header per message, acks from the transport's byte
//! acknowledgements, no credits.

mod backoff;
mod config;
mod credit;
mod frame;
mod machine;
mod rx;
mod state;
mod tx;

pub use backoff::Backoff;
pub use config::{ConnectRule, Flavor, PathConfig};
pub use credit::{CREDIT_LIMIT, CREDIT_UPDATE_AT, CreditOverflow, Credits};
pub use frame::{FrameKind, PathCmd, PathId, RxRefused, TxFrame, TxPayload};
pub use machine::{Path, PathEvents, PeerParams, Violation};
pub use state::{AckState, ConnState, PathCtx, Timer, TimerTable};
