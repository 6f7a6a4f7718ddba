//! Progress: destinations and address handles, the UDP socket, completions.
//!
//! The steps and their order are described in the [parent module](super); this file holds
//! them and the destination map they maintain.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use super::qp::DsQp;
use super::rx::{Loc, Msg, UdpIn, dest_key, parse_ud, parse_udp};
use super::{
    CQ_BATCH, Dest, MAX_DESTS, MAX_QPS, RDMA_UDP_QKEY, RsDatagram, UDP_BATCH, UDP_HOT_STEPS,
    UDP_POLL_EVERY, unspecified,
};
use crate::error::RsError;
use crate::error::io_err;
use crate::wire::{DS_IPV6_HDR_LEN, DS_UDP_IPV6_HDR_LEN, DsUdpHeader, RsOp};
use dp_fabric::{Completion, Device, GRH_LEN, Provider};

impl<P: Provider> RsDatagram<P> {
    /// The source address our datagrams to `dest` come from: the bound address, or, when
    /// bound to the unspecified address, the one the kernel routes from (learned with a
    /// throw-away connected UDP socket, as librdmacm's `ds_get_src_addr`).
    fn src_ip_for(&self, dest: &SocketAddr) -> Result<IpAddr, RsError> {
        let bound = self.local.ok_or(RsError::Invalid)?;
        if !bound.ip().is_unspecified() {
            return Ok(bound.ip());
        }
        let probe = UdpSocket::bind(unspecified(dest.is_ipv6())).map_err(|e| io_err(&e))?;
        probe.connect(dest).map_err(|e| io_err(&e))?;
        Ok(probe.local_addr().map_err(|e| io_err(&e))?.ip())
    }

    /// The index of the queue pair for source `ip`, creating it if needed.
    fn qp_for(&mut self, ip: IpAddr) -> Result<u16, RsError> {
        if let Some(i) = self.qps.iter().position(|q| q.ip == ip) {
            return Ok(i as u16);
        }
        if self.qps.len() >= MAX_QPS {
            return Err(RsError::NoMemory);
        }
        let geom = self.geom.ok_or(RsError::Invalid)?;
        let pd = &self.pd;
        let q = self
            .ctx
            .with_device(|dev, _, _| DsQp::<P>::new(dev, pd, ip, geom, RDMA_UDP_QKEY))?;
        self.qps.push(q);
        // Every slot may hold a queued message and every queue pair may yield a batch of
        // receives per step: size both queues for that now, so they never grow later.
        let slots = self.staging.len() + self.qps.len() * geom.rq as usize;
        self.rx.reserve_exact(slots.saturating_sub(self.rx.len()));
        let batch = self.qps.len() * CQ_BATCH;
        self.pending
            .reserve_exact(batch.saturating_sub(self.pending.len()));
        Ok(self.qps.len() as u16 - 1)
    }

    /// Makes sure `key` has a destination entry (and our queue pair for it).
    pub(super) fn ensure_dest(&mut self, key: SocketAddr) -> Result<(), RsError> {
        if self.dests.contains_key(&key) {
            return Ok(());
        }
        if self.dests.len() >= MAX_DESTS {
            return Err(RsError::NoMemory);
        }
        let ip = self.src_ip_for(&key)?;
        let qp = self.qp_for(ip)?;
        self.dests.insert(
            key,
            Dest {
                qp,
                ah: None,
                qpn: 0,
                failed_qpn: None,
                awaiting: false,
                udp_in: false,
            },
        );
        Ok(())
    }

