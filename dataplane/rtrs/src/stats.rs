//! Per-path counters in the shape of Linux's sysfs files (rtrs.md section 8), kept by the
//! state machines as plain integers (single writer: the lcore that drives the path).
//!
//! | Linux file | here | printed by |
//! |---|---|---|
//! | client `paths/<p>/stats/rdma`: `read-cnt read-bytes write-cnt write-bytes inflight failovered` | [`ClientPathStats::rdma`], `inflight`, `failover_cnt` | [`ClientPathStats::rdma_sysfs`] |
//! | client `paths/<p>/stats/reconnects`: `successful failed` (successful starts at -1) | `reconnects_ok`, `reconnects_fail` | [`ClientPathStats::reconnects_sysfs`] |
//! | client `paths/<p>/cur_latency`: `<ns> ns` | `cur_latency` | [`ClientPathStats::cur_latency_sysfs`] |
//! | client `paths/<p>/stats/reset_all` (write 1) | | [`ClientPathStats::reset_all`] |
//! | server `paths/<p>/stats/rdma`: `read-cnt read-bytes write-cnt write-bytes` | [`ServerPathStats::rdma`] | [`ServerPathStats::rdma_sysfs`] |
//!
//! Bytes count user message plus data, as Linux does. Beyond Linux: protocol violations (with
//! the last one), completion errors, heartbeats, and responses that waited for send-queue
//! room.

use core::fmt;
use std::time::Duration;

use crate::error::Violation;

/// Read and write counts and bytes (`struct rtrs_clt_stats_rdma`, `rtrs_srv_stats_rdma_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// READ requests.
    pub read_cnt: u64,
    /// Bytes of READ requests (user message + data).
    pub read_bytes: u64,
    /// WRITE requests.
    pub write_cnt: u64,
    /// Bytes of WRITE requests (user message + data).
    pub write_bytes: u64,
}

impl RdmaStats {
    /// Counts one request.
    #[inline]
    pub fn add(&mut self, read: bool, bytes: u64) {
        if read {
            self.read_cnt += 1;
            self.read_bytes += bytes;
        } else {
            self.write_cnt += 1;
            self.write_bytes += bytes;
        }
    }
}

/// Counters of one client path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientPathStats {
    /// Requests posted on this path, including failed-over ones.
    pub rdma: RdmaStats,
    /// Requests in flight on this path (every request, whatever the policy).
    pub inflight: u32,
    /// Requests this path took over from a failed path.
    pub failover_cnt: u64,
    /// Successful (re)connects; -1 until the first, as Linux prints it.
    pub reconnects_ok: i64,
    /// Failed reconnect attempts.
    pub reconnects_fail: u64,
    /// The last heartbeat round trip (the min-latency policy's key).
    pub cur_latency: Option<Duration>,
    /// Heartbeats sent.
    pub hb_sent: u64,
    /// Violations by the peer on this path.
    pub protocol_errors: u64,
    /// The last violation.
    pub last_violation: Option<Violation>,
    /// Completions with an error status (flushes of a connection we closed excepted).
    pub wc_errors: u64,
    /// Connection-manager failures (rejects, unreachable, disconnects).
    pub cm_errors: u64,
}

impl Default for ClientPathStats {
    fn default() -> Self {
        Self {
            rdma: RdmaStats::default(),
            inflight: 0,
            failover_cnt: 0,
            reconnects_ok: -1,
            reconnects_fail: 0,
            cur_latency: None,
            hb_sent: 0,
            protocol_errors: 0,
            last_violation: None,
            wc_errors: 0,
            cm_errors: 0,
        }
    }
}

impl ClientPathStats {
    /// `stats/rdma` as Linux prints it: `"%llu %llu %llu %llu %u %llu\n"`.
    pub fn rdma_sysfs(&self) -> impl fmt::Display + '_ {
        Line(move |f| {
            writeln!(
                f,
                "{} {} {} {} {} {}",
                self.rdma.read_cnt,
                self.rdma.read_bytes,
                self.rdma.write_cnt,
                self.rdma.write_bytes,
                self.inflight,
                self.failover_cnt
            )
        })
    }

    /// `stats/reconnects` as Linux prints it: `"%d %d\n"`.
    pub fn reconnects_sysfs(&self) -> impl fmt::Display + '_ {
        Line(move |f| writeln!(f, "{} {}", self.reconnects_ok, self.reconnects_fail))
    }

    /// `cur_latency` as Linux prints it: `"%lld ns\n"`.
    pub fn cur_latency_sysfs(&self) -> impl fmt::Display + '_ {
        Line(move |f| {
            let ns = self.cur_latency.map_or(0, |d| d.as_nanos());
            writeln!(f, "{ns} ns")
        })
    }

    /// `stats/reset_all` (writing 1): every counter back to zero except `inflight`, which
    /// counts what is really in flight (Linux zeroes it too and so can go negative).
    pub fn reset_all(&mut self) {
        *self = Self {
            inflight: self.inflight,
            reconnects_ok: 0,
            ..Self::default()
        };
    }

    pub(crate) fn violation(&mut self, v: Violation) {
        self.protocol_errors += 1;
        self.last_violation = Some(v);
    }
}

/// Counters of one server path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerPathStats {
    /// Requests received (bytes: the header offset, user message + data).
    pub rdma: RdmaStats,
    /// Responses that waited for send-queue room (Linux's `rsp_wr_wait_list`).
    pub queued_responses: u64,
    /// Heartbeats sent.
    pub hb_sent: u64,
    /// Violations by the peer on this path.
    pub protocol_errors: u64,
    /// The last violation.
    pub last_violation: Option<Violation>,
    /// Completions with an error status (flushes of a connection we closed excepted).
    pub wc_errors: u64,
}

impl ServerPathStats {
    /// `stats/rdma` as Linux prints it: `"%llu %llu %llu %llu\n"`.
    pub fn rdma_sysfs(&self) -> impl fmt::Display + '_ {
        Line(move |f| {
            writeln!(
                f,
                "{} {} {} {}",
                self.rdma.read_cnt,
                self.rdma.read_bytes,
                self.rdma.write_cnt,
                self.rdma.write_bytes
            )
        })
    }

    pub(crate) fn violation(&mut self, v: Violation) {
        self.protocol_errors += 1;
        self.last_violation = Some(v);
    }

    /// Every counter back to zero, as writing 1 to the client's `stats/reset_all` does (the
    /// kernel's server has no such file; this lets an operator start a measurement window
    /// on the server too).
    pub fn reset_all(&mut self) {
        *self = Self::default();
    }
}

/// A `Display` from a closure: formats without building a `String`.
struct Line<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result>(F);

impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for Line<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_sysfs_shapes() {
        let mut s = ClientPathStats::default();
        assert_eq!(s.reconnects_sysfs().to_string(), "-1 0\n");
        s.rdma.add(true, 4096 + 32);
        s.rdma.add(false, 100);
        s.inflight = 3;
        s.failover_cnt = 2;
        assert_eq!(s.rdma_sysfs().to_string(), "1 4128 1 100 3 2\n");
        s.cur_latency = Some(Duration::from_nanos(1234));
        assert_eq!(s.cur_latency_sysfs().to_string(), "1234 ns\n");
        s.reset_all();
        assert_eq!(s.rdma_sysfs().to_string(), "0 0 0 0 3 0\n");
        let mut v = ServerPathStats::default();
        v.rdma.add(false, 7);
        assert_eq!(v.rdma_sysfs().to_string(), "0 0 1 7\n");
        v.hb_sent = 3;
        v.reset_all();
        assert_eq!(v, ServerPathStats::default());
    }
}
