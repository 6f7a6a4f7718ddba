//! Counters, named as Linux names them (`net/rds/stats.c`, `ib_stats.c`), so `rds-info -c`
//! style output lines up with the kernel's; then the ones this implementation adds.
//!
//! [`Stats::iter`] yields `(name, value)` in the order `RDS_INFO_COUNTERS` lists them:
//! the core counters in the kernel's order, the message-transport counters under their
//! `ib_` names (the credit and ack machinery they count lives in this crate's path state
//! machine, for every message transport), then this crate's own counters, mostly one per
//! kind of malformed input.

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),+ $(,)?) => {
        /// Engine counters (see the module doc for the order and naming).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[$doc])* pub $name: u64, )+
        }

        impl Stats {
            /// Every counter's name, in output order.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name) ),+];

            /// `(name, value)` for every counter, in output order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$( (stringify!($name), self.$name) ),+].into_iter()
            }

            /// The value of the counter called `name`.
            pub fn get(&self, name: &str) -> Option<u64> {
                self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
            }
        }
    };
}

counters! {
    // ---- net/rds/stats.c, in order ----
    /// Paths that went down (every drop, for any reason).
    conn_reset,
    /// Frames whose header checksum failed (the path is reset).
    recv_drop_bad_checksum,
    /// Retransmitted messages already received (dropped, acked).
    recv_drop_old_seq,
    /// Messages to a port no socket is bound to (dropped, acked).
    recv_drop_no_sock,
    /// Messages to a socket being closed.
    recv_drop_dead_sock,
    /// Receives that raced another reader (never here: one owner).
    recv_deliver_raced,
    /// Messages returned by `recv_from`.
    recv_delivered,
    /// Messages queued to a socket.
    recv_queued,
    /// Stream bytes the receive path could not take at once.
    recv_immediate_retry,
    /// Frames refused because the message store was full (the transport offers them again).
    recv_delayed_retry,
    /// Received messages that asked for an ack.
    recv_ack_required,
    /// RDMA bytes received (phase 2).
    recv_rdma_bytes,
    /// Pings answered.
    recv_ping,
    /// Sockets whose send queue became empty (all acked).
    send_queue_empty,
    /// Sends refused for lack of send-buffer space (`EAGAIN` or a wait).
    send_queue_full,
    /// Transmit lock contention (never here: one owner).
    send_lock_contention,
    /// Transmit raced a queueing (never here).
    send_lock_queue_raced,
    /// Transmit retried at once.
    send_immediate_retry,
    /// Transmit retried later.
    send_delayed_retry,
    /// Messages released by an ack.
    send_drop_acked,
    /// Messages sent with ACK_REQUIRED.
    send_ack_required,
    /// Messages queued on a path (data, pings, pongs, probes).
    send_queued,
    /// RDMA operations sent (phase 2).
    send_rdma,
    /// RDMA bytes sent (phase 2).
    send_rdma_bytes,
    /// Pongs and probes sent.
    send_pong,
    /// Kernel page-cache counter (never here).
    page_remainder_hit,
    /// Kernel page-cache counter (never here).
    page_remainder_miss,
    /// Payload bytes copied to applications.
    copy_to_user,
    /// Payload bytes copied from applications.
    copy_from_user,
    /// Congestion-map updates queued for sending.
    cong_update_queued,
    /// Congestion maps received.
    cong_update_received,
    /// Sends refused with `ENOBUFS` (destination congested, non-blocking).
    cong_send_error,
    /// Sends that had to wait for a congested destination (blocking).
    cong_send_blocked,
    /// Payload bytes queued to sockets.
    recv_bytes_added_to_sock,
    /// Payload bytes read or dropped from sockets.
    recv_bytes_freed_fromsock,
    /// A message stuck in transmit.
    send_stuck_rm,
    /// Paths above 0 waiting for path 0 to drain before their first transmit (mprds).
    mprds_catchup_tx0_retries,
    // ---- net/rds/ib_stats.c, the ones the core counts ----
    /// Incoming connects refused while connecting ("wait and see").
    ib_connect_raced,
    /// Incoming connects that replaced a connection thought up (stale).
    ib_listen_closed_stale,
    /// Transmits stopped by a full send ring.
    ib_tx_ring_full,
    /// Transmits stopped for lack of credits.
    ib_tx_throttle,
    /// Frames that advertised credits.
    ib_tx_credit_updates,
    /// Frames that granted us credits.
    ib_rx_credit_updates,
    /// ACK-only frames sent.
    ib_ack_sent,
    /// ACK-only frames postponed because one was in flight.
    ib_ack_send_delayed,
    /// Acks carried by data frames.
    ib_ack_send_piggybacked,
    /// ACK-only frames received.
    ib_ack_received,
    // ---- this implementation ----
    /// Frames shorter than a header (the path is reset).
    recv_drop_truncated,
    /// Headers announcing more than 1 MiB (the path is reset).
    recv_drop_bad_len,
    /// Fragments whose sequence, length or ports differ from their message's first (reset).
    recv_drop_frag_mismatch,
    /// Fragments of the wrong size: short before the last, or not the remainder (reset).
    recv_drop_bad_frag_len,
    /// Impossible sequence numbers: 0 or 2^64-1 on a message (reset).
    recv_drop_bad_seq,
    /// Messages whose sequence number went back without RETRANSMITTED (a restarted peer;
    /// accepted, as the kernel does).
    recv_seq_rewind,
    /// Acks for sequence numbers never sent (reset).
    recv_drop_bad_ack,
    /// Credit grants beyond any receive ring (reset).
    recv_drop_bad_credit,
    /// Congestion frames with other flag bits, or not 8192 bytes on a stream (reset).
    recv_drop_bad_cong,
    /// Congestion maps of the wrong length on a message transport (ignored, as the kernel).
    recv_cong_bad_len,
    /// Headers with flag bits Linux 6.1 does not interpret (counted, ignored).
    recv_unknown_flags,
    /// Extension areas that ended in an invalid type or an overrun (counted, ignored).
    recv_bad_exthdr,
    /// Pings from port 0 (ignored, as the kernel).
    recv_ping_bad_sport,
    /// Frames arriving on a path that is not connected or connecting (ignored).
    recv_ignored_down,
    /// Paths reset for a protocol violation (the sum of the resetting kinds above).
    conn_violation,
    /// Acks sent because the delayed-ack timer fired.
    delayed_ack_fired,
    /// Connections dropped because they were not established within `connect_timeout`.
    conn_connect_timeout,
    /// Sends refused because the message store was full (`ENOMEM`).
    send_nomem,
    /// Messages dropped instead of resent (peer restarted, or an RDMA op after a reset).
    send_drop_flushed,
    /// Messages cancelled by `RDS_CANCEL_SENT_TO` or close before being acked.
    send_drop_cancelled,
    /// Messages retransmitted after a reset.
    send_retransmitted,
    /// Peer generation changes seen (the peer restarted).
    peer_gen_changed,
    /// RDMA operations the transport reported failed (their notification carries it).
    send_rdma_failed,
    /// Use-once memory regions freed by the peer's RDMA extension header.
    rdma_use_once_freed,
    /// RDMA extension headers naming a key the receiving socket does not own (ignored).
    rdma_unuse_unknown_key,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_stats_names_start_with_the_kernel_list_in_order() {
        let kernel = [
            "conn_reset",
            "recv_drop_bad_checksum",
            "recv_drop_old_seq",
            "recv_drop_no_sock",
            "recv_drop_dead_sock",
            "recv_deliver_raced",
            "recv_delivered",
            "recv_queued",
            "recv_immediate_retry",
            "recv_delayed_retry",
            "recv_ack_required",
            "recv_rdma_bytes",
            "recv_ping",
            "send_queue_empty",
            "send_queue_full",
            "send_lock_contention",
            "send_lock_queue_raced",
            "send_immediate_retry",
            "send_delayed_retry",
            "send_drop_acked",
            "send_ack_required",
            "send_queued",
            "send_rdma",
            "send_rdma_bytes",
            "send_pong",
            "page_remainder_hit",
            "page_remainder_miss",
            "copy_to_user",
            "copy_from_user",
            "cong_update_queued",
            "cong_update_received",
            "cong_send_error",
            "cong_send_blocked",
            "recv_bytes_added_to_sock",
            "recv_bytes_freed_fromsock",
            "send_stuck_rm",
        ];
        assert_eq!(&Stats::NAMES[..kernel.len()], &kernel);
        assert!(
            Stats::NAMES.iter().all(|n| n.len() < 32),
            "rds_info_counter names are u8[32]"
        );
        let s = Stats {
            recv_ping: 3,
            ..Stats::default()
        };
        assert_eq!(s.get("recv_ping"), Some(3));
        assert_eq!(s.get("nope"), None);
    }
}
