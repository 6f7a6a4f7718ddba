//! Byte-vector tests of the wire formats against the layouts of `reference/rds.md` and the
//! wire dumps in `tools/kernel-peers/README.md` (Linux 6.1 on the wire).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::exthdr::{EXT_TYPE_MAX, ExtEnd, ExtFull};
use super::ib::{IncompatibleVersion, PRIV_LEN_V4, check_reply, negotiate_passive};
use super::*;

/// The first data message of the kernel-peers dump: 19 payload bytes, port 4000 -> 4001,
/// sequence 1, as Linux 6.1 RDS-TCP sends it.
const KERNEL_TCP_FIRST_DATA: [u8; 48] = [
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // h_sequence = 1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // h_ack = 0
    0x00, 0x00, 0x00, 0x13, 0x0f, 0xa0, 0x0f, 0xa1, // h_len = 19, sport 4000, dport 4001
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags, credit, padding, h_csum = 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // h_exthdr
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn test_header_kernel_tcp_first_data_message() {
    let r = HeaderRepr::parse_bytes(&KERNEL_TCP_FIRST_DATA).unwrap();
    assert_eq!(
        r,
        HeaderRepr {
            sequence: 1,
            ack: 0,
            len: 19,
            sport: 4000,
            dport: 4001,
            flags: Flags::empty(),
            credit: 0,
            ext: [0; 16],
        }
    );
    assert_eq!(
        r.to_bytes(false),
        KERNEL_TCP_FIRST_DATA,
        "emit is byte-exact"
    );
}

#[test]
fn test_header_field_offsets() {
    let r = HeaderRepr {
        sequence: 0x0102_0304_0506_0708,
        ack: 0x1112_1314_1516_1718,
        len: 0x0010_0000,
        sport: 0x2122,
        dport: 0x2324,
        flags: Flags(0x25),
        credit: 0x26,
        ext: [0x31; 16],
    };
    let b = r.to_bytes(false);
    assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[8..16], &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
    assert_eq!(&b[16..20], &[0x00, 0x10, 0x00, 0x00]);
    assert_eq!(&b[20..24], &[0x21, 0x22, 0x23, 0x24]);
    assert_eq!(b[24], 0x25);
    assert_eq!(b[25], 0x26);
    assert_eq!(&b[26..30], &[0, 0, 0, 0], "padding is zero");
    assert_eq!(&b[30..32], &[0, 0], "no checksum asked for");
    assert_eq!(&b[32..48], &[0x31; 16]);
    let v = Header::new_checked(&b[..]).unwrap();
    assert_eq!(v.sequence(), r.sequence);
    assert_eq!(v.ack(), r.ack);
    assert_eq!(v.len(), r.len);
    assert_eq!((v.sport(), v.dport()), (r.sport, r.dport));
    assert_eq!((v.flags(), v.credit()), (r.flags, r.credit));
    assert_eq!(v.padding(), [0; 4]);
}

#[test]
fn test_checksum_ack_only_frame() {
    // An ACK-only frame as RDS-IB sends it: seq 0, ports 0, len 0, h_ack = 5, credit 0.
    let r = HeaderRepr {
        ack: 5,
        ..HeaderRepr::default()
    };
    let b = r.to_bytes(true);
    // RFC 1071 over the 24 big-endian words: the only non-zero word is 0x0005.
    assert_eq!(&b[30..32], &[0xff, 0xfa]);
    assert!(Header::new_unchecked(&b[..]).verify_checksum());
    assert_eq!(checksum(&b), 0, "a checksummed header folds to zero");
    assert!(r.is_ack_only(0));
    assert!(!r.is_ack_only(1));
}

#[test]
fn test_checksum_known_value() {
    // seq 7, ack 3, len 10240, 4000 -> 4001, ACK_REQUIRED, credit 17 (computed independently).
    let r = HeaderRepr {
        sequence: 7,
        ack: 3,
        len: 10240,
        sport: 4000,
        dport: 4001,
        flags: Flags::ACK_REQUIRED,
        credit: 17,
        ext: [0; 16],
    };
    let b = r.to_bytes(true);
    assert_eq!(u16::from_be_bytes([b[30], b[31]]), 0xb6a3);
    assert_eq!(HeaderRepr::parse_bytes(&b).unwrap(), r);
}

#[test]
fn test_checksum_zero_means_unchecked() {
    let mut b = KERNEL_TCP_FIRST_DATA;
    b[5] = 0x77; // any content: h_csum 0 is never verified
    assert!(Header::new_unchecked(&b[..]).verify_checksum());
}

#[test]
fn test_checksum_every_corrupted_bit_is_caught() {
    let r = HeaderRepr {
        sequence: 42,
        ack: 41,
        len: 4096,
        sport: 9,
        dport: 10,
        flags: Flags::RETRANSMITTED,
        credit: 3,
        ext: [5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    };
    let good = r.to_bytes(true);
    for bit in 0..48 * 8 {
        let mut b = good;
        b[bit / 8] ^= 1 << (bit % 8);
        // Flipping a bit of h_csum itself to 0 would read as "unchecked"; skip that case.
        if u16::from_be_bytes([b[30], b[31]]) == 0 {
            continue;
        }
        assert_eq!(
            HeaderRepr::parse_bytes(&b),
            Err(HeaderFault::BadChecksum),
            "bit {bit}"
        );
    }
}

#[test]
fn test_checksum_odd_length_pads_with_zero() {
    assert_eq!(checksum(&[0x12]), !0x1200);
    assert_eq!(checksum(&[]), 0xffff);
    // Carries fold back in: 0xffff + 0x0001 = 0x0001 after the fold.
    assert_eq!(checksum(&[0xff, 0xff, 0x00, 0x01]), !0x0001);
}

#[test]
fn test_header_truncated_and_too_long() {
    assert_eq!(
        HeaderRepr::parse_bytes(&KERNEL_TCP_FIRST_DATA[..47]),
        Err(HeaderFault::Truncated)
    );
    assert!(Header::new_checked(&KERNEL_TCP_FIRST_DATA[..47]).is_err());
    let mut r = HeaderRepr::parse_bytes(&KERNEL_TCP_FIRST_DATA).unwrap();
    r.len = MAX_MSG_SIZE as u32;
    assert!(
        HeaderRepr::parse_bytes(&r.to_bytes(true)).is_ok(),
        "1 MiB is allowed"
    );
    r.len += 1;
    assert_eq!(
        HeaderRepr::parse_bytes(&r.to_bytes(true)),
        Err(HeaderFault::LenTooLarge)
    );
    r.len = u32::MAX;
    assert_eq!(
        HeaderRepr::parse_bytes(&r.to_bytes(false)),
        Err(HeaderFault::LenTooLarge)
    );
    assert_eq!(
        dp_wire::Error::from(HeaderFault::LenTooLarge),
        dp_wire::Error::Malformed
    );
}

#[test]
fn test_flags_exact_cong_bitmap_and_unknown_bits() {
    assert!(Flags(0x01).is_cong_map());
    assert!(
        !Flags(0x03).is_cong_map(),
        "exact equality, as the kernel tests it"
    );
    assert!(!Flags(0x00).is_cong_map());
    assert_eq!(Flags(0x07).unknown(), 0);
    assert_eq!(Flags(0x0f).unknown(), 0x08);
    assert_eq!(Flags(0xff).unknown(), 0xf8);
    let f = Flags::ACK_REQUIRED.union(Flags::RETRANSMITTED);
    assert!(f.contains(Flags::RETRANSMITTED));
    assert_eq!(f.without(Flags::ACK_REQUIRED), Flags::RETRANSMITTED);
    assert_eq!(format!("{f:?}"), "Flags(0x06 ACK_REQUIRED RETRANSMITTED)");
}

#[test]
fn test_exthdr_kernel_probe_npaths() {
    // Linux 6.1's probe ping carries one extension: NPATHS = 8 (`05 00 08`).
    let mut area = [0u8; 16];
    area[..3].copy_from_slice(&[0x05, 0x00, 0x08]);
    let exts: Vec<_> = ExtIter::new(&area).collect();
    assert_eq!(exts, vec![ExtHeader::NPaths(8)]);
    let mut w = ExtWriter::new();
    w.push(ExtHeader::NPaths(8)).unwrap();
    assert_eq!(w.finish(), area);
}

#[test]
fn test_exthdr_several_back_to_back() {
    // The newest kernel's probe: NPATHS (3) + GEN_NUM (5) + SPORT_IDX (2) = 10 bytes.
    let mut w = ExtWriter::new();
    w.push(ExtHeader::NPaths(8)).unwrap();
    w.push(ExtHeader::GenNum(0xdead_beef)).unwrap();
    w.push(ExtHeader::SportIdx).unwrap();
    assert_eq!(w.len(), 10);
    let area = w.finish();
    assert_eq!(
        &area[..11],
        &[5, 0, 8, 6, 0xde, 0xad, 0xbe, 0xef, 8, 0, 0],
        "packed, then a NONE terminator"
    );
    let mut it = ExtIter::new(&area);
    assert_eq!(
        it.by_ref().collect::<Vec<_>>(),
        vec![
            ExtHeader::NPaths(8),
            ExtHeader::GenNum(0xdead_beef),
            ExtHeader::SportIdx
        ]
    );
    assert_eq!(it.end(), ExtEnd::Clean);
}

#[test]
fn test_exthdr_rdma_and_rdma_dest_fill_and_overflow() {
    let mut w = ExtWriter::new();
    w.push(ExtHeader::Rdma { rkey: 0x0102_0304 }).unwrap(); // 5 bytes
    w.push(ExtHeader::RdmaDest {
        rkey: 0x1112_1314,
        offset: 0x2122_2324,
    })
    .unwrap(); // 9 bytes: 14 used
    assert_eq!(
        w.push(ExtHeader::GenNum(1)),
        Err(ExtFull),
        "5 more do not fit"
    );
    w.push(ExtHeader::NPaths(2))
        .expect_err("3 more do not fit either");
    let area = w.finish();
    assert_eq!(
        area,
        [
            2, 1, 2, 3, 4, 3, 0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24, 0, 0
        ]
    );
    // Exactly 16 bytes used: no terminator is needed, and the parse ends cleanly.
    let mut w = ExtWriter::new();
    w.push(ExtHeader::RdmaDest { rkey: 1, offset: 2 }).unwrap();
    assert_eq!(
        w.push(ExtHeader::RdmaBytes { bytes: 3, dir: 1 }),
        Err(ExtFull),
        "9 + 9 = 18 bytes do not fit"
    );
    w.push(ExtHeader::GenNum(3)).unwrap();
    w.push(ExtHeader::SportIdx).unwrap();
    assert_eq!(w.len(), 16);
    let area = w.finish();
    let mut it = ExtIter::new(&area);
    assert_eq!(it.by_ref().count(), 3);
    assert_eq!(it.end(), ExtEnd::Clean);
}

#[test]
fn test_exthdr_unknown_types_skipped_as_the_kernel_does() {
    // 9..=15 have no table entry: zero-length, skipped one byte at a time.
    let mut area = [0u8; 16];
    area[..6].copy_from_slice(&[9, 15, 5, 0, 3, 0]);
    let exts: Vec<_> = ExtIter::new(&area).collect();
    assert_eq!(
        exts,
        vec![
            ExtHeader::Unknown(9),
            ExtHeader::Unknown(15),
            ExtHeader::NPaths(3)
        ]
    );
}

#[test]
fn test_exthdr_stops_at_type_16_and_at_overrun() {
    let mut area = [0u8; 16];
    area[0] = 5;
    area[3] = EXT_TYPE_MAX;
    let mut it = ExtIter::new(&area);
    assert_eq!(it.by_ref().collect::<Vec<_>>(), vec![ExtHeader::NPaths(0)]);
    assert_eq!(it.end(), ExtEnd::BadType(16));

    // RDMA_DEST (8 payload bytes) starting at byte 9 would end at 18 > 16.
    let mut area = [0u8; 16];
    area[..9].copy_from_slice(&[9, 9, 9, 9, 9, 9, 9, 9, 9]);
    area[9] = 3;
    let mut it = ExtIter::new(&area);
    assert_eq!(it.by_ref().count(), 9);
    assert_eq!(it.end(), ExtEnd::Overrun(3));
}

#[test]
fn test_exthdr_all_types_round_trip() {
    for ext in [
        ExtHeader::Version(0x0301),
        ExtHeader::Rdma { rkey: 7 },
        ExtHeader::RdmaDest { rkey: 8, offset: 9 },
        ExtHeader::RdmaBytes { bytes: 10, dir: 2 },
        ExtHeader::NPaths(8),
        ExtHeader::GenNum(11),
        ExtHeader::CapBits(12),
        ExtHeader::SportIdx,
        ExtHeader::Unknown(14),
    ] {
        let mut w = ExtWriter::new();
        w.push(ext).unwrap();
        assert_eq!(w.len(), ext.wire_len());
        assert_eq!(ExtIter::new(&w.finish()).collect::<Vec<_>>(), vec![ext]);
    }
    assert_eq!(ExtType::from(5), ExtType::NPaths);
    assert_eq!(ExtType::from(12), ExtType::Unknown(12));
    assert_eq!(u8::from(ExtType::SportIdx), 8);
}

#[test]
fn test_exthdr_parse_never_panics_on_any_first_two_bytes() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            let mut area = [b; 16];
            area[0] = a;
            let n = ExtIter::new(&area).count();
            assert!(n <= 16);
        }
    }
}

