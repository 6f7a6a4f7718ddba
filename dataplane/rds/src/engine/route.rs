//! Where received messages go (`rds_recv_incoming` after the sequence rules): congestion
//! maps into the peer's map, pings answered, multipath probes processed, everything else
//! to the socket bound to the destination port. And the receive-buffer accounting that
//! marks ports congested (`rds_recv_rcvbuf_delta`), with its propagation.

use lcore::time::Instant;

use super::config::TransportKind;
use super::cong::MapIdx;
use super::core::RdsEngine;
use super::socket::Bound;
use crate::addr::Addr;
use crate::path::PathId;
use crate::store::{Lane, List, Msg, MsgId};
use crate::wire::exthdr::ExtEnd;
use crate::wire::{CONG_MAP_BYTES, ExtHeader, ExtIter, ExtWriter, MPATH_WORKERS, PROBE_PORT};

impl RdsEngine {
    /// A path came up: every path of the connection may now send the queued map update;
    /// a multipath connection that has not negotiated its paths pings (the passive side
    /// of RDS-TCP does this after accepting path 0; here both sides do, guarded).
    pub(crate) fn path_up(&mut self, now: Instant, id: PathId) {
        let conn = &self.conns[id.conn as usize];
        if conn.spec.multipath && id.index == 0 && conn.npaths == 0 {
            self.send_probe_ping(now, id.conn);
        }
        self.touch_conn(now, id.conn);
    }

    /// `rds_send_ping`: one probe ping (port 1 to port 0) on path 0, with NPATHS and
    /// GEN_NUM, unless one is outstanding.
    pub(crate) fn send_probe_ping(&mut self, now: Instant, c: u32) {
        let conn = &mut self.conns[c as usize];
        if conn.ping_triggered {
            return;
        }
        conn.ping_triggered = true;
        let id = PathId { conn: c, index: 0 };
        if self.queue_probe(now, id, PROBE_PORT, 0) {
            self.touch(now, id);
        }
    }

    /// `rds_send_probe`: a zero-length sequenced message (ping, pong or probe) on a path;
    /// probes between ports 1 and 0 of a multipath connection carry NPATHS and GEN_NUM, and
    /// SPORT_IDX if the transport's spec says so (last: Linux 6.1 knows no type 8, skips its
    /// type byte and reads the dummy byte 0 as the end).
    ///
    /// The caller touches the path: a pong is queued while routing the path's received
    /// messages, which `after_path` follows with the touch (one per ping, not two).
    pub(crate) fn queue_probe(&mut self, now: Instant, id: PathId, sport: u16, dport: u16) -> bool {
        let spec = self.conns[id.conn as usize].spec;
        let multipath = spec.multipath;
        let faddr = self.conns[id.conn as usize].key.faddr;
        let Some(mid) = self.store.msgs.alloc() else {
            return false;
        };
        let m = self.store.msgs.get_mut(mid);
        m.sport = sport;
        m.dport = dport;
        m.len = 0;
        m.peer = faddr;
        if multipath && crate::wire::is_hs_probe(sport, dport) {
            let mut w = ExtWriter::new();
            // All fit (3 + 5 + 2 bytes of 16).
            let _ = w.push(ExtHeader::NPaths(MPATH_WORKERS as u16));
            let _ = w.push(ExtHeader::GenNum(self.gen_num));
            if spec.sport_idx {
                let _ = w.push(ExtHeader::SportIdx);
            }
            m.ext = w.finish();
        }
        self.with_path(id, |p, ctx| {
            p.connect_if_down(now);
            p.queue(mid, ctx);
        });
        self.stats.send_pong += 1;
        true
    }

    /// Routes the messages a path received whole.
    pub(crate) fn route_received(&mut self, now: Instant, id: PathId, mut list: List) {
        while let Some(mid) = self.store.msgs.pop_front(&mut list, Lane::Conn) {
            let m = self.store.msgs.get(mid);
            let (cong, sport, dport, ext) = (m.has(Msg::CONG_MAP), m.sport, m.dport, m.ext);
            if cong {
                self.cong_received(now, id.conn, mid);
            } else if dport == 0 && self.cfg.ping_enable {
                self.store.free_now(mid);
                if sport == 0 {
                    self.stats.recv_ping_bad_sport += 1;
                    continue;
                }
                self.stats.recv_ping += 1;
                let fcong = self.conns[id.conn as usize].fcong;
                if self.cong.map(fcong).test(sport) {
                    // Kernel pongs use the non-blocking congestion check: not sent.
                    self.stats.cong_send_error += 1;
                } else {
                    // On this path: route_outputs' caller (after_path) touches it.
                    self.queue_probe(now, id, 0, sport);
                }
                if sport == PROBE_PORT {
                    self.recv_hs(now, id.conn, &ext);
                }
            } else if dport == PROBE_PORT && sport == 0 {
                self.store.free_now(mid);
                self.recv_hs(now, id.conn, &ext);
            } else {
                self.deliver(now, id.conn, mid);
            }
        }
    }

