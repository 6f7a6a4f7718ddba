//! The fabric transport: RDS-IB's protocol over any dp-fabric provider (shm, verbs), as
//! a [`Transport`](crate::transport::Transport) an [`RdsNode`](crate::node::RdsNode) runs.
//!
//! # What goes on the wire
//!
//! Exactly what RDS-IB sends, so a kernel RDS-IB peer understands it: one RC queue pair
//! per connection, set up through the provider's RDMA CM on port 18634 (IPv4) or 16385
//! (IPv6) with `rds_ib_connect_private` as the request's and reply's private data
//! (addresses, protocol 3.1 with minor mask 3, our ack, our initial credits); each frame is
//! one SEND of the 48-byte header and at most 4096 payload bytes; ACK-only frames and
//! credits as the path state machine makes them.
//!
//! # Memory and trust
//!
//! The engine's fragment region is registered once, for local access: payloads go out
//! from it with no copy (frames small enough go inline). Each connection has its own
//! receive ring (`recv_depth` buffers of 48 + 4096 bytes, registered for local access
//! only, plus the send-header slots): no key is ever given to a peer, so a peer can write
//! nothing of ours except the receive buffers posted on its own connection. Every received
//! frame is copied out of its buffer and checked by the engine; a violation, an error
//! completion or a CM disconnect resets only that connection, whose unacked messages are
//! retransmitted on the next one.
//!
//! # Progress
//!
//! [`Transport::poll`](crate::transport::Transport::poll) polls every connection's
//! completion queues (no system call, no allocation), and the CM channel every
//! [`FabricConfig::cm_interval`]. Connecting, accepting and tearing down are control
//! path: they allocate and register a connection's ring.
//!
//! # Failure
//!
//! A connection fails on an error completion, a failed post or a CM disconnect, but what
//! completed ahead of the failure counts first: the frames received before it go to the
//! engine (a peer's last acks before it closed release our messages), as a verbs CQ
//! delivers successful completions ahead of the flush errors. A dial or an accept that
//! the CM never answers is given up by the path after
//! [`PathConfig::connect_timeout`](crate::path::PathConfig::connect_timeout) and dialled
//! again with the backoff, so no path stays Connecting (refusing the peer's redials as
//! racing) for ever.

mod config;
mod link;
mod rdma;
mod transport;

pub use config::{FabricConfig, FabricStats, HDR_SLOT, RECV_BUF};
pub use rdma::MAX_WINDOW;
pub use transport::{FabricTransport, FabricTransportError};