#[test]
fn test_cong_map_bit_layout_little_endian() {
    let mut m = CongMap::new();
    m.set(0);
    m.set(9);
    m.set(65535);
    let b = m.to_bytes();
    assert_eq!(b[0], 0x01, "port 0 = byte 0 bit 0");
    assert_eq!(b[1], 0x02, "port 9 = byte 1 bit 1");
    assert_eq!(b[8191], 0x80, "port 65535 = byte 8191 bit 7");
    assert_eq!(b.iter().map(|x| x.count_ones()).sum::<u32>(), 3);
    assert_eq!(CongMap::parse(&b[..]).unwrap(), m);
    assert!(m.test(9) && !m.test(8));
    m.clear(9);
    assert!(!m.test(9));
    assert_eq!(m.count(), 2);
}

#[test]
fn test_cong_map_uncongested_mask() {
    let mut old = CongMap::new();
    old.set(4000);
    old.set(4001);
    old.set(64 + 3);
    let mut new = old.clone();
    new.clear(4000); // 4000 % 64 = 32
    new.clear(64 + 3); // 3
    new.set(5);
    let mask = old.update_from_wire(&new.to_bytes()[..]).unwrap();
    assert_eq!(mask, (1 << 32) | (1 << 3), "only ports that went 1 -> 0");
    assert_eq!(old, new);
    assert_eq!(old.update_from_wire(&[0u8; 100]), Err(cong::BadCongLen));
    assert_eq!(old, new, "a bad length leaves the map alone");
    assert_eq!(cong::monitor_mask(4001), 1 << (4001 % 64));
}

