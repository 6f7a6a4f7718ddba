//! `sendmsg` (`rds_sendmsg`): every check of Linux in Linux's order, send-buffer accounting
//! (`rds_send_queue_rm`), path selection, congestion, and loopback delivery.

use std::net::SocketAddr;

use lcore::time::Instant;

use super::config::TransportKind;
use super::conn::{ConnKey, mpath_hash};
use super::core::RdsEngine;
use super::mr::{cookie_key, cookie_offset};
use super::socket::{RdsSocket, SendCmsg, SendFlags, split};
use crate::addr::Addr;
use crate::error::{Block, RdsError};
use crate::path::{ConnState, PathId};
use crate::store::{Lane, Msg};
use crate::uapi::{MSG_CMSG_COMPAT, MSG_DONTWAIT, MSG_ZEROCOPY};
use crate::wire::cong::monitor_mask;
use crate::wire::{ExtHeader, ExtWriter, MAX_MSG_SIZE, MPATH_WORKERS, frag_count};

impl RdsEngine {
    /// Sends `data` as one message to `dest` (or the `connect`ed destination when `None`).
    /// Zero-length messages are legal. Returns the payload length.
    ///
    /// The message is accepted (and will be delivered, in order, exactly once, whatever
    /// happens to connections, unless cancelled or the peer restarts) or refused with the
    /// error Linux gives, checked in Linux's order:
    ///
    /// | condition | error |
    /// |---|---|
    /// | a flag other than `MSG_DONTWAIT`, `MSG_ZEROCOPY`, `MSG_CMSG_COMPAT` | `EOPNOTSUPP` |
    /// | destination any, broadcast, multicast, link-local without scope | `EINVAL` |
    /// | socket unbound, or no destination | `ENOTCONN` |
    /// | IPv4 destination from an IPv6 socket or the reverse | `EOPNOTSUPP` |
    /// | payload or RDMA bytes above 1 MiB | `EMSGSIZE` |
    /// | payload above the send buffer | `EMSGSIZE` |
    /// | `MSG_ZEROCOPY` not on TCP / without a cookie | `EOPNOTSUPP` / `EINVAL` |
    /// | unknown control message, DEST/MAP with ARGS/ATOMIC | `EINVAL` |
    /// | RDMA or atomic control message on a transport without RDMA | `EOPNOTSUPP` |
    /// | atomics (no provider has them); RDMA to an address of this node | `EOPNOTSUPP` |
    /// | two `RDMA_ARGS`, or two `RDMA_DEST`/`MAP`; `RDMA_DEST` of no region of the socket | `EINVAL` |
    /// | `nr_local` above 1024 | `EMSGSIZE` |
    /// | `nr_local` other than 1; empty local range; local longer than remote | `EINVAL` |
    /// | local range outside the RDMA window; `RDMA_MAP` as `RDS_GET_MR` | `EFAULT`; as [`get_mr`](Self::get_mr) |
    /// | destination port congested | `ENOBUFS`, or [`RdsError::Blocked`] when blocking |
    /// | send buffer full | `EAGAIN`, or [`RdsError::Blocked`] when blocking |
    /// | message store full | `ENOMEM`, or [`RdsError::Blocked`] when blocking |
    ///
    /// # Errors
    ///
    /// As in the table; [`RdsError::BadSocket`] for a handle that is not open.
    pub fn send_to(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        dest: Option<SocketAddr>,
        data: &[u8],
        flags: SendFlags,
    ) -> Result<usize, RdsError> {
        self.send_msg(now, sock, dest, data, &[], flags)
    }

