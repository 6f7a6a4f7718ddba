//! RDS over TCP: [`TcpTransport`], a [`Transport`](crate::transport::Transport) of kind
//! [`TransportKind::Tcp`](crate::TransportKind) (`SO_RDS_TRANSPORT` = `RDS_TRANS_TCP`),
//! wire-compatible with Linux's `rds_tcp`.
//!
//! **This transport makes system calls on its data path**: it runs over non-blocking kernel
//! TCP sockets (`read`, `write`, `ioctl(SIOCOUTQ)` every poll with traffic; `accept` and
//! the dial checks on the control path). It is for talking to nodes that run the kernel's
//! RDS (or to reach a node without a fabric). The fabric transport
//! ([`crate::fabric`]) stays free of system calls.
//!
//! # What goes on the wire (Linux 6.1, `net/rds/tcp*.c`)
//!
//! * One TCP connection per path, from the **numerically smaller** address (ephemeral
//!   port) to the larger one's port 16385 ([`RDS_TCP_PORT`]; [`TcpConfig`] separates the
//!   port we listen on from the port we dial, because a kernel with `rds_tcp` loaded holds
//!   16385 in every namespace). A connection accepted from a larger address is closed and
//!   we dial back ([`RdsEngine::handle_knock`](crate::RdsEngine::handle_knock)); a
//!   connection we dialled from the larger address is closed once established (the peer
//!   has seen it and dials us), exactly as `rds_tcp_accept_one` / `rds_tcp_state_change`.
//! * Per message: the 48-byte big-endian header, then exactly `h_len` payload bytes; no
//!   fragmentation on the wire (a 1 MiB message is one header and 1 MiB). `h_ack`,
//!   `h_credit`, the padding and `h_csum` are 0 on send and ignored on receive. Sequence
//!   numbers start at 1 on each connection. 0-byte messages are legal. Congestion-map
//!   updates (`seq 0, len 8192, flags 0x01`) go out on every new path and are applied
//!   when received.
//! * Multipath (mprds): the engine's probe ping (port 1 to 0, `NPATHS`) on path 0 and its
//!   pong; after negotiation the smaller address dials every path. With
//!   [`TransportSpec::sport_idx`](crate::TransportSpec::sport_idx) (the default) our
//!   probes carry `SPORT_IDX` (last, so 6.1 ignores it), our dialler binds the source port
//!   of path `i` to a port `p` with `p % 8 == i`, and our passive side maps an accepted
//!   connection to path `sport % 8` once the peer's probe said `SPORT_IDX`; a peer that
//!   did not say so (Linux 6.1, random ports) gets 6.1's rule: path 0 until negotiated,
//!   then the first path that is down (`TcpTransport::accept_index`).
//!
//!   A connection that replaces a live one of its path (the peer lost the old one) is
//!   parked until the old one has been read to its end, so nothing the peer's TCP saw
//!   acknowledged is dropped: as long as the old one holds unread bytes (`SIOCINQ`), and
//!   up to 1 s for its end of stream once it holds none (a peer that vanished sends none).
//!   A path's parked connections are taken in the order they arrived: a peer that lost
//!   the parked one too dials a third, which carries only what its TCP had not seen
//!   acknowledged on the second, so the second is read to its end first (taking the
//!   third as soon as the first had ended, while the second still waited, skipped the
//!   second's messages; test `a_paths_parked_connections_are_taken_in_arrival_order`).
//!
//!   The receive side keeps the fan-out in order: a sender moves a socket's traffic from
//!   path 0 to its hashed path only once its earlier path-0 bytes were acknowledged by
//!   our TCP, so each poll reads the other paths once, then path 0 to its end, and only
//!   then hands the other paths' bytes to the engine (`TcpTransport::receive_ordered`).
//!   Reading the sockets in any order had handed a later message of path 3 to a socket
//!   before the end of an earlier 1 MiB message of path 0 (1 run in 10-20 of the tests with
//!   `RDS_TCP_MP=1`).
//!
//!   A connection ends only when its read side says so: an end of stream or a read error,
//!   after every byte it held was read and handed to the engine. Its unread bytes were
//!   acknowledged by our TCP, so the peer's RDS has released those messages; closing it
//!   earlier loses them. A failed write (`EPIPE` after our own shutdown, `ECONNRESET`)
//!   therefore only stops the writes and shuts our write side; Linux keeps the receive
//!   queue readable after both, and the read side then reports the end. Before that
//!   rule, a killed receiver that wrote a map update or a pong to its shut path-0 socket
//!   dropped up to 458 KB of backlog there, and 5 to 9 runs in 200 of `RDS_TCP_MP=1`
//!   lost a run of 30-300 messages (issue 14). `tcp_closed_unread` counts closes that
//!   break the rule (expected only after a protocol violation).
//!
//!   **Multipath between our nodes is proven** over loopback with connections killed on
//!   both sides under traffic (`tests/rds_tcp.rs`, 8 paths): 16 kills in about 0.2 s
//!   over 16,000 messages, every message once and in order, 0 failures in 3,920 runs.
//!   Before the park was first in, first out and the fan-in waited for a parked path 0
//!   (above), that load skipped or reordered a run of messages about 1 run in 1,000.
//!   Nodes that talk only to our nodes can use
//!   [`TransportSpec::tcp`](crate::TransportSpec::tcp) as it is (8 paths).
//!   Against the kernel's RDS (Debian 6.1) the kernel lab shows it
//!   (`scripts/rds-kernel-lab.sh`, the `mprds` rows): 8 paths negotiated whether we dial
//!   (the smaller address) or the kernel does, the traffic of 8 sockets spread over
//!   several paths, every message once, in order, byte-exact, both ways. The lab found
//!   that our passive side took a 6.1 dialler's path 0 for path `sport % 8` (a random
//!   path, 7 times in 8) before the peer had said anything about `SPORT_IDX`; our
//!   messages to it then waited on a path 0 nobody dialled (fixed; test
//!   `multipath_accept_from_a_random_port_dialler_takes_path_0` in `tests/rds_tcp.rs`). Killed
//!   connections under multipath are not run against 6.1: without SPORT_IDX a
//!   reconnecting path can be taken for another whose sequence numbers differ (rds.md
//!   §6), a fault of 6.1's, so the lab's reset rows run single path.
//! * `SO_KEEPALIVE` with the kernel's `rds_tcp_keepalive` values (idle 5 s, interval 5 s,
//!   5 probes), `TCP_NODELAY`, `SO_REUSEADDR`, backlog 64.
//! * Reconnect backoff (one change from 6.1): the kernel closes its backoff window when the
//!   TCP connection is established, so a dial that the peer's TCP accepts and its RDS resets
//!   at once (6.1's `rds_tcp_accept_one` does that while its path is still going down after
//!   a kill) is redialled at once, again and again: the kernel lab's reset row counted 164
//!   connections lost for 2 kills. Ours closes the window when the peer's first message
//!   arrives on the connection (its congestion map comes first), so such redials back off
//!   (test `a_peer_that_resets_each_connection_gets_backed_off_dials`).
//!
//! # Reassembly and trust
//!
//! Each connection reads into a fixed buffer ([`TcpConfig::rx_buffer`], 64 KiB) and hands
//! the bytes to the engine ([`RdsEngine::handle_stream_bytes`](crate::RdsEngine::handle_stream_bytes)),
//! which reassembles headers and payloads into its own bounded store and checks every
//! field: a garbage header, an `h_len` above 1 MiB (the 2026 `rds_tcp` fix), a bad sequence
//! or a malformed congestion map is counted and resets only that path (its Disconnect
//! closes the socket; unacked messages are retransmitted on the next connection and
//! de-duplicated by sequence). A full store leaves the bytes in the buffer and in the
//! kernel's socket buffer, so TCP's window slows the peer: nothing is dropped. An end of
//! stream or a read error resets the path the same way, once every byte before it was
//! read.
//!
//! # Acks
//!
//! The kernel releases a sent message when TCP's `snd_una` passes its last byte. From user
//! space we read **`SIOCOUTQ`** (`write_seq - snd_una`: bytes written and not yet
//! acknowledged by the peer) after writing: `acked = written - SIOCOUTQ` is the stream
//! offset the peer's TCP acknowledged, handed to
//! [`RdsEngine::handle_stream_acked`](crate::RdsEngine::handle_stream_acked), which releases
//! every message whose last byte is below it. `TCP_INFO` has no `snd_una` (only counts),
//! which is why `SIOCOUTQ` was chosen. As in the kernel, "acked" means the peer's kernel
//! has the bytes, not that its RDS took them: if the peer process dies after its TCP acked,
//! those messages are lost, exactly as with kernel RDS-TCP.
//!
//! # Writes
//!
//! Frames handed over by the engine are queued per connection and gathered into one
//! staging buffer ([`TcpConfig::tx_buffer`]), so a burst of small messages costs one
//! `write`; a frame is completed to the engine when its last byte is in the socket. The
//! path's send depth ([`PathConfig::send_depth`](crate::path::PathConfig::send_depth), 4
//! for RDS-TCP by default) bounds the frames queued; raising it batches more per write.

mod config;
mod conn;
mod sys;
mod transport;

pub use config::{RDS_TCP_PORT, TcpConfig, TcpStats};
pub use transport::TcpTransport;