#[test]
fn test_ib_private_data_kernel_v4_dump() {
    // REQ private data seen from Linux 6.1 rds_rdma on Soft-RoCE (kernel-peers README):
    // saddr 10.78.0.1, daddr 10.78.0.2, protocol 3.1, minor mask 3, ack_seq 0, credit 0.
    let mut wire = [0u8; PRIV_LEN_V4];
    wire[..12].copy_from_slice(&[
        0x0a, 0x4e, 0x00, 0x01, 0x0a, 0x4e, 0x00, 0x02, 0x03, 0x01, 0x00, 0x03,
    ]);
    let r = IbConnPrivRepr::parse(&wire, false).unwrap();
    assert_eq!(
        r,
        IbConnPrivRepr {
            saddr: IpAddr::V4(Ipv4Addr::new(10, 78, 0, 1)),
            daddr: IpAddr::V4(Ipv4Addr::new(10, 78, 0, 2)),
            version: IbVersion::V3_1,
            minor_mask: 3,
            tos: 0,
            ack_seq: 0,
            credit: 0,
        }
    );
    let (b, n) = r.to_bytes();
    assert_eq!(n, 32);
    assert_eq!(&b[..32], &wire);
}

#[test]
fn test_ib_private_data_offsets_v4_and_v6() {
    let v4 = IbConnPrivRepr {
        saddr: IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)),
        daddr: IpAddr::V4(Ipv4Addr::new(5, 6, 7, 8)),
        version: IbVersion::V4_1,
        minor_mask: 0x0003,
        tos: 0x09,
        ack_seq: 0x1011_1213_1415_1617,
        credit: 0x2021_2223,
    };
    let (b, n) = v4.to_bytes();
    assert_eq!(n, 32);
    assert_eq!(&b[8..16], &[4, 1, 0, 3, 9, 0, 0, 0]);
    assert_eq!(&b[16..24], &0x1011_1213_1415_1617u64.to_be_bytes());
    assert_eq!(&b[24..28], &0x2021_2223u32.to_be_bytes());
    assert_eq!(&b[28..32], &[0; 4], "tail padding");

    let v6 = IbConnPrivRepr {
        saddr: IpAddr::V6("fe80::1".parse::<Ipv6Addr>().unwrap()),
        daddr: IpAddr::V6("2001:db8::2".parse::<Ipv6Addr>().unwrap()),
        ..v4
    };
    let (b, n) = v6.to_bytes();
    assert_eq!(n, 56);
    assert_eq!(&b[0..2], &[0xfe, 0x80]);
    assert_eq!(&b[16..18], &[0x20, 0x01]);
    assert_eq!(&b[32..40], &[4, 1, 0, 3, 9, 0, 0, 0]);
    assert_eq!(&b[40..48], &0x1011_1213_1415_1617u64.to_be_bytes());
    assert_eq!(&b[48..52], &0x2021_2223u32.to_be_bytes());
    assert_eq!(IbConnPrivRepr::parse(&b[..56], true).unwrap(), v6);
    assert_eq!(
        IbConnPrivRepr::parse(&b[..55], true),
        Err(dp_wire::Error::Truncated)
    );
    // A padded buffer (the CM hands up 196 bytes of REP data) parses the same.
    let mut padded = [0u8; 196];
    padded[..56].copy_from_slice(&b[..56]);
    assert_eq!(IbConnPrivRepr::parse(&padded, true).unwrap(), v6);
    // IPv4-mapped addresses do not belong in the IPv6 layout.
    let mapped = IbConnPrivRepr {
        saddr: IpAddr::V6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped()),
        ..v6
    };
    let (b, _) = mapped.to_bytes();
    assert_eq!(
        IbConnPrivRepr::parse(&b[..56], true),
        Err(dp_wire::Error::Malformed)
    );
}

