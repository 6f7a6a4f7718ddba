//! What the fabric transport is made with, and what it counts.

use std::time::Duration;

use crate::wire::{FRAG_SIZE, HEADER_LEN, IB_PORT_V4, IB_PORT_V6};

/// Bytes of one receive buffer: a 48-byte header and a 4 KiB fragment, rounded up to a
/// cache line so buffers never share one.
pub const RECV_BUF: usize = (HEADER_LEN + FRAG_SIZE).div_ceil(64) * 64;

/// Bytes of one send-header slot (a header that goes out as its own scatter entry).
pub const HDR_SLOT: usize = 64;

/// Fabric transport settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// RDMA CM port over IPv4 (RDS-IB: 18634, `RDS_PORT`). Tests and tools on one host
    /// may pick others so that several node pairs coexist.
    pub port_v4: u16,
    /// RDMA CM port over IPv6 (RDS-IB: 16385, `RDS_CM_PORT`).
    pub port_v6: u16,
    /// The port to dial on a peer, when not `port_v4`/`port_v6` (both families). Beside a
    /// kernel `rds_rdma`, which holds 18634 on every address (`0.0.0.0`), a node must
    /// listen elsewhere and still dial the kernel's 18634.
    pub peer_port: Option<u16>,
    /// Receive buffers posted per connection (RDS-IB's `max_recv_wr`, 1024 in the
    /// kernel): the credits the peer gets. At least [`MIN_RECV_DEPTH`] (a sender holds its
    /// last credit back for credit updates), at most 16383 (the credit counter's limit).
    pub recv_depth: u32,
    /// Request a send completion at least every this many frames (RDS-IB's
    /// `max_unsignaled_wr`, 16); the last frame of every message and every ACK-only frame
    /// is signalled anyway.
    pub signal_every: u32,
    /// Frames up to this many bytes (header included) are posted inline: copied at post
    /// time, no scatter list (capped by the queue pair's `max_inline_data`).
    pub inline_max: u32,
    /// How often connection events are polled (the CM channel is control path: on some
    /// providers looking costs a system call).
    pub cm_interval: Duration,
    /// Completions taken per completion-queue poll.
    pub cq_batch: usize,
}

/// Fewest receive buffers per connection [`FabricConfig::check`] accepts.
pub const MIN_RECV_DEPTH: u32 = 4;

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            port_v4: IB_PORT_V4,
            port_v6: IB_PORT_V6,
            peer_port: None,
            recv_depth: 256,
            signal_every: 16,
            inline_max: 256,
            cm_interval: Duration::from_micros(100),
            cq_batch: 32,
        }
    }
}

impl FabricConfig {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A text naming the bad field and the range it must be in.
    pub fn check(&self) -> Result<(), &'static str> {
        // A tiny ring cannot work: the peer holds its last send credit back for a credit
        // update while it has nothing new to advertise (RDS-IB's hold-back rule), so with one
        // buffer no frame ever moves, and credit updates need room to be asked for before
        // the peer stops (`Credits::update_at`).
        if self.recv_depth < MIN_RECV_DEPTH || self.recv_depth > crate::path::CREDIT_LIMIT {
            return Err(
                "FabricConfig::recv_depth must be 4..=16383: at least 4 (the last credit is \
                 held back for credit updates), at most the credit limit",
            );
        }
        if self.signal_every == 0 {
            return Err("FabricConfig::signal_every must be at least 1");
        }
        if self.cq_batch == 0 || self.cq_batch > 1024 {
            return Err("FabricConfig::cq_batch must be 1..=1024");
        }
        Ok(())
    }
}

/// Counters of one fabric transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Connect requests sent.
    pub connects: u64,
    /// Incoming requests accepted.
    pub accepts: u64,
    /// Incoming requests refused (not ours, incompatible, racing, malformed).
    pub rejects: u64,
    /// Incoming requests whose private data did not parse or named another address.
    pub bad_requests: u64,
    /// Connections established.
    pub established: u64,
    /// Connect attempts that failed (rejected, unreachable, resources).
    pub connect_failures: u64,
    /// Connections lost: CM disconnects, error completions, failed posts.
    pub errors: u64,
    /// Connections torn down (disconnect commands).
    pub teardowns: u64,
    /// Frames posted (inline or with a scatter list).
    pub tx_frames: u64,
    /// Of those, posted inline.
    pub tx_inline: u64,
    /// Frames dropped because their path had no live connection.
    pub tx_no_link: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Received frames the engine refused (store full) and that were offered again.
    pub rx_refused: u64,
    /// Receive completions whose length or buffer id was impossible (the connection was
    /// reset).
    pub rx_bad: u64,
    /// RDMA operations posted (ahead of their messages' headers).
    pub rdma_ops: u64,
    /// Bytes they moved (asked for).
    pub rdma_bytes: u64,
    /// RDMA operations that completed in error (the connection was reset).
    pub rdma_errors: u64,
}

impl FabricStats {
    /// `(name, value)` of every counter, prefixed `fabric_`.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("fabric_connects", self.connects),
            ("fabric_accepts", self.accepts),
            ("fabric_rejects", self.rejects),
            ("fabric_bad_requests", self.bad_requests),
            ("fabric_established", self.established),
            ("fabric_connect_failures", self.connect_failures),
            ("fabric_errors", self.errors),
            ("fabric_teardowns", self.teardowns),
            ("fabric_tx_frames", self.tx_frames),
            ("fabric_tx_inline", self.tx_inline),
            ("fabric_tx_no_link", self.tx_no_link),
            ("fabric_rx_frames", self.rx_frames),
            ("fabric_rx_refused", self.rx_refused),
            ("fabric_rx_bad", self.rx_bad),
            ("fabric_rdma_ops", self.rdma_ops),
            ("fabric_rdma_bytes", self.rdma_bytes),
            ("fabric_rdma_errors", self.rdma_errors),
        ]
        .into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_depth_below_two_or_above_the_credit_limit_is_refused() {
        let with = |recv_depth| FabricConfig {
            recv_depth,
            ..FabricConfig::default()
        };
        for bad in [0, 1, 3, crate::path::CREDIT_LIMIT + 1] {
            let err = with(bad).check().expect_err("refused");
            assert!(err.contains("recv_depth must be 4..=16383"), "{bad}: {err}");
        }
        for good in [MIN_RECV_DEPTH, 256, crate::path::CREDIT_LIMIT] {
            assert_eq!(with(good).check(), Ok(()), "{good}");
        }
    }
}