    /// `rds_recv_hs_exthdrs` and `rds_start_mprds`: the peer's path count and generation.
    fn recv_hs(&mut self, now: Instant, c: u32, ext: &[u8; 16]) {
        let mut npaths: Option<u16> = None;
        let mut peer_gen = 0u32;
        let mut sport_idx = false;
        let mut it = ExtIter::new(ext);
        for e in it.by_ref() {
            match e {
                ExtHeader::NPaths(n) => npaths = Some(n),
                ExtHeader::GenNum(g) => peer_gen = g,
                ExtHeader::SportIdx => sport_idx = true,
                _ => {}
            }
        }
        if !matches!(it.end(), ExtEnd::Clean) {
            self.stats.recv_bad_exthdr += 1;
        }
        let conn = &mut self.conns[c as usize];
        conn.ping_triggered = false;
        if !conn.spec.multipath {
            return;
        }
        conn.peer_sport_idx = sport_idx;
        // min(8, NPATHS), at least 1 (absent: a legacy single-path peer); rounded down to a
        // power of two, which the path hash needs (the kernel would use 3 as a mask).
        let n = npaths.map_or(1, |n| n.min(MPATH_WORKERS as u16)).max(1);
        let n = 1u16 << (15 - n.leading_zeros() as u16);
        let was = conn.npaths;
        conn.npaths = n as u8;
        if peer_gen != 0 {
            if conn.peer_gen != 0 && peer_gen != conn.peer_gen {
                self.stats.peer_gen_changed += 1;
                for i in 0..self.conns[c as usize].paths.len() {
                    let id = PathId {
                        conn: c,
                        index: i as u8,
                    };
                    self.with_path(id, |p, ctx| p.peer_restarted(ctx));
                }
            }
            self.conns[c as usize].peer_gen = peer_gen;
        }
        let conn = &mut self.conns[c as usize];
        if was < 2 && n > 1 {
            conn.catchup_seq = Some(conn.paths[0].next_tx_seq());
            for p in conn.paths.iter_mut().skip(1) {
                p.set_tx_hold(true);
            }
        }
        if n > 1 && conn.key.laddr < conn.key.faddr {
            for i in 0..usize::from(n) {
                self.conns[c as usize].paths[i].connect_if_down(now);
            }
        }
        self.touch_conn(now, c);
    }

    /// A congestion map arrived on connection `c`: it replaces the peer's map.
    fn cong_received(&mut self, _now: Instant, c: u32, mid: MsgId) {
        let mut bytes = [0u8; CONG_MAP_BYTES];
        self.store.read_payload(mid, 0, &mut bytes);
        self.store.free_now(mid);
        let fcong = self.conns[c as usize].fcong;
        if let Some(mask) = self.cong.received(fcong, &bytes) {
            self.stats.cong_update_received += 1;
            self.cong_map_updated(mask);
        }
    }

    /// `rds_cong_map_updated`: monitoring sockets learn which ports cleared, and sockets
    /// that saw congestion are woken.
    pub(crate) fn cong_map_updated(&mut self, mask: u64) {
        for k in 0..self.monitors.len() {
            let idx = self.monitors[k];
            let s = &mut self.socks.slots[idx as usize];
            s.cong_notify |= s.cong_mask & mask;
            s.cong_mask &= !mask;
            if s.cong_notify != 0 {
                self.notify_sock(idx);
            }
        }
        let seen = core::mem::take(&mut self.seen_cong);
        for idx in &seen {
            self.socks.slots[*idx as usize].seen_congestion = false;
            self.notify_sock(*idx);
        }
        self.seen_cong = seen;
        self.seen_cong.clear();
    }

