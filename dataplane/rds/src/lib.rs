//! `dp-rds`: RDS, reliable datagram sockets, as a sans-IO protocol core with the socket
//! semantics of Linux `net/rds` (6.1).
//!
//! RDS gives reliable, ordered datagrams between sockets bound to `address:port`. All the
//! sockets of two nodes share one connection (per transport and TOS; up to eight paths on
//! a multipath stream transport), so thousands of peers cost a handful of connections.
//! The protocol and the socket layer ([`engine`], [`path`]) do no I/O: they build and
//! test with no fabric provider, no socket and no clock. Around them, [`fabric`] is the
//! transport over any dp-fabric provider (shm, verbs; written against the traits, never a
//! provider), and [`node`] drives an engine and its transports in a run-to-completion loop
//! (an lcore poller) or behind blocking calls for ordinary threads.
//!
//! # Layers (each module uses only those below it)
//!
//! | module | what |
//! |---|---|
//! | [`node`] | [`RdsNode`](node::RdsNode): an engine and its transports, one loop iteration per `poll`; [`BlockingNode`](node::BlockingNode) for threads |
//! | [`fabric`] | [`FabricTransport`](fabric::FabricTransport): RDS-IB's protocol over a dp-fabric provider (RC queue pairs, CM private data, receive rings, credits); no system calls on its data path |
//! | [`tcp`] | [`TcpTransport`](tcp::TcpTransport): RDS over TCP, wire-compatible with Linux's `rds_tcp` (port 16385, the smaller address dials, acks from `SIOCOUTQ`); kernel sockets, so **its data path makes system calls** |
//! | [`transport`] | the [`Transport`](transport::Transport) trait: how a node drives a transport (the fabric one; RDS-TCP plugs in beside it) |
//! | [`engine`] | [`RdsEngine`]: the node: sockets, connections, congestion maps, routing |
//! | [`path`] | [`Path`]: one connection path's state machine (states, sequence numbers, acks, credits, fragments, retransmission) |
//! | [`store`] | message memory: 4 KiB fragments in one region, message records on intrusive queues |
//! | [`wire`] | the wire formats: header, extension headers, checksum, congestion bitmap, RDS-IB private data |
//! | [`stats`], [`error`], [`uapi`], [`addr`], [`rng`] | counters with the kernel's names, errors with Linux's errnos, `<linux/rds.h>` constants, addresses, the seeded generator |
//! | `sim` (feature `testing`) | a deterministic simulator of N engines over simulated transports |
//!
//! # The node model
//!
//! One [`RdsEngine`] is one RDS node. It owns a set of local addresses
//! ([`RdsEngine::add_local_addr`]); sockets bind to one of them (there is no wildcard
//! bind); connections go from one of them to a peer address. Two engines in two processes
//! are two nodes, even on one host: they must own different addresses, exactly as two
//! hosts would, and talk through a transport. Messages between two addresses of the same
//! engine never leave it (the loopback transport: delivered at once, acked at once, the
//! destination's congestion still applies). An engine has one owner at a time (`&mut
//! self`): an lcore runs it in its poll loop, or a thread shares it behind a lock.
//!
//! # Two faces
//!
//! **Applications** call the socket API: [`RdsEngine::socket`], [`RdsEngine::bind`],
//! [`RdsEngine::send_to`] / [`RdsEngine::send_msg`], [`RdsEngine::recv_from`],
//! [`RdsEngine::poll`], the options ([`RdsEngine::setsockopt_raw`] and its typed
//! wrappers), [`RdsEngine::cancel_sent_to`], [`RdsEngine::close`]. Sockets are
//! [`RdsSocket`] handles. Every call returns at once: a call that Linux would make wait
//! returns [`RdsError::Blocked`] saying what for, and a blocking wrapper waits for the
//! socket's readiness ([`RdsEngine::poll_event`]) and calls again; non-blocking callers pass
//! `MSG_DONTWAIT` and get Linux's `EAGAIN` / `ENOBUFS`.
//!
//! **A transport driver** connects the engine to the wire. After every batch of inputs it
//! takes the outputs, in this order:
//!
//! ```text
//! inputs:  handle_incoming / handle_connected / handle_connect_failed
//!          handle_transport_error / handle_transport_down
//!          handle_frame (message transports) / handle_stream_bytes (stream transports)
//!          handle_send_complete / handle_stream_acked / handle_recv_posted
//!          handle_timeout (when poll_timeout says)
//! outputs: poll_transport  -> Connect / Disconnect commands
//!          poll_transmit   -> frames: header + payload segments of the fragment region
//!          poll_event      -> socket readiness changes (wake pollers and waiters)
//!          poll_timeout    -> when to call handle_timeout next
//! ```
//!
//! A message transport (RDS-IB, the fabric transport) posts receives of 48 + 4096 bytes,
//! reports each with [`RdsEngine::handle_recv_posted`] (they are the credits), hands each
//! received frame to [`RdsEngine::handle_frame`] (a refused frame, [`path::RxRefused`],
//! is kept and offered again later: the store was full), posts every frame of
//! [`RdsEngine::poll_transmit`] as a SEND of the header and the payload's segments
//! (offsets into [`RdsEngine::frags`]'s region, which it registers once: no copy), and
//! reports completions by token. Connect requests carry
//! [`RdsEngine::connect_private`], accepts [`RdsEngine::accept_private`] (RDS-IB's
//! `rds_ib_connect_private`), so a kernel RDS-IB peer understands them. A stream transport
//! (RDS-TCP) writes each frame's header and payload to its socket, feeds received bytes
//! to [`RdsEngine::handle_stream_bytes`], and reports the peer's acknowledged byte count
//! with [`RdsEngine::handle_stream_acked`].
//!
//! An lcore poller does the same each iteration: poll its transport's completion queues
//! and sockets into the `handle_*` inputs, then drain `poll_transport`, `poll_transmit`
//! (while the transport has room) and `poll_event` (waking the tasks of the sockets it
//! names), and arm a timer for `poll_timeout`. Nothing on that path allocates or makes a
//! system call (the stream transport's socket I/O is the driver's, not this crate's).
//!
//! # Memory
//!
//! Everything is sized in [`RdsConfig`] and allocated by [`RdsEngine::new`]: `frags`
//! fragments of 4 KiB in one `mempool` region (hugepages when available) hold every
//! payload, sends and receives alike; `msgs` records describe messages; the socket table,
//! the per-path tables and the timer heap have fixed capacities. Only a first contact with
//! a new peer allocates (its connection, up to `max_conns`), as in the kernel. So memory is
//! bounded by the configuration whatever the number of sockets or the behaviour of peers:
//! a full store makes sends fail with `ENOMEM` (or wait) and refuses received frames back
//! to the transport, which slows the peer (its credits, its TCP window) and drops nothing.
//! Sends never take the last `rx_reserve` fragments, so a node busy sending can still
//! receive the acks that free its memory.
//!
//! # Peers are untrusted
//!
//! Every field a peer sends is checked before use; see [`path`] for the list. A violation
//! is counted under its own name in [`Stats`] and resets only the path it arrived on; the
//! messages in flight are retransmitted on the next connection; no panic, no other
//! connection touched, no memory kept. Every parser is a fuzz target, and so is the engine
//! driven by a hostile peer (`fuzz/`, `scripts/fuzz.sh`).
//!
//! # Where this differs from Linux 6.1, and why
//!
//! * Added checks (the kernel trusts these): `h_len` above 1 MiB resets the path on every
//!   transport (the 2026 RDS-TCP fix, and on IB too); a fragment must carry exactly
//!   `min(remaining, 4096)` bytes (the kernel misses short middle fragments); sequence
//!   numbers 0 and 2^64-1 (which no sender reaches; 2^64-1 would wrap the kernel's next
//!   receive sequence to 0) reset the path, while a step backwards without RETRANSMITTED is
//!   accepted as the kernel accepts it (a restarted peer) and counted; a congestion frame with
//!   other flag bits resets the path (the kernel takes it for a ping from port 0 and
//!   rewinds its receive sequence); credit grants beyond 16383 reset the path (the kernel's
//!   16-bit counter would overflow into its posted count); an ack beyond anything sent is
//!   counted and ignored (the kernel would release messages never sent, e.g. after a
//!   restart); a probe's NPATHS is clamped to the transport's paths and rounded down to a
//!   power of two (the kernel uses it as a hash mask as given, and would index past a
//!   single-path connection's path array).
//! * A delayed-ack timer (1 ms by default, [`path::PathConfig::delayed_ack`]) acks the tail
//!   of a one-way burst; the kernel holds that sender's buffer until traffic flows again.
//! * Flow control is on by default for the message transport (both sides must grant
//!   initial credits, as in the kernel, whose default is off) because this core's driver
//!   posts receives before connecting; credits are plain fields, not one atomic word.
//! * Extension headers of types 4, 7 and 8 are parsed with their newer lengths (6.1 would
//!   misread them); several extensions are packed into one header (newer kernels do; 6.1
//!   refused a second one, and its parser accepts any subset).
//! * Before multipath negotiation every send uses path 0 and the paths fan out afterwards
//!   under the newest kernel's catch-up rule (ordering kept); 6.1 made a blocking sender
//!   wait for the probe answer instead.
//! * The bind table is keyed by address and port (not scope id); local traffic needs no
//!   connection object; `RDS_INFO_*` listings, RDMA, zero-copy and receive-path latency
//!   tracing are not here (see below).
//!
//! # Running it
//!
//! ```text
//! let mut engine = RdsEngine::new(RdsConfig { transports: vec![TransportSpec::ib()], .. })?;
//! engine.add_local_addr(addr);
//! let fabric = FabricTransport::<Shm>::new(device, &engine, FabricConfig::default())?;
//! let mut node = RdsNode::new(engine);
//! node.add_transport(Box::new(fabric))?;
//! // on an lcore: register `node` as a poller, use node.engine_mut() for the sockets;
//! // on threads: BlockingNode::spawn(node, PollMode::hybrid_default(), "rds")?
//! ```
//!
//! # RDMA
//!
//! On the fabric transport, once it has an RDMA window
//! ([`FabricTransport::expose_window`](fabric::FabricTransport::expose_window): a mempool
//! region the application takes its RDMA buffers from): `RDS_GET_MR` /
//! `RDS_GET_MR_FOR_DEST` / `RDS_FREE_MR` ([`RdsEngine::get_mr`], [`RdsEngine::free_mr`],
//! and the raw option forms), `RDS_CMSG_RDMA_DEST` / `_MAP`, and `RDS_CMSG_RDMA_ARGS` READ
//! and WRITE with `NOTIFY_ME`,
//! `FENCE`, `USE_ONCE` and `RDS_RECVERR`, notified as [`Received::RdmaStatus`]
//! (`SUCCESS`, `REMOTE_ERROR`, `CANCELED`, `DROPPED`, `OTHER_ERROR`). Where this differs
//! from Linux: memory must lie in the window (`EFAULT` otherwise, as an unpinnable range in
//! Linux), an operation takes one local range (`nr_local` 1), the cookie's offset is an
//! offset in the owner's window (its base travels in the connection's private data; IPv6
//! has no room for it in the RDMA CM's 56 bytes, so RDMA between our nodes is IPv4), a
//! region is read-only to peers unless registered with `RDS_RDMA_READWRITE`, and a
//! `SILENT` operation still sends its header. As in Linux, an operation is reported when
//! its message's SENDs complete (it completed before them), once; one that never got there
//! is reported `DROPPED` on a reset or `CANCELED` by `RDS_CANCEL_SENT_TO`. `RDS_CMSG_RDMA_DEST` and `RDS_CMSG_RDMA_MAP`
//! offer a region to the receiver (`RDS_EXTHDR_RDMA_DEST`, delivered as
//! [`Received::Data`]'s `rdma_dest`). Not here: atomics (the dp-fabric providers have
//! none: `EOPNOTSUPP`), and a kernel RDS-IB peer's RDMA into our memory (its addresses are
//! zero-based, ours virtual). RDS-TCP has no RDMA, as in Linux.
//!
//! # Not done yet
//!
//! The RDS-TCP transport ([`tcp`]) is proven single-path and, between our own nodes,
//! multipath; its multipath (mprds) against the kernel's RDS is not proven in the lab yet
//! (see [`tcp`]).
#![deny(unsafe_code)]

pub mod addr;
pub mod engine;
pub mod error;
pub mod fabric;
mod idmap;
pub mod node;
pub mod path;
pub mod rng;
#[cfg(feature = "testing")]
pub mod sim;
pub mod stats;
pub mod store;
pub mod tcp;
pub mod transport;
pub mod uapi;
pub mod wire;

pub use engine::{
    Accept, EngineError, Incoming, RdsConfig, RdsEngine, RdsSocket, Ready, Received, RecvFlags,
    Reject, SendCmsg, SendFlags, SocketEvent, TransportCmd, TransportKind, TransportSpec,
};
pub use error::{Block, RdsError};
pub use path::{Path, PathId};
pub use stats::Stats;
