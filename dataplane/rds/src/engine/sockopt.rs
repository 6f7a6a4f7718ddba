//! Socket lifecycle and options: `socket`, `bind` (`rds_bind`, `rds_add_bound`), `connect`
//! (`rds_connect`), `close` (`rds_release`), `setsockopt`/`getsockopt` with Linux's values
//! and errors (raw, as a C shim passes them, and typed), `RDS_CANCEL_SENT_TO`
//! (`rds_send_drop_to`) and the TOS ioctl.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lcore::time::Instant;

use super::config::TransportKind;
use super::core::RdsEngine;
use super::socket::{Bound, RdsSocket, sockaddr, split};
use crate::addr::Addr;
use crate::error::RdsError;
use crate::store::{Lane, Msg};
use crate::uapi::*;
use crate::wire::PROBE_PORT;

/// `sizeof(struct sockaddr_in)` and `sizeof(struct sockaddr_in6)`.
const SIN_LEN: usize = 16;
const SIN6_LEN: usize = 28;

fn int_opt(val: &[u8]) -> Option<i32> {
    (val.len() >= 4).then(|| i32::from_ne_bytes([val[0], val[1], val[2], val[3]]))
}

/// Encodes a socket address as `struct sockaddr_in` / `sockaddr_in6` bytes (for the raw
/// option calls).
pub fn sockaddr_bytes(sa: SocketAddr) -> ([u8; SIN6_LEN], usize) {
    let mut b = [0u8; SIN6_LEN];
    match sa {
        SocketAddr::V4(v4) => {
            b[0..2].copy_from_slice(&2u16.to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            (b, SIN_LEN)
        }
        SocketAddr::V6(v6) => {
            b[0..2].copy_from_slice(&10u16.to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            (b, SIN6_LEN)
        }
    }
}

impl RdsEngine {
    /// `socket(AF_RDS, SOCK_SEQPACKET, 0)`: a new, unbound socket.
    ///
    /// # Errors
    ///
    /// [`RdsError::NoMemory`] when [`RdsConfig::max_sockets`](super::RdsConfig) are open.
    pub fn socket(&mut self) -> Result<RdsSocket, RdsError> {
        self.socks
            .open(self.cfg.wmem_default, self.cfg.rmem_default)
            .ok_or(RdsError::NoMemory("max_sockets sockets are open"))
    }

    /// `socket(AF_RDS, ty, protocol)` with the C arguments: anything but
    /// `SOCK_SEQPACKET` (5) and protocol 0 fails with `ESOCKTNOSUPPORT`.
    ///
    /// # Errors
    ///
    /// As [`socket`](Self::socket), and [`RdsError::SocketType`].
    pub fn socket_raw(&mut self, ty: i32, protocol: i32) -> Result<RdsSocket, RdsError> {
        const SOCK_SEQPACKET: i32 = 5;
        if ty != SOCK_SEQPACKET || protocol != 0 {
            return Err(RdsError::SocketType);
        }
        self.socket()
    }

    /// Sockets open.
    pub fn socket_count(&self) -> usize {
        self.socks.open_count()
    }

    /// `bind`: address and port, and with them the transport. Port 0 picks a free port at
    /// random (never 0 or 1). Returns the bound address.
    ///
    /// # Errors
    ///
    /// `EINVAL`: any, broadcast or multicast address, link-local IPv6 without scope,
    /// already bound, port 1 (the multipath probe port). `EADDRINUSE`: the port is taken
    /// (or, for port 0, every port is). `EADDRNOTAVAIL`: the address is not this engine's.
    /// `ENOPROTOOPT`: the transport chosen with `SO_RDS_TRANSPORT` does not serve it.
    pub fn bind(&mut self, sock: RdsSocket, addr: SocketAddr) -> Result<SocketAddr, RdsError> {
        let (a, port, scope) = split(addr);
        a.check_unicast().map_err(RdsError::InvalidArgument)?;
        if a.is_link_local() && scope == 0 {
            return Err(RdsError::InvalidArgument(
                "a link-local IPv6 address needs a scope id",
            ));
        }
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        if s.bound.is_some() {
            return Err(RdsError::InvalidArgument(
                "the socket is already bound; RDS does not re-bind",
            ));
        }
        if let Some((_, _, cscope)) = s.conn_addr
            && scope != 0
            && cscope != 0
            && scope != cscope
        {
            return Err(RdsError::InvalidArgument(
                "the address's scope id differs from the connected address's",
            ));
        }
        let loopback = a.is_loopback();
        let transport = match s.transport {
            Some(t) => {
                if !self.local.contains_key(&a) {
                    return Err(RdsError::NoProtoOpt(
                        "the transport set with SO_RDS_TRANSPORT does not serve this address",
                    ));
                }
                t
            }
            None if loopback => TransportKind::Loop,
            None => {
                if !self.local.contains_key(&a) {
                    return Err(RdsError::AddrNotAvailable);
                }
                self.cfg
                    .transports
                    .iter()
                    .map(|t| t.kind)
                    .min()
                    .ok_or(RdsError::AddrNotAvailable)?
            }
        };
        if port == PROBE_PORT {
            return Err(RdsError::InvalidArgument(
                "port 1 is reserved for the multipath probe",
            ));
        }
        let key = |p: u16| Bound {
            addr: a,
            port: p,
            scope: 0,
        };
        let chosen = if port != 0 {
            if self.socks.bound.contains_key(&key(port)) {
                return Err(RdsError::AddrInUse);
            }
            port
        } else {
            // rds_add_bound: start at max(random, 2), probe every port once, skip 0 and 1.
            let start = (self.rng.next_u32() as u16).max(2);
            let mut rover = start;
            loop {
                if rover >= 2 && !self.socks.bound.contains_key(&key(rover)) {
                    break rover;
                }
                rover = rover.wrapping_add(1);
                if rover == start {
                    return Err(RdsError::AddrInUse);
                }
            }
        };
        if loopback && !self.local.contains_key(&a) {
            self.add_local_addr(a.ip());
        }
        self.socks.bound.insert(key(chosen), sock.idx);
        let s = self.socks.get_mut(sock).expect("checked");
        s.bound = Some(Bound {
            addr: a,
            port: chosen,
            scope,
        });
        s.transport = Some(transport);
        Ok(sockaddr(a, chosen, scope))
    }

    /// The bound address.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`]; [`RdsError::NotConnected`] if unbound.
    pub fn local_addr(&self, sock: RdsSocket) -> Result<SocketAddr, RdsError> {
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        let b = s
            .bound
            .ok_or(RdsError::NotConnected("the socket is not bound"))?;
        Ok(sockaddr(b.addr, b.port, b.scope))
    }

    /// `connect`: records a default destination (no handshake).
    ///
    /// # Errors
    ///
    /// `EDESTADDRREQ` for the wildcard, `EINVAL` for multicast or broadcast (and bad
    /// link-local scopes), `EPROTOTYPE` for a non-unicast IPv6 address.
    pub fn connect(&mut self, sock: RdsSocket, addr: SocketAddr) -> Result<(), RdsError> {
        let (a, port, scope) = split(addr);
        let s = self.socks.get_mut(sock).ok_or(RdsError::BadSocket)?;
        match addr.ip() {
            IpAddr::V4(v4) => {
                if v4.is_unspecified() {
                    return Err(RdsError::DestAddrRequired);
                }
                if v4.is_multicast() || v4.is_broadcast() {
                    return Err(RdsError::InvalidArgument(
                        "multicast and broadcast destinations are not allowed",
                    ));
                }
            }
            IpAddr::V6(v6) => {
                if a.check_unicast().is_err() {
                    return Err(RdsError::ProtoType("the IPv6 destination is not unicast"));
                }
                if a.is_link_local() {
                    let bound_scope = s.bound.map_or(0, |b| b.scope);
                    if scope == 0 || (bound_scope != 0 && scope != bound_scope) {
                        return Err(RdsError::InvalidArgument(
                            "a link-local destination needs the bound address's scope id",
                        ));
                    }
                }
                let _ = v6;
            }
        }
        s.conn_addr = Some((a, port, scope));
        Ok(())
    }

    /// `close`: unread messages are dropped (the port's congestion clears), unacked sends
    /// are cancelled from every queue, and the port is free again.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn close(&mut self, now: Instant, sock: RdsSocket) -> Result<(), RdsError> {
        self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        let idx = sock.idx;
        // rds_clear_recv_queue
        loop {
            let s = &mut self.socks.slots[idx as usize];
            let Some(mid) = self.store.msgs.pop_front(&mut s.recv_list, Lane::Sock) else {
                break;
            };
            let len = i64::from(self.store.msgs.get(mid).len);
            self.store.msgs.get_mut(mid).clear(Msg::ON_SOCK);
            self.store.free_now(mid);
            self.rcvbuf_delta(now, idx, -len);
        }
        // rds_cong_remove_socket
        self.monitors.retain(|&m| m != idx);
        if let Some(b) = self.socks.slots[idx as usize].bound
            && let Some(&map) = self.local.get(&b.addr)
            && self.cong.map(map).test(b.port)
        {
            self.set_port_congested(now, b.addr, b.port, false);
        }
        // rds_send_drop_to(rs, NULL)
        self.drop_sends(now, sock, None);
        // rds_rdma_drop_keys
        self.drop_mrs(sock);
        self.socks.release(idx);
        Ok(())
    }

    /// `RDS_CANCEL_SENT_TO`: drops this socket's unacked messages to `dest` from the
    /// socket and from the connection queues (one being transmitted is finished, but
    /// never resent).
    ///
    /// # Errors
    ///
    /// As the raw option: `ENOTCONN` on an unbound socket.
    pub fn cancel_sent_to(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        dest: SocketAddr,
    ) -> Result<(), RdsError> {
        let (b, n) = sockaddr_bytes(dest);
        self.setsockopt_raw(now, sock, SOL_RDS, RDS_CANCEL_SENT_TO, &b[..n])
    }

    /// Drops the socket's unacked sends, all of them or those to `dest`.
    fn drop_sends(&mut self, now: Instant, sock: RdsSocket, dest: Option<(Addr, u16)>) {
        let idx = sock.idx;
        let mut at = self.socks.slots[idx as usize].send_list.front();
        let mut touched = Vec::new();
        while let Some(mid) = at {
            at = self.store.msgs.next(Lane::Sock, mid);
            let m = self.store.msgs.get(mid);
            if dest.is_some_and(|(a, p)| m.peer != a || m.dport != p) {
                continue;
            }
            let (conn, path, len) = (m.conn, m.path, u64::from(m.len));
            let s = &mut self.socks.slots[idx as usize];
            self.store.msgs.remove(&mut s.send_list, Lane::Sock, mid);
            s.snd_bytes = s.snd_bytes.saturating_sub(len);
            self.store.msgs.get_mut(mid).clear(Msg::ON_SOCK);
            // __rds_send_complete(.., RDS_RDMA_CANCELED) for a cancelled RDMA message
            // (a closing socket gets no notifications).
            if let Some(op) = self.store.msgs.get(mid).rdma
                && dest.is_some()
                && !op.done
                && (op.notify || op.recverr)
            {
                s.notify.push_back(crate::engine::RdmaNotify {
                    user_token: op.user_token,
                    status: RDS_RDMA_CANCELED,
                });
            }
            if (conn as usize) < self.conns.len() {
                let id = crate::path::PathId { conn, index: path };
                self.with_path(id, |p, ctx| p.cancel(mid, ctx));
                touched.push(id);
            }
            self.stats.send_drop_cancelled += 1;
            self.store.release_if_unused(mid);
        }
        for id in touched {
            self.touch(now, id);
        }
        if self.socks.slots[idx as usize].live {
            self.notify_sock(idx);
        }
    }

    /// `setsockopt` with C's arguments: `level`, `name`, and the option bytes as the
    /// caller's `optval`/`optlen`.
    ///
    /// | level, option | value | errors |
    /// |---|---|---|
    /// | `SOL_SOCKET`, `SO_SNDBUF`/`SO_RCVBUF` | int, capped at `wmem_max`/`rmem_max`, stored doubled | `EINVAL` if shorter than an int |
    /// | `SOL_RDS`, `RDS_CANCEL_SENT_TO` | `sockaddr_in`/`_in6` | `ENOTCONN` unbound, `EINVAL` shorter than `sockaddr_in` |
    /// | `SOL_RDS`, `RDS_RECVERR`, `RDS_CONG_MONITOR` | int (bool) | `EINVAL` if shorter than an int |
    /// | `SOL_RDS`, `SO_RDS_TRANSPORT` | int | `EOPNOTSUPP` once a transport is attached (bound or set); `EINVAL` unless exactly 4 bytes, or a value outside 0..3; `ENOPROTOOPT` if no such transport here |
    /// | `SOL_RDS`, `SO_TIMESTAMP_OLD`/`_NEW` | int | `EFAULT` unless exactly 4 bytes |
    /// | `SOL_RDS`, `RDS_GET_MR`, `RDS_GET_MR_FOR_DEST` | `rds_get_mr_args` (32 B) / `_for_dest_args` (160 B) | `EINVAL` another length, then as [`get_mr`](Self::get_mr); `EFAULT` for a non-zero `cookie_addr` (use [`get_mr_raw`](Self::get_mr_raw), which returns the cookie) |
    /// | `SOL_RDS`, `RDS_FREE_MR` | `rds_free_mr_args` (16 B) | as [`free_mr_raw`](Self::free_mr_raw) |
    /// | anything else | | `ENOPROTOOPT` |
    ///
    /// # Errors
    ///
    /// As in the table, and [`RdsError::BadSocket`].
    pub fn setsockopt_raw(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        level: i32,
        name: i32,
        val: &[u8],
    ) -> Result<(), RdsError> {
        self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        let short = RdsError::InvalidArgument("the option value is shorter than an int");
        if level == SOL_SOCKET {
            let v = int_opt(val).ok_or(short)?;
            let v = u32::try_from(v.max(0)).unwrap_or(0);
            let (max, min) = match name {
                SO_SNDBUF => (self.cfg.wmem_max, SOCK_MIN_SNDBUF),
                SO_RCVBUF => (self.cfg.rmem_max, SOCK_MIN_RCVBUF),
                _ => {
                    return Err(RdsError::NoProtoOpt(
                        "this engine implements SO_SNDBUF and SO_RCVBUF at SOL_SOCKET",
                    ));
                }
            };
            let stored = v.min(max).saturating_mul(2).max(min);
            let s = self.socks.get_mut(sock).expect("checked");
            let before = s.base_ready();
            if name == SO_SNDBUF {
                s.sk_sndbuf = stored;
            } else {
                s.sk_rcvbuf = stored;
            }
            if s.base_ready() != before {
                self.notify_sock(sock.idx);
            }
            return Ok(());
        }
        if level != SOL_RDS {
            return Err(RdsError::NoProtoOpt(
                "RDS options are at level SOL_RDS (276)",
            ));
        }
        match name {
            RDS_CANCEL_SENT_TO => {
                let s = self.socks.get(sock).expect("checked");
                if s.bound.is_none() {
                    return Err(RdsError::NotConnected("the socket is not bound"));
                }
                let dest = if val.len() < SIN_LEN {
                    return Err(RdsError::InvalidArgument(
                        "RDS_CANCEL_SENT_TO takes a sockaddr_in or sockaddr_in6",
                    ));
                } else if val.len() < SIN6_LEN {
                    let ip = Ipv4Addr::new(val[4], val[5], val[6], val[7]);
                    (
                        Addr::new(IpAddr::V4(ip)),
                        u16::from_be_bytes([val[2], val[3]]),
                    )
                } else {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&val[8..24]);
                    (
                        Addr::new(IpAddr::V6(Ipv6Addr::from(a))),
                        u16::from_be_bytes([val[2], val[3]]),
                    )
                };
                self.drop_sends(now, sock, Some(dest));
                Ok(())
            }
            RDS_RECVERR | RDS_CONG_MONITOR => {
                let on = int_opt(val).ok_or(short)? != 0;
                let idx = sock.idx;
                let s = self.socks.get_mut(sock).expect("checked");
                if name == RDS_RECVERR {
                    s.recverr = on;
                    return Ok(());
                }
                s.cong_monitor = on;
                if on {
                    if !self.monitors.contains(&idx) {
                        self.monitors.push(idx);
                    }
                } else {
                    s.cong_mask = 0;
                    s.cong_notify = 0;
                    self.monitors.retain(|&m| m != idx);
                }
                Ok(())
            }
            SO_RDS_TRANSPORT => {
                let s = self.socks.get(sock).expect("checked");
                if s.transport.is_some() {
                    return Err(RdsError::NotSupported(
                        "the socket already has a transport (set it once, before bind)",
                    ));
                }
                if val.len() != 4 {
                    return Err(RdsError::InvalidArgument(
                        "SO_RDS_TRANSPORT takes exactly an int",
                    ));
                }
                let t = int_opt(val).expect("4 bytes");
                let kind = match t {
                    RDS_TRANS_IB => TransportKind::Ib,
                    RDS_TRANS_TCP => TransportKind::Tcp,
                    RDS_TRANS_GAP => {
                        return Err(RdsError::NoProtoOpt(
                            "RDS_TRANS_GAP (iWARP) is deprecated and not provided",
                        ));
                    }
                    _ => {
                        return Err(RdsError::InvalidArgument(
                            "SO_RDS_TRANSPORT is RDS_TRANS_IB (0) or RDS_TRANS_TCP (2)",
                        ));
                    }
                };
                if self.spec(kind).is_none() {
                    return Err(RdsError::NoProtoOpt(
                        "this engine's driver provides no such transport",
                    ));
                }
                self.socks.get_mut(sock).expect("checked").transport = Some(kind);
                Ok(())
            }
            SO_TIMESTAMP_OLD | SO_TIMESTAMP_NEW => {
                if val.len() != 4 {
                    return Err(RdsError::Fault("SO_TIMESTAMP takes exactly an int"));
                }
                self.socks.get_mut(sock).expect("checked").timestamp =
                    int_opt(val).expect("4 bytes") != 0;
                Ok(())
            }
            RDS_GET_MR | RDS_GET_MR_FOR_DEST => {
                let a = super::rdma::GetMrArgs::parse(name, val)?;
                if a.cookie_addr != 0 {
                    // Checked before registering, so nothing is left behind.
                    self.mr_precheck(sock)?;
                    crate::engine::check_mr_range(a.addr, a.bytes)?;
                    return Err(RdsError::Fault(
                        "the engine writes no memory through cookie_addr: call RdsEngine::get_mr_raw (or get_mr), which returns the cookie",
                    ));
                }
                self.get_mr(sock, a.addr, a.bytes, a.flags).map(|_| ())
            }
            RDS_FREE_MR => self.free_mr_raw(sock, val),
            _ => Err(RdsError::NoProtoOpt("unknown SOL_RDS option")),
        }
    }

    /// `getsockopt` with C's arguments: writes the value into `out` and returns its length.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `out` is shorter than an int; `ENOPROTOOPT` for other options (the
    /// `RDS_INFO_*` listings are served by the engine's info methods, not here).
    pub fn getsockopt_raw(
        &self,
        sock: RdsSocket,
        level: i32,
        name: i32,
        out: &mut [u8],
    ) -> Result<usize, RdsError> {
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        let v: i32 = match (level, name) {
            (SOL_SOCKET, SO_SNDBUF) => s.sk_sndbuf as i32,
            (SOL_SOCKET, SO_RCVBUF) => s.sk_rcvbuf as i32,
            (SOL_RDS, RDS_RECVERR) => i32::from(s.recverr),
            (SOL_RDS, SO_RDS_TRANSPORT) => s.transport.map_or(RDS_TRANS_NONE, |t| t.value()),
            _ => return Err(RdsError::NoProtoOpt("unknown option")),
        };
        if out.len() < 4 {
            return Err(RdsError::InvalidArgument(
                "the option buffer is shorter than an int",
            ));
        }
        out[..4].copy_from_slice(&v.to_ne_bytes());
        Ok(4)
    }

    /// `SO_SNDBUF`.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn set_sndbuf(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        bytes: u32,
    ) -> Result<(), RdsError> {
        let v = bytes.min(i32::MAX as u32) as i32;
        self.setsockopt_raw(now, sock, SOL_SOCKET, SO_SNDBUF, &v.to_ne_bytes())
    }

    /// `SO_RCVBUF`.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn set_rcvbuf(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        bytes: u32,
    ) -> Result<(), RdsError> {
        let v = bytes.min(i32::MAX as u32) as i32;
        self.setsockopt_raw(now, sock, SOL_SOCKET, SO_RCVBUF, &v.to_ne_bytes())
    }

    /// The send-buffer limit in payload bytes (half of what `getsockopt(SO_SNDBUF)` says).
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn sndbuf(&self, sock: RdsSocket) -> Result<u64, RdsError> {
        Ok(self.socks.get(sock).ok_or(RdsError::BadSocket)?.sndbuf())
    }

    /// The receive-buffer limit in payload bytes.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn rcvbuf(&self, sock: RdsSocket) -> Result<u64, RdsError> {
        Ok(self.socks.get(sock).ok_or(RdsError::BadSocket)?.rcvbuf())
    }

    /// Payload bytes sent and not yet acked, and bytes queued unread.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn queued_bytes(&self, sock: RdsSocket) -> Result<(u64, u64), RdsError> {
        let s = self.socks.get(sock).ok_or(RdsError::BadSocket)?;
        Ok((s.snd_bytes, s.rcv_bytes))
    }

    /// `RDS_CONG_MONITOR`.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn set_cong_monitor(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        on: bool,
    ) -> Result<(), RdsError> {
        self.setsockopt_raw(
            now,
            sock,
            SOL_RDS,
            RDS_CONG_MONITOR,
            &i32::from(on).to_ne_bytes(),
        )
    }

    /// `RDS_RECVERR`.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn set_recverr(&mut self, now: Instant, sock: RdsSocket, on: bool) -> Result<(), RdsError> {
        self.setsockopt_raw(
            now,
            sock,
            SOL_RDS,
            RDS_RECVERR,
            &i32::from(on).to_ne_bytes(),
        )
    }

    /// `SO_RDS_TRANSPORT` (`RDS_TRANS_IB` 0, `RDS_TRANS_TCP` 2).
    ///
    /// # Errors
    ///
    /// See [`setsockopt_raw`](Self::setsockopt_raw).
    pub fn set_transport(&mut self, now: Instant, sock: RdsSocket, t: i32) -> Result<(), RdsError> {
        self.setsockopt_raw(now, sock, SOL_RDS, SO_RDS_TRANSPORT, &t.to_ne_bytes())
    }

    /// `getsockopt(SO_RDS_TRANSPORT)`: the transport, or `RDS_TRANS_NONE` when none is
    /// attached.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn transport(&self, sock: RdsSocket) -> Result<i32, RdsError> {
        let mut b = [0u8; 4];
        self.getsockopt_raw(sock, SOL_RDS, SO_RDS_TRANSPORT, &mut b)?;
        Ok(i32::from_ne_bytes(b))
    }

    /// `SO_TIMESTAMP`: received messages carry the time they were queued.
    ///
    /// # Errors
    ///
    /// [`RdsError::BadSocket`].
    pub fn set_timestamp(
        &mut self,
        now: Instant,
        sock: RdsSocket,
        on: bool,
    ) -> Result<(), RdsError> {
        self.setsockopt_raw(
            now,
            sock,
            SOL_RDS,
            SO_TIMESTAMP_OLD,
            &i32::from(on).to_ne_bytes(),
        )
    }

    /// `ioctl(SIOCRDSSETTOS)`: the socket's type of service, part of its connections' key;
    /// only before the socket has a TOS or a connection.
    ///
    /// # Errors
    ///
    /// `EINVAL` once set or once the socket has sent; `ENOTCONN` (the kernel's
    /// `ENOIOCTLCMD`) before bind.
    pub fn set_tos(&mut self, sock: RdsSocket, tos: u8) -> Result<(), RdsError> {
        let s = self.socks.get_mut(sock).ok_or(RdsError::BadSocket)?;
        if s.transport.is_none() {
            return Err(RdsError::NotConnected(
                "bind the socket before setting its TOS",
            ));
        }
        if s.tos != 0 || s.cached_conn.is_some() {
            return Err(RdsError::InvalidArgument(
                "the TOS is set once, before the socket's first send",
            ));
        }
        s.tos = tos;
        Ok(())
    }
}
