//! The receive side: validation of both paths' headers, the staging slots of UDP-path
//! datagrams, and the queue of received messages.
//!
//! Every queued message owns the slot its payload sits in (a UD receive slot or a UDP
//! staging slot) until the application consumes it, so the queue can never hold more
//! entries than there are slots and never grows after setup.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use super::qp::SLOT;
use crate::wire::{DS_IPV4_HDR_LEN, DS_UDP_IPV6_HDR_LEN, DsHeader, DsUdpHeader, RsOp};

/// Bytes of one UDP staging slot: the largest payload a slot holds (2048) plus the largest
/// header, rounded up. A datagram filling the whole slot may have been cut by the kernel;
/// it is larger than any valid one, so it is rejected either way.
pub(crate) const UDP_SLOT: usize = (SLOT + DS_UDP_IPV6_HDR_LEN as usize).next_multiple_of(64);

/// Where a queued message's payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// In receive slot `slot` of queue pair `qp`.
    Ud {
        /// Index of the queue pair in the socket.
        qp: u16,
        /// Receive slot.
        slot: u16,
    },
    /// In UDP staging slot `slot`.
    Udp {
        /// Staging slot.
        slot: u16,
    },
}

/// One received, not yet consumed datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Msg {
    /// The sender (its UDP socket address).
    pub src: SocketAddr,
    /// Where the payload is.
    pub loc: Loc,
    /// Offset of the payload in its slot (the header length).
    pub off: u16,
    /// Payload bytes.
    pub len: u16,
}

/// What a valid UDP-path datagram asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UdpIn {
    /// User data at `hdr_len..`; the sender's UD queue pair is `qpn`.
    Data {
        /// The sender's queue pair number.
        qpn: u32,
        /// Header bytes before the payload.
        hdr_len: usize,
    },
    /// A header-only reply carrying the sender's queue pair number.
    Ctrl {
        /// The sender's queue pair number.
        qpn: u32,
    },
}

/// Validates a UDP-path datagram received from `from`: tag, version matching the family of
/// `from` (as librdmacm requires: IPv4-mapped senders with version-4 headers on an IPv6
/// socket are dropped), header length, a known operation, and a payload that fits a slot.
/// `None` for anything else.
pub(crate) fn parse_udp(b: &[u8], from: &SocketAddr) -> Option<UdpIn> {
    let (h, hdr_len) = DsUdpHeader::parse(b, from.is_ipv6()).ok()?;
    match h.op {
        RsOp::Data if b.len() - hdr_len <= SLOT => Some(UdpIn::Data {
            qpn: h.qpn,
            hdr_len,
        }),
        RsOp::Ctrl => Some(UdpIn::Ctrl { qpn: h.qpn }),
        _ => None,
    }
}

/// Validates the first bytes of a UD receive that carried `avail` bytes after the GRH, on
/// a queue pair whose address is IPv6 (`expect_v6`) or IPv4: returns the sender's address
/// and the header length. `None` if the arrival is shorter than any header or longer than
/// a slot, the header is malformed (version and length disagree) or longer than what
/// arrived, or its family is not the queue pair's (a peer that reached this queue pair
/// routed to its address, so it sends from the same family, and its header says so: the
/// UDP path's rule, applied to the UD path).
pub(crate) fn parse_ud(head: &[u8], avail: usize, expect_v6: bool) -> Option<(SocketAddr, usize)> {
    if avail < usize::from(DS_IPV4_HDR_LEN) || avail > SLOT {
        return None;
    }
    let (h, len) = DsHeader::parse(&head[..head.len().min(avail)]).ok()?;
    if h.addr.is_ipv6() != expect_v6 {
        return None;
    }
    let src = match h.addr {
        IpAddr::V4(_) => SocketAddr::new(h.addr, h.port),
        IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, h.port, h.flowinfo, 0)),
    };
    (len <= avail).then_some((src, len))
}

/// The key of an address in the destination map: IPv6 flow information is not part of a
/// destination's identity (librdmacm compares whole `sockaddr`s, which only differ there
/// when an application sets it).
pub(crate) fn dest_key(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v) if v.flowinfo() != 0 => {
            SocketAddr::V6(SocketAddrV6::new(*v.ip(), v.port(), 0, v.scope_id()))
        }
        other => other,
    }
}

/// Staging slots for datagrams that arrive on the UDP socket.
pub(crate) struct Staging {
    buf: Vec<u8>,
    free: Vec<u16>,
}

impl Staging {
    /// `n` slots of [`UDP_SLOT`] bytes.
    pub(crate) fn new(n: u16) -> Self {
        Self {
            buf: vec![0; usize::from(n) * UDP_SLOT],
            free: (0..n).rev().collect(),
        }
    }

    /// Slots in all.
    pub(crate) fn len(&self) -> usize {
        self.buf.len() / UDP_SLOT
    }

