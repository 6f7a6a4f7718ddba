//! Byte vectors from `shared/reference/rtrs.md` section 2 and the captures of Linux 6.1
//! decoded in `shared/tools/kernel-peers/README.md`, and the rules of every parser.

use super::*;
use crate::wire::conn::{ConnReq, ConnRsp};
use crate::wire::io::data_len;

const PATH_UUID: [u8; 16] = [
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
];
const SESS_UUID: [u8; 16] = [
    0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
];

/// The connect request of Linux 6.1 as captured on the wire (kernel-peers README: cid 1 of a
/// path of 3 connections, first attempt, first path): `00 00 bd 1b 00 02 <cid> <cid_num=3>
/// <recon_cnt=1> <path uuid> <sess uuid> 01`, then 11 reserved zero bytes.
fn kernel_conn_req(cid: u16) -> [u8; 56] {
    let mut b = [0u8; 56];
    b[..6].copy_from_slice(&[0x00, 0x00, 0xbd, 0x1b, 0x00, 0x02]);
    b[6..8].copy_from_slice(&cid.to_le_bytes());
    b[8..10].copy_from_slice(&[0x03, 0x00]);
    b[10..12].copy_from_slice(&[0x01, 0x00]);
    b[12..28].copy_from_slice(&PATH_UUID);
    b[28..44].copy_from_slice(&SESS_UUID);
    b[44] = 0x01;
    b
}

