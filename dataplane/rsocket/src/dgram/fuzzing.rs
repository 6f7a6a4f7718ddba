//! Entry points for the fuzz target `dgram_rx` in `fuzz/` (compiled only with `--cfg fuzzing`, which
//! `cargo fuzz` sets): each feeds peer-written bytes to a crate-private decoder the way the
//! socket layer does, and checks the contract the socket layer relies on. Not an API.

use std::net::SocketAddr;

use super::qp::SLOT;
use super::rx::{self, Staging, UDP_SLOT, UdpIn};
use crate::wire::DS_IPV6_HDR_LEN;

/// A datagram from `from` on the UDP path (`RsDatagram::on_udp`): it lands in a staging
/// slot (the kernel cuts it to the slot), is validated by `parse_udp`, and a `Data` payload
/// is then read from `hdr_len..n` of the slot and queued with a `u16` offset and length.
pub fn dgram_udp(datagram: &[u8], from: SocketAddr) {
    let mut staging = Staging::new(2);
    let slot = staging.take().expect("two slots");
    let n = datagram.len().min(UDP_SLOT);
    staging.slot_mut(slot)[..n].copy_from_slice(&datagram[..n]);
    let from = rx::dest_key(from);
    if let Some(UdpIn::Data { hdr_len, .. }) = rx::parse_udp(staging.bytes(slot, 0, n), &from) {
        assert!(
            hdr_len <= n,
            "header {hdr_len} longer than the datagram {n}"
        );
        let len = n - hdr_len;
        assert!(len <= SLOT, "payload {len} larger than a slot");
        assert!(u16::try_from(hdr_len).is_ok() && u16::try_from(len).is_ok());
        assert_eq!(staging.bytes(slot, hdr_len, len).len(), len);
    }
}

/// A receive on a UD queue pair (`RsDatagram::on_ud_recv`): `byte_len` is what the
/// completion claims (GRH included), `slot` the bytes the receive slot holds. The header is
/// read from the slot and validated by `parse_ud`; the payload is then `hlen..avail` of
/// the slot, queued with a `u16` offset and length.
pub fn dgram_ud(slot: &[u8], byte_len: u32, expect_v6: bool) {
    let grh = dp_fabric::GRH_LEN;
    if byte_len < grh {
        return;
    }
    let avail = (byte_len - grh) as usize;
    let mut mem = vec![0u8; SLOT];
    let k = slot.len().min(SLOT);
    mem[..k].copy_from_slice(&slot[..k]);
    let mut head = [0u8; DS_IPV6_HDR_LEN as usize];
    let k = avail.min(head.len());
    head[..k].copy_from_slice(&mem[..k]);
    if let Some((src, hlen)) = rx::parse_ud(&head[..k], avail, expect_v6) {
        assert_eq!(
            src.is_ipv6(),
            expect_v6,
            "a header of the other family accepted"
        );
        assert!(
            hlen <= avail && avail <= SLOT,
            "header {hlen}, {avail} bytes arrived"
        );
        assert!(u16::try_from(hlen).is_ok() && u16::try_from(avail - hlen).is_ok());
        assert_eq!(mem[hlen..avail].len(), avail - hlen);
    }
}