fn proposal(major: u8, minor: u8, mask: u16) -> [u8; PRIV_LEN_V4] {
    let r = IbConnPrivRepr {
        saddr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        daddr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        version: IbVersion::new(major, minor),
        minor_mask: mask,
        tos: 0,
        ack_seq: 0,
        credit: 0,
    };
    let (b, _) = r.to_bytes();
    let mut out = [0u8; PRIV_LEN_V4];
    out.copy_from_slice(&b[..PRIV_LEN_V4]);
    out
}

#[test]
fn test_ib_version_negotiation_passive() {
    // What Linux proposes: 3.1 with mask 3 -> 3.1 (compatibility version).
    assert_eq!(
        negotiate_passive(&proposal(3, 1, 3), false),
        Ok(IbVersion::V3_1)
    );
    // Major 4: the highest common minor.
    assert_eq!(
        negotiate_passive(&proposal(4, 1, 3), false),
        Ok(IbVersion::V4_1)
    );
    assert_eq!(
        negotiate_passive(&proposal(4, 0, 1), false),
        Ok(IbVersion::V4_0)
    );
    assert_eq!(
        negotiate_passive(&proposal(4, 7, 0xff), false),
        Ok(IbVersion::V4_1),
        "only minors we support count"
    );
    // Major 4 with nothing in common, 3.0, 5.0: rejected.
    for (maj, min, mask) in [(4, 2, 4), (3, 0, 3), (5, 0, 3), (2, 0, 0)] {
        assert_eq!(
            negotiate_passive(&proposal(maj, min, mask), false),
            Err(IncompatibleVersion {
                peer: IbVersion::new(maj, min)
            }),
            "{maj}.{min} mask {mask:#x}"
        );
    }
    // Old peers: short private data or major 0 count as 4.0; no private data is refused.
    assert_eq!(negotiate_passive(&[1, 2, 3], false), Ok(IbVersion::V4_0));
    assert_eq!(
        negotiate_passive(&proposal(0, 9, 3), false),
        Ok(IbVersion::V4_0)
    );
    assert!(negotiate_passive(&[], false).is_err());
    // The IPv6 layout needs 56 bytes: 32 are "short", hence 4.0.
    assert_eq!(
        negotiate_passive(&proposal(3, 1, 3), true),
        Ok(IbVersion::V4_0)
    );
}