#[test]
fn test_conn_req_kernel_bytes() {
    let b = kernel_conn_req(1);
    let r = ConnReqRepr::parse(&ConnReq::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(
        r,
        ConnReqRepr {
            version: 0x0200,
            cid: 1,
            cid_num: 3,
            recon_cnt: 1,
            path_uuid: PATH_UUID,
            sess_uuid: SESS_UUID,
            first_conn: true,
        }
    );
    assert_eq!(r.to_bytes(), b, "emit reproduces the kernel's bytes");
}

#[test]
fn test_conn_req_checks() {
    let good = kernel_conn_req(0);
    let parse = |b: &[u8]| ConnReqRepr::parse(&ConnReq::new_unchecked(b));
    assert_eq!(parse(&good[..55]), Err(Bad::Truncated));
    let mut b = good;
    b[2] = 0xbe;
    assert_eq!(parse(&b), Err(Bad::Magic));
    let mut b = good;
    b[5] = 3;
    assert_eq!(parse(&b), Err(Bad::Version), "major 3 is refused");
    let mut b = good;
    b[4] = 7;
    assert_eq!(
        parse(&b).unwrap().version,
        0x0207,
        "only the major is compared"
    );
    let mut b = good;
    b[8..10].copy_from_slice(&4097u16.to_le_bytes());
    assert_eq!(parse(&b), Err(Bad::ConnNum), "cid_num above 4096");
    b[8..10].copy_from_slice(&4096u16.to_le_bytes());
    assert!(parse(&b).is_ok(), "cid_num 4096 is the limit");
    b[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(parse(&b), Err(Bad::ConnNum), "no connections");
    let mut b = good;
    b[6..8].copy_from_slice(&3u16.to_le_bytes());
    assert_eq!(parse(&b), Err(Bad::Cid), "cid == cid_num");
    let mut b = good;
    b[44] = 0xfe;
    assert!(!parse(&b).unwrap().first_conn, "reserved bits are ignored");
    let mut long = [0u8; 64];
    long[..56].copy_from_slice(&good);
    assert!(
        parse(&long).is_ok(),
        "longer private data (zero padding) is accepted"
    );
}

/// The accept of Linux 6.1 with its defaults (kernel-peers README): `bd 1b 00 02 00 00 00 02
/// 00 f0 01 00 00 10 00 00 02 00 00 00`: queue depth 512, max_io_size 126976, max_hdr_size
/// 4096, flags NEW_RKEY.
#[test]
fn test_conn_rsp_kernel_bytes() {
    let mut b = [0u8; 56];
    b[..20].copy_from_slice(&[
        0xbd, 0x1b, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0xf0, 0x01, 0x00, 0x00, 0x10, 0x00,
        0x00, 0x02, 0x00, 0x00, 0x00,
    ]);
    let r = ConnRspRepr::parse(&ConnRsp::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(
        r,
        ConnRspRepr {
            version: PROTO_VER,
            errno: 0,
            queue_depth: 512,
            max_io_size: 126_976,
            max_hdr_size: 4096,
            flags: MSG_NEW_RKEY_F,
        }
    );
    assert!(r.new_rkey());
    let g = r.check_accept().unwrap();
    assert_eq!(g.chunk_size(), 131_072);
    assert_eq!(
        g.mem_bits(),
        19,
        "qd 512: 9 bits of chunk index, 19 of offset"
    );
    assert_eq!(r.to_bytes(), b);
}

#[test]
fn test_conn_rsp_reject_errno() {
    // rtrs_rdma_do_reject(-EBUSY): the errno travels as le16 and is read back as int16.
    let r = ConnRspRepr::reject(-(libc::EBUSY as i16));
    let b = r.to_bytes();
    assert_eq!(&b[4..6], &(-16i16).to_le_bytes());
    let back = ConnRspRepr::parse(&ConnRsp::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(back.errno, -16);
}

#[test]
fn test_conn_rsp_check_accept() {
    let ok = ConnRspRepr {
        version: PROTO_VER,
        errno: 0,
        queue_depth: 512,
        max_io_size: 126_976,
        max_hdr_size: 4096,
        flags: 0,
    };
    assert!(ok.check_accept().is_ok());
    let bad = |f: &dyn Fn(&mut ConnRspRepr)| {
        let mut r = ok;
        f(&mut r);
        r.check_accept().unwrap_err()
    };
    assert_eq!(bad(&|r| r.queue_depth = 0), Bad::QueueDepth);
    assert_eq!(bad(&|r| r.max_hdr_size = 16), Bad::HdrSize);
    assert_eq!(bad(&|r| r.max_io_size = u32::MAX), Bad::ChunkSize);
    assert_eq!(
        bad(&|r| r.queue_depth = 4096),
        Bad::ImmBudget,
        "12 + 17 bits exceed 28"
    );
    let mut r = ok;
    r.queue_depth = 2048;
    assert!(
        r.check_accept().is_ok(),
        "11 + 17 bits: the largest qd with 128 KiB chunks"
    );
}

#[test]
fn test_geometry_budget_and_split() {
    assert_eq!(bits(1), 0);
    assert_eq!(bits(2), 1);
    assert_eq!(bits(512), 9);
    assert_eq!(bits(513), 10);
    assert_eq!(bits(131_072), 17);
    assert_eq!(Geometry::max_queue_depth(131_072), 2048);
    assert_eq!(Geometry::max_queue_depth(8192), 32768);
    assert_eq!(Geometry::max_queue_depth(4096), 65535);
    let g = Geometry::new(512, 131_072).unwrap();
    assert_eq!(g.mem_off(3), 3 << 19);
    assert_eq!(g.encode(3, 100), Some((3 << 19) | 100));
    assert_eq!(g.split((3 << 19) | 100), Some((3, 100)));
    assert_eq!(g.encode(512, 0), None, "chunk index out of range");
    assert_eq!(g.encode(0, 131_072), None, "offset out of range");
    // A hostile payload: index bits beyond the queue depth, or an offset beyond the chunk
    // that still fits the offset bits.
    let g500 = Geometry::new(500, 131_072).unwrap();
    assert_eq!(g500.split(499 << 19), Some((499, 0)));
    assert_eq!(g500.split(500 << 19), None);
    assert_eq!(g500.split(511 << 19), None);
    assert_eq!(g.split(131_072), None);
    assert_eq!(g.split((1 << 19) - 1), None);
    // One chunk: no index bits, 28 bits of offset.
    let g1 = Geometry::new(1, 8192).unwrap();
    assert_eq!(g1.mem_bits(), 28);
    assert_eq!(g1.split(8191), Some((0, 8191)));
    assert_eq!(g1.split(8192), None);
    assert_eq!(Geometry::new(0, 8192), Err(Bad::QueueDepth));
    assert_eq!(Geometry::new(4096, 131_072), Err(Bad::ImmBudget));
}

#[test]
fn test_imm_encodings() {
    // rtrs_to_imm(type, payload) = (type & 0xF) << 28 | payload & 0x0FFFFFFF.
    assert_eq!(Imm::HB_MSG.0, 0x8000_0000);
    assert_eq!(Imm::HB_ACK.0, 0x9000_0000);
    assert_eq!(Imm::io_req(0x0123_4567).0, 0x0123_4567);
    assert_eq!(
        Imm::new(1, 0xFFFF_FFFF).0,
        0x1FFF_FFFF,
        "payload truncated to 28 bits"
    );
    assert_eq!(Imm(0x8000_0000).ty(), ImmType::HbMsg);
    assert_eq!(Imm(0x5000_0000).ty(), ImmType::Unknown(5));
    // IO response: 9 bits of |errno| << 19 | 19 bits of msg_id.
    let r = IoRsp {
        msg_id: 511,
        errno: -libc::EIO,
    };
    assert_eq!(r.payload(), (5 << 19) | 511);
    assert_eq!(r.imm(false).0, 0x1000_0000 | (5 << 19) | 511);
    assert_eq!(r.imm(true).0, 0x2000_0000 | (5 << 19) | 511);
    assert_eq!(IoRsp::decode(r.payload()), r);
    // Errnos above 511 are truncated as Linux truncates them.
    let big = IoRsp {
        msg_id: 0,
        errno: -600,
    };
    assert_eq!(IoRsp::decode(big.payload()).errno, -(600 & 0x1FF));
}

#[test]
fn test_info_req_bytes() {
    let mut b = [0u8; 272];
    InfoReqRepr {
        pathname: PathName::new(b"host1-sess").unwrap(),
    }
    .emit(&mut InfoReq::new_unchecked(&mut b[..]));
    assert_eq!(&b[0..2], &[0, 0], "type INFO_REQ");
    assert_eq!(&b[2..12], b"host1-sess");
    assert!(b[12..].iter().all(|&c| c == 0), "NUL padded, reserved zero");
    let r = InfoReqRepr::parse(&InfoReq::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(r.pathname.as_bytes(), b"host1-sess");
    // A name that fills all 255 bytes without a NUL is taken whole.
    let mut full = [b'a'; 272];
    full[0..2].fill(0);
    let r = InfoReqRepr::parse(&InfoReq::new_checked(&full[..]).unwrap()).unwrap();
    assert_eq!(r.pathname.as_bytes().len(), 255);
}

#[test]
fn test_info_req_checks() {
    let parse = |b: &[u8]| InfoReqRepr::parse(&InfoReq::new_unchecked(b));
    let mut b = [0u8; 272];
    b[2..5].copy_from_slice(b"a.b");
    assert_eq!(parse(&b), Err(Bad::PathName), "'.' is refused");
    b[2..5].copy_from_slice(b"a/b");
    assert_eq!(parse(&b), Err(Bad::PathName), "'/' is refused");
    b[2..5].fill(0);
    assert_eq!(parse(&b), Err(Bad::PathName), "empty name");
    b[2] = b'x';
    b[0] = 1;
    assert_eq!(parse(&b), Err(Bad::MsgType));
    assert_eq!(parse(&b[..271]), Err(Bad::Truncated));
}

/// An `always_invalidate=Y` server's table: one descriptor per chunk (8 + 16 * 512 = 8200
/// bytes for qd 512, as the kernel-peers capture shows).
fn table(descs: &[SgDesc]) -> Vec<u8> {
    let mut b = vec![0u8; InfoRsp::<&[u8]>::len_for(descs.len())];
    InfoRsp::new_unchecked(&mut b[..]).emit(descs);
    b
}

#[test]
fn test_info_rsp_bytes() {
    let d = SgDesc {
        addr: 0x1122_3344_5566_7788,
        key: 0xaabb_ccdd,
        len: 0x0002_0000,
    };
    let b = table(&[d]);
    assert_eq!(
        b,
        [
            1, 0, 1, 0, 0, 0, 0, 0, // type INFO_RSP, sg_cnt 1, reserved
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // addr
            0xdd, 0xcc, 0xbb, 0xaa, // key
            0x00, 0x00, 0x02, 0x00, // len
        ]
    );
    let descs: Vec<SgDesc> = (0..512)
        .map(|i| SgDesc {
            addr: 0x10_0000 + i * 0x2_0000,
            key: 0x100 + i as u32,
            len: 0x2_0000,
        })
        .collect();
    let b = table(&descs);
    assert_eq!(b.len(), 8200);
    let g = Geometry::new(512, 0x2_0000).unwrap();
    let mut rbufs = vec![(0, 0); 512];
    InfoRsp::new_checked(&b[..])
        .unwrap()
        .chunk_table(&g, &mut rbufs)
        .unwrap();
    assert_eq!(rbufs[7], (0x10_0000 + 7 * 0x2_0000, 0x107));
}

#[test]
fn test_info_rsp_one_desc_many_chunks() {
    // always_invalidate=N: one region covers several chunks, sliced by chunk size.
    let g = Geometry::new(8, 8192).unwrap();
    let b = table(&[
        SgDesc {
            addr: 0x1000_0000,
            key: 7,
            len: 4 * 8192,
        },
        SgDesc {
            addr: 0x2000_0000,
            key: 9,
            len: 4 * 8192,
        },
    ]);
    let mut rbufs = [(0, 0); 8];
    InfoRsp::new_checked(&b[..])
        .unwrap()
        .chunk_table(&g, &mut rbufs)
        .unwrap();
    assert_eq!(rbufs[3], (0x1000_0000 + 3 * 8192, 7));
    assert_eq!(rbufs[4], (0x2000_0000, 9));
}

#[test]
fn test_info_rsp_bad_tables() {
    let g = Geometry::new(8, 8192).unwrap();
    let check = |descs: &[SgDesc]| {
        let b = table(descs);
        let mut rbufs = [(0, 0); 8];
        InfoRsp::new_checked(&b[..])
            .unwrap()
            .chunk_table(&g, &mut rbufs)
    };
    let d = |addr: u64, len: u32| SgDesc { addr, key: 1, len };
    assert_eq!(check(&[]), Err(Bad::SgCount), "no descriptors");
    assert_eq!(
        check(&[d(0, 8192 * 3), d(0, 8192 * 3), d(0, 8192 * 2)]),
        Err(Bad::SgCount),
        "3 does not divide 8"
    );
    assert_eq!(
        check(&[d(0, 8192 * 8 + 1)]),
        Err(Bad::SgLen),
        "not a multiple"
    );
    assert_eq!(check(&[d(0, 0), d(0, 8192 * 8)]), Err(Bad::SgLen), "empty");
    assert_eq!(
        check(&[d(0, 8192 * 4), d(0, 8192 * 2)]),
        Err(Bad::SgTotal),
        "too few"
    );
    assert_eq!(check(&[d(0, 8192 * 16)]), Err(Bad::SgTotal), "too many");
    assert_eq!(
        check(&[d(u64::MAX - 8192, 8192 * 8)]),
        Err(Bad::SgWraps),
        "address wraps"
    );
    // sg_cnt announces more descriptors than the message holds.
    let mut b = table(&[d(0, 8192 * 8)]);
    b[2] = 2;
    assert_eq!(InfoRsp::new_checked(&b[..]).unwrap_err(), Bad::Truncated);
    // A different message type.
    let mut b = table(&[d(0, 8192 * 8)]);
    b[0] = 4;
    let mut rbufs = [(0, 0); 8];
    assert_eq!(
        InfoRsp::new_checked(&b[..])
            .unwrap()
            .chunk_table(&g, &mut rbufs),
        Err(Bad::MsgType)
    );
}

#[test]
fn test_rkey_rsp_bytes() {
    let r = RkeyRspRepr {
        buf_id: 0x0102,
        rkey: 0x0a0b_0c0d,
    };
    let b = r.to_bytes();
    assert_eq!(b, [4, 0, 0x02, 0x01, 0x0d, 0x0c, 0x0b, 0x0a]);
    assert_eq!(
        RkeyRspRepr::parse(&RkeyRsp::new_checked(&b[..]).unwrap()),
        Ok(r)
    );
    let mut wrong = b;
    wrong[0] = 1;
    assert_eq!(
        RkeyRspRepr::parse(&RkeyRsp::new_checked(&wrong[..]).unwrap()),
        Err(Bad::MsgType)
    );
    assert_eq!(RkeyRsp::new_checked(&b[..7]).unwrap_err(), Bad::Truncated);
}

#[test]
fn test_rdma_write_bytes() {
    let mut b = [0u8; 4];
    RdmaWriteRepr { usr_len: 32 }.emit(&mut b);
    assert_eq!(b, [2, 0, 32, 0]);
    assert_eq!(
        RdmaWriteRepr::parse(&RdmaWrite::new_checked(&b[..]).unwrap()),
        Ok(RdmaWriteRepr { usr_len: 32 })
    );
    assert_eq!(data_len(4096 + 32, 32), Ok(4096));
    assert_eq!(
        data_len(31, 32),
        Err(Bad::UsrLen),
        "usr_len beyond the offset"
    );
}

#[test]
fn test_rdma_read_bytes() {
    // What the Linux client sends for a 4 KiB read through one fast-registered region.
    let r = RdmaReadRepr {
        usr_len: 32,
        need_inval: true,
        desc: Some(SgDesc {
            addr: 0xffff_8881_0000_0000,
            key: 0x1234_5601,
            len: 4096,
        }),
    };
    let mut b = [0u8; 24];
    assert_eq!(r.buffer_len(), 24);
    r.emit(&mut b);
    assert_eq!(&b[..8], &[3, 0, 32, 0, 1, 0, 1, 0]);
    assert_eq!(&b[8..16], &0xffff_8881_0000_0000u64.to_le_bytes());
    assert_eq!(&b[16..20], &0x1234_5601u32.to_le_bytes());
    assert_eq!(&b[20..24], &4096u32.to_le_bytes());
    assert_eq!(
        RdmaReadRepr::parse(&RdmaRead::new_unchecked(&b[..]), 131_072),
        Ok(r)
    );
    // A read with no data carries no descriptor and no flag.
    let none = RdmaReadRepr {
        usr_len: 36,
        need_inval: true,
        desc: None,
    };
    let mut b = [0u8; 8];
    none.emit(&mut b);
    assert_eq!(b, [3, 0, 36, 0, 0, 0, 0, 0]);
}

#[test]
fn test_rdma_read_checks() {
    let mut b = [0u8; 40];
    RdmaReadRepr {
        usr_len: 0,
        need_inval: false,
        desc: Some(SgDesc {
            addr: 0,
            key: 1,
            len: 4096,
        }),
    }
    .emit(&mut b);
    let parse = |b: &[u8], max| RdmaReadRepr::parse(&RdmaRead::new_unchecked(b), max);
    assert_eq!(parse(&b, 4095), Err(Bad::ReadLen), "longer than the chunk");
    let mut z = b;
    z[20..24].fill(0);
    assert_eq!(parse(&z, 8192), Err(Bad::ReadLen), "zero length");
    let mut two = b;
    two[6] = 2;
    assert_eq!(parse(&two, 8192), Err(Bad::ReadSgCount));
    assert_eq!(
        parse(&b[..23], 8192),
        Err(Bad::Truncated),
        "descriptor cut off"
    );
    let mut w = b;
    w[0] = 2;
    assert_eq!(parse(&w, 8192), Err(Bad::MsgType));
}

#[test]
fn test_bad_maps_to_dp_wire_error() {
    assert_eq!(
        dp_wire::Error::from(Bad::Truncated),
        dp_wire::Error::Truncated
    );
    assert_eq!(dp_wire::Error::from(Bad::Version), dp_wire::Error::Version);
    assert_eq!(dp_wire::Error::from(Bad::SgLen), dp_wire::Error::Malformed);
    assert!(!Bad::ImmBudget.reason().is_empty());
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn conn_req_roundtrip(cid in 0u16..4096, extra in 1u16..=4096, recon: u16,
                              p: [u8; 16], s: [u8; 16], first: bool) {
            let cid_num = (cid + extra).min(4096).max(cid + 1);
            prop_assume!(cid < cid_num);
            let r = ConnReqRepr { version: PROTO_VER, cid, cid_num, recon_cnt: recon,
                                  path_uuid: p, sess_uuid: s, first_conn: first };
            let b = r.to_bytes();
            prop_assert_eq!(ConnReqRepr::parse(&ConnReq::new_checked(&b[..]).unwrap()), Ok(r));
        }

        #[test]
        fn any_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400), qd in 1u16..600,
                                 cs in 4096u32..200_000) {
            let _ = ConnReqRepr::parse(&ConnReq::new_unchecked(&b[..]));
            let _ = ConnRspRepr::parse(&ConnRsp::new_unchecked(&b[..])).map(|r| r.check_accept());
            let _ = InfoReqRepr::parse(&InfoReq::new_unchecked(&b[..]));
            let _ = RkeyRspRepr::parse(&RkeyRsp::new_unchecked(&b[..]));
            let _ = RdmaWriteRepr::parse(&RdmaWrite::new_unchecked(&b[..]));
            let _ = RdmaReadRepr::parse(&RdmaRead::new_unchecked(&b[..]), cs);
            if let Ok(g) = Geometry::new(qd, cs) {
                let mut rbufs = vec![(0, 0); qd as usize];
                let _ = InfoRsp::new_unchecked(&b[..]).chunk_table(&g, &mut rbufs);
                if let Ok(v) = InfoRsp::new_checked(&b[..]) {
                    prop_assert_eq!(v.descs().count(), v.sg_cnt() as usize);
                }
            }
        }

        #[test]
        fn split_inverts_encode(qd in 1u16..=65535, cs_bits in 1u32..=27, id: u16, off: u32) {
            if let Ok(g) = Geometry::new(qd, 1 << cs_bits) {
                let id = id % qd;
                let off = off % g.chunk_size();
                let p = g.encode(id, off).unwrap();
                prop_assert!(p <= imm::PAYLOAD_MASK);
                prop_assert_eq!(g.split(p), Some((id, off)));
            }
        }
    }
}