    /// Records that `key`'s queue pair is `qpn`: resolves the address handle if there is
    /// none or the queue pair changed. Failures leave the peer on the UDP path.
    fn learn(&mut self, key: SocketAddr, qpn: u32) {
        let Some(d) = self.dests.get(&key) else {
            return;
        };
        if (d.ah.is_some() && d.qpn == qpn) || d.failed_qpn == Some(qpn) {
            return;
        }
        let local = self.qps[usize::from(d.qp)].ip;
        let pd = &self.pd;
        let r = self
            .ctx
            .with_device(|dev, _, _| dev.resolve_ud_dest(pd, local, key.ip(), qpn, RDMA_UDP_QKEY));
        let Some(d) = self.dests.get_mut(&key) else {
            return;
        };
        match r {
            Ok(ah) => {
                d.ah = Some(ah);
                d.qpn = qpn;
                d.failed_qpn = None;
                if d.awaiting {
                    d.awaiting = false;
                    self.awaiting -= 1;
                }
                self.stats.ah_resolved += 1;
            }
            Err(_) => {
                // Most likely not an rsocket peer: it stays on the UDP path, nothing is
                // awaited from it and it is not expected to switch.
                d.ah = None;
                d.failed_qpn = Some(qpn);
                if d.awaiting {
                    d.awaiting = false;
                    self.awaiting -= 1;
                }
                if d.udp_in {
                    d.udp_in = false;
                    self.switching -= 1;
                }
                self.stats.resolve_failures += 1;
            }
        }
    }

    pub(super) fn step(&mut self, force_udp: bool) -> usize {
        if self.udp.is_none() {
            return 0;
        }
        self.steps = self.steps.wrapping_add(1);
        let mut work = 0;
        self.pending.clear();
        for (qi, q) in self.qps.iter_mut().enumerate() {
            let n = q.poll(&mut self.scratch);
            for c in &self.scratch[..n] {
                if q.recv_slot(c).is_some() {
                    self.pending.push((qi as u16, *c));
                } else if !q.complete_send(c) {
                    self.stats.send_errors += 1;
                }
            }
            work += n;
        }
        if force_udp
            || (self.awaiting > 0 && self.steps < self.await_until)
            || self.udp_hot > 0
            || self.steps.is_multiple_of(UDP_POLL_EVERY)
        {
            work += self.drain_udp();
        }
        let pending = std::mem::take(&mut self.pending);
        for (qi, c) in &pending {
            self.on_ud_recv(*qi, c);
        }
        self.pending = pending;
        self.udp_hot = self.udp_hot.saturating_sub(1);
        work
    }

    /// Validates and queues one UD receive, or posts its slot again.
    fn on_ud_recv(&mut self, qi: u16, c: &Completion) {
        let q = &mut self.qps[usize::from(qi)];
        let Some(slot) = q.recv_slot(c) else {
            return;
        };
        if DsQp::<P>::is_flush(c) {
            // The queue pair is dead: posting again would only flush again.
            self.stats.invalid_ud += 1;
            return;
        }
        let avail = c.byte_len.saturating_sub(GRH_LEN) as usize;
        let parsed = if c.is_ok() && c.byte_len >= GRH_LEN {
            let mut head = [0u8; DS_IPV6_HDR_LEN as usize];
            let k = avail.min(head.len());
            q.read(slot, 0, &mut head[..k]);
            parse_ud(&head[..k], avail, q.ip.is_ipv6())
        } else {
            None
        };
        let Some((src, hlen)) = parsed else {
            self.stats.invalid_ud += 1;
            q.post_recv(slot);
            return;
        };
        if self.peer.is_some_and(|p| p != dest_key(src)) {
            self.stats.filtered += 1;
            q.post_recv(slot);
            return;
        }
        if self.switching > 0 {
            self.first_ud_from(dest_key(src));
        }
        self.stats.ud_received += 1;
        debug_assert!(
            self.rx.len() < self.rx.capacity(),
            "a queued message per slot"
        );
        self.rx.push_back(Msg {
            src,
            loc: Loc::Ud { qp: qi, slot },
            off: hlen as u16,
            len: (avail - hlen) as u16,
        });
    }