#[test]
fn test_ib_version_check_reply_active() {
    assert_eq!(
        check_reply(&proposal(3, 1, 3), false, IbVersion::V4_1),
        Ok(IbVersion::V3_1)
    );
    assert_eq!(
        check_reply(&proposal(4, 1, 3), false, IbVersion::V4_1),
        Ok(IbVersion::V4_1)
    );
    assert_eq!(
        check_reply(&[], false, IbVersion::V4_1),
        Ok(IbVersion::V4_1),
        "no private data keeps the version we set"
    );
    assert_eq!(
        check_reply(&proposal(3, 0, 0), false, IbVersion::V4_1),
        Err(IncompatibleVersion {
            peer: IbVersion::V3_0
        })
    );
}

#[test]
fn test_constants_match_the_kernel() {
    assert_eq!(HEADER_LEN, 48);
    assert_eq!(EXT_SPACE, 16);
    assert_eq!(FRAG_SIZE, 4096);
    assert_eq!(MAX_MSG_SIZE, 1_048_576);
    assert_eq!(CONG_MAP_BYTES, 8192);
    assert_eq!((TCP_PORT, IB_PORT_V4, IB_PORT_V6), (16385, 18634, 16385));
    assert_eq!(PROBE_PORT, 1);
    assert_eq!(MPATH_WORKERS, 8);
    assert_eq!(frag_count(0), 1);
    assert_eq!(frag_count(4096), 1);
    assert_eq!(frag_count(4097), 2);
    assert_eq!(
        frag_count(10240),
        3,
        "the kernel-peers dump: 10 KiB = 3 SENDs"
    );
    assert_eq!(frag_count(MAX_MSG_SIZE), 256);
    assert!(is_hs_probe(1, 0) && is_hs_probe(0, 1));
    assert!(!is_hs_probe(1, 1) && !is_hs_probe(0, 0) && !is_hs_probe(2, 0));
}