    /// [`send_to`](Self::send_to) with `SOL_RDS` control messages.
    ///
    /// # Errors
    ///
    /// As [`send_to`](Self::send_to).
    pub fn send_msg(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        dest: Option<SocketAddr>,
        data: &[u8],
        cmsgs: &[SendCmsg],
        flags: SendFlags,
    ) -> Result<usize, RdsError> {
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        if flags.0 & !(MSG_DONTWAIT | MSG_CMSG_COMPAT | MSG_ZEROCOPY) != 0 {
            return Err(RdsError::NotSupported(
                "send flags other than MSG_DONTWAIT and MSG_ZEROCOPY",
            ));
        }
        let nonblock = flags.has(SendFlags::DONTWAIT);
        let (daddr, dport, mut scope) = match dest {
            Some(sa) => {
                let (a, p, sc) = split(sa);
                a.check_unicast().map_err(RdsError::InvalidArgument)?;
                if a.is_link_local() && sc == 0 {
                    return Err(RdsError::InvalidArgument(
                        "a link-local IPv6 destination needs a scope id",
                    ));
                }
                (a, p, sc)
            }
            None => s.conn_addr.unwrap_or((Addr::ANY, 0, 0)),
        };
        let Some(b) = s.bound else {
            return Err(RdsError::NotConnected("bind the socket before sending"));
        };
        if daddr.is_any() {
            return Err(RdsError::NotConnected(
                "no destination: name one, or connect() the socket first",
            ));
        }
        if dest.is_some() {
            if daddr.is_v4() != b.addr.is_v4() {
                return Err(RdsError::NotSupported(
                    "IPv4 and IPv6 do not mix: the destination's family must be the bound address's",
                ));
            }
            if scope != b.scope {
                if scope == 0 {
                    scope = b.scope;
                } else if b.scope != 0 {
                    return Err(RdsError::InvalidArgument(
                        "the destination's scope id differs from the bound address's",
                    ));
                }
            }
        }
        let _ = scope;
        // RDMA bytes count against the 1 MiB limit too.
        let mut rdma_bytes = 0u64;
        for c in cmsgs {
            if let SendCmsg::RdmaArgs { remote_bytes, .. } = c {
                rdma_bytes = rdma_bytes.saturating_add(*remote_bytes);
            }
        }
        if data.len().max(rdma_bytes.min(usize::MAX as u64) as usize) > MAX_MSG_SIZE {
            return Err(RdsError::MessageTooLong {
                len: data.len().max(rdma_bytes as usize),
                limit: MAX_MSG_SIZE,
                what: "the 1 MiB RDS message limit",
            });
        }
        let sndbuf = s.sndbuf() as usize;
        if data.len() > sndbuf {
            return Err(RdsError::MessageTooLong {
                len: data.len(),
                limit: sndbuf,
                what: "the socket's send buffer (raise SO_SNDBUF)",
            });
        }
        let transport = s.transport.unwrap_or(TransportKind::Loop);
        let rdma_ok = self.spec(transport).is_some_and(|t| t.rdma);
        let mut zcookie = false;
        let (mut g1, mut g2) = (false, false);
        for c in cmsgs {
            match c {
                SendCmsg::RdmaArgs { .. } | SendCmsg::Atomic(_) => g1 = true,
                SendCmsg::RdmaDest(_) | SendCmsg::RdmaMap { .. } => g2 = true,
                SendCmsg::ZcopyCookie(_) => {
                    zcookie = true;
                    g2 = true;
                }
                SendCmsg::Other(_) => {
                    return Err(RdsError::InvalidArgument("unknown SOL_RDS control message"));
                }
            }
        }
        if flags.has(SendFlags::ZEROCOPY) {
            if transport != TransportKind::Tcp {
                return Err(RdsError::NotSupported(
                    "MSG_ZEROCOPY needs the TCP transport",
                ));
            }
            if !zcookie {
                return Err(RdsError::InvalidArgument(
                    "MSG_ZEROCOPY needs an RDS_CMSG_ZCOPY_COOKIE control message",
                ));
            }
        }
        if g1 && g2 {
            return Err(RdsError::InvalidArgument(
                "RDMA_DEST/RDMA_MAP cannot be combined with RDMA_ARGS/atomics in one message",
            ));
        }
        if (g1
            || cmsgs
                .iter()
                .any(|c| matches!(c, SendCmsg::RdmaDest(_) | SendCmsg::RdmaMap { .. })))
            && !rdma_ok
        {
            return Err(RdsError::NotSupported(
                "RDMA operations need a transport with RDMA (the fabric transport)",
            ));
        }
        if flags.has(SendFlags::ZEROCOPY) {
            return Err(RdsError::NotSupported(
                "MSG_ZEROCOPY is not implemented by this engine",
            ));
        }
        // Most sends carry no control message: no call for nothing.
        let rdma = if cmsgs.is_empty() {
            None
        } else {
            self.rdma_from_cmsgs(cmsgs, s.recverr)?
        };
        let (tos, cached, sport) = (s.tos, s.cached_conn, b.port);
        let len = data.len();
        let local = self.local.contains_key(&daddr);
        let offers = cmsgs
            .iter()
            .any(|c| matches!(c, SendCmsg::RdmaDest(_) | SendCmsg::RdmaMap { .. }));
        if local && (rdma.is_some() || offers) {
            return Err(RdsError::NotSupported(
                "RDMA between two addresses of one node (the loopback transport has no RDMA)",
            ));
        }
        let dest_cookie = if offers {
            self.rdma_dest_from_cmsgs(sock, cmsgs)?
        } else {
            None
        };

        // Loopback: the destination is one of ours.
        if local {
            return self.send_local(now, sock, b.addr, sport, daddr, dport, data, nonblock);
        }
        if transport == TransportKind::Loop {
            return Err(RdsError::NotSupported(
                "a socket bound to a loopback address can only send to this engine's addresses",
            ));
        }

        // The connection (cached in the socket) and the path.
        let key = ConnKey {
            laddr: b.addr,
            faddr: daddr,
            transport,
            tos,
        };
        let c = match cached.filter(|&c| self.conns[c as usize].key == key) {
            Some(c) => c,
            None => {
                let c = self.conn_for(key).ok_or(RdsError::NoMemory(
                    "the connection table is full (max_conns)",
                ))?;
                if let Some(s) = self.socks.get_mut(sock) {
                    s.cached_conn = Some(c);
                }
                c
            }
        };
        let index = self.select_path(now, c, sport);
        let id = PathId { conn: c, index };
        // rds_check_all_paths: a send kicks a connect of any path that is down.
        if self.conns[c as usize].paths[index as usize].state() == ConnState::Down {
            let n = usize::from(self.conns[c as usize].npaths.max(1));
            for i in 0..n.min(self.conns[c as usize].paths.len()) {
                self.conns[c as usize].paths[i].connect_if_down(now);
                self.touch(
                    now,
                    PathId {
                        conn: c,
                        index: i as u8,
                    },
                );
            }
        }
        // Congestion (rds_cong_wait).
        let fcong = self.conns[c as usize].fcong;
        self.cong_check(sock, fcong, dport, nonblock)?;
        // Send buffer, then memory.
        let mid = self.admit(sock, data, nonblock)?;
        let m = self.store.msgs.get_mut(mid);
        m.sport = sport;
        m.dport = dport;
        m.peer = daddr;
        if let Some(op) = rdma {
            // The receiver learns of the operation from RDS_EXTHDR_RDMA on the header
            // (and frees a use-once region named by it).
            let mut w = ExtWriter::new();
            w.push(ExtHeader::Rdma { rkey: op.rkey })
                .expect("an empty extension area has room for one");
            m.ext = w.finish();
            m.rdma = Some(op);
            m.set(Msg::RDMA);
        } else if let Some(c) = dest_cookie {
            // The receiver gets the cookie as RDS_CMSG_RDMA_DEST.
            let mut w = ExtWriter::new();
            w.push(ExtHeader::RdmaDest {
                rkey: cookie_key(c),
                offset: cookie_offset(c),
            })
            .expect("an empty extension area has room for one");
            m.ext = w.finish();
        }
        self.with_path(id, |p, ctx| {
            p.queue(mid, ctx);
        });
        self.stats.copy_from_user += len as u64;
        self.after_path(now, id);
        Ok(len)
    }