    /// Called for a UD datagram from `key` while some senders are switching from the UDP
    /// path: if this is `key`'s first UD datagram, every UDP datagram it sent before is in
    /// our socket buffer (it switched only after our `Ctrl`), so drain the socket before
    /// queueing this one, unless this step already did.
    fn first_ud_from(&mut self, key: SocketAddr) {
        let Some(d) = self.dests.get_mut(&key) else {
            return;
        };
        if !d.udp_in {
            return;
        }
        d.udp_in = false;
        self.switching -= 1;
        if self.drained_at != self.steps {
            self.drain_udp();
        }
    }

    /// Reads what the UDP socket holds (at most [`UDP_BATCH`] datagrams, and no more than
    /// free staging slots: the rest waits in the kernel's buffer).
    fn drain_udp(&mut self) -> usize {
        self.drained_at = self.steps;
        let mut work = 0;
        while work < UDP_BATCH {
            let Some(udp) = &self.udp else {
                break;
            };
            let Some(slot) = self.staging.take() else {
                break;
            };
            let (n, from) = match udp.recv_from(self.staging.slot_mut(slot)) {
                Ok(x) => x,
                Err(e) => {
                    self.staging.release(slot);
                    match e.kind() {
                        io::ErrorKind::Interrupted => continue,
                        // An ICMP error of an earlier send (connected sockets): consumed.
                        io::ErrorKind::ConnectionRefused => {
                            work += 1;
                            continue;
                        }
                        _ => break,
                    }
                }
            };
            work += 1;
            self.udp_hot = UDP_HOT_STEPS;
            self.on_udp(slot, n, from);
        }
        work
    }

    /// Handles one datagram that arrived on the UDP socket into staging slot `slot`.
    fn on_udp(&mut self, slot: u16, n: usize, from: SocketAddr) {
        let from = dest_key(from);
        let parsed = parse_udp(self.staging.bytes(slot, 0, n), &from);
        let (qpn, data_off) = match parsed {
            None => {
                self.stats.invalid_udp += 1;
                self.staging.release(slot);
                return;
            }
            Some(UdpIn::Ctrl { qpn }) => (qpn, None),
            Some(UdpIn::Data { qpn, hdr_len }) => (qpn, Some(hdr_len)),
        };
        if self.peer.is_some_and(|p| p != from) {
            self.stats.filtered += 1;
            self.staging.release(slot);
            return;
        }
        let known = match self.ensure_dest(from) {
            Ok(()) => true,
            Err(_) => {
                self.stats.handshake_skipped += 1;
                false
            }
        };
        match data_off {
            None => {
                self.stats.ctrl_received += 1;
                self.staging.release(slot);
            }
            Some(off) => {
                if known {
                    self.send_ctrl(from);
                    if let Some(d) = self.dests.get_mut(&from)
                        && !d.udp_in
                        && d.failed_qpn != Some(qpn)
                    {
                        d.udp_in = true;
                        self.switching += 1;
                    }
                }
                self.stats.udp_received += 1;
                debug_assert!(
                    self.rx.len() < self.rx.capacity(),
                    "a queued message per slot"
                );
                self.rx.push_back(Msg {
                    src: from,
                    loc: Loc::Udp { slot },
                    off: off as u16,
                    len: (n - off) as u16,
                });
            }
        }
        if known {
            self.learn(from, qpn);
        }
    }

    /// Answers a `Data` datagram from `to` with a header-only `Ctrl` carrying our queue pair
    /// number. A reply the kernel cannot take is dropped: the peer's next `Data` asks again.
    fn send_ctrl(&mut self, to: SocketAddr) {
        let (Some(udp), Some(d)) = (&self.udp, self.dests.get(&to)) else {
            return;
        };
        let q = &self.qps[usize::from(d.qp)];
        let h = DsUdpHeader {
            op: RsOp::Ctrl,
            qpn: q.qpn(),
            addr: q.ip,
        };
        let mut b = [0u8; DS_UDP_IPV6_HDR_LEN as usize];
        let len = h.buffer_len();
        h.emit(&mut b[..len]);
        if udp.send_to(&b[..len], to).is_ok() {
            self.stats.ctrl_sent += 1;
        }
    }
}