    /// Queues a message to the socket bound to its destination port, or drops it.
    fn deliver(&mut self, now: Instant, c: u32, mid: MsgId) {
        let conn = &self.conns[c as usize];
        let (laddr, faddr) = (conn.key.laddr, conn.key.faddr);
        self.deliver_to(now, laddr, faddr, mid);
    }

    /// Delivery proper: `daddr:dport` is looked up in the bind table.
    pub(crate) fn deliver_to(&mut self, now: Instant, daddr: Addr, saddr: Addr, mid: MsgId) {
        let m = self.store.msgs.get(mid);
        let (dport, len, ext) = (m.dport, m.len, m.ext);
        let Some(&sidx) = self.socks.bound.get(&Bound {
            addr: daddr,
            port: dport,
            scope: 0,
        }) else {
            self.stats.recv_drop_no_sock += 1;
            self.store.free_now(mid);
            return;
        };
        let mut cookie = 0;
        for e in ExtIter::new(&ext) {
            match e {
                ExtHeader::RdmaDest { rkey, offset } => {
                    cookie = u64::from(rkey) | (u64::from(offset) << 32);
                }
                // The peer's RDMA on one of this socket's regions preceded this message
                // (`rds_rdma_unuse`): a use-once region is freed now. A key the socket
                // does not own changes nothing (another socket's region stays).
                ExtHeader::Rdma { rkey } => self.rdma_unuse(sidx, rkey),
                _ => {}
            }
        }
        let s = &mut self.socks.slots[sidx as usize];
        let m = self.store.msgs.get_mut(mid);
        m.peer = saddr;
        m.sock = sidx;
        m.rdma_cookie = cookie;
        m.queued_at = now;
        m.set(Msg::ON_SOCK);
        self.store.msgs.push_back(&mut s.recv_list, Lane::Sock, mid);
        self.stats.recv_queued += 1;
        self.rcvbuf_delta(now, sidx, i64::from(len));
        self.notify_sock(sidx);
    }

    /// `rds_recv_rcvbuf_delta`: receive-queue accounting, with the congestion hysteresis
    /// (congested above the receive buffer, clear again below half of it).
    pub(crate) fn rcvbuf_delta(&mut self, now: Instant, sidx: u32, delta: i64) {
        if delta == 0 {
            return;
        }
        let s = &mut self.socks.slots[sidx as usize];
        if delta > 0 {
            s.rcv_bytes += delta as u64;
            self.stats.recv_bytes_added_to_sock += delta as u64;
        } else {
            s.rcv_bytes = s.rcv_bytes.saturating_sub(delta.unsigned_abs());
            self.stats.recv_bytes_freed_fromsock += delta.unsigned_abs();
        }
        if s.transport == Some(TransportKind::Loop) {
            return;
        }
        let Some(b) = s.bound else {
            return;
        };
        let rcvbuf = s.rcvbuf();
        let now_congested = s.rcv_bytes > rcvbuf;
        if !s.congested && now_congested {
            s.congested = true;
            self.set_port_congested(now, b.addr, b.port, true);
        } else if s.congested && s.rcv_bytes < rcvbuf / 2 {
            s.congested = false;
            self.set_port_congested(now, b.addr, b.port, false);
        }
    }

    /// Sets or clears a port's bit in a local map and propagates the change.
    pub(crate) fn set_port_congested(&mut self, now: Instant, addr: Addr, port: u16, on: bool) {
        let Some(&map) = self.local.get(&addr) else {
            return;
        };
        if on {
            self.cong.map_mut(map).set(port);
        } else {
            self.cong.map_mut(map).clear(port);
        }
        self.queue_cong_updates(now, map);
        // Senders inside this engine read the local map directly (loopback delivery):
        // wake them as a received update would (all ports, as the loopback transport does).
        self.cong.bump();
        if !on {
            self.cong_map_updated(!0);
        }
    }

    /// `rds_cong_queue_updates`: every connection whose local map this is sends it (once
    /// per pending change; the map content at send time goes out).
    pub(crate) fn queue_cong_updates(&mut self, now: Instant, map: MapIdx) {
        let n = self.cong.conns(map).len();
        for k in 0..n {
            let c = self.cong.conns(map)[k];
            let conn = &mut self.conns[c as usize];
            if !conn.map_queued {
                conn.map_queued = true;
                self.stats.cong_update_queued += 1;
            }
            self.touch_conn(now, c);
        }
    }
}