    /// The path a socket's messages take (`rds_send_mprds_hash`): the bound port's hash
    /// over the negotiated paths; before negotiation, path 0, with a probe ping if the
    /// hash would pick another (a blocking sender does not wait for the answer here:
    /// the catch-up rule keeps the order when the paths fan out).
    fn select_path(&mut self, now: Instant, c: u32, sport: u16) -> u8 {
        let conn = &self.conns[c as usize];
        if !conn.spec.multipath {
            return 0;
        }
        let n = if conn.npaths == 0 {
            MPATH_WORKERS
        } else {
            usize::from(conn.npaths)
        };
        let hash = mpath_hash(sport, self.hash_initval, n) as u8;
        if conn.npaths == 0 {
            if hash != 0 {
                self.send_probe_ping(now, c);
            }
            return 0;
        }
        hash
    }

    /// `rds_cong_wait` for a send on `sock` to `port` behind map `fcong`.
    fn cong_check(
        &mut self,
        sock: RdsSocket,
        fcong: super::cong::MapIdx,
        port: u16,
        nonblock: bool,
    ) -> Result<(), RdsError> {
        if !self.cong.map(fcong).test(port) {
            return Ok(());
        }
        let idx = sock.idx;
        let s = &mut self.socks.slots[idx as usize];
        if !s.seen_congestion {
            s.seen_congestion = true;
            self.seen_cong.push(idx);
        }
        if nonblock {
            if s.cong_monitor {
                s.cong_mask |= monitor_mask(port);
                if !self.cong.map(fcong).test(port) {
                    return Ok(());
                }
            }
            self.stats.cong_send_error += 1;
            return Err(RdsError::Congested { port });
        }
        self.stats.cong_send_blocked += 1;
        Err(RdsError::Blocked(Block::Congestion { port }))
    }

