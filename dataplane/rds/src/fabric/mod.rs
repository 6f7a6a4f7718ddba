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
//! credits as the path state machine makes them. The last SEND of every message or
//! update and every ACK-only frame asks for a solicited event, as `rds_ib_xmit` does:
//! Linux arms its receive completion queue for solicited events only, and does not look
//! at what arrived until one comes. Proven against the kernel's `rds_rdma` over Soft-RoCE
//! by `scripts/rds-ib-kernel-lab.sh`; beside a kernel RDS, which holds port 18634 on every
//! address, a node listens on another port and dials 18634
//! ([`FabricConfig::peer_port`]).
//!
//! # Memory and trust
//!
//! The engine's fragment region is registered once, for local access: payloads go out
//! from it with no copy (frames small enough go inline). Each connection has its own
//! receive ring (`recv_depth` buffers of 48 + 4096 bytes, registered for local access
//! only, plus the send-header slots). Every received frame is copied out of its buffer and
//! checked by the engine; a violation, an error completion or a CM disconnect resets only
//! that connection, whose unacked messages are retransmitted on the next one.
//!
//! Keys are given to peers only for RDMA, and only for memory the application chose:
//! without an RDMA window ([`FabricTransport::expose_window`]) no key of ours ever leaves
//! the node, and a peer can write nothing of ours except the receive buffers posted on its
//! own connection. With a window, each `RDS_GET_MR` registers just the pages of its range
//! under a key of its own (remote read, plus remote write with `RDS_RDMA_READWRITE`); any
//! peer that learns the cookie can reach that range, as with the kernel's keys (the
//! application decides whom it tells), until `RDS_FREE_MR`, the socket's close, or, for a
//! use-once region, the arrival of the peer's RDMA extension header revokes the key. The
//! fragment region, the rings and the rest of the window stay out of reach. Over shm the
//! provider shares whole pages of the region (4 KiB, or 2 MiB on hugepages), and its key
//! checks keep a peer inside the registered pages.
//!
//! Our RDMA operations are posted just before their message's first frame on the same
//! queue pair (the kernel's order), from our window to the peer's window at the offset its
//! cookie gave plus the window base it announced at connect time (16 bytes after RDS-IB's
//! private data, magic `DPRW`; without it the peer's cookies are taken as zero-based, as a
//! kernel peer's are). Everything about the peer's cookie is hostile: the peer's provider
//! checks key, range and right, and a refusal completes our operation in error, which
//! notifies the sender (`RDS_RDMA_REMOTE_ERROR`) and resets only that connection (the RC
//! queue pair is in error after it); the message is not retransmitted, the others are.
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

pub use config::{FabricConfig, FabricStats, HDR_SLOT, MIN_RECV_DEPTH, RECV_BUF};
pub use rdma::{CM_PRIVATE_MAX, MAX_WINDOW, WINDOW_EXT_LEN, append_window, peer_window};
pub use transport::{FabricTransport, FabricTransportError};
