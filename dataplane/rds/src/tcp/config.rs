//! What an RDS-TCP transport is made with, and its counters.

use std::time::Duration;

/// `RDS_TCP_PORT`: the IANA port of RDS over TCP.
pub const RDS_TCP_PORT: u16 = 16385;

/// Configuration of a [`TcpTransport`](super::TcpTransport).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// The port we listen on, on every local address (16385). The kernel's `rds_tcp` holds
    /// `*:16385` in every network namespace where it is loaded, so a user-space node beside
    /// it listens elsewhere and has the peer's traffic redirected (the kernel lab uses
    /// 26385 with an nftables redirect).
    pub listen_port: u16,
    /// The port we dial on the peer (16385).
    pub peer_port: u16,
    /// Listen backlog (the kernel's 64).
    pub backlog: i32,
    /// `rds_tcp_keepalive`: `TCP_KEEPIDLE` (5 s).
    pub keepalive_idle: Duration,
    /// `TCP_KEEPINTVL` (5 s).
    pub keepalive_interval: Duration,
    /// `TCP_KEEPCNT` (5 probes: a dead peer is found in about 30 s).
    pub keepalive_count: u32,
    /// A dial that has not completed after this long fails (the path backs off and, on
    /// the smaller address, dials again).
    pub connect_timeout: Duration,
    /// Per connection: the receive buffer, which bounds what is read from the socket and
    /// not yet taken by the engine (the engine reassembles messages in its own store; a
    /// full store leaves bytes here and in the kernel's socket buffer, so TCP's window
    /// slows the peer). 64 KiB.
    pub rx_buffer: usize,
    /// The transport's staging buffer for writes: queued frames are gathered into it (many
    /// small messages per `write`). 256 KiB.
    pub tx_buffer: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            listen_port: RDS_TCP_PORT,
            peer_port: RDS_TCP_PORT,
            backlog: 64,
            keepalive_idle: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(5),
            keepalive_count: 5,
            connect_timeout: Duration::from_secs(5),
            rx_buffer: 64 << 10,
            tx_buffer: 256 << 10,
        }
    }
}

impl TcpConfig {
    /// The defaults with one port for listening and dialling (tests, and nodes that are
    /// not beside a kernel RDS).
    pub fn with_port(port: u16) -> Self {
        Self {
            listen_port: port,
            peer_port: port,
            ..Self::default()
        }
    }
}

/// The transport's counters (`rds-info`-style names, next to the engine's [`Stats`](crate::Stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpStats {
    /// Connections accepted and handed to the engine.
    pub tcp_accepted: u64,
    /// Accepted connections that waited for the old connection of their path to be read
    /// to its end first (nothing the peer's TCP saw acknowledged is dropped).
    pub tcp_accept_parked: u64,
    /// Accepted connections refused: the address is not ours, or the engine said no.
    pub tcp_accept_refused: u64,
    /// Accepted connections from a larger address, closed; we dialled back (the connect rule).
    pub tcp_accept_from_larger: u64,
    /// Dials started.
    pub tcp_connect: u64,
    /// Dials that failed (refused, timed out, error).
    pub tcp_connect_failed: u64,
    /// Our own dials from the larger address, closed when established (the connect rule).
    pub tcp_connect_dropped_larger: u64,
    /// Connections that ended by an error, an end of stream or a protocol violation.
    pub tcp_conn_lost: u64,
    /// Connections closed while the peer's bytes still waited in them (our buffer or the
    /// socket). Only a protocol violation may do that (the rest of that stream is of no
    /// use); any other such close loses messages the peer's TCP saw acknowledged, which
    /// its RDS has released.
    pub tcp_closed_unread: u64,
    /// Writes that failed: the connection stopped writing and was read to its end before
    /// it was reported lost (its unread bytes were acknowledged to the peer).
    pub tcp_tx_failed: u64,
    /// Bytes written to sockets.
    pub tcp_tx_bytes: u64,
    /// Bytes read from sockets.
    pub tcp_rx_bytes: u64,
    /// `write` calls.
    pub tcp_writes: u64,
    /// `read` calls that returned data.
    pub tcp_reads: u64,
    /// `SIOCOUTQ` queries (acks derived from the peer's acknowledged bytes).
    pub tcp_ack_queries: u64,
    /// Times the engine's store was full and received bytes waited in the buffer.
    pub tcp_rx_store_full: u64,
    /// Frames for a path with no live connection (the path is being reset and retransmits).
    pub tcp_tx_no_conn: u64,
}

impl TcpStats {
    /// Calls `f` with each counter's name and value.
    pub fn each(&self, f: &mut dyn FnMut(&'static str, u64)) {
        f("tcp_accepted", self.tcp_accepted);
        f("tcp_accept_parked", self.tcp_accept_parked);
        f("tcp_accept_refused", self.tcp_accept_refused);
        f("tcp_accept_from_larger", self.tcp_accept_from_larger);
        f("tcp_connect", self.tcp_connect);
        f("tcp_connect_failed", self.tcp_connect_failed);
        f(
            "tcp_connect_dropped_larger",
            self.tcp_connect_dropped_larger,
        );
        f("tcp_conn_lost", self.tcp_conn_lost);
        f("tcp_closed_unread", self.tcp_closed_unread);
        f("tcp_tx_failed", self.tcp_tx_failed);
        f("tcp_tx_bytes", self.tcp_tx_bytes);
        f("tcp_rx_bytes", self.tcp_rx_bytes);
        f("tcp_writes", self.tcp_writes);
        f("tcp_reads", self.tcp_reads);
        f("tcp_ack_queries", self.tcp_ack_queries);
        f("tcp_rx_store_full", self.tcp_rx_store_full);
        f("tcp_tx_no_conn", self.tcp_tx_no_conn);
    }
}