    /// `rds_send_queue_rm`'s socket half: admit if the socket's queued bytes are below its
    /// send buffer (so the last admitted message may overshoot and poll stays consistent),
    /// then take a record and fragments and copy the payload in. The message is on the
    /// socket's send list on return.
    fn admit(
        &mut self,
        sock: RdsSocket,
        data: &[u8],
        nonblock: bool,
    ) -> Result<crate::store::MsgId, RdsError> {
        let len = data.len();
        let s = &self.socks.slots[sock.idx as usize];
        if s.snd_bytes >= s.sndbuf() {
            self.stats.send_queue_full += 1;
            return Err(if nonblock {
                RdsError::WouldBlock
            } else {
                RdsError::Blocked(Block::SendSpace)
            });
        }
        let nfrags = if len == 0 { 0 } else { frag_count(len) as u32 };
        let nomem = |this: &mut Self| {
            this.stats.send_nomem += 1;
            if nonblock {
                RdsError::NoMemory("the engine's message store is full (RdsConfig::frags, msgs)")
            } else {
                RdsError::Blocked(Block::Memory)
            }
        };
        if !self.store.frags.can_send(nfrags) || !self.store.msgs.can_take_data() {
            return Err(nomem(self));
        }
        let Some(mid) = self.store.msgs.alloc() else {
            return Err(nomem(self));
        };
        let Some(chain) = self.store.frags.alloc_tx(nfrags) else {
            self.store.msgs.free(mid);
            return Err(nomem(self));
        };
        self.store.frags.write_chain(&chain, data);
        let m = self.store.msgs.get_mut(mid);
        m.frags = chain;
        m.len = len as u32;
        m.sock = sock.idx;
        m.set(Msg::ON_SOCK);
        let s = &mut self.socks.slots[sock.idx as usize];
        s.snd_bytes += len as u64;
        if s.snd_bytes >= s.sndbuf() / 2 {
            // "close to send space exhaustion": ask the receiver to ack at once.
            self.store.msgs.get_mut(mid).set(Msg::ACK_REQUIRED);
        }
        self.store.msgs.push_back(&mut s.send_list, Lane::Sock, mid);
        Ok(mid)
    }

    /// Delivery between two addresses of this engine (the loopback transport): the
    /// message goes straight to the destination socket and is acked at once; the
    /// destination's congestion still applies.
    #[allow(clippy::too_many_arguments)]
    fn send_local(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        saddr: Addr,
        sport: u16,
        daddr: Addr,
        dport: u16,
        data: &[u8],
        nonblock: bool,
    ) -> Result<usize, RdsError> {
        let map = self.local[&daddr];
        self.cong_check(sock, map, dport, nonblock)?;
        let mid = self.admit(sock, data, nonblock)?;
        // Acked at once: off the socket's send list, its space back.
        let s = &mut self.socks.slots[sock.idx as usize];
        self.store.msgs.remove(&mut s.send_list, Lane::Sock, mid);
        s.snd_bytes -= data.len() as u64;
        if s.snd_bytes == 0 {
            self.stats.send_queue_empty += 1;
        }
        let m = self.store.msgs.get_mut(mid);
        m.clear(Msg::ON_SOCK | Msg::ACK_REQUIRED);
        m.sport = sport;
        m.dport = dport;
        self.stats.send_queued += 1;
        self.stats.copy_from_user += data.len() as u64;
        if dport == 0 && self.cfg.ping_enable {
            // A ping to ourselves: answered with a pong from port 0.
            self.store.free_now(mid);
            if sport == 0 {
                self.stats.recv_ping_bad_sport += 1;
                return Ok(data.len());
            }
            self.stats.recv_ping += 1;
            if let Some(pong) = self.store.msgs.alloc() {
                let p = self.store.msgs.get_mut(pong);
                p.sport = 0;
                p.dport = sport;
                self.stats.send_pong += 1;
                self.deliver_to(now, saddr, daddr, pong);
            }
            return Ok(data.len());
        }
        self.deliver_to(now, daddr, saddr, mid);
        Ok(data.len())
    }
}
