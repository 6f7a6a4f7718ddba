//! `recvmsg` (`rds_recvmsg`) and `poll` (`rds_poll`).

use lcore::time::Instant;

use super::core::RdsEngine;
use super::socket::{RdsSocket, Ready, Received, RecvFlags, sockaddr};
use crate::error::{Block, RdsError};
use crate::store::{Lane, Msg};

impl RdsEngine {
    /// Receives one message, or one notification, in Linux's priority order: first a
    /// pending RDMA notification ([`Received::RdmaStatus`]), then a congestion update for
    /// a monitoring socket ([`Received::CongUpdate`]), then data. A buffer shorter than the
    /// message gets its first bytes and the rest is discarded (`truncated`); with
    /// [`RecvFlags::TRUNC`] the returned length is the message's. [`RecvFlags::PEEK`]
    /// leaves the message queued. [`RecvFlags::OOB`] returns [`Received::Nothing`] at once,
    /// as Linux returns 0.
    ///
    /// # Errors
    ///
    /// Nothing queued: [`RdsError::WouldBlock`] with [`RecvFlags::DONTWAIT`], else
    /// [`RdsError::Blocked`] (wait for readability and call again); [`RdsError::BadSocket`].
    pub fn recv_from(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        buf: &mut [u8],
        flags: RecvFlags,
    ) -> Result<Received, RdsError> {
        let s = self.socks.get_mut(sock).ok_or(RdsError::BadSocket)?;
        if flags.has(RecvFlags::OOB) {
            return Ok(Received::Nothing);
        }
        if let Some(n) = s.notify.pop_front() {
            return Ok(Received::RdmaStatus(n));
        }
        if s.cong_notify != 0 {
            let mask = core::mem::take(&mut s.cong_notify);
            return Ok(Received::CongUpdate(mask));
        }
        let Some(mid) = s.recv_list.front() else {
            return Err(if flags.has(RecvFlags::DONTWAIT) {
                RdsError::WouldBlock
            } else {
                RdsError::Blocked(Block::Receive)
            });
        };
        let scope = s.bound.map_or(0, |b| b.scope);
        let stamp = s.timestamp;
        let m = self.store.msgs.get(mid);
        let msg_len = m.len as usize;
        let n = msg_len.min(buf.len());
        let from = sockaddr(m.peer, m.sport, scope);
        let rdma_dest = (m.rdma_cookie != 0).then_some(m.rdma_cookie);
        let timestamp = stamp.then_some(m.queued_at);
        self.store.read_payload(mid, 0, &mut buf[..n]);
        self.stats.copy_to_user += n as u64;
        self.stats.recv_delivered += 1;
        if !flags.has(RecvFlags::PEEK) {
            let s = &mut self.socks.slots[sock.idx as usize];
            self.store.msgs.remove(&mut s.recv_list, Lane::Sock, mid);
            self.store.msgs.get_mut(mid).clear(Msg::ON_SOCK);
            self.store.free_now(mid);
            self.rcvbuf_delta(now, sock.idx, -(msg_len as i64));
        }
        let truncated = n < msg_len;
        Ok(Received::Data {
            len: if truncated && flags.has(RecvFlags::TRUNC) {
                msg_len
            } else {
                n
            },
            msg_len,
            from,
            truncated,
            rdma_dest,
            timestamp,
        })
    }

    /// Readiness without side effects: what [`poll`](Self::poll) would report.
    pub fn readiness(&self, sock: RdsSocket) -> Ready {
        let Some(s) = self.socks.get(sock) else {
            return Ready(crate::uapi::POLLERR);
        };
        let mut r = s.base_ready();
        if !s.cong_monitor && s.cong_track != self.cong.generation() {
            r |= Ready::CONG;
        }
        Ready(r)
    }

    /// `rds_poll`: the socket's readiness. `POLLIN` for a queued message or notification;
    /// without `RDS_CONG_MONITOR`, also (with `POLLWRBAND`) once after any congestion-map
    /// change since the last poll, "for historical reasons" (this call consumes that);
    /// `POLLOUT` while the send buffer has room, which does not mean a send to a
    /// congested port succeeds.
    pub fn poll(&mut self, sock: RdsSocket) -> Ready {
        let r = self.readiness(sock);
        let generation = self.cong.generation();
        if let Some(s) = self.socks.get_mut(sock) {
            if !s.cong_monitor {
                s.cong_track = generation;
            }
            if r.0 != 0 {
                s.seen_congestion = false;
            }
        }
        r
    }
}