    /// Takes a free slot.
    pub(crate) fn take(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Returns a slot.
    pub(crate) fn release(&mut self, slot: u16) {
        self.free.push(slot);
    }

    /// The whole slot, to receive into.
    pub(crate) fn slot_mut(&mut self, slot: u16) -> &mut [u8] {
        let o = usize::from(slot) * UDP_SLOT;
        &mut self.buf[o..o + UDP_SLOT]
    }

    /// `len` bytes of slot `slot` from `off`.
    pub(crate) fn bytes(&self, slot: u16, off: usize, len: usize) -> &[u8] {
        let o = usize::from(slot) * UDP_SLOT + off;
        &self.buf[o..o + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DS_UDP_IPV4_HDR_LEN, DS_UDP_TAG};

    fn udp(op: RsOp, addr: &str, payload: usize) -> Vec<u8> {
        let h = DsUdpHeader {
            op,
            qpn: 0x00ab_cdef,
            addr: addr.parse().unwrap(),
        };
        let mut b = vec![0u8; h.buffer_len() + payload];
        h.emit(&mut b);
        b
    }

    #[test]
    fn udp_path_accepts_data_and_ctrl_of_the_sockets_family() {
        let v4: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(
            parse_udp(&udp(RsOp::Data, "127.0.0.1", 5), &v4),
            Some(UdpIn::Data {
                qpn: 0x00ab_cdef,
                hdr_len: 16
            })
        );
        assert_eq!(
            parse_udp(&udp(RsOp::Ctrl, "::1", 0), &v6),
            Some(UdpIn::Ctrl { qpn: 0x00ab_cdef })
        );
        assert_eq!(
            parse_udp(&udp(RsOp::Data, "::1", SLOT), &v6),
            Some(UdpIn::Data {
                qpn: 0x00ab_cdef,
                hdr_len: 28
            })
        );
    }

    #[test]
    fn udp_path_rejects_what_librdmacm_rejects() {
        let v4: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        let good = udp(RsOp::Data, "127.0.0.1", 4);
        let mut tag = good.clone();
        tag[0] = 0x54;
        assert_eq!(parse_udp(&tag, &v4), None, "wrong tag");
        assert_eq!(
            parse_udp(&good, &v6),
            None,
            "version 4 header from an IPv6 sender"
        );
        assert_eq!(
            parse_udp(&udp(RsOp::Data, "::1", 0), &v4),
            None,
            "version 6 header from an IPv4 sender"
        );
        assert_eq!(parse_udp(&good[..15], &v4), None, "short");
        let mut len = good.clone();
        len[6] = 20;
        assert_eq!(
            parse_udp(&len, &v4),
            None,
            "header length not matching the version"
        );
        assert_eq!(
            parse_udp(&udp(RsOp::Sgl, "127.0.0.1", 0), &v4),
            None,
            "unknown op"
        );
        assert_eq!(
            parse_udp(&udp(RsOp::Data, "127.0.0.1", SLOT + 1), &v4),
            None,
            "payload beyond a slot"
        );
        assert_eq!(
            u32::from_be_bytes([good[0], good[1], good[2], good[3]]),
            DS_UDP_TAG
        );
        assert_eq!(good[6], DS_UDP_IPV4_HDR_LEN);
    }

    #[test]
    fn ud_path_header_validation() {
        let h = DsHeader {
            port: 7174,
            addr: "10.0.0.2".parse().unwrap(),
            flowinfo: 0,
        };
        let mut b = [0u8; 24];
        h.emit(&mut b);
        assert_eq!(
            parse_ud(&b, 8, false),
            Some(("10.0.0.2:7174".parse().unwrap(), 8))
        );
        assert_eq!(
            parse_ud(&b, 100, false),
            Some(("10.0.0.2:7174".parse().unwrap(), 8))
        );
        assert_eq!(parse_ud(&b, 7, false), None, "shorter than any header");
        assert_eq!(parse_ud(&b, SLOT + 1, false), None, "longer than a slot");
        assert_eq!(
            parse_ud(&b, 8, true),
            None,
            "version 4 header on an IPv6 queue pair"
        );
        let h6 = DsHeader {
            port: 1,
            addr: "::1".parse().unwrap(),
            flowinfo: 5,
        };
        h6.emit(&mut b);
        assert_eq!(
            parse_ud(&b, 24, false),
            None,
            "version 6 header on an IPv4 queue pair"
        );
        let (src, len) = parse_ud(&b, 24, true).unwrap();
        assert_eq!(len, 24);
        let SocketAddr::V6(v) = src else {
            panic!("v6 expected")
        };
        assert_eq!(v.flowinfo(), 5, "flow information reported as sent");
        assert_eq!(
            dest_key(src),
            "[::1]:1".parse().unwrap(),
            "but not part of the key"
        );
        assert_eq!(parse_ud(&b, 20, true), None, "IPv6 header cut short");
        b[1] = 8;
        assert_eq!(
            parse_ud(&b, 24, true),
            None,
            "version 6 with the IPv4 length"
        );
        b[0] = 7;
        b[1] = 24;
        assert_eq!(parse_ud(&b, 24, true), None, "unknown version");
    }

    #[test]
    fn staging_slots_are_disjoint() {
        let mut s = Staging::new(3);
        let (a, b) = (s.take().unwrap(), s.take().unwrap());
        assert_ne!(a, b);
        s.slot_mut(a).fill(1);
        s.slot_mut(b).fill(2);
        assert!(s.bytes(a, 0, UDP_SLOT).iter().all(|&x| x == 1));
        assert!(s.bytes(b, 10, 100).iter().all(|&x| x == 2));
        s.take().unwrap();
        assert_eq!(s.take(), None);
        s.release(a);
        assert_eq!(s.take(), Some(a));
    }
}
